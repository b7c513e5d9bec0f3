//! `attention`: causal (optionally sliding-window, optionally soft-capped)
//! grouped-query attention over an f16 KV cache read through a page table,
//! with an online softmax so the score matrix is never stored; the decode
//! kernel can also store the call's new K/V rows itself, and split each
//! head's keys over several workgroups where few heads would leave a GPU
//! idle (flash-decoding, [`KeySplit`]). Numerics follow
//! llama.cpp's `ggml_soft_max_ext` over `scale * q·k` (with `ggml_tanh`
//! soft-capping).

use std::sync::Arc;

use super::kv_store::{KvStoreCall, LayerKv, record_kv_store};
use super::params::AttentionParams;
use super::{AnyMat, Mat, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, MemoryKind, Recording, groups_1d};

/// Head geometry of an attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: usize,
    /// KV heads (divides `n_head`).
    pub n_head_kv: usize,
    /// Floats per head (even, at most 256).
    pub head_dim: usize,
}

/// Largest head dimension the kernels support.
pub const MAX_HEAD_DIM: usize = 256;
const ATTN_WG: u32 = 64;
/// Workgroup of the decode kernel (`attention.comp`).
const DECODE_WG: u32 = 128;
/// Keys each key group of the decode kernel loads per iteration: the
/// loads of a group's keys are independent, one round trip for several.
const DECODE_KEYS_IN_FLIGHT: u32 = 2;

/// The kernel an attention call runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionVariant {
    /// A workgroup per (token, head), its key groups each walking a share of
    /// the keys, merged through shared memory (`attention.comp`).
    Tiled,
    /// A few invocations per query walking the keys together (`attention_rows.comp`).
    Rows,
    /// Blocks of queries walking tiles of keys staged in shared memory
    /// (`attention_blocks.comp`): prompts on GPUs.
    Blocks,
    /// Blocks of queries on cooperative matrices (`attention_coop.comp`):
    /// prompts and encoders on GPUs that have them. Queries and
    /// probabilities enter the products as f16.
    Coop,
}

impl AttentionVariant {
    /// The variant combs picks: everywhere on CPU devices rows (uniform key
    /// loads); on GPUs with cooperative matrices the cooperative kernel for
    /// prompts, blocks on other GPUs; tiled for decode and for prompts whose rows layout
    /// would give the GPU fewer than two workgroups per SM or so — on the
    /// H200, 512 tokens of SmolLM2's 9 heads: 122 µs tiled, 335 µs rows;
    /// of Llama-1B's 32: 401 and 367 µs (`combs kernel-bench --attention 512`).
    pub fn choose(ctx: &crate::gpu::GpuContext, n_tokens: usize, shape: AttentionShape) -> Self {
        if super::is_cpu(ctx) {
            return AttentionVariant::Rows;
        }
        if n_tokens > 1 && coop_layout(ctx, shape.head_dim).is_some() {
            return AttentionVariant::Coop;
        }
        if n_tokens > 1 && blocks_split(ctx, shape.head_dim).is_some() {
            return AttentionVariant::Blocks;
        }
        let per_wg = (ATTN_WG / rows_split(ctx, shape.head_dim)) as usize;
        if n_tokens == 1 || n_tokens.div_ceil(per_wg) * shape.n_head < 256 {
            AttentionVariant::Tiled
        } else {
            AttentionVariant::Rows
        }
    }
}

/// Invocations per query for the rows variant: enough that each holds at most
/// 32 dimensions on GPUs (registers), one on CPU devices or where the subgroup
/// size is not fixed.
fn rows_split(ctx: &crate::gpu::GpuContext, head_dim: usize) -> u32 {
    let sg = kernel_subgroup(ctx);
    if sg <= 1 || super::is_cpu(ctx) {
        return 1;
    }
    let mut ds = 1u32;
    while head_dim / (ds as usize) > 32
        && (head_dim / (2 * ds as usize)).is_multiple_of(2)
        && 2 * ds <= sg
    {
        ds *= 2;
    }
    ds
}

/// Workgroup of the prompt kernel (`attention_blocks.comp`).
const BLOCKS_WG: u32 = 128;

/// (invocations per query, keys per tile) of the prompt kernel: 16
/// dimensions per invocation where the subgroup allows (32 otherwise), so a
/// query's scores for a tile stay in registers; `None` where no split fits
/// (a subgroup size the driver may change, odd dimensions per invocation,
/// or more than 32 per invocation: a 256-wide head on subgroups of 4), and
/// [`AttentionVariant::choose`] then takes another kernel.
pub fn blocks_split(ctx: &crate::gpu::GpuContext, head_dim: usize) -> Option<(u32, u32)> {
    let sg = kernel_subgroup(ctx) as usize;
    if sg <= 1 {
        return None;
    }
    let mut qt = 1usize;
    while head_dim / qt > 16 && 2 * qt <= sg.min(BLOCKS_WG as usize) {
        qt *= 2;
    }
    let dpl = head_dim / qt;
    if !head_dim.is_multiple_of(qt) || !dpl.is_multiple_of(2) || dpl > 32 {
        return None;
    }
    let bc = if head_dim > 128 { 16 } else { 32 };
    Some((qt as u32, bc))
}

/// (subgroups of 16 queries, keys per tile) of a workgroup of the
/// cooperative-matrix kernel: the most subgroups (up to four), then the
/// widest tile (64 or 32 keys), whose shared memory fits the device (the
/// staged keys and values, and per subgroup its scores or output rows and
/// its probabilities); `None` where the device has no 16×16×16 f16
/// cooperative matrices with subgroups of 32 or the head dimension is not
/// a multiple of 16.
pub fn coop_layout(ctx: &crate::gpu::GpuContext, head_dim: usize) -> Option<(u32, u32)> {
    if !super::linear::LinearVariant::coop_available(ctx) || !head_dim.is_multiple_of(16) {
        return None;
    }
    let d = head_dim;
    // Each subgroup's float area holds a tile's scores or 64 columns of
    // its output (`SF` of the kernel).
    let shared = |nsg: usize, bc: usize| {
        2 * bc * (d + 8) * 2 + nsg * 16 * (bc.max(d.min(64)) * 4 + bc * 2 + 4) + 16 * nsg * 8
    };
    let limit = ctx.caps().max_shared_memory as usize;
    [(4usize, 64usize), (4, 32), (2, 64), (2, 32), (1, 32)]
        .into_iter()
        .find(|&(nsg, bc)| shared(nsg, bc) <= limit)
        .map(|(nsg, bc)| (nsg as u32, bc as u32))
}

/// (workgroup size, invocations per key group) of the decode kernel: about 16
/// dimensions per invocation, so a key group reads a key row in wide pieces
/// and the workgroup walks 128 / (head_dim / 16) keys at a time; the
/// workgroup shrinks where a key group must hold whole heads (subgroup size
/// not fixed), to bound the shared memory of the final merge (16 KiB).
fn keys_split(ctx: &crate::gpu::GpuContext, head_dim: usize) -> (u32, u32) {
    let sg = kernel_subgroup(ctx).max(1);
    let mut ds = 1u32;
    while head_dim / (ds as usize) > 16
        && (head_dim / (2 * ds as usize)).is_multiple_of(2)
        && 2 * ds <= sg
    {
        ds *= 2;
    }
    let dpl = (head_dim / ds as usize).max(1) as u32;
    let wg = (4096 / dpl)
        .clamp(ds, DECODE_WG)
        .next_power_of_two()
        .min(DECODE_WG);
    (wg.max(ds), ds)
}

/// Threads of the decode kernel one SM keeps resident, for the workgroup
/// choice: its ~80 registers per invocation leave room for about six
/// workgroups of 128 on an NVIDIA SM of 64K registers.
const DECODE_THREADS_PER_SM: usize = 768;

/// (workgroup size, invocations per key group) of an unsplit decode call
/// of `pairs` (token, head) pairs whose tokens see at most `max_keys` keys:
/// the default workgroup (`keys_split`) or a half or quarter of it
/// (never below the subgroup), whichever `decode_workgroup_cost` finds
/// cheapest on this device. Many pairs of few keys (a batch of short
/// sessions) leave a workgroup of 128 mostly idle, walking a handful of keys
/// each, in several waves: on the H200 a step of 64 sequences of the 1B
/// over 16–48 keys spent 0.35 ms in attention with workgroups of 128 and
/// 0.21 ms with 32. Long contexts keep the wide workgroups, which keep more
/// keys in flight. The default where the device's SM count or the keys are
/// not known.
pub fn decode_workgroup(
    ctx: &GpuContext,
    head_dim: usize,
    pairs: usize,
    max_keys: Option<usize>,
) -> (u32, u32) {
    let (wg0, ds) = keys_split(ctx, head_dim);
    let (Some(keys), Some(sms)) = (max_keys, ctx.caps().sm_count) else {
        return (wg0, ds);
    };
    if super::is_cpu(ctx) {
        return (wg0, ds);
    }
    let floor = ds.max(kernel_subgroup(ctx));
    let capacity = sms as usize * DECODE_THREADS_PER_SM;
    (
        pick_decode_workgroup(wg0, ds, floor, pairs, keys, capacity),
        ds,
    )
}

/// The cheapest of `wg0`, `wg0 / 2` and `wg0 / 4` (none below `floor`) by
/// [`decode_workgroup_cost`]; the larger one on a tie.
fn pick_decode_workgroup(
    wg0: u32,
    ds: u32,
    floor: u32,
    pairs: usize,
    keys: usize,
    capacity: usize,
) -> u32 {
    let mut best = (wg0, decode_workgroup_cost(wg0, ds, pairs, keys, capacity));
    for wg in [wg0 / 2, wg0 / 4] {
        if wg < floor.max(1) {
            break;
        }
        let cost = decode_workgroup_cost(wg, ds, pairs, keys, capacity);
        if cost < best.1 {
            best = (wg, cost);
        }
    }
    best.0
}

/// Cost of an unsplit decode call on workgroups of `wg` in units of a key
/// iteration's latency: waves of resident workgroups (`capacity` threads
/// at a time) times each workgroup's iterations over `keys`, plus two for
/// what a workgroup does besides (the query's load, the merge).
fn decode_workgroup_cost(wg: u32, ds: u32, pairs: usize, keys: usize, capacity: usize) -> usize {
    let waves = (pairs * wg as usize).div_ceil(capacity.max(1));
    let per_iteration = ((wg / ds.max(1)) * DECODE_KEYS_IN_FLIGHT) as usize;
    waves * (keys.div_ceil(per_iteration.max(1)) + 2)
}

/// Most workgroups one (token, head) of the decode kernel is split over:
/// the split that finishes last reads every other split's partial, so more
/// splits than this cost more in the merge than they save in the walk.
pub const MAX_KEY_SPLITS: usize = 64;

/// Workgroups the split decode kernel aims to give the device: two per SM
/// where the driver says how many there are, otherwise 256 (two per SM of a
/// typical large discrete GPU).
fn split_target(ctx: &GpuContext) -> usize {
    ctx.caps().sm_count.map_or(256, |n| 2 * n as usize)
}

/// Workgroups each (token, head) of a decode call is split over: enough
/// that `pairs` (token, head) pairs fill the device
/// (`split_target`), no more than `max_keys` keys (where the caller
/// knows them) make whole iterations of the kernel's workgroup, and at most
/// [`MAX_KEY_SPLITS`]. One (the kernel without splits) on CPU devices,
/// where workgroups do not run side by side in numbers, and where the
/// pairs fill the device already.
pub fn key_splits(
    ctx: &GpuContext,
    pairs: usize,
    head_dim: usize,
    max_keys: Option<usize>,
) -> usize {
    if super::is_cpu(ctx) || pairs == 0 {
        return 1;
    }
    let mut n = split_target(ctx) / pairs;
    if let Some(keys) = max_keys {
        n = n.min(keys.div_ceil(keys_per_iteration(ctx, head_dim)));
    }
    n.clamp(1, MAX_KEY_SPLITS)
}

/// Keys one iteration of the decode kernel's workgroup covers: the chunk a
/// split's keys are rounded to.
fn keys_per_iteration(ctx: &GpuContext, head_dim: usize) -> usize {
    let (wg, ds) = keys_split(ctx, head_dim);
    ((wg / ds) * DECODE_KEYS_IN_FLIGHT) as usize
}

/// What the split decode kernel needs beyond a call's operands, owned by
/// whoever records the calls (the planner's workspace): each split's
/// partial softmax, and per (token, head) a count of the splits done, zero
/// between dispatches (the last split sets it back). Clones share the
/// buffers; calls sharing them must be ordered, as the calls of one
/// recording are.
#[derive(Clone, Debug)]
pub struct AttentionScratch {
    /// One u32 per (token, head), zero-filled at creation.
    counters: Arc<Buffer>,
    /// `head_dim + 2` floats per (token, head, split).
    partials: Arc<Buffer>,
}

impl AttentionScratch {
    /// Scratch for calls of up to `triples` (token, head, split) workgroups
    /// of heads of up to `head_dim` floats.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn new(ctx: &Arc<GpuContext>, triples: usize, head_dim: usize) -> Result<Self> {
        let triples = triples.max(1);
        Ok(AttentionScratch {
            // Zero: the kernel counts from what it finds.
            counters: Buffer::zeroed(
                ctx,
                4 * triples as u64,
                MemoryKind::Device,
                "attention split counters",
            )?,
            partials: Buffer::new(
                ctx,
                (4 * triples * (head_dim + 2)) as u64,
                MemoryKind::Device,
                "attention split partials",
            )?,
        })
    }

    /// Scratch for every decode call [`key_splits`] may split on this
    /// device, heads of up to `head_dim` floats: the splits it picks never
    /// make more workgroups than its target; a 4-byte stub on CPU devices,
    /// where it picks none.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn for_decode(ctx: &Arc<GpuContext>, head_dim: usize) -> Result<Self> {
        if super::is_cpu(ctx) {
            return Self::new(ctx, 1, 0);
        }
        Self::new(ctx, split_target(ctx), head_dim)
    }

    /// Whether a call of `pairs` (token, head) pairs of `head_dim` floats
    /// split `n` ways fits.
    fn holds(&self, pairs: usize, n: usize, head_dim: usize) -> bool {
        pairs * 4 <= self.counters.size() as usize
            && pairs * n * (head_dim + 2) * 4 <= self.partials.size() as usize
    }
}

/// The keys of each (token, head) of a decode call split over several
/// workgroups whose partial softmaxes the last one merges (flash-decoding).
#[derive(Clone, Copy, Debug)]
pub struct KeySplit<'a> {
    /// Partials and counters.
    pub scratch: &'a AttentionScratch,
    /// Workgroups per (token, head) (at most [`MAX_KEY_SPLITS`]); `None`:
    /// [`key_splits`] picks them for the device, as the scratch allows.
    pub n: Option<usize>,
    /// Most keys a token of the call may see (the cache's capacity, or the
    /// window), where known: no more splits than that needs, and the
    /// workgroup of an unsplit call ([`decode_workgroup`]).
    pub max_keys: Option<usize>,
    /// Workgroup size of an unsplit call (a power of two between the
    /// kernel's key-group width and its default); `None`: combs' choice.
    pub wg: Option<u32>,
}

/// Options of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttentionOptions {
    /// Multiplier of q·k (usually 1/√head_dim).
    pub scale: f32,
    /// Soft-cap (0: none).
    pub softcap: f32,
    /// Sliding window (0: full causal).
    pub window: usize,
}

/// The new K and V rows of a call (f32, one row of `n_head_kv × head_dim`
/// per token).
#[derive(Clone, Copy, Debug)]
pub struct NewRows<'a> {
    /// Keys, roped.
    pub k: Mat<'a>,
    /// Values.
    pub v: Mat<'a>,
}

/// What happens to the call's new K/V rows.
#[derive(Clone, Copy, Debug)]
pub enum NewKv<'a> {
    /// The cache holds them already.
    Stored,
    /// `kv_store` writes them first (two dispatches before the attention).
    Store(NewRows<'a>),
    /// The decode kernel stores them itself: every token of the call must
    /// be the only new one of its sequence (decode, batched decode); the
    /// caller guarantees it.
    StoreInKernel(NewRows<'a>),
}

/// The attention of the queries of a call over everything each one's
/// sequence holds up to its position.
#[derive(Clone, Copy, Debug)]
pub struct AttentionCall<'a> {
    /// Queries, roped: one row of `n_head × head_dim` per token.
    pub q: Mat<'a>,
    /// The result, of `q`'s shape; f16 only from the decode kernel storing
    /// the new rows ([`NewKv::StoreInKernel`]).
    pub out: AnyMat<'a>,
    /// The layer's caches.
    pub kv: LayerKv<'a>,
    /// The new rows.
    pub new: NewKv<'a>,
    /// Head geometry.
    pub shape: AttentionShape,
    /// Scale, soft-cap and window.
    pub opts: AttentionOptions,
    /// The kernel, instead of the one [`AttentionVariant::choose`] picks
    /// (tests, tuning); storing in the kernel takes `Tiled`.
    pub variant: Option<AttentionVariant>,
    /// Where the tiled decode kernel may split each (token, head)'s keys
    /// over several workgroups; `None`: one workgroup each.
    pub split: Option<KeySplit<'a>>,
}

impl AttentionCall<'_> {
    /// Checks the head geometry and the operands' shapes.
    pub(crate) fn check(&self) -> Result<()> {
        let s = self.shape;
        if !s.head_dim.is_multiple_of(2)
            || s.head_dim > MAX_HEAD_DIM
            || s.n_head_kv == 0
            || !s.n_head.is_multiple_of(s.n_head_kv)
        {
            return Err(ModelError::invalid(
                "attention shape",
                format!(
                    "{} heads, {} KV heads, head dim {} (need an even head dim <= {MAX_HEAD_DIM} \
                     and KV heads dividing heads)",
                    s.n_head, s.n_head_kv, s.head_dim
                ),
            ));
        }
        let (qw, kvw, n) = (s.n_head * s.head_dim, s.n_head_kv * s.head_dim, self.q.rows);
        let bad = |what: &str, rows: usize, cols: usize, want: usize| {
            Err(ModelError::Shape {
                tensor: format!("attention {what}"),
                expected: vec![n as u64, want as u64],
                got: vec![rows as u64, cols as u64],
            })
        };
        if self.q.cols != qw {
            return bad("queries", n, self.q.cols, qw);
        }
        if self.out.rows() != n || self.out.cols() != qw {
            return bad("output", self.out.rows(), self.out.cols(), qw);
        }
        self.q.check("attention queries")?;
        self.out.check("attention output")?;
        if let NewKv::Store(r) | NewKv::StoreInKernel(r) = self.new {
            for m in [r.k, r.v] {
                if m.rows != n || m.cols != kvw {
                    return bad("new rows", m.rows, m.cols, kvw);
                }
                m.check("attention new rows")?;
            }
        }
        Ok(())
    }
}

/// Records the attention (and, as `call.new` says, the store of the new rows).
///
/// # Errors
/// Head geometry the kernels do not support, operands of the wrong shape,
/// an f16 output or a store in a kernel that cannot do it, a key split the
/// kernel or the scratch cannot take, or a value beyond 32 bits.
pub fn record_attention(rec: &mut Recording, call: &AttentionCall<'_>) -> Result<()> {
    call.check()?;
    let n_tokens = call.q.rows;
    let variant = match (call.variant, call.new) {
        (Some(v), _) => v,
        (None, NewKv::StoreInKernel(_)) => AttentionVariant::Tiled,
        (None, _) => AttentionVariant::choose(rec.context(), n_tokens, call.shape),
    };
    let n_split = key_split_count(rec.context(), call, variant)?;
    let in_kernel = match call.new {
        NewKv::StoreInKernel(r) => {
            if variant != AttentionVariant::Tiled || r.k.ld != r.v.ld {
                return Err(ModelError::kernel(
                    "attention",
                    format!(
                        "{variant:?} attention cannot store new rows (strides {} and {})",
                        r.k.ld, r.v.ld
                    ),
                ));
            }
            Some(r)
        }
        NewKv::Store(r) => {
            for (src, cache) in [(r.k, call.kv.k), (r.v, call.kv.v)] {
                let at = call.kv.at;
                record_kv_store(rec, &KvStoreCall { src, cache, at })?;
            }
            None
        }
        NewKv::Stored => None,
    };
    if call.out.dtype() == super::DType::F16
        && in_kernel.is_none()
        && variant != AttentionVariant::Coop
    {
        return Err(ModelError::kernel(
            "attention",
            "f16 output: only the decode kernel storing the new rows and the \
             cooperative-matrix kernel write it",
        ));
    }
    let (o_offset, _, _, ld_o) = call.out.layout();
    let (shape, at) = (call.shape, call.kv.at);
    let params = AttentionParams {
        n_tokens: pc_u32("n_tokens", n_tokens)?,
        n_head: pc_u32("n_head", shape.n_head)?,
        n_head_kv: pc_u32("n_head_kv", shape.n_head_kv)?,
        head_dim: pc_u32("head_dim", shape.head_dim)?,
        ld_q: pc_u32("ld_q", call.q.ld)?,
        q_offset: pc_u32("q_offset", call.q.offset)?,
        ld_o: pc_u32("ld_o", ld_o)?,
        o_offset: pc_u32("o_offset", o_offset)?,
        scale: call.opts.scale,
        softcap: call.opts.softcap,
        window: pc_u32("window", call.opts.window)?,
        page_size: pc_u32("page_size", at.page_size)?,
        ring: pc_u32("ring", at.ring)?,
        flags: if in_kernel.is_some() {
            AttentionParams::STORE_NEW
        } else {
            0
        },
        ld_new: pc_u32("ld_new", in_kernel.map_or(0, |n| n.k.ld))?,
        k_new: pc_u32("k_new", in_kernel.map_or(0, |n| n.k.offset))?,
        v_new: pc_u32("v_new", in_kernel.map_or(0, |n| n.v.offset))?,
    };
    let ctx = rec.context().clone();
    let (kernel, spec, groups) = match variant {
        AttentionVariant::Tiled => {
            let (wg, ds) = if n_split > 1 {
                keys_split(&ctx, shape.head_dim)
            } else {
                unsplit_workgroup(&ctx, call)?
            };
            let mut spec = vec![
                wg,
                kernel_subgroup(&ctx),
                ds,
                (shape.head_dim / ds as usize) as u32,
                DECODE_KEYS_IN_FLIGHT,
            ];
            let kernel = match (call.out, n_split > 1) {
                (AnyMat::F16(_), false) => Kernel::AttentionF16F16,
                (AnyMat::F32(_), false) => Kernel::AttentionF16F32,
                (AnyMat::F16(_), true) => Kernel::AttentionSplitF16F16,
                (AnyMat::F32(_), true) => Kernel::AttentionSplitF16F32,
            };
            if n_split > 1 {
                spec.push(n_split as u32);
            }
            let groups = n_tokens * shape.n_head * n_split;
            (
                kernel,
                spec,
                groups_1d(&ctx, pc_u32("attention groups", groups)?),
            )
        }
        AttentionVariant::Blocks => {
            let (qt, bc) = blocks_split(&ctx, shape.head_dim).ok_or_else(|| {
                ModelError::kernel(
                    "attention_blocks",
                    format!(
                        "no query-block layout for head dim {} on this device",
                        shape.head_dim
                    ),
                )
            })?;
            let per_wg = (BLOCKS_WG / qt) as usize;
            (
                Kernel::AttentionBlocksF16F32,
                vec![
                    BLOCKS_WG,
                    kernel_subgroup(&ctx),
                    qt,
                    (shape.head_dim / qt as usize) as u32,
                    bc,
                ],
                [
                    pc_u32("attention groups", n_tokens.div_ceil(per_wg))?,
                    pc_u32("heads", shape.n_head)?,
                    1,
                ],
            )
        }
        AttentionVariant::Coop => {
            let (nsg, bc) = coop_layout(&ctx, shape.head_dim).ok_or_else(|| {
                ModelError::kernel(
                    "attention_coop",
                    format!(
                        "no cooperative-matrix layout for head dim {} on this device",
                        shape.head_dim
                    ),
                )
            })?;
            let kernel = match call.out {
                AnyMat::F16(_) => Kernel::AttentionCoopF16F16,
                AnyMat::F32(_) => Kernel::AttentionCoopF16F32,
            };
            (
                kernel,
                vec![32 * nsg, nsg, shape.head_dim as u32, bc],
                [
                    pc_u32("attention groups", n_tokens.div_ceil(16 * nsg as usize))?,
                    pc_u32("heads", shape.n_head)?,
                    1,
                ],
            )
        }
        AttentionVariant::Rows => {
            let ds = rows_split(&ctx, shape.head_dim);
            let per_wg = (ATTN_WG / ds) as usize;
            (
                Kernel::AttentionRowsF16F32,
                vec![
                    ATTN_WG,
                    kernel_subgroup(&ctx),
                    ds,
                    (shape.head_dim / ds as usize) as u32,
                ],
                [
                    pc_u32("attention groups", n_tokens.div_ceil(per_wg))?,
                    pc_u32("heads", shape.n_head)?,
                    1,
                ],
            )
        }
    };
    let (k_cache, v_cache) = (call.kv.k, call.kv.v);
    let cache = |b| {
        if in_kernel.is_some() {
            Binding::write(b)
        } else {
            Binding::read(b)
        }
    };
    let mut bindings = vec![
        Binding::read(call.q.buf),
        cache(k_cache),
        cache(v_cache),
        Binding::write(call.out.buf()),
        Binding::read(at.positions),
        Binding::read(at.page_table),
        Binding::read(at.seq_base),
        Binding::read(in_kernel.map_or(call.q.buf, |n| n.k.buf)),
        Binding::read(in_kernel.map_or(call.q.buf, |n| n.v.buf)),
    ];
    if let Some(split) = call.split.filter(|_| n_split > 1) {
        bindings.push(Binding::write(&split.scratch.counters));
        bindings.push(Binding::write(&split.scratch.partials));
    }
    rec.dispatch(
        kernel,
        &spec,
        &bindings,
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// (workgroup size, invocations per key group) of `call` unsplit: its
/// [`KeySplit`]'s forced size, or [`decode_workgroup`]'s choice.
///
/// # Errors
/// A forced size that is not a power of two between the key-group width
/// and the default workgroup.
fn unsplit_workgroup(ctx: &GpuContext, call: &AttentionCall<'_>) -> Result<(u32, u32)> {
    let (hd, pairs) = (call.shape.head_dim, call.q.rows * call.shape.n_head);
    let Some(split) = call.split else {
        return Ok(keys_split(ctx, hd));
    };
    match split.wg {
        None => Ok(decode_workgroup(ctx, hd, pairs, split.max_keys)),
        Some(wg) => {
            let (wg0, ds) = keys_split(ctx, hd);
            if !wg.is_power_of_two() || wg < ds || wg > wg0 {
                return Err(ModelError::kernel(
                    "attention",
                    format!("a decode workgroup of {wg} (a power of two from {ds} to {wg0})"),
                ));
            }
            Ok((wg, ds))
        }
    }
}

/// Workgroups per (token, head) of `call` on `variant`: its
/// [`KeySplit`]'s count, or the device's choice cut to what the scratch
/// holds; 1 without a split or on another variant.
///
/// # Errors
/// A count forced on a variant other than `Tiled`, above
/// [`MAX_KEY_SPLITS`], or beyond the scratch.
fn key_split_count(
    ctx: &GpuContext,
    call: &AttentionCall<'_>,
    variant: AttentionVariant,
) -> Result<usize> {
    let Some(split) = call.split else {
        return Ok(1);
    };
    let (pairs, hd) = (call.q.rows * call.shape.n_head, call.shape.head_dim);
    match split.n {
        None if variant != AttentionVariant::Tiled => Ok(1),
        None => {
            let mut n = key_splits(ctx, pairs, hd, split.max_keys);
            while n > 1 && !split.scratch.holds(pairs, n, hd) {
                n -= 1;
            }
            Ok(n)
        }
        Some(0 | 1) => Ok(1),
        Some(n) => {
            if variant != AttentionVariant::Tiled
                || n > MAX_KEY_SPLITS
                || !split.scratch.holds(pairs, n, hd)
            {
                return Err(ModelError::kernel(
                    "attention",
                    format!(
                        "{n} key splits of {pairs} (token, head) pairs on {variant:?} attention \
                         (only Tiled splits, at most {MAX_KEY_SPLITS}, as far as the scratch holds)"
                    ),
                ));
            }
            Ok(n)
        }
    }
}

/// Reference attention of one query head over keys/values given per position
/// (`keys[j]`, `values[j]` for positions `0..=pos`), in f64.
pub fn attention_ref(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    pos: usize,
    opts: AttentionOptions,
) -> Vec<f32> {
    let lo = if opts.window > 0 {
        (pos + 1).saturating_sub(opts.window)
    } else {
        0
    };
    let scores: Vec<f64> = (lo..=pos)
        .map(|j| {
            let mut s: f64 = q
                .iter()
                .zip(keys[j])
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum::<f64>()
                * f64::from(opts.scale);
            if opts.softcap > 0.0 {
                let c = f64::from(opts.softcap);
                s = c * (s / c).tanh();
            }
            s
        })
        .collect();
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    let hd = values[0].len();
    (0..hd)
        .map(|d| {
            (lo..=pos)
                .zip(&e)
                .map(|(j, w)| w * f64::from(values[j][d]))
                .sum::<f64>()
                / sum
        })
        .map(|v| v as f32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // The H200's 132 SMs; the 1B's heads (64 wide, key groups of 4).
    const CAPACITY: usize = 132 * DECODE_THREADS_PER_SM;

    #[test]
    fn short_sessions_in_numbers_take_narrow_workgroups() {
        // 64 sequences × 32 heads over at most 49 keys: one wave of 32.
        assert_eq!(pick_decode_workgroup(128, 4, 32, 64 * 32, 49, CAPACITY), 32);
        assert_eq!(
            pick_decode_workgroup(128, 4, 32, 256 * 32, 49, CAPACITY),
            32
        );
    }

    #[test]
    fn long_contexts_and_few_pairs_keep_the_default() {
        // The same batch over 2000 keys: the wide workgroups keep more
        // keys in flight.
        assert_eq!(
            pick_decode_workgroup(128, 4, 32, 64 * 32, 2000, CAPACITY),
            128
        );
        // One sequence: every workgroup resident at once either way.
        assert_eq!(pick_decode_workgroup(128, 4, 32, 32, 64, CAPACITY), 128);
        // Nothing below the floor (a subgroup of 64).
        assert_eq!(pick_decode_workgroup(128, 4, 64, 64 * 32, 49, CAPACITY), 64);
    }

    #[test]
    fn cost_counts_waves_and_iterations() {
        // 2048 pairs × 128 threads over 101376 resident: 3 waves; 64 keys
        // per iteration: 1 iteration for 49 keys, plus 2.
        assert_eq!(decode_workgroup_cost(128, 4, 2048, 49, CAPACITY), 9);
        // × 32: one wave, 16 keys per iteration: 4 iterations, plus 2.
        assert_eq!(decode_workgroup_cost(32, 4, 2048, 49, CAPACITY), 6);
    }
}
