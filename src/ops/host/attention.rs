//! Attention on the host: the call's new K/V rows stored (f16) at the cache
//! rows their positions map to (the page-table walk of `kv_slot.glsl`),
//! then each query head over the keys its window sees, queries spread over
//! the cores. The cache pages a call reads are borrowed once, on the
//! recording's thread, and shared with the workers.

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use super::Rows;
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, HostMem, HostRef, HostStep, Recording};
use crate::ops::AnyMat;
use crate::ops::attention::{AttentionCall, AttentionOptions, AttentionShape, NewKv};
use crate::ops::kv_store::KvStoreCall;

/// The cache side of a call, as a host step holds it.
struct Cache {
    k: Arc<Buffer>,
    v: Arc<Buffer>,
    positions: Arc<Buffer>,
    page_table: Arc<Buffer>,
    seq_base: Arc<Buffer>,
    page_size: usize,
    ring: usize,
}

impl Cache {
    /// The cache row of position `j` of the sequence whose table starts at `base`.
    fn slot(&self, table: &[i32], base: i32, j: i32) -> Result<usize> {
        let mut pj = j as usize;
        if self.ring > 0 {
            pj %= self.ring;
        }
        let entry = usize::try_from(base).ok().map(|b| b + pj / self.page_size);
        let page = entry
            .and_then(|e| table.get(e))
            .and_then(|&p| usize::try_from(p).ok())
            .ok_or_else(|| ModelError::Internal(format!("position {j} outside its page table")))?;
        Ok(page * self.page_size + pj % self.page_size)
    }
}

/// Records the store of the call's new rows and its attention.
///
/// # Errors
/// As the Vulkan family's checks, and an f16 output (which only batched
/// decode on GPUs asks for).
pub(super) fn record(rec: &mut Recording, call: &AttentionCall<'_>) -> Result<()> {
    call.check()?;
    let AnyMat::F32(out) = call.out else {
        return Err(ModelError::kernel("host attention", "f16 output"));
    };
    let new = match call.new {
        NewKv::Stored => None,
        NewKv::Store(r) | NewKv::StoreInKernel(r) => Some((Rows::of(&r.k), Rows::of(&r.v))),
    };
    let at = call.kv.at;
    let cache = Cache {
        k: call.kv.k.clone(),
        v: call.kv.v.clone(),
        positions: at.positions.clone(),
        page_table: at.page_table.clone(),
        seq_base: at.seq_base.clone(),
        page_size: at.page_size.max(1),
        ring: at.ring,
    };
    let (q, out, shape, opts) = (Rows::of(&call.q), Rows::of(&out), call.shape, call.opts);
    rec.host(HostStep::new("attention", move |mem| {
        let n = q.rows;
        let pos = mem.read::<i32>(&cache.positions, 0..n)?.to_vec();
        let base = mem.read::<i32>(&cache.seq_base, 0..n)?.to_vec();
        let table = mem.read_all::<i32>(&cache.page_table)?.to_vec();
        let seqs = Seqs {
            cache: &cache,
            table: &table,
            pos: &pos,
            base: &base,
        };
        if let Some((k, v)) = &new {
            seqs.store(mem, shape.n_head_kv * shape.head_dim, k, v)?;
        }
        let o = seqs.attend(mem, &q.to_vec(mem)?, shape, opts)?;
        let mut d = out.write::<f32>(mem)?;
        let qw = shape.n_head * shape.head_dim;
        for t in 0..n {
            out.row_mut(&mut d, t)
                .copy_from_slice(&o[t * qw..(t + 1) * qw]);
        }
        Ok(())
    }))
}

/// Records the store of new K or V rows alone (f16, at the rows their
/// positions map to), as the Vulkan `kv_store` kernel does.
///
/// # Errors
/// An odd width, a view outside its buffer.
pub(super) fn record_kv_store(rec: &mut Recording, call: &KvStoreCall<'_>) -> Result<()> {
    let (src, at) = (call.src, call.at);
    if !src.cols.is_multiple_of(2) {
        return Err(ModelError::invalid(
            "kv width",
            format!("{} is odd", src.cols),
        ));
    }
    src.check("kv_store source")?;
    let cache = Cache {
        k: call.cache.clone(),
        v: call.cache.clone(),
        positions: at.positions.clone(),
        page_table: at.page_table.clone(),
        seq_base: at.seq_base.clone(),
        page_size: at.page_size.max(1),
        ring: at.ring,
    };
    let rows = Rows::of(&src);
    rec.host(HostStep::new("kv_store", move |mem| {
        let n = rows.rows;
        let pos = mem.read::<i32>(&cache.positions, 0..n)?.to_vec();
        let base = mem.read::<i32>(&cache.seq_base, 0..n)?.to_vec();
        let table = mem.read_all::<i32>(&cache.page_table)?.to_vec();
        let width = rows.cols;
        let xs = rows.to_vec(mem)?;
        for (t, row) in xs.chunks_exact(width.max(1)).enumerate() {
            let slot = cache.slot(&table, base[t], pos[t])?;
            let mut d = mem.write::<u16>(&cache.k, slot * width..(slot + 1) * width)?;
            for (o, &x) in d.iter_mut().zip(row) {
                *o = f16::from_f32(x).to_bits();
            }
        }
        Ok(())
    }))
}

/// The tokens of one call: each one's position and where its sequence's
/// page table starts.
struct Seqs<'a> {
    cache: &'a Cache,
    table: &'a [i32],
    pos: &'a [i32],
    base: &'a [i32],
}

impl Seqs<'_> {
    /// The cache row of position `j` of token `t`'s sequence.
    fn slot(&self, t: usize, j: i32) -> Result<usize> {
        self.cache.slot(self.table, self.base[t], j)
    }

    /// The first position token `t` sees.
    fn first(&self, t: usize, window: usize) -> i32 {
        match window {
            0 => 0,
            w => (self.pos[t] - w as i32 + 1).max(0),
        }
    }

    /// Writes each token's new K and V rows, rounded to f16.
    fn store(&self, mem: &HostMem, width: usize, k: &Rows, v: &Rows) -> Result<()> {
        for (src, dst) in [(k, &self.cache.k), (v, &self.cache.v)] {
            let rows = src.to_vec(mem)?;
            for (t, row) in rows.chunks_exact(width).enumerate() {
                let slot = self.slot(t, self.pos[t])?;
                let mut d = mem.write::<u16>(dst, slot * width..(slot + 1) * width)?;
                for (o, &x) in d.iter_mut().zip(row) {
                    *o = f16::from_f32(x).to_bits();
                }
            }
        }
        Ok(())
    }

    /// The tokens of the call by sequence, each sequence's cache rows
    /// converted to f32 once for all its queries and heads.
    fn gather(&self, mem: &HostMem, width: usize, window: usize) -> Result<Vec<Keys>> {
        let ps = self.cache.page_size;
        let mut seqs: Vec<Keys> = Vec::new();
        for t in 0..self.pos.len() {
            match seqs.iter_mut().find(|s| s.base == self.base[t]) {
                Some(s) => {
                    s.lo = s.lo.min(self.first(t, window));
                    s.hi = s.hi.max(self.pos[t]);
                }
                None => seqs.push(Keys {
                    base: self.base[t],
                    lo: self.first(t, window),
                    hi: self.pos[t],
                    k: Vec::new(),
                    v: Vec::new(),
                }),
            }
        }
        for s in &mut seqs {
            let n = (s.hi - s.lo + 1).max(0) as usize;
            s.k = vec![0.0; n * width];
            s.v = vec![0.0; n * width];
            // One page borrowed at a time: consecutive positions share it.
            let mut held: Option<(usize, HostRef<'_, f16>, HostRef<'_, f16>)> = None;
            for (c, j) in (s.lo..=s.hi).enumerate() {
                let slot = self.cache.slot(self.table, s.base, j)?;
                let page = slot / ps;
                if held.as_ref().is_none_or(|h| h.0 != page) {
                    let range = page * ps * width..(page + 1) * ps * width;
                    let k = mem.read::<f16>(&self.cache.k, range.clone())?;
                    held = Some((page, k, mem.read::<f16>(&self.cache.v, range)?));
                }
                if let Some((_, k, v)) = &held {
                    let r = (slot % ps) * width..(slot % ps + 1) * width;
                    super::widen_halves_simd(&k[r.clone()], &mut s.k[c * width..(c + 1) * width]);
                    super::widen_halves_simd(&v[r], &mut s.v[c * width..(c + 1) * width]);
                }
            }
        }
        Ok(seqs)
    }

    /// The output rows (`n × n_head × head_dim`) of every query.
    fn attend(
        &self,
        mem: &HostMem,
        qs: &[f32],
        shape: AttentionShape,
        opts: AttentionOptions,
    ) -> Result<Vec<f32>> {
        let (hd, width) = (shape.head_dim, shape.n_head_kv * shape.head_dim);
        let seqs = self.gather(mem, width, opts.window)?;
        let group = shape.n_head / shape.n_head_kv;
        let qw = shape.n_head * hd;
        let n = self.pos.len();
        // Runs of up to QUERY_BLOCK tokens of one sequence that see the same
        // keys (an encoder's positions, cross-attention queries) share each
        // key and value row they load: a block reads the keys from cache
        // once for all its queries instead of once per query.
        let mut blocks = Vec::new();
        let mut t = 0;
        while t < n {
            let key = |u: usize| (self.base[u], self.first(u, opts.window), self.pos[u]);
            let mut len = 1;
            while len < QUERY_BLOCK && t + len < n && key(t + len) == key(t) {
                len += 1;
            }
            blocks.push((t, len));
            t += len;
        }
        let parts: Vec<Vec<f32>> = (0..blocks.len() * shape.n_head)
            .into_par_iter()
            .map(|i| {
                let ((t0, len), h) = (blocks[i / shape.n_head], i % shape.n_head);
                let mut out = vec![0.0f32; len * hd];
                let Some(s) = seqs.iter().find(|s| s.base == self.base[t0]) else {
                    return out;
                };
                let (a, b) = (self.first(t0, opts.window) - s.lo, self.pos[t0] - s.lo);
                if a < 0 || b < a {
                    return out;
                }
                let (a, nk) = (a as usize, (b - a + 1) as usize);
                let q: Vec<&[f32]> = (t0..t0 + len)
                    .map(|t| &qs[t * qw + h * hd..t * qw + (h + 1) * hd])
                    .collect();
                let rows = KeyRows {
                    width,
                    col: (h / group) * hd,
                    first: a,
                    n: nk,
                    hd,
                };
                let mut scores = vec![0.0f32; len * nk];
                super::arch().dispatch(BlockScores {
                    q: &q,
                    k: &s.k,
                    rows,
                    out: &mut scores,
                });
                let mut sums = Vec::with_capacity(len);
                for row in scores.chunks_exact_mut(nk) {
                    for x in row.iter_mut() {
                        *x *= opts.scale;
                        if opts.softcap > 0.0 {
                            *x = opts.softcap * (*x / opts.softcap).tanh();
                        }
                    }
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    sums.push(super::math::exp_shifted(row, m));
                }
                super::arch().dispatch(BlockSum {
                    p: &scores,
                    v: &s.v,
                    rows,
                    out: &mut out,
                });
                for (o, sum) in out.chunks_exact_mut(hd).zip(sums) {
                    o.iter_mut().for_each(|x| *x /= sum);
                }
                out
            })
            .collect();
        let mut o = vec![0.0f32; n * qw];
        for (i, part) in parts.iter().enumerate() {
            let ((t0, _), h) = (blocks[i / shape.n_head], i % shape.n_head);
            for (r, src) in part.chunks_exact(hd).enumerate() {
                let at = (t0 + r) * qw + h * hd;
                o[at..at + hd].copy_from_slice(src);
            }
        }
        Ok(o)
    }
}

/// One sequence's cache rows for positions `lo..=hi`, as f32
/// (`(hi - lo + 1) × width`, K and V).
struct Keys {
    base: i32,
    lo: i32,
    hi: i32,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// Most queries of one block.
const QUERY_BLOCK: usize = 8;

/// Where a head's key (or value) rows lie in a sequence's gathered rows.
#[derive(Clone, Copy)]
struct KeyRows {
    /// Floats per gathered row.
    width: usize,
    /// The head's first column.
    col: usize,
    /// First row.
    first: usize,
    /// Rows.
    n: usize,
    /// Floats per head.
    hd: usize,
}

impl KeyRows {
    fn row<'a>(&self, m: &'a [f32], j: usize) -> &'a [f32] {
        let at = (self.first + j) * self.width + self.col;
        &m[at..at + self.hd]
    }
}

/// `out[r * n + j] = q[r] · k[j]` for a block of queries, each key row
/// loaded once for all of them.
struct BlockScores<'a> {
    q: &'a [&'a [f32]],
    k: &'a [f32],
    rows: KeyRows,
    out: &'a mut [f32],
}

impl pulp::WithSimd for BlockScores<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let BlockScores { q, k, rows, out } = self;
        for j in 0..rows.n {
            let kj = rows.row(k, j);
            for (r, qr) in q.iter().enumerate() {
                let mut acc = [0.0f32; 8];
                let (ca, cb) = (qr.chunks_exact(8), kj.chunks_exact(8));
                let tail: f32 = ca
                    .remainder()
                    .iter()
                    .zip(cb.remainder())
                    .map(|(x, y)| x * y)
                    .sum();
                for (x, y) in ca.zip(cb) {
                    for l in 0..8 {
                        acc[l] += x[l] * y[l];
                    }
                }
                out[r * rows.n + j] = acc.iter().sum::<f32>() + tail;
            }
        }
    }
}

/// `out[r] += Σ_j p[r * n + j] · v[j]` for a block of queries, each value
/// row loaded once for all of them.
struct BlockSum<'a> {
    p: &'a [f32],
    v: &'a [f32],
    rows: KeyRows,
    out: &'a mut [f32],
}

impl pulp::WithSimd for BlockSum<'_> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let BlockSum { p, v, rows, out } = self;
        for j in 0..rows.n {
            let vj = rows.row(v, j);
            for (r, o) in out.chunks_exact_mut(rows.hd).enumerate() {
                let w = p[r * rows.n + j];
                for (a, &x) in o.iter_mut().zip(vj) {
                    *a += w * x;
                }
            }
        }
    }
}
