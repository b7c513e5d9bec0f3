//! `PagePool`: the KV pages shared by the paged caches of one model. One
//! page index names the same rows in the K and V buffers of every
//! full-attention layer, so a sequence has a single page table for them.
//! Sliding-window layers (Gemma 3's local layers, Mistral) keep only their
//! window: they draw on a second set of pages, and each sequence uses a ring
//! of `ring_rows / page_size` of them, position `j` living in ring row
//! `j mod ring_rows`. Pages are counted by reference so forks share them.

use std::sync::{Arc, Mutex, MutexGuard};

use super::{LayerCall, LayerGeometry, LayerKv};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording};
use crate::ops::kv_store::CacheAddressing;

/// Most positions one sequence adds in one forward call on a pool with
/// sliding-window layers (their rings hold the window plus this many rows).
pub const MAX_CALL_TOKENS: usize = 512;

/// What a pool holds and how much of it is in use.
///
/// ```
/// # use combs::formats::gguf::GgufFile;
/// # use combs::models::synth::{SynthConfig, synth_gguf};
/// # use combs::quant::QuantType;
/// use combs::gpu::GpuContext;
/// use combs::{CacheConfig, GenerativeModel, LoadOptions, ModelRegistry, PageStats};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
///     let cfg = CacheConfig { pool_pages: 8, ..CacheConfig::paged(64, 16) };
///     let mut cache = model.create_kv_cache(&cfg)?;
///     model.prefill(&model.embed(&[1; 20])?, cache.as_mut())?;
///     let stats: PageStats = cache.page_stats().unwrap_or_default();
///     assert_eq!((stats.pages_total, stats.pages_used, stats.tokens), (8, 2, 20));
///     Ok(())
/// }
/// ```
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
pub(super) struct PageSet {
    name: &'static str,
    page_size: usize,
    pub(super) n_pages: usize,
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
                k: Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("{name} k.{i}"))?,
                v: Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("{name} v.{i}"))?,
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
    pub(super) fn page_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| 2 * l.row * self.page_size as u64)
            .sum()
    }

    fn used(&self) -> usize {
        self.n_pages - self.lock().free.len()
    }

    /// Takes `n` free pages, all or none.
    pub(super) fn take(&self, n: usize) -> Result<Vec<u32>> {
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
    pub(super) fn release(&self, pages: &[u32]) {
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
    pub(super) fn share(&self, pages: &[u32]) {
        let mut st = self.lock();
        for &p in pages {
            st.refs[p as usize] += 1;
        }
    }

    pub(super) fn shared(&self, page: u32) -> bool {
        self.lock().refs[page as usize] > 1
    }

    /// Records copies of the first `rows` rows of page `src` to page `dst` in every layer.
    pub(super) fn record_copy(
        &self,
        rec: &mut Recording,
        src: u32,
        dst: u32,
        rows: usize,
    ) -> Result<()> {
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
    pub(super) ctx: Arc<GpuContext>,
    pub(super) page_size: usize,
    slots: Vec<Slot>,
    pub(super) full: PageSet,
    /// The sliding-window layers' pages, with the ring size and the window.
    pub(super) ring: Option<(PageSet, usize, usize)>,
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

    pub(super) fn adjust(&self, sequences: isize, tokens: isize) {
        let mut c = self.counters();
        c.0 = c.0.saturating_add_signed(sequences);
        c.1 = c.1.saturating_add_signed(tokens);
    }

    /// The caches of `call`'s layer for its tokens, each reading its sequence's pages through the tables of `t`.
    pub(super) fn layer_kv<'a>(
        &'a self,
        call: LayerCall<'a>,
        t: Tables<'a>,
    ) -> Result<LayerKv<'a>> {
        let LayerCall {
            il,
            n_tokens,
            positions,
        } = call;
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
        if n_tokens * 4 > seq_base.size() as usize {
            return Err(ModelError::Internal(format!(
                "{n_tokens} tokens in one call, sequence table sized for {}",
                seq_base.size() / 4
            )));
        }
        Ok(LayerKv {
            k: &layer.k,
            v: &layer.v,
            at: CacheAddressing {
                positions,
                page_table,
                seq_base,
                page_size: self.page_size,
                ring,
            },
        })
    }
}

/// The device tables one attention call reads: page tables of the full and
/// the ring layers, and per token where its sequence's table starts in each.
#[derive(Clone, Copy)]
pub(super) struct Tables<'a> {
    pub(super) full: &'a Arc<Buffer>,
    pub(super) full_base: &'a Arc<Buffer>,
    pub(super) ring: &'a Arc<Buffer>,
    pub(super) ring_base: &'a Arc<Buffer>,
}
