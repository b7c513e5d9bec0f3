//! KV caches: per-layer K and V storage on the device, and the attention
//! computation over it (the cache decides how positions map to rows, so it
//! records the K/V store and the attention dispatch itself).
//!
//! `ContiguousKVCache` holds one sequence in `n_ctx` rows per layer;
//! `PagedKVCache` (MLC / vLLM style) keeps each sequence in pages of a pool
//! shared by all sequences of a model, which is what lets several sequences
//! run in one forward pass and forks share their prompt.

pub mod contiguous;
pub mod paged;

use std::sync::Arc;

pub use contiguous::ContiguousKVCache;
pub use paged::{PagePool, PageStats, PagedBatchView, PagedKVCache, PoolRegistry};

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
    /// Pages of the model's pool for this page size, if this cache creates
    /// it (0: enough for max(n_ctx, 16384) positions, within a quarter of
    /// the device's memory). A pool that exists already keeps its size.
    pub pool_pages: usize,
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
            pool_pages: 0,
            max_batch: 512,
        }
    }

    /// A paged cache of `n_ctx` positions in pages of `page_size` rows.
    pub fn paged(n_ctx: usize, page_size: usize) -> Self {
        CacheConfig {
            kind: CacheKind::Paged,
            page_size,
            ..CacheConfig::contiguous(n_ctx)
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

/// Something that records one layer's K/V store and attention: a sequence's
/// cache, or a batch of sequences of one page pool.
pub trait KvAttention {
    /// Positions each sequence may hold (LongRoPE models pick their rope
    /// factors by it).
    fn n_ctx(&self) -> usize;
    /// Records the store of this call's K/V rows of layer `il` and the attention
    /// of its queries over everything the sequence holds up to each query.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()>;
    /// Whether each of a call's `n_tokens` tokens is the only new one of its
    /// sequence (decode, batched decode): then GPUs run the decode kernel,
    /// which can write its output as f16 ([`View::f16`](crate::ops::View)).
    fn one_per_sequence(&self, n_tokens: usize) -> bool {
        n_tokens == 1
    }
}

/// Per-layer K/V storage for one sequence that also records attention over it.
pub trait KVCache: KvAttention + Send {
    /// The implementation.
    fn kind(&self) -> CacheKind;
    /// Positions currently held.
    fn len(&self) -> usize;
    /// Most positions one forward call may add (sliding-window rings hold
    /// the window plus this many rows).
    fn max_call_tokens(&self) -> usize {
        usize::MAX
    }
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
    /// Forgets every position from `n_keep` on, and returns how many
    /// positions it now holds: `n_keep`, or fewer (then 0) when a
    /// sliding-window ring has overwritten rows that the kept positions'
    /// successors would attend to — the caller evaluates the kept tokens
    /// again from there.
    ///
    /// # Errors
    /// `n_keep` beyond the current length.
    fn truncate(&mut self, n_keep: usize) -> Result<usize>;
    /// A new cache holding the same positions: a copy of the rows, or for a
    /// paged cache the same pages, shared until written.
    ///
    /// # Errors
    /// Out of device memory.
    fn fork(&self) -> Result<Box<dyn KVCache>>;
    /// The usage of the page pool behind the cache (`None`: not paged).
    fn page_stats(&self) -> Option<PageStats> {
        None
    }
    /// The cache as a paged one, if it is.
    fn as_paged(&self) -> Option<&PagedKVCache> {
        None
    }
    /// Bytes of device memory the cache holds.
    fn device_bytes(&self) -> u64;
}
