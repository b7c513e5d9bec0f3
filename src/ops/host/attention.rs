//! Attention on the host: the call's new K/V rows stored (f16) at the cache
//! rows their positions map to (the page-table walk of `kv_slot.glsl`),
//! then each query head over the keys its window sees, queries spread over
//! the cores. The cache pages a call reads are borrowed once, on the
//! recording's thread, and shared with the workers.

use std::collections::HashMap;
use std::sync::Arc;

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::Rows;
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, HostMem, HostStep, Recording};
use crate::ops::AnyMat;
use crate::ops::attention::{AttentionCall, AttentionOptions, AttentionShape, NewKv};

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

    /// The output rows (`n × n_head × head_dim`) of every query.
    fn attend(
        &self,
        mem: &HostMem,
        qs: &[f32],
        shape: AttentionShape,
        opts: AttentionOptions,
    ) -> Result<Vec<f32>> {
        let (hd, width) = (shape.head_dim, shape.n_head_kv * shape.head_dim);
        let ps = self.cache.page_size;
        // The pages the queries read, each borrowed once for all workers.
        let mut pages: Vec<usize> = Vec::new();
        let mut slots: Vec<Vec<usize>> = Vec::with_capacity(self.pos.len());
        for t in 0..self.pos.len() {
            let lo = self.first(t, opts.window);
            let s = (lo..=self.pos[t])
                .map(|j| self.slot(t, j))
                .collect::<Result<Vec<_>>>()?;
            pages.extend(s.iter().map(|&r| r / ps));
            slots.push(s);
        }
        pages.sort_unstable();
        pages.dedup();
        let mut held = Vec::with_capacity(pages.len());
        for &p in &pages {
            let range = p * ps * width..(p + 1) * ps * width;
            let k = mem.read::<f16>(&self.cache.k, range.clone())?;
            held.push((p, k, mem.read::<f16>(&self.cache.v, range)?));
        }
        let kv: HashMap<usize, (&[f16], &[f16])> = held
            .iter()
            .map(|(p, k, v)| (*p, (&k[..], &v[..])))
            .collect();
        let group = shape.n_head / shape.n_head_kv;
        let qw = shape.n_head * hd;
        let mut o = vec![0.0f32; self.pos.len() * qw];
        o.par_chunks_mut(hd).enumerate().for_each(|(i, out)| {
            let (t, h) = (i / shape.n_head, i % shape.n_head);
            let q = &qs[t * qw + h * hd..t * qw + (h + 1) * hd];
            let col = (h / group) * hd;
            // Row `slot` of K (`which` 0) or V, as f32.
            let row = |slot: usize, which: usize, buf: &mut [f32]| {
                let (k, v) = kv[&(slot / ps)];
                let r = (slot % ps) * width + col;
                let m = if which == 0 { k } else { v };
                m[r..r + hd].convert_to_f32_slice(buf);
            };
            let mut buf = vec![0.0f32; hd];
            let scores: Vec<f32> = slots[t]
                .iter()
                .map(|&s| {
                    row(s, 0, &mut buf);
                    let d: f32 = q.iter().zip(&buf).map(|(a, b)| a * b).sum();
                    let x = d * opts.scale;
                    if opts.softcap > 0.0 {
                        opts.softcap * (x / opts.softcap).tanh()
                    } else {
                        x
                    }
                })
                .collect();
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            out.fill(0.0);
            for (&s, &slot) in scores.iter().zip(&slots[t]) {
                let w = (s - m).exp();
                sum += w;
                row(slot, 1, &mut buf);
                for (a, &v) in out.iter_mut().zip(&buf) {
                    *a += w * v;
                }
            }
            out.iter_mut().for_each(|a| *a /= sum);
        });
        Ok(o)
    }
}
