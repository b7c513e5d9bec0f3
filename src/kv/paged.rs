//! `PagedKVCache` (vLLM / MLC style): every sequence of a model keeps its K/V
//! rows in fixed-size pages taken from one shared [`PagePool`], found through
//! the sequence's page table. Pages are taken on demand, given back on rewind
//! and drop, and shared between forks: a page written while another sequence
//! still references it is copied first (copy-on-write), which in practice
//! only happens to the partially filled last page of a forked prompt.
//!
//! Sliding-window layers keep rings of pages (see [`PagePool`]). Sequences
//! of one pool can be evaluated in one forward
//! pass ([`PagedBatchView`]): the attention kernels read each token's keys
//! through its own sequence's tables.

use std::sync::Arc;

use super::pool::{PagePool, PageStats, Tables};
use super::{CacheKind, KVCache, KvAttention, LayerCall, LayerKv};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, MemoryKind, run_once};

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

    fn layer_kv<'a>(&'a self, call: LayerCall<'a>) -> Result<LayerKv<'a>> {
        let t = Tables {
            full: &self.page_table,
            full_base: &self.seq_base,
            ring: &self.ring_table,
            ring_base: &self.seq_base,
        };
        self.pool.layer_kv(call, t)
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

    fn layer_kv<'a>(&'a self, call: LayerCall<'a>) -> Result<LayerKv<'a>> {
        let t = Tables {
            full: self.page_table,
            full_base: self.seq_base,
            ring: self.ring_table,
            ring_base: self.ring_base,
        };
        self.pool.layer_kv(call, t)
    }

    fn one_per_sequence(&self, n_tokens: usize) -> bool {
        self.one_per_sequence || n_tokens == 1
    }
}
