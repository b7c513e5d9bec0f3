//! `ContiguousKVCache`: one sequence, `n_ctx` f16 rows of `n_head_kv ×
//! head_dim` per layer for K and for V. Sliding-window layers keep a ring of
//! `window + max_batch` rows instead, when that is smaller.

use std::sync::Arc;

use super::{CacheKind, KVCache, KvAttention, LayerCall, LayerGeometry, LayerKv};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, run_once};
use crate::ops::kv_store::CacheAddressing;

struct LayerCache {
    k: Arc<Buffer>,
    v: Arc<Buffer>,
    rows: usize,
    ring: usize,
}

/// A contiguous KV cache for one sequence.
pub struct ContiguousKVCache {
    ctx: Arc<GpuContext>,
    geometry: Vec<LayerGeometry>,
    max_batch: usize,
    layers: Vec<LayerCache>,
    n_ctx: usize,
    len: usize,
    pending: usize,
    /// One page covering the whole cache: page 0.
    page_table: Arc<Buffer>,
    /// Per token, index 0 into `page_table` (sized for the largest batch).
    seq_base: Arc<Buffer>,
}

impl ContiguousKVCache {
    /// Allocates the cache for `layers` (one geometry per layer) and `n_ctx` positions.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn new(
        ctx: &Arc<GpuContext>,
        layers: &[LayerGeometry],
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<Self> {
        let max_batch = max_batch.max(1);
        let mut out = Vec::with_capacity(layers.len());
        for (il, g) in layers.iter().enumerate() {
            let ring_rows = g.window + max_batch;
            let (rows, ring) = if g.window > 0 && ring_rows < n_ctx {
                (ring_rows, ring_rows)
            } else {
                (n_ctx, 0)
            };
            let bytes = (rows * g.n_head_kv * g.head_dim * 2) as u64;
            let k = Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("cache_k.{il}"))?;
            let v = Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("cache_v.{il}"))?;
            out.push(LayerCache { k, v, rows, ring });
        }
        let page_table = Buffer::new(ctx, 4, MemoryKind::Upload, "page table")?;
        page_table.write_slice(0, &[0i32])?;
        let seq_base = Buffer::new(ctx, 4 * max_batch as u64, MemoryKind::Upload, "seq base")?;
        seq_base.write_slice(0, &vec![0i32; max_batch])?;
        Ok(ContiguousKVCache {
            ctx: ctx.clone(),
            geometry: layers.to_vec(),
            max_batch,
            layers: out,
            n_ctx,
            len: 0,
            pending: 0,
            page_table,
            seq_base,
        })
    }

    fn check_len(&self, n_keep: usize) -> Result<()> {
        if n_keep > self.len {
            return Err(ModelError::invalid(
                "n_keep",
                format!("{n_keep} is past the {} positions held", self.len),
            ));
        }
        Ok(())
    }
}

impl KvAttention for ContiguousKVCache {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn layer_kv<'a>(&'a self, call: LayerCall<'a>) -> Result<LayerKv<'a>> {
        let LayerCall {
            il,
            n_tokens,
            positions,
        } = call;
        let layer = self
            .layers
            .get(il)
            .ok_or_else(|| ModelError::Internal(format!("cache has no layer {il}")))?;
        if n_tokens * 4 > self.seq_base.size() as usize {
            return Err(ModelError::Internal(format!(
                "{n_tokens} tokens in one call, cache sized for {}",
                self.seq_base.size() / 4
            )));
        }
        Ok(LayerKv {
            k: &layer.k,
            v: &layer.v,
            at: CacheAddressing {
                positions,
                page_table: &self.page_table,
                seq_base: &self.seq_base,
                page_size: layer.rows,
                ring: layer.ring,
            },
        })
    }
}

impl KVCache for ContiguousKVCache {
    fn kind(&self) -> CacheKind {
        CacheKind::Contiguous
    }

    fn len(&self) -> usize {
        self.len
    }

    fn max_call_tokens(&self) -> usize {
        self.max_batch
    }

    fn reserve(&mut self, n: usize) -> Result<()> {
        if self.len + n > self.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx,
                requested: self.len + n,
            });
        }
        self.pending = n;
        Ok(())
    }

    fn commit(&mut self, n: usize) {
        self.len = (self.len + n.min(self.pending)).min(self.n_ctx);
        self.pending = 0;
    }

    fn truncate(&mut self, n_keep: usize) -> Result<usize> {
        self.check_len(n_keep)?;
        // A ring of `ring` rows holds positions len - ring .. len - 1; the
        // next query (position n_keep) reads the window before it.
        let intact = self.layers.iter().zip(&self.geometry).all(|(l, g)| {
            l.ring == 0 || (n_keep + 1).saturating_sub(g.window) + l.ring >= self.len
        });
        self.len = if intact { n_keep } else { 0 };
        self.pending = 0;
        Ok(self.len)
    }

    fn fork(&self) -> Result<Box<dyn KVCache>> {
        let mut f = ContiguousKVCache::new(&self.ctx, &self.geometry, self.n_ctx, self.max_batch)?;
        run_once(&self.ctx, |rec| {
            for (src, dst) in self.layers.iter().zip(&f.layers) {
                // A ring holds its window anywhere in its rows; a plain cache the first `len`.
                let rows = if src.ring > 0 { src.rows } else { self.len };
                let bytes = src.k.size() / src.rows as u64 * rows as u64;
                if bytes > 0 {
                    rec.copy(&src.k, 0, &dst.k, 0, bytes)?;
                    rec.copy(&src.v, 0, &dst.v, 0, bytes)?;
                }
            }
            Ok(())
        })?;
        f.len = self.len;
        Ok(Box::new(f))
    }

    fn device_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.k.size() + l.v.size()).sum()
    }
}
