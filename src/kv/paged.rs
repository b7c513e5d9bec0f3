//! `PagedKVCache` (vLLM / MLC style): every sequence of a model keeps its K/V
//! rows in fixed-size pages taken from one shared [`PagePool`], found through
//! the sequence's page table. Pages are taken on demand, given back on rewind
//! and drop, and shared between forks: a page written while another sequence
//! still references it is copied first (copy-on-write), which in practice
//! only happens to the partially filled last page of a forked prompt.
//!
//! One page index names the same rows in every layer's K and V buffer, so a
//! sequence has a single page table. Sequences of one pool can be evaluated
//! in one forward pass ([`PagedBatchView`]): the attention kernels read each
//! token's keys through its own sequence's table.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{AttentionIo, CacheKind, KVCache, KvAttention, LayerGeometry};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording, run_once};
use crate::ops::attention::{CacheAddressing, record_attention, record_kv_store};

/// What a pool holds and how much of it is in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStats {
    /// Rows (positions) per page.
    pub page_size: usize,
    /// Pages in the pool.
    pub pages_total: usize,
    /// Pages referenced by at least one sequence.
    pub pages_used: usize,
    /// Pages free to take.
    pub pages_free: usize,
    /// Live sequences (caches) drawing on the pool.
    pub sequences: usize,
    /// Positions held, summed over sequences (a shared prompt counts once per sequence).
    pub tokens: usize,
    /// Device bytes of the pool's K and V buffers, all layers.
    pub bytes_total: u64,
    /// Device bytes of the pages in use.
    pub bytes_used: u64,
}

/// The bookkeeping of a pool, behind its lock.
struct PoolState {
    /// Free page indices (taken from the back).
    free: Vec<u32>,
    /// References per page.
    refs: Vec<u32>,
    sequences: usize,
    tokens: usize,
}

struct LayerPages {
    k: Arc<Buffer>,
    v: Arc<Buffer>,
}

/// A pool of KV pages shared by the paged caches of one model.
pub struct PagePool {
    ctx: Arc<GpuContext>,
    page_size: usize,
    n_pages: usize,
    geometry: Vec<LayerGeometry>,
    layers: Vec<LayerPages>,
    state: Mutex<PoolState>,
}

/// Name of the pool in errors.
const POOL: &str = "kv pages";

impl PagePool {
    /// Allocates `n_pages` pages of `page_size` rows for every layer of `geometry`.
    ///
    /// # Errors
    /// Zero sizes, a layer buffer beyond one descriptor's range, or out of device memory.
    pub fn new(
        ctx: &Arc<GpuContext>,
        geometry: &[LayerGeometry],
        page_size: usize,
        n_pages: usize,
    ) -> Result<Arc<Self>> {
        if page_size == 0 || n_pages == 0 {
            return Err(ModelError::invalid(
                "page pool",
                format!("{n_pages} pages of {page_size} rows"),
            ));
        }
        if n_pages > u32::MAX as usize / page_size {
            return Err(ModelError::invalid(
                "page pool",
                format!("{n_pages} pages of {page_size} rows exceed 2^32 rows"),
            ));
        }
        let max_binding = ctx.caps().max_binding_bytes(4);
        let mut layers = Vec::with_capacity(geometry.len());
        for (il, g) in geometry.iter().enumerate() {
            let bytes = (n_pages * page_size * g.n_head_kv * g.head_dim * 2) as u64;
            if bytes > max_binding {
                return Err(ModelError::PoolExhausted {
                    pool: POOL,
                    reason: format!(
                        "{n_pages} pages of {page_size} rows need {bytes} bytes per layer; \
                         the device binds at most {max_binding}"
                    ),
                });
            }
            layers.push(LayerPages {
                k: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("kv pages k.{il}"))?,
                v: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("kv pages v.{il}"))?,
            });
        }
        Ok(Arc::new(PagePool {
            ctx: ctx.clone(),
            page_size,
            n_pages,
            geometry: geometry.to_vec(),
            layers,
            state: Mutex::new(PoolState {
                free: (0..n_pages as u32).rev().collect(),
                refs: vec![0; n_pages],
                sequences: 0,
                tokens: 0,
            }),
        }))
    }

    /// The number of pages [`PagePool::new`] would get for `positions` rows of
    /// `page_size`, limited by one descriptor's range and by `budget_bytes`.
    pub fn pages_for(
        ctx: &GpuContext,
        geometry: &[LayerGeometry],
        page_size: usize,
        positions: usize,
        budget_bytes: u64,
    ) -> usize {
        let row_bytes: usize = geometry
            .iter()
            .map(|g| 2 * g.n_head_kv * g.head_dim)
            .max()
            .unwrap_or(1);
        let all_rows_bytes: u64 = geometry
            .iter()
            .map(|g| (4 * g.n_head_kv * g.head_dim) as u64)
            .sum::<u64>()
            .max(1);
        let want = positions.div_ceil(page_size.max(1));
        let by_binding = ctx.caps().max_binding_bytes(4) as usize / (row_bytes * page_size.max(1));
        let by_budget = (budget_bytes / (all_rows_bytes * page_size.max(1) as u64)) as usize;
        want.min(by_binding).min(by_budget).max(1)
    }

    /// Rows per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub fn n_pages(&self) -> usize {
        self.n_pages
    }

    fn page_bytes(&self) -> u64 {
        self.geometry
            .iter()
            .map(|g| (2 * self.page_size * g.n_head_kv * g.head_dim * 2) as u64)
            .sum()
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // The state stays consistent even if a holder panicked: every update
        // is a few integer writes done before any fallible call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Usage of the pool now.
    pub fn stats(&self) -> PageStats {
        let st = self.lock();
        let used = self.n_pages - st.free.len();
        PageStats {
            page_size: self.page_size,
            pages_total: self.n_pages,
            pages_used: used,
            pages_free: st.free.len(),
            sequences: st.sequences,
            tokens: st.tokens,
            bytes_total: self.page_bytes() * self.n_pages as u64,
            bytes_used: self.page_bytes() * used as u64,
        }
    }

    /// Takes `n` free pages, all or none.
    fn take(&self, n: usize) -> Result<Vec<u32>> {
        let mut st = self.lock();
        if st.free.len() < n {
            return Err(ModelError::PoolExhausted {
                pool: POOL,
                reason: format!(
                    "{n} more pages of {} rows needed, {} of {} free; free or rewind \
                     other sessions, or create the pool with more pages",
                    self.page_size,
                    st.free.len(),
                    self.n_pages
                ),
            });
        }
        let at = st.free.len() - n;
        let pages = st.free.split_off(at);
        for &p in &pages {
            st.refs[p as usize] = 1;
        }
        Ok(pages)
    }

    /// Drops one reference to each of `pages`; unreferenced ones become free.
    fn release(&self, pages: &[u32]) {
        let mut st = self.lock();
        for &p in pages {
            let r = &mut st.refs[p as usize];
            *r = r.saturating_sub(1);
            if *r == 0 {
                st.free.push(p);
            }
        }
    }

    /// Adds one reference to each of `pages`.
    fn share(&self, pages: &[u32]) {
        let mut st = self.lock();
        for &p in pages {
            st.refs[p as usize] += 1;
        }
    }

    fn refs(&self, page: u32) -> u32 {
        self.lock().refs[page as usize]
    }

    fn adjust(&self, sequences: isize, tokens: isize) {
        let mut st = self.lock();
        st.sequences = st.sequences.saturating_add_signed(sequences);
        st.tokens = st.tokens.saturating_add_signed(tokens);
    }

    /// Copies the first `rows` rows of page `src` to page `dst` in every layer's K and V.
    fn copy_page(&self, src: u32, dst: u32, rows: usize) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        run_once(&self.ctx, |rec| {
            for (l, g) in self.layers.iter().zip(&self.geometry) {
                let row = (g.n_head_kv * g.head_dim * 2) as u64;
                let page = row * self.page_size as u64;
                for b in [&l.k, &l.v] {
                    rec.copy(
                        b,
                        u64::from(src) * page,
                        b,
                        u64::from(dst) * page,
                        row * rows as u64,
                    )?;
                }
            }
            Ok(())
        })
    }

    /// Records the K/V store and the attention of layer `il` for `io`'s
    /// tokens, each reading its sequence's pages through `page_table` from
    /// index `seq_base[token]` on.
    fn record(
        &self,
        rec: &mut Recording,
        il: usize,
        io: &AttentionIo<'_>,
        page_table: &Arc<Buffer>,
        seq_base: &Arc<Buffer>,
    ) -> Result<()> {
        let layer = self
            .layers
            .get(il)
            .ok_or_else(|| ModelError::Internal(format!("page pool has no layer {il}")))?;
        if io.n_tokens * 4 > seq_base.size() as usize {
            return Err(ModelError::Internal(format!(
                "{} tokens in one call, sequence table sized for {}",
                io.n_tokens,
                seq_base.size() / 4
            )));
        }
        let at = CacheAddressing {
            positions: io.positions,
            page_table,
            seq_base,
            page_size: self.page_size,
            ring: 0,
        };
        let width = io.shape.n_head_kv * io.shape.head_dim;
        record_kv_store(rec, io.k, io.n_tokens, width, &layer.k, at)?;
        record_kv_store(rec, io.v, io.n_tokens, width, &layer.v, at)?;
        record_attention(
            rec,
            io.q,
            io.o,
            io.n_tokens,
            io.shape,
            &layer.k,
            &layer.v,
            at,
            io.opts,
        )
    }
}

/// One sequence's pages in a [`PagePool`].
pub struct PagedKVCache {
    pool: Arc<PagePool>,
    /// Page of each run of `page_size` positions, in order.
    pages: Vec<u32>,
    n_ctx: usize,
    len: usize,
    pending: usize,
    /// `pages`, on the device (room for `n_ctx` positions).
    page_table: Arc<Buffer>,
    /// Zeros: every token of this sequence's calls starts at table index 0.
    seq_base: Arc<Buffer>,
}

impl PagedKVCache {
    /// An empty sequence of up to `n_ctx` positions on `pool`, whose forward
    /// calls carry at most `max_batch` tokens.
    ///
    /// # Errors
    /// Out of device memory for the page table.
    pub fn new(pool: &Arc<PagePool>, n_ctx: usize, max_batch: usize) -> Result<Self> {
        let ctx = &pool.ctx;
        let max_pages = n_ctx.div_ceil(pool.page_size).max(1);
        let page_table = Buffer::new(ctx, 4 * max_pages as u64, MemoryKind::Upload, "page table")?;
        let max_batch = max_batch.max(1);
        let seq_base = Buffer::new(ctx, 4 * max_batch as u64, MemoryKind::Upload, "seq base")?;
        seq_base.write_slice(0, &vec![0i32; max_batch])?;
        pool.adjust(1, 0);
        Ok(PagedKVCache {
            pool: pool.clone(),
            pages: Vec::new(),
            n_ctx,
            len: 0,
            pending: 0,
            page_table,
            seq_base,
        })
    }

    /// The pool the pages come from.
    pub fn pool(&self) -> &Arc<PagePool> {
        &self.pool
    }

    /// Page indices of the positions held and reserved, in order.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    fn upload_table(&self) -> Result<()> {
        self.page_table.write_slice(0, &self.pages)
    }

    /// Gives back the pages past those needed for `positions`.
    fn shrink_to(&mut self, positions: usize) {
        let keep = positions.div_ceil(self.pool.page_size);
        if keep < self.pages.len() {
            let gone = self.pages.split_off(keep);
            self.pool.release(&gone);
        }
    }

    /// A new sequence holding the same positions, sharing every page until
    /// one of the two writes into a shared one.
    ///
    /// # Errors
    /// Out of device memory for the new page table.
    pub fn fork_paged(&self) -> Result<PagedKVCache> {
        let max_batch = (self.seq_base.size() / 4) as usize;
        let mut f = PagedKVCache::new(&self.pool, self.n_ctx, max_batch)?;
        self.pool.share(&self.pages);
        f.pages = self.pages.clone();
        f.len = self.len;
        self.pool.adjust(0, self.len as isize);
        f.upload_table()?;
        Ok(f)
    }
}

impl KvAttention for PagedKVCache {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()> {
        self.pool
            .record(rec, il, io, &self.page_table, &self.seq_base)
    }
}

impl KVCache for PagedKVCache {
    fn kind(&self) -> CacheKind {
        CacheKind::Paged
    }

    fn len(&self) -> usize {
        self.len
    }

    fn reserve(&mut self, n: usize) -> Result<()> {
        let end = self.len + n;
        if end > self.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx,
                requested: end,
            });
        }
        // Pages past `len` left by an earlier reservation that was not committed.
        self.shrink_to(self.len);
        let ps = self.pool.page_size;
        let need = end.div_ceil(ps).saturating_sub(self.pages.len());
        // The page position `len` falls in, if it is already held and shared.
        let cow = if n > 0 && !self.len.is_multiple_of(ps) {
            let i = self.len / ps;
            self.pages
                .get(i)
                .copied()
                .filter(|&p| self.pool.refs(p) > 1)
                .map(|p| (i, p))
        } else {
            None
        };
        let mut fresh = self.pool.take(need + usize::from(cow.is_some()))?;
        if let Some((i, old)) = cow {
            let new = fresh
                .pop()
                .ok_or_else(|| ModelError::Internal("no page".into()))?;
            if let Err(e) = self.pool.copy_page(old, new, self.len % ps) {
                self.pool.release(&[new]);
                self.pool.release(&fresh);
                return Err(e);
            }
            self.pages[i] = new;
            self.pool.release(&[old]);
        }
        self.pages.extend(fresh);
        self.pending = n;
        self.upload_table()
    }

    fn commit(&mut self, n: usize) {
        let n = n.min(self.pending);
        self.len += n;
        self.pending = 0;
        self.pool.adjust(0, n as isize);
    }

    fn truncate(&mut self, n_keep: usize) -> Result<usize> {
        if n_keep > self.len {
            return Err(ModelError::invalid(
                "n_keep",
                format!("{n_keep} is past the {} positions held", self.len),
            ));
        }
        self.pool.adjust(0, -((self.len - n_keep) as isize));
        self.len = n_keep;
        self.pending = 0;
        self.shrink_to(n_keep);
        self.upload_table()?;
        Ok(n_keep)
    }

    fn fork(&self) -> Result<Box<dyn KVCache>> {
        Ok(Box::new(self.fork_paged()?))
    }

    fn page_stats(&self) -> Option<PageStats> {
        Some(self.pool.stats())
    }

    fn as_paged(&self) -> Option<&PagedKVCache> {
        Some(self)
    }

    fn device_bytes(&self) -> u64 {
        self.pool.page_bytes() * self.pages.len() as u64
    }
}

impl Drop for PagedKVCache {
    fn drop(&mut self) {
        self.pool.release(&self.pages);
        self.pool.adjust(-1, -(self.len as isize));
    }
}

/// The tokens of several sequences of one pool in one forward call: each
/// token reads its own sequence's pages through a concatenation of their
/// page tables.
pub struct PagedBatchView<'a> {
    /// The pool all sequences draw on.
    pub pool: &'a PagePool,
    /// The page tables of all sequences, one after another.
    pub page_table: &'a Arc<Buffer>,
    /// Per token, where its sequence's table starts in `page_table`.
    pub seq_base: &'a Arc<Buffer>,
    /// The context size of the sequences (one rope-scaling choice for all).
    pub n_ctx: usize,
}

impl KvAttention for PagedBatchView<'_> {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()> {
        self.pool
            .record(rec, il, io, self.page_table, self.seq_base)
    }
}

/// Where a model's page pools live: one per page size, made by the first
/// paged cache that asks for it.
#[derive(Default)]
pub struct PoolRegistry {
    pools: Mutex<Vec<Arc<PagePool>>>,
}

impl PoolRegistry {
    /// The pool of `page_size`, created with `n_pages()` pages if there is none.
    ///
    /// # Errors
    /// From [`PagePool::new`].
    pub fn get_or_create(
        &self,
        ctx: &Arc<GpuContext>,
        geometry: &[LayerGeometry],
        page_size: usize,
        n_pages: impl FnOnce() -> usize,
    ) -> Result<Arc<PagePool>> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.iter().find(|p| p.page_size == page_size) {
            return Ok(p.clone());
        }
        let p = PagePool::new(ctx, geometry, page_size, n_pages())?;
        pools.push(p.clone());
        Ok(p)
    }

    /// The pool of `page_size`, if one was made.
    pub fn get(&self, page_size: usize) -> Option<Arc<PagePool>> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.iter().find(|p| p.page_size == page_size).cloned()
    }
}
