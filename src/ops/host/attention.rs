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
        let mut o = vec![0.0f32; self.pos.len() * qw];
        o.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
            let (t, h) = (i / shape.n_head, i % shape.n_head);
            let Some(s) = seqs.iter().find(|s| s.base == self.base[t]) else {
                return;
            };
            let q = &qs[t * qw + h * hd..t * qw + (h + 1) * hd];
            let col = (h / group) * hd;
            let (a, b) = (
                (self.first(t, opts.window) - s.lo) as usize,
                (self.pos[t] - s.lo) as usize,
            );
            let at = |c: usize| c * width + col..c * width + col + hd;
            let mut scores: Vec<f32> = (a..=b)
                .map(|c| {
                    let x = super::arch().dispatch(Dot(q, &s.k[at(c)])) * opts.scale;
                    if opts.softcap > 0.0 {
                        opts.softcap * (x / opts.softcap).tanh()
                    } else {
                        x
                    }
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum = super::math::exp_shifted(&mut scores, m);
            out.fill(0.0);
            super::arch().dispatch(WeightedSum {
                w: &scores,
                rows: (a..=b).map(|c| &s.v[at(c)]),
                out,
            });
            out.iter_mut().for_each(|a| *a /= sum);
        });
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

/// `a · b`, in eight lanes the target's SIMD vectorizes.
struct Dot<'a>(&'a [f32], &'a [f32]);

impl pulp::WithSimd for Dot<'_> {
    type Output = f32;
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> f32 {
        let Dot(a, b) = self;
        let mut acc = [0.0f32; 8];
        let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
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
        acc.iter().sum::<f32>() + tail
    }
}

/// `out += Σ w[i] · rows[i]`.
struct WeightedSum<'a, I> {
    w: &'a [f32],
    rows: I,
    out: &'a mut [f32],
}

impl<'a, I: Iterator<Item = &'a [f32]> + Clone> pulp::WithSimd for WeightedSum<'a, I> {
    type Output = ();
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let WeightedSum { w, rows, out } = self;
        // 64 outputs at a time in a fixed-size array the compiler keeps in
        // registers over all rows (a slice would be loaded and stored per row).
        for (c, chunk) in out.chunks_mut(64).enumerate() {
            let mut acc = [0.0f32; 64];
            let len = chunk.len();
            for (&p, r) in w.iter().zip(rows.clone()) {
                let r = &r[64 * c..64 * c + len];
                if len == 64 {
                    for l in 0..64 {
                        acc[l] += p * r[l];
                    }
                } else {
                    for (a, &v) in acc.iter_mut().zip(r) {
                        *a += p * v;
                    }
                }
            }
            for (o, a) in chunk.iter_mut().zip(&acc) {
                *o += a;
            }
        }
    }
}
