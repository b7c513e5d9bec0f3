//! `topk`: the k largest logits of each row with their indices, best first,
//! so a sampler reads k candidates per sequence from the device instead of
//! the whole vocabulary (`glsl/topk.comp`). Order: larger value first, the
//! lower index first among equal values (-0 counts as +0); NaN is never a
//! candidate; a row with fewer than k candidates ends its list with
//! [`TOP_K_NONE`] entries.

use std::sync::Arc;

use super::params::TopKParams;
use super::{Mat, pc_u32, room};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, Recording};

/// Most candidates one row may ask for.
pub const MAX_TOP_K: usize = 256;
/// Invocations per workgroup of the first pass.
const WG: usize = 128;
/// Invocations per workgroup of the merge.
const MERGE_WG: usize = 256;
/// Values per invocation of the first pass.
const PER: usize = 32;
/// Lists per invocation of the merge.
const OWN: usize = 16;
/// Values one workgroup of the first pass takes.
pub const TOP_K_CHUNK: usize = WG * PER;
/// Candidates a sampling step selects are rounded up to a multiple of this
/// (fewer recorded steps; more candidates than a sampler needs are as exact).
pub const TOP_K_STEP: usize = 16;
/// The index of an entry past a row's last candidate.
pub const TOP_K_NONE: u32 = u32::MAX;

/// The candidates a step selects for samplers needing `k`: 1 (greedy) as
/// is, more rounded up to a multiple of [`TOP_K_STEP`] (capped at
/// [`MAX_TOP_K`]); `None` past it.
pub fn top_k_bucket(k: usize) -> Option<usize> {
    match k {
        0 | 1 => Some(1),
        k if k <= MAX_TOP_K => Some(k.next_multiple_of(TOP_K_STEP).min(MAX_TOP_K)),
        _ => None,
    }
}

/// Lists a first-pass workgroup writes: one per subgroup the device may form.
fn lists_per_chunk(ctx: &GpuContext) -> usize {
    WG / (ctx.caps().min_subgroup_size.max(4) as usize).min(WG)
}

/// The top-k of every row of `logits` into `out`.
#[derive(Clone, Copy, Debug)]
pub struct TopKCall<'a> {
    /// The rows, f32.
    pub logits: Mat<'a>,
    /// Candidates per row, 1..=[`MAX_TOP_K`].
    pub k: usize,
    /// Room for the first pass's lists ([`top_k_scratch_bytes`]).
    pub scratch: &'a Arc<Buffer>,
    /// `[rows, k]` entries of (value bits, index) as two u32.
    pub out: &'a Arc<Buffer>,
}

/// Chunks (first-pass workgroups) per row of `width` values.
pub fn top_k_chunks(width: usize) -> usize {
    width.div_ceil(TOP_K_CHUNK).max(1)
}

/// Bytes of the first pass's lists for `rows` rows of `width` values on `ctx`.
pub fn top_k_scratch_bytes(ctx: &GpuContext, rows: usize, width: usize, k: usize) -> u64 {
    (rows * top_k_chunks(width) * lists_per_chunk(ctx) * k * 8) as u64
}

impl TopKCall<'_> {
    /// Checks k, the views and the buffers' sizes.
    ///
    /// # Errors
    /// k out of range, a view outside its buffer, buffers too small, or a
    /// row with more lists than one merge workgroup takes.
    pub fn check(&self) -> Result<()> {
        if self.k == 0 || self.k > MAX_TOP_K {
            return Err(ModelError::invalid(
                "k",
                format!("{} is outside 1..={MAX_TOP_K}", self.k),
            ));
        }
        self.logits.check("top-k rows")?;
        let rows = self.logits.rows;
        let ctx = self.out.context();
        let lists = top_k_chunks(self.logits.cols) * lists_per_chunk(ctx);
        if lists > MERGE_WG * OWN {
            return Err(ModelError::invalid(
                "top-k rows",
                format!(
                    "{} values per row (at most {})",
                    self.logits.cols,
                    MERGE_WG * OWN / lists_per_chunk(ctx) * TOP_K_CHUNK
                ),
            ));
        }
        room(self.out, (rows * self.k * 8) as u64)?;
        room(
            self.scratch,
            top_k_scratch_bytes(ctx, rows, self.logits.cols, self.k),
        )
    }
}

/// Records the top-k of every row: the first pass over chunks of the rows
/// (a list per subgroup), then a merge per row.
///
/// # Errors
/// As [`TopKCall::check`]; values beyond 32 bits.
pub fn record_top_k(rec: &mut Recording, call: &TopKCall<'_>) -> Result<()> {
    call.check()?;
    let x = call.logits;
    if x.rows == 0 {
        return Ok(());
    }
    let chunks = top_k_chunks(x.cols);
    let nsub = lists_per_chunk(call.out.context());
    let params = TopKParams {
        n_rows: pc_u32("rows", x.rows)?,
        width: pc_u32("width", x.cols)?,
        ld: pc_u32("ld", x.ld)?,
        offset: pc_u32("offset", x.offset)?,
        k: pc_u32("k", call.k)?,
        chunk: pc_u32("chunk", TOP_K_CHUNK)?,
    };
    rec.dispatch(
        Kernel::TopkF32,
        &[WG as u32, PER as u32, nsub as u32, OWN as u32],
        &[
            Binding::read(x.buf),
            // The first pass reads no lists: any buffer serves the binding.
            Binding::read(x.buf),
            Binding::write(call.scratch),
        ],
        bytemuck::bytes_of(&params),
        [chunks as u32, params.n_rows, 1],
    )?;
    let merge = TopKParams {
        width: pc_u32("lists", chunks * nsub)?,
        ..params
    };
    rec.dispatch(
        Kernel::TopkMerge,
        &[MERGE_WG as u32, PER as u32, nsub as u32, OWN as u32],
        &[
            Binding::read(x.buf),
            Binding::read(call.scratch),
            Binding::write(call.out),
        ],
        bytemuck::bytes_of(&merge),
        [params.n_rows, 1, 1],
    )
}

/// The order the kernel ranks values by: `a` before `b`.
pub fn ranks_before(a: (u32, f32), b: (u32, f32)) -> bool {
    match a.1.partial_cmp(&b.1) {
        Some(std::cmp::Ordering::Greater) => true,
        Some(std::cmp::Ordering::Equal) => a.0 < b.0,
        _ => false,
    }
}

/// Reference top-k of one row: `(index, value)` best first, NaN left out,
/// at most `k` entries.
pub fn top_k_ref(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let order = |a: &(u32, f32), b: &(u32, f32)| {
        b.1.partial_cmp(&a.1)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(&b.0))
    };
    let mut c: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if k == 0 {
        return Vec::new();
    }
    if k < c.len() {
        c.select_nth_unstable_by(k - 1, order);
        c.truncate(k);
    }
    c.sort_by(order);
    c
}

/// An entry of [`top_k_host`]'s heap, ordered worst first: the smaller
/// value, then the larger index.
#[derive(Clone, Copy, PartialEq)]
struct Worst(f32, u32);

impl Eq for Worst {}

impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Worst {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // NaN never enters the heap.
        other
            .0
            .partial_cmp(&self.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(self.1.cmp(&other.1))
    }
}

/// [`top_k_ref`] in one pass over the row with a heap of k entries: for
/// k much smaller than the row (a sampler's top-k of a vocabulary), most
/// values cost one comparison with the k-th best so far.
pub fn top_k_host(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let mut heap = std::collections::BinaryHeap::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if heap.len() < k {
            heap.push(Worst(v, i as u32));
        } else if let Some(mut worst) = heap.peek_mut() {
            // Indices grow: an equal value later in the row ranks behind.
            if v > worst.0 {
                *worst = Worst(v, i as u32);
            }
        }
    }
    heap.into_sorted_vec()
        .into_iter()
        .map(|w| (w.1, w.0))
        .collect()
}

/// Writes `list` as `k` output entries (two u32 each), empty ones after it.
pub fn encode_top_k(list: &[(u32, f32)], k: usize, out: &mut [u32]) {
    for (j, e) in out.chunks_exact_mut(2).take(k).enumerate() {
        match list.get(j) {
            Some(&(i, v)) => {
                e[0] = v.to_bits();
                e[1] = i;
            }
            None => {
                e[0] = f32::NAN.to_bits();
                e[1] = TOP_K_NONE;
            }
        }
    }
}

/// Decodes `k` output entries of one row (as the kernel writes them, two
/// u32 each) into `(index, value)` pairs, stopping at the first empty one.
pub fn decode_top_k(words: &[u32]) -> Vec<(u32, f32)> {
    words
        .chunks_exact(2)
        .take_while(|e| e[1] != TOP_K_NONE)
        .map(|e| (e[1], f32::from_bits(e[0])))
        .collect()
}
