//! KV caches: per-layer K and V storage on the device, and the attention
//! computation over it (the cache decides how positions map to rows, so it
//! records the K/V store and the attention dispatch itself).
//!
//! `ContiguousKVCache` holds one sequence in `n_ctx` rows per layer; the paged
//! cache (MLC / vLLM style) lands with batching.

pub mod contiguous;

use std::sync::Arc;

pub use contiguous::ContiguousKVCache;

use crate::error::Result;
use crate::gpu::{Buffer, Recording};
use crate::ops::View;
use crate::ops::attention::{AttentionOptions, AttentionShape};

/// Which cache implementation a session uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CacheKind {
    /// One contiguous block of `n_ctx` rows per layer.
    #[default]
    Contiguous,
    /// Fixed-size pages from a shared pool, mapped through a page table.
    Paged,
}

/// Size and kind of a cache.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Positions the sequence may hold.
    pub n_ctx: usize,
    /// Implementation.
    pub kind: CacheKind,
    /// Rows per page (paged caches).
    pub page_size: usize,
    /// Most tokens one forward call stores at once (sizes ring buffers of
    /// sliding-window layers).
    pub max_batch: usize,
}

impl CacheConfig {
    /// A contiguous cache of `n_ctx` positions.
    pub fn contiguous(n_ctx: usize) -> Self {
        CacheConfig {
            n_ctx,
            kind: CacheKind::Contiguous,
            page_size: 256,
            max_batch: 512,
        }
    }
}

/// The geometry of one layer's cache rows.
#[derive(Clone, Copy, Debug)]
pub struct LayerGeometry {
    /// KV heads.
    pub n_head_kv: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Sliding window of the layer (0: full attention).
    pub window: usize,
}

/// What one layer's attention call reads and writes.
pub struct AttentionIo<'a> {
    /// Queries, roped: `n_tokens × n_head × head_dim`.
    pub q: View<'a>,
    /// New keys, roped: `n_tokens × n_head_kv × head_dim`.
    pub k: View<'a>,
    /// New values: `n_tokens × n_head_kv × head_dim`.
    pub v: View<'a>,
    /// Output: `n_tokens × n_head × head_dim`.
    pub o: View<'a>,
    /// Tokens in this call.
    pub n_tokens: usize,
    /// Position of each token (i32, device).
    pub positions: &'a Arc<Buffer>,
    /// Head geometry.
    pub shape: AttentionShape,
    /// Scale, soft-cap and window.
    pub opts: AttentionOptions,
}

/// Per-layer K/V storage for one sequence that also records attention over it.
pub trait KVCache: Send {
    /// The implementation.
    fn kind(&self) -> CacheKind;
    /// Positions the cache can hold.
    fn n_ctx(&self) -> usize;
    /// Positions currently held.
    fn len(&self) -> usize;
    /// Whether no position is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Makes room for `n` more positions (allocating pages where needed).
    ///
    /// # Errors
    /// `ContextFull` past `n_ctx`, or an exhausted page pool.
    fn reserve(&mut self, n: usize) -> Result<()>;
    /// Marks `n` more positions as filled (after a forward pass stored them).
    fn commit(&mut self, n: usize);
    /// Forgets every position from `n_keep` on.
    ///
    /// # Errors
    /// `n_keep` beyond the current length.
    fn truncate(&mut self, n_keep: usize) -> Result<()>;
    /// Records the store of this call's K/V rows of layer `il` and the attention
    /// of its queries over everything the sequence holds up to each query.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()>;
    /// Bytes of device memory the cache holds.
    fn device_bytes(&self) -> u64;
}
