//! KV caches: per-layer K and V storage on the device, and how a call's
//! tokens address it ([`KvAttention`]: the cache decides how positions map
//! to rows; the planner records the store and the attention over them).
//!
//! `ContiguousKVCache` holds one sequence in `n_ctx` rows per layer;
//! `PagedKVCache` (MLC / vLLM style) keeps each sequence in pages of a pool
//! shared by all sequences of a model, which is what lets several sequences
//! run in one forward pass and forks share their prompt.

pub mod caches;
pub mod contiguous;
pub mod paged;
pub mod pool;

pub use caches::KvCaches;
pub use contiguous::ContiguousKVCache;
pub use paged::{PagedBatchView, PagedKVCache};
pub use pool::{PagePool, PageStats};

pub use crate::ops::kv_store::{KvAttention, LayerCall, LayerKv};

use crate::error::Result;

/// Which cache implementation a session uses.
///
/// ```
/// use combs::{CacheConfig, CacheKind};
///
/// assert_eq!(CacheKind::default(), CacheKind::Contiguous);
/// assert_eq!(CacheConfig::paged(4096, 256).kind, CacheKind::Paged);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheKind {
    /// One contiguous block of `n_ctx` rows per layer.
    #[default]
    Contiguous,
    /// Fixed-size pages from a shared pool, mapped through a page table.
    Paged,
}

/// Size and kind of a cache, as [`crate::GenerativeModel::create_kv_cache`]
/// takes it.
///
/// ```
/// use combs::{CacheConfig, CacheKind};
///
/// let cfg = CacheConfig { max_batch: 64, ..CacheConfig::paged(2048, 128) };
/// assert_eq!((cfg.n_ctx, cfg.kind, cfg.page_size), (2048, CacheKind::Paged, 128));
/// assert_eq!(cfg.pool_pages, 0); // the pool sized for the device
/// ```
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
