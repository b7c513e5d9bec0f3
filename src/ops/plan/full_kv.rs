//! `FullKv`: keys and values every query of a call sees in full — the
//! non-causal attention of an encoder, and cross-attention over an
//! encoder's output. The attention kernels read causal caches through page
//! tables; a key set every query sees whole is such a cache of one page,
//! stored at positions `0..n_keys` and read by queries that all stand at
//! the last position ([`FullKvAddressing`]), so no kernel needs a mode of
//! its own.

use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind};
use crate::ops::kv_store::{CacheAddressing, LayerKv};

/// One attention layer's keys and values, f16 rows of `width`.
pub struct FullKv {
    /// Keys (and values) held.
    pub n_keys: usize,
    /// Floats per row (`n_head * head_dim`).
    pub width: usize,
    pub(super) k: Arc<Buffer>,
    pub(super) v: Arc<Buffer>,
}

impl FullKv {
    /// Device buffers for `n_keys` rows of `width`.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn new(ctx: &Arc<GpuContext>, n_keys: usize, width: usize, name: &str) -> Result<Self> {
        let bytes = (2 * n_keys.max(1) * width.max(1)) as u64;
        Ok(FullKv {
            n_keys,
            width,
            k: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("{name} k"))?,
            v: Buffer::new(ctx, bytes, MemoryKind::Device, &format!("{name} v"))?,
        })
    }

    /// Bytes of device memory.
    pub fn device_bytes(&self) -> u64 {
        self.k.size() + self.v.size()
    }

    /// The caches as the attention kernels take them, addressed by `at`.
    pub(super) fn layer<'a>(&'a self, at: CacheAddressing<'a>) -> LayerKv<'a> {
        LayerKv {
            k: &self.k,
            v: &self.v,
            at,
        }
    }
}

/// How a call's tokens address a [`FullKv`] of `n_keys` rows: positions
/// `0..n_keys` to store the rows, and `n_keys - 1` for every query. A
/// batched addressing ([`FullKvAddressing::batched`]) holds `n_seqs` such
/// key sets, one page each, token `i` of the call in set `i / n_keys`: the
/// encoder's attention over several images at once, each seeing its own.
pub struct FullKvAddressing {
    /// Rows of each key set addressed.
    pub n_keys: usize,
    /// Key sets (1 but for a batched addressing).
    pub n_seqs: usize,
    /// Most queries of one call.
    pub max_queries: usize,
    store_positions: Arc<Buffer>,
    attend_positions: Arc<Buffer>,
    page_table: Arc<Buffer>,
    seq_base: Arc<Buffer>,
}

impl FullKvAddressing {
    /// The addressing of `n_keys` rows for calls of up to `max_queries` queries.
    ///
    /// # Errors
    /// No keys, or out of host-visible memory.
    pub fn new(ctx: &Arc<GpuContext>, n_keys: usize, max_queries: usize) -> Result<Self> {
        Self::make(ctx, n_keys, 1, max_queries)
    }

    /// The addressing of `n_seqs` key sets of `n_keys` rows each, for calls
    /// of up to `n_keys · n_seqs` tokens (the keys of set `s` at rows
    /// `s · n_keys..` of a [`FullKv`] of `n_keys · n_seqs` rows).
    ///
    /// # Errors
    /// No keys or no sets, or out of host-visible memory.
    pub fn batched(ctx: &Arc<GpuContext>, n_keys: usize, n_seqs: usize) -> Result<Self> {
        if n_seqs == 0 {
            return Err(ModelError::invalid("full attention", "no key sets"));
        }
        Self::make(ctx, n_keys, n_seqs, n_keys * n_seqs)
    }

    fn make(
        ctx: &Arc<GpuContext>,
        n_keys: usize,
        n_seqs: usize,
        max_queries: usize,
    ) -> Result<Self> {
        if n_keys == 0 {
            return Err(ModelError::invalid("full attention", "no keys"));
        }
        let rows = max_queries.max(n_keys * n_seqs);
        let ints = |v: &[i32], name: &str| -> Result<Arc<Buffer>> {
            let b = Buffer::new(ctx, (4 * v.len()) as u64, MemoryKind::Upload, name)?;
            b.write_slice(0, v)?;
            Ok(b)
        };
        let too_many =
            || ModelError::invalid("full attention", format!("{n_seqs} x {n_keys} keys"));
        let last = i32::try_from(n_keys - 1).map_err(|_| too_many())?;
        let seqs = i32::try_from(n_seqs).map_err(|_| too_many())?;
        let store: Vec<i32> = (0..seqs).flat_map(|_| 0..=last).collect();
        // Queries past the sets (Whisper's decoder asks for more queries
        // than keys) belong to the first.
        let base: Vec<i32> = (0..rows)
            .map(|i| {
                if i < n_keys * n_seqs {
                    (i / n_keys) as i32
                } else {
                    0
                }
            })
            .collect();
        let pages: Vec<i32> = (0..seqs).collect();
        Ok(FullKvAddressing {
            n_keys,
            n_seqs,
            max_queries: rows,
            store_positions: ints(&store, "full kv store positions")?,
            attend_positions: ints(&vec![last; rows], "full kv query positions")?,
            page_table: ints(&pages, "full kv page table")?,
            seq_base: ints(&base, "full kv sequence base")?,
        })
    }

    /// Where rows `0..n_keys` are stored.
    pub(super) fn store(&self) -> CacheAddressing<'_> {
        CacheAddressing {
            positions: &self.store_positions,
            page_table: &self.page_table,
            seq_base: &self.seq_base,
            page_size: self.n_keys,
            ring: 0,
        }
    }

    /// What every query sees: all rows.
    pub(super) fn attend(&self) -> CacheAddressing<'_> {
        CacheAddressing {
            positions: &self.attend_positions,
            ..self.store()
        }
    }
}
