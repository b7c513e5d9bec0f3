//! `kv_store`: new K or V rows (f32) into a layer's f16 cache, each at the
//! cache row its token's position maps to through its sequence's page table
//! (`common/kv_slot.glsl`), and the addressing the attention kernels share.

use std::sync::Arc;

use super::params::KvStoreParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording};

/// Where one layer's K or V cache rows live and how positions map to them.
#[derive(Clone, Copy, Debug)]
pub struct CacheAddressing<'a> {
    /// Token positions, one i32 per token of the call.
    pub positions: &'a Arc<Buffer>,
    /// Page tables of all sequences, i32 page indices.
    pub page_table: &'a Arc<Buffer>,
    /// Per token, the index in `page_table` where its sequence's table starts.
    pub seq_base: &'a Arc<Buffer>,
    /// Cache rows per page.
    pub page_size: usize,
    /// Ring size of a window-only cache, 0 otherwise.
    pub ring: usize,
}

/// One layer's K and V caches (f16 rows of `n_head_kv × head_dim`) and how
/// the tokens of a call address them.
#[derive(Clone, Copy, Debug)]
pub struct LayerKv<'a> {
    /// Keys.
    pub k: &'a Arc<Buffer>,
    /// Values.
    pub v: &'a Arc<Buffer>,
    /// Positions, page tables, page and ring sizes.
    pub at: CacheAddressing<'a>,
}

/// One attention call's layer and tokens, as a cache addresses them.
#[derive(Clone, Copy, Debug)]
pub struct LayerCall<'a> {
    /// The layer.
    pub il: usize,
    /// Tokens of the call.
    pub n_tokens: usize,
    /// Each token's position, one i32 per token.
    pub positions: &'a Arc<Buffer>,
}

/// What the planner needs of a KV cache — a sequence's, or a batch of
/// sequences of one page pool: each layer's caches and how a call's tokens
/// address them. The cache decides how positions map to rows.
pub trait KvAttention {
    /// Positions each sequence may hold (LongRoPE models pick their rope
    /// factors by it).
    fn n_ctx(&self) -> usize;
    /// The caches of `call`'s layer for its tokens.
    ///
    /// # Errors
    /// A layer the cache does not have, or more tokens than its tables hold.
    fn layer_kv<'a>(&'a self, call: LayerCall<'a>) -> Result<LayerKv<'a>>;
    /// Whether each of a call's `n_tokens` tokens is the only new one of its
    /// sequence (decode, batched decode): then the decode kernel may store
    /// the new rows itself and write f16.
    fn one_per_sequence(&self, n_tokens: usize) -> bool {
        n_tokens == 1
    }
}

/// The store of the rows of `src` (one per token, an even number of floats)
/// into `cache`.
#[derive(Clone, Copy, Debug)]
pub struct KvStoreCall<'a> {
    /// The new rows, f32.
    pub src: Mat<'a>,
    /// The layer's K or V cache, f16.
    pub cache: &'a Arc<Buffer>,
    /// Where each token's row goes.
    pub at: CacheAddressing<'a>,
}

/// Records the store.
///
/// # Errors
/// An odd width, a view outside its buffer, or a value beyond 32 bits.
pub fn record_kv_store(rec: &mut Recording, call: &KvStoreCall<'_>) -> Result<()> {
    let (src, at) = (call.src, call.at);
    if !src.cols.is_multiple_of(2) {
        return Err(ModelError::invalid(
            "kv width",
            format!("{} is odd", src.cols),
        ));
    }
    src.check("kv_store source")?;
    let params = KvStoreParams {
        n_tokens: pc_u32("n_tokens", src.rows)?,
        width: pc_u32("width", src.cols)?,
        ld: pc_u32("ld", src.ld)?,
        offset: pc_u32("offset", src.offset)?,
        page_size: pc_u32("page_size", at.page_size)?,
        ring: pc_u32("ring", at.ring)?,
    };
    rec.dispatch_elementwise(
        Kernel::KvStoreF32F16,
        &[
            Binding::read(src.buf),
            Binding::write(call.cache),
            Binding::read(at.positions),
            Binding::read(at.page_table),
            Binding::read(at.seq_base),
        ],
        &params,
        pc_u32("kv_store threads", src.rows * src.cols / 2)?,
    )
}
