//! `PagedKVCache` (vLLM / MLC style): every sequence of a model keeps its K/V
//! rows in fixed-size pages taken from one shared [`PagePool`], found through
//! the sequence's page table. Pages are taken on demand, given back on rewind
//! and drop, and shared between forks: a page written while another sequence
//! still references it is copied first (copy-on-write), which in practice
//! only happens to the partially filled last page of a forked prompt.
//!
//! One page index names the same rows in the K and V buffers of every
//! full-attention layer, so a sequence has a single page table for them.
//! Sliding-window layers (Gemma 3's local layers, Mistral) keep only their
//! window: they draw on a second set of pages, and each sequence uses a ring
//! of `ring_rows / page_size` of them, position `j` living in ring row
//! `j mod ring_rows`. Sequences of one pool can be evaluated in one forward
//! pass ([`PagedBatchView`]): the attention kernels read each token's keys
//! through its own sequence's tables.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{AttentionIo, CacheKind, KVCache, KvAttention, LayerGeometry};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording, run_once};
use crate::ops::attention::{CacheAddressing, NewRows, record_store_and_attention};

/// Most positions one sequence adds in one forward call on a pool with
/// sliding-window layers (their rings hold the window plus this many rows).
pub const MAX_CALL_TOKENS: usize = 512;

/// What a pool holds and how much of it is in use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStats {
    /// Rows (positions) per page.
    pub page_size: usize,
    /// Pages of the full-attention layers.
    pub pages_total: usize,
    /// Those referenced by at least one sequence.
    pub pages_used: usize,
    /// Those free to take.
    pub pages_free: usize,
    /// Pages of the sliding-window layers' rings (0 without such layers).
    pub window_pages_total: usize,
    /// Those referenced by at least one sequence.
    pub window_pages_used: usize,
    /// Live sequences (caches) drawing on the pool.
    pub sequences: usize,
    /// Positions held, summed over sequences (a shared prompt counts once per sequence).
    pub tokens: usize,
    /// Device bytes of the pool's K and V buffers, all layers.
    pub bytes_total: u64,
    /// Device bytes of the pages in use.
    pub bytes_used: u64,
}

struct LayerPages {
    k: Arc<Buffer>,
    v: Arc<Buffer>,
    /// Bytes of one row (one position) of K or V.
    row: u64,
}

struct SetState {
    /// Free page indices (taken from the back).
    free: Vec<u32>,
    /// References per page.
    refs: Vec<u32>,
}

/// The pages of one kind of layer: their K/V buffers, free list and references.
struct PageSet {
    name: &'static str,
    page_size: usize,
    n_pages: usize,
    layers: Vec<LayerPages>,
    state: Mutex<SetState>,
}

impl PageSet {
    fn new(
        ctx: &Arc<GpuContext>,
        name: &'static str,
        geometry: &[&LayerGeometry],
        page_size: usize,
        n_pages: usize,
    ) -> Result<Self> {
        let max_binding = ctx.caps().max_binding_bytes(4);
        let mut layers = Vec::with_capacity(geometry.len());
        for (i, g) in geometry.iter().enumerate() {
            let row = (g.n_head_kv * g.head_dim * 2) as u64;
            let bytes = n_pages as u64 * page_size as u64 * row;
            if bytes > max_binding {
                return Err(ModelError::PoolExhausted {
                    pool: name,
                    reason: format!(
                        "{n_pages} pages of {page_size} rows need {bytes} bytes per layer; \
                         the device binds at most {max_binding}: use fewer pages"
                    ),
                });
            }
            layers.push(LayerPages {
                k: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("{name} k.{i}"))?,
                v: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("{name} v.{i}"))?,
                row,
            });
        }
        Ok(PageSet {
            name,
            page_size,
            n_pages,
            layers,
            state: Mutex::new(SetState {
                free: (0..n_pages as u32).rev().collect(),
                refs: vec![0; n_pages],
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, SetState> {
        // The state stays consistent even if a holder panicked: every update
        // is a few integer writes done before any fallible call.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Device bytes of one page over all layers, K and V.
    fn page_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| 2 * l.row * self.page_size as u64)
            .sum()
    }

    fn used(&self) -> usize {
        self.n_pages - self.lock().free.len()
    }

    /// Takes `n` free pages, all or none.
    fn take(&self, n: usize) -> Result<Vec<u32>> {
        let mut st = self.lock();
        if st.free.len() < n {
            return Err(ModelError::PoolExhausted {
                pool: self.name,
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

    fn shared(&self, page: u32) -> bool {
        self.lock().refs[page as usize] > 1
    }

    /// Records copies of the first `rows` rows of page `src` to page `dst` in every layer.
    fn record_copy(&self, rec: &mut Recording, src: u32, dst: u32, rows: usize) -> Result<()> {
        for l in &self.layers {
            let page = l.row * self.page_size as u64;
            for b in [&l.k, &l.v] {
                rec.copy(
                    b,
                    u64::from(src) * page,
                    b,
                    u64::from(dst) * page,
                    l.row * rows as u64,
                )?;
            }
        }
        Ok(())
    }
}

/// Which page set serves a layer, and its index there.
#[derive(Clone, Copy)]
enum Slot {
    Full(usize),
    Ring(usize),
}

/// A pool of KV pages shared by the paged caches of one model.
pub struct PagePool {
    ctx: Arc<GpuContext>,
    page_size: usize,
    slots: Vec<Slot>,
    full: PageSet,
    /// The sliding-window layers' pages, with the ring size and the window.
    ring: Option<(PageSet, usize, usize)>,
    /// (sequences, tokens).
    counters: Mutex<(usize, usize)>,
}

/// Pool names in errors.
const FULL: &str = "kv pages";
const RING: &str = "kv window pages";

impl PagePool {
    /// Allocates `n_pages` pages of `page_size` rows for the full-attention
    /// layers of `geometry`, and for its sliding-window layers (if any) rings
    /// for `n_rings` sequences.
    ///
    /// # Errors
    /// Zero sizes, layers with different windows, a layer buffer beyond one
    /// descriptor's range, or out of device memory.
    pub fn new(
        ctx: &Arc<GpuContext>,
        geometry: &[LayerGeometry],
        page_size: usize,
        n_pages: usize,
        n_rings: usize,
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
        let window = geometry.iter().map(|g| g.window).max().unwrap_or(0);
        if geometry.iter().any(|g| g.window != 0 && g.window != window) {
            return Err(ModelError::invalid(
                "page pool",
                "layers with different sliding windows",
            ));
        }
        let mut slots = Vec::with_capacity(geometry.len());
        let (mut full_g, mut ring_g) = (Vec::new(), Vec::new());
        for g in geometry {
            if g.window == 0 {
                slots.push(Slot::Full(full_g.len()));
                full_g.push(g);
            } else {
                slots.push(Slot::Ring(ring_g.len()));
                ring_g.push(g);
            }
        }
        let full = PageSet::new(ctx, FULL, &full_g, page_size, n_pages)?;
        let ring = if ring_g.is_empty() {
            None
        } else {
            let ring_rows = (window + MAX_CALL_TOKENS).div_ceil(page_size) * page_size;
            let pages = (ring_rows / page_size) * n_rings.max(1);
            Some((
                PageSet::new(ctx, RING, &ring_g, page_size, pages)?,
                ring_rows,
                window,
            ))
        };
        Ok(Arc::new(PagePool {
            ctx: ctx.clone(),
            page_size,
            slots,
            full,
            ring,
            counters: Mutex::new((0, 0)),
        }))
    }

    /// The number of pages for `positions` rows of `page_size`, limited by
    /// one descriptor's range and by `budget_bytes` for the full-attention
    /// layers of `geometry`.
    pub fn pages_for(
        ctx: &GpuContext,
        geometry: &[LayerGeometry],
        page_size: usize,
        positions: usize,
        budget_bytes: u64,
    ) -> usize {
        let full = geometry.iter().filter(|g| g.window == 0);
        let row_bytes = full
            .clone()
            .map(|g| 2 * g.n_head_kv * g.head_dim)
            .max()
            .unwrap_or(1);
        let all_rows_bytes = full
            .map(|g| (4 * g.n_head_kv * g.head_dim) as u64)
            .sum::<u64>()
            .max(1);
        let ps = page_size.max(1);
        let want = positions.div_ceil(ps);
        let by_binding = ctx.caps().max_binding_bytes(4) as usize / (row_bytes * ps);
        let by_budget = (budget_bytes / (all_rows_bytes * ps as u64)) as usize;
        want.min(by_binding).min(by_budget).max(1)
    }

    /// Rows per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages of the full-attention layers.
    pub fn n_pages(&self) -> usize {
        self.full.n_pages
    }

    /// Rows of each sequence's ring in the sliding-window layers (0: none).
    pub fn ring_rows(&self) -> usize {
        self.ring.as_ref().map_or(0, |r| r.1)
    }

    /// Usage of the pool now.
    pub fn stats(&self) -> PageStats {
        let (sequences, tokens) = *self.counters();
        let used = self.full.used();
        let (w_total, w_used, w_bytes_total, w_bytes_used) = match &self.ring {
            Some((set, ..)) => {
                let u = set.used();
                (
                    set.n_pages,
                    u,
                    set.page_bytes() * set.n_pages as u64,
                    set.page_bytes() * u as u64,
                )
            }
            None => (0, 0, 0, 0),
        };
        PageStats {
            page_size: self.page_size,
            pages_total: self.full.n_pages,
            pages_used: used,
            pages_free: self.full.n_pages - used,
            window_pages_total: w_total,
            window_pages_used: w_used,
            sequences,
            tokens,
            bytes_total: self.full.page_bytes() * self.full.n_pages as u64 + w_bytes_total,
            bytes_used: self.full.page_bytes() * used as u64 + w_bytes_used,
        }
    }

    fn counters(&self) -> MutexGuard<'_, (usize, usize)> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn adjust(&self, sequences: isize, tokens: isize) {
        let mut c = self.counters();
        c.0 = c.0.saturating_add_signed(sequences);
        c.1 = c.1.saturating_add_signed(tokens);
    }

    /// Records the K/V store and the attention of layer `il` for `io`'s
    /// tokens, each reading its sequence's pages through the tables of `t`.
    fn record(
        &self,
        rec: &mut Recording,
        il: usize,
        io: &AttentionIo<'_>,
        t: Tables<'_>,
    ) -> Result<()> {
        let slot = self
            .slots
            .get(il)
            .copied()
            .ok_or_else(|| ModelError::Internal(format!("page pool has no layer {il}")))?;
        let (layer, page_table, seq_base, ring) = match (slot, &self.ring) {
            (Slot::Full(i), _) => (&self.full.layers[i], t.full, t.full_base, 0),
            (Slot::Ring(i), Some((set, rows, _))) => (&set.layers[i], t.ring, t.ring_base, *rows),
            (Slot::Ring(_), None) => {
                return Err(ModelError::Internal(
                    "window layer without ring pages".into(),
                ));
            }
        };
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
            ring,
        };
        record_store_and_attention(
            rec,
            io.q,
            NewRows { k: io.k, v: io.v },
            io.o,
            io.n_tokens,
            io.shape,
            &layer.k,
            &layer.v,
            at,
            io.opts,
            t.one_per_sequence || io.n_tokens == 1,
        )
    }
}

/// The device tables one attention call reads: page tables of the full and
/// the ring layers, and per token where its sequence's table starts in each.
#[derive(Clone, Copy)]
struct Tables<'a> {
    full: &'a Arc<Buffer>,
    full_base: &'a Arc<Buffer>,
    ring: &'a Arc<Buffer>,
    ring_base: &'a Arc<Buffer>,
    /// Every token is the only new one of its sequence (batched decode).
    one_per_sequence: bool,
}

/// One sequence's pages in a [`PagePool`].
pub struct PagedKVCache {
    pool: Arc<PagePool>,
    /// Full-attention page of each run of `page_size` positions, in order.
    pages: Vec<u32>,
    /// Ring pages of the sliding-window layers (at most ring_rows / page_size).
    ring_pages: Vec<u32>,
    n_ctx: usize,
    len: usize,
    pending: usize,
    /// `pages` on the device (room for `n_ctx` positions).
    page_table: Arc<Buffer>,
    /// `ring_pages` on the device.
    ring_table: Arc<Buffer>,
    /// Zeros: every token of this sequence's calls starts at table index 0.
    seq_base: Arc<Buffer>,
}

impl PagedKVCache {
    /// An empty sequence of up to `n_ctx` positions on `pool`, whose forward
    /// calls carry at most `max_batch` tokens.
    ///
    /// # Errors
    /// Out of device memory for the page tables.
    pub fn new(pool: &Arc<PagePool>, n_ctx: usize, max_batch: usize) -> Result<Self> {
        let ctx = &pool.ctx;
        let max_pages = n_ctx.div_ceil(pool.page_size).max(1);
        let page_table = Buffer::new(ctx, 4 * max_pages as u64, MemoryKind::Upload, "page table")?;
        let ring_entries = (pool.ring_rows() / pool.page_size).max(1);
        let ring_table = Buffer::new(
            ctx,
            4 * ring_entries as u64,
            MemoryKind::Upload,
            "ring page table",
        )?;
        let max_batch = max_batch.max(1);
        let seq_base = Buffer::new(ctx, 4 * max_batch as u64, MemoryKind::Upload, "seq base")?;
        seq_base.write_slice(0, &vec![0i32; max_batch])?;
        pool.adjust(1, 0);
        Ok(PagedKVCache {
            pool: pool.clone(),
            pages: Vec::new(),
            ring_pages: Vec::new(),
            n_ctx,
            len: 0,
            pending: 0,
            page_table,
            ring_table,
            seq_base,
        })
    }

    /// The pool the pages come from.
    pub fn pool(&self) -> &Arc<PagePool> {
        &self.pool
    }

    /// Full-attention page indices of the positions held and reserved, in order.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// The sliding-window layers' ring pages (empty without such layers).
    pub fn ring_pages(&self) -> &[u32] {
        &self.ring_pages
    }

    fn upload_tables(&self) -> Result<()> {
        self.page_table.write_slice(0, &self.pages)?;
        self.ring_table.write_slice(0, &self.ring_pages)
    }

    /// Gives back the full-attention pages past those needed for `positions`.
    fn shrink_to(&mut self, positions: usize) {
        let keep = positions.div_ceil(self.pool.page_size);
        if keep < self.pages.len() {
            let gone = self.pages.split_off(keep);
            self.pool.full.release(&gone);
        }
    }

    /// A new sequence holding the same positions, sharing every page until
    /// one of the two writes into a shared one.
    ///
    /// # Errors
    /// Out of device memory for the new page tables.
    pub fn fork_paged(&self) -> Result<PagedKVCache> {
        let max_batch = (self.seq_base.size() / 4) as usize;
        let mut f = PagedKVCache::new(&self.pool, self.n_ctx, max_batch)?;
        self.pool.full.share(&self.pages);
        f.pages = self.pages.clone();
        if let Some((set, ..)) = &self.pool.ring {
            set.share(&self.ring_pages);
            f.ring_pages = self.ring_pages.clone();
        }
        f.len = self.len;
        self.pool.adjust(0, self.len as isize);
        f.upload_tables()?;
        Ok(f)
    }

    /// Takes the ring pages positions `len..end` write into: new ones where
    /// the ring has not reached yet, copies of those shared with a fork.
    /// Returns the copies to make (old, new) and the pages taken.
    fn ring_plan(&self, end: usize) -> Result<(Vec<(usize, u32)>, usize)> {
        let Some((set, rows, window)) = &self.pool.ring else {
            return Ok((Vec::new(), 0));
        };
        let ps = self.pool.page_size;
        if end - self.len > rows - window {
            return Err(ModelError::Internal(format!(
                "{} positions in one call; the ring holds {}",
                end - self.len,
                rows - window
            )));
        }
        let mut fresh = 0;
        let mut cow = Vec::new();
        // Ring slots written, in ring order; only slots already held can be shared.
        let mut slots: Vec<usize> = (self.len..end).map(|p| (p % rows) / ps).collect();
        slots.dedup();
        for k in slots {
            match self.ring_pages.get(k) {
                Some(&p) if set.shared(p) && !cow.iter().any(|c: &(usize, u32)| c.0 == k) => {
                    cow.push((k, p));
                }
                Some(_) => {}
                // Before the ring first wraps, slots are taken in order.
                None => fresh += 1,
            }
        }
        Ok((cow, fresh))
    }
}

impl KvAttention for PagedKVCache {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()> {
        self.pool.record(
            rec,
            il,
            io,
            Tables {
                full: &self.page_table,
                full_base: &self.seq_base,
                ring: &self.ring_table,
                ring_base: &self.seq_base,
                one_per_sequence: false,
            },
        )
    }
}

impl KVCache for PagedKVCache {
    fn kind(&self) -> CacheKind {
        CacheKind::Paged
    }

    fn len(&self) -> usize {
        self.len
    }

    fn max_call_tokens(&self) -> usize {
        match &self.pool.ring {
            Some((_, rows, window)) => rows - window,
            None => usize::MAX,
        }
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
        // The full-attention page position `len` falls in, if held and shared.
        let cow = if n > 0 && !self.len.is_multiple_of(ps) {
            let i = self.len / ps;
            self.pages
                .get(i)
                .copied()
                .filter(|&p| self.pool.full.shared(p))
                .map(|p| (i, p))
        } else {
            None
        };
        let (ring_cow, ring_fresh) = self.ring_plan(end)?;
        let mut fresh = self.pool.full.take(need + usize::from(cow.is_some()))?;
        let mut ring_new = match &self.pool.ring {
            Some((set, ..)) => match set.take(ring_fresh + ring_cow.len()) {
                Ok(p) => p,
                Err(e) => {
                    self.pool.full.release(&fresh);
                    return Err(e);
                }
            },
            None => Vec::new(),
        };
        // Copy shared pages before anything is written to them.
        let full_copy = cow.and_then(|(i, old)| fresh.pop().map(|new| (i, old, new)));
        let ring_copies: Vec<(usize, u32, u32)> = ring_cow
            .iter()
            .zip(ring_new.split_off(ring_new.len() - ring_cow.len()))
            .map(|(&(k, old), new)| (k, old, new))
            .collect();
        if full_copy.is_some() || !ring_copies.is_empty() {
            let copied = run_once(&self.pool.ctx, |rec| {
                if let Some((_, old, new)) = full_copy {
                    self.pool.full.record_copy(rec, old, new, self.len % ps)?;
                }
                if let Some((set, ..)) = &self.pool.ring {
                    for &(_, old, new) in &ring_copies {
                        set.record_copy(rec, old, new, ps)?;
                    }
                }
                Ok(())
            });
            if let Err(e) = copied {
                self.pool.full.release(&fresh);
                if let Some((_, _, new)) = full_copy {
                    self.pool.full.release(&[new]);
                }
                if let Some((set, ..)) = &self.pool.ring {
                    set.release(&ring_new);
                    let news: Vec<u32> = ring_copies.iter().map(|c| c.2).collect();
                    set.release(&news);
                }
                return Err(e);
            }
        }
        if let Some((i, old, new)) = full_copy {
            self.pages[i] = new;
            self.pool.full.release(&[old]);
        }
        if let Some((set, ..)) = &self.pool.ring {
            for (k, old, new) in ring_copies {
                self.ring_pages[k] = new;
                set.release(&[old]);
            }
        }
        self.pages.extend(fresh);
        self.ring_pages.extend(ring_new);
        self.pending = n;
        self.upload_tables()
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
        // The ring holds positions len - rows .. len - 1; the next query
        // (position n_keep) reads the window before it.
        let intact = match &self.pool.ring {
            Some((_, rows, window)) => (n_keep + 1).saturating_sub(*window) + rows >= self.len,
            None => true,
        };
        let keep = if intact { n_keep } else { 0 };
        self.pool.adjust(0, -((self.len - keep) as isize));
        self.len = keep;
        self.pending = 0;
        self.shrink_to(keep);
        if keep == 0
            && let Some((set, ..)) = &self.pool.ring
        {
            set.release(&self.ring_pages);
            self.ring_pages.clear();
        }
        self.upload_tables()?;
        Ok(keep)
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
        let ring = self.pool.ring.as_ref().map_or(0, |(set, ..)| {
            set.page_bytes() * self.ring_pages.len() as u64
        });
        self.pool.full.page_bytes() * self.pages.len() as u64 + ring
    }
}

impl Drop for PagedKVCache {
    fn drop(&mut self) {
        self.pool.full.release(&self.pages);
        if let Some((set, ..)) = &self.pool.ring {
            set.release(&self.ring_pages);
        }
        self.pool.adjust(-1, -(self.len as isize));
    }
}

/// The tokens of several sequences of one pool in one forward call: each
/// token reads its own sequence's pages through concatenations of their
/// page tables.
pub struct PagedBatchView<'a> {
    /// The pool all sequences draw on.
    pub pool: &'a PagePool,
    /// The full-attention page tables of all sequences, one after another.
    pub page_table: &'a Arc<Buffer>,
    /// Per token, where its sequence's table starts in `page_table`.
    pub seq_base: &'a Arc<Buffer>,
    /// The ring page tables of all sequences, one after another.
    pub ring_table: &'a Arc<Buffer>,
    /// Per token, where its sequence's ring table starts in `ring_table`.
    pub ring_base: &'a Arc<Buffer>,
    /// The context size of the sequences (one rope-scaling choice for all).
    pub n_ctx: usize,
    /// Every token is the only new one of its sequence (a decode step): the
    /// attention kernel may store the new K/V rows itself.
    pub one_per_sequence: bool,
}

impl KvAttention for PagedBatchView<'_> {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn record_attention(&self, rec: &mut Recording, il: usize, io: &AttentionIo<'_>) -> Result<()> {
        self.pool.record(
            rec,
            il,
            io,
            Tables {
                full: self.page_table,
                full_base: self.seq_base,
                ring: self.ring_table,
                ring_base: self.ring_base,
                one_per_sequence: self.one_per_sequence,
            },
        )
    }

    fn one_per_sequence(&self, n_tokens: usize) -> bool {
        self.one_per_sequence || n_tokens == 1
    }
}

/// Where a model's page pools live: one per page size, made by the first
/// paged cache that asks for it.
#[derive(Default)]
pub struct PoolRegistry {
    pools: Mutex<Vec<Arc<PagePool>>>,
}

impl PoolRegistry {
    /// The pool of `page_size`, created by `make` if there is none.
    ///
    /// # Errors
    /// From `make`.
    pub fn get_or_create(
        &self,
        page_size: usize,
        make: impl FnOnce() -> Result<Arc<PagePool>>,
    ) -> Result<Arc<PagePool>> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.iter().find(|p| p.page_size == page_size) {
            return Ok(p.clone());
        }
        let p = make()?;
        pools.push(p.clone());
        Ok(p)
    }
}
