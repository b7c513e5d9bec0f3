//! `KvCaches`: the KV caches of one model — a contiguous cache per
//! sequence, or a paged one from the model's page pool for its page size,
//! made by the first paged cache that asks for it and sized by the policy
//! here. The runtime asks through `GenerativeModel::create_kv_cache`; the
//! architecture only states its layers' geometry.

use std::sync::{Arc, Mutex};

use super::{
    CacheConfig, CacheKind, ContiguousKVCache, KVCache, LayerGeometry, PagePool, PagedKVCache,
};
use crate::error::Result;
use crate::gpu::GpuContext;

/// Positions a pool made without an explicit size holds at least.
const DEFAULT_POOL_POSITIONS: usize = 16384;

/// Sliding-window rings a pool holds at least.
const MIN_RINGS: usize = 8;

/// The KV caches of one model on one device, and its page pools.
pub struct KvCaches {
    ctx: Arc<GpuContext>,
    geometry: Vec<LayerGeometry>,
    /// One pool per page size.
    pools: Mutex<Vec<Arc<PagePool>>>,
}

impl KvCaches {
    /// The caches of a model whose layers have `geometry`.
    pub fn new(ctx: &Arc<GpuContext>, geometry: Vec<LayerGeometry>) -> Self {
        KvCaches {
            ctx: ctx.clone(),
            geometry,
            pools: Mutex::new(Vec::new()),
        }
    }

    /// A cache for one sequence as `cfg` says.
    ///
    /// # Errors
    /// Out of device memory, or a pool that cannot be made.
    pub fn create(&self, cfg: &CacheConfig) -> Result<Box<dyn KVCache>> {
        Ok(match cfg.kind {
            CacheKind::Contiguous => Box::new(ContiguousKVCache::new(
                &self.ctx,
                &self.geometry,
                cfg.n_ctx,
                cfg.max_batch,
            )?),
            CacheKind::Paged => Box::new(PagedKVCache::new(
                &self.pool(cfg)?,
                cfg.n_ctx,
                cfg.max_batch,
            )?),
        })
    }

    /// The pool of `cfg.page_size`, made on first use: `cfg.pool_pages`
    /// pages, or (0) enough for max(n_ctx, 16384) positions within a
    /// quarter of the device's memory; sliding-window rings for as many
    /// sequences as the full pages hold contexts of `n_ctx`, and at least 8.
    /// A pool that exists already keeps its size.
    fn pool(&self, cfg: &CacheConfig) -> Result<Arc<PagePool>> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.iter().find(|p| p.page_size() == cfg.page_size) {
            return Ok(p.clone());
        }
        let n_pages = if cfg.pool_pages > 0 {
            cfg.pool_pages
        } else {
            let budget = self.ctx.caps().device_local_bytes / 4;
            PagePool::pages_for(
                &self.ctx,
                &self.geometry,
                cfg.page_size,
                cfg.n_ctx.max(DEFAULT_POOL_POSITIONS),
                budget,
            )
        };
        let n_rings = (n_pages * cfg.page_size / cfg.n_ctx.max(1)).max(MIN_RINGS);
        let pool = PagePool::new(&self.ctx, &self.geometry, cfg.page_size, n_pages, n_rings)?;
        pools.push(pool.clone());
        Ok(pool)
    }
}
