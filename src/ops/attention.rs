//! `attention` and `kv_store`: causal (optionally sliding-window, optionally
//! soft-capped) grouped-query attention over an f16 KV cache read through a
//! page table, with an online softmax so the score matrix is never stored;
//! and the store of new K/V rows into that cache. Numerics follow llama.cpp's
//! `ggml_soft_max_ext` over `scale * q·k` (with `ggml_tanh` soft-capping).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{ELEMENTWISE_WG, View, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};

/// Push constants of `glsl/attention.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct AttentionParams {
    /// Query tokens.
    pub n_tokens: u32,
    /// Query heads.
    pub n_head: u32,
    /// KV heads.
    pub n_head_kv: u32,
    /// Floats per head.
    pub head_dim: u32,
    /// Floats between tokens of q.
    pub ld_q: u32,
    /// Float index of q's token 0.
    pub q_offset: u32,
    /// Floats between tokens of o.
    pub ld_o: u32,
    /// Float index of o's token 0.
    pub o_offset: u32,
    /// Multiplier of q·k.
    pub scale: f32,
    /// Soft-cap of the scores (0: none).
    pub softcap: f32,
    /// Sliding window in positions (0: full).
    pub window: u32,
    /// Cache rows per page.
    pub page_size: u32,
    /// Ring size of a window-only cache (0: none).
    pub ring: u32,
    /// 1: the decode kernel also stores the new K/V rows (see [`NewRows`]).
    pub flags: u32,
    /// Floats between tokens of the new K and V rows.
    pub ld_new: u32,
    /// Float index of token 0's new K row.
    pub k_new: u32,
    /// Float index of token 0's new V row.
    pub v_new: u32,
}
const _: () = assert!(std::mem::size_of::<AttentionParams>() == 68);

/// Push constants of `glsl/kv_store.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct KvStoreParams {
    /// Tokens.
    pub n_tokens: u32,
    /// Floats per token row.
    pub width: u32,
    /// Floats between tokens of the source.
    pub ld: u32,
    /// Float index of the source's token 0.
    pub offset: u32,
    /// Cache rows per page.
    pub page_size: u32,
    /// Ring size (0: none).
    pub ring: u32,
}
const _: () = assert!(std::mem::size_of::<KvStoreParams>() == 24);

/// Where one layer's K or V cache rows live and how positions map to them.
#[derive(Clone, Copy)]
pub struct CacheAddressing<'a> {
    /// Token positions, one i32 per query token.
    pub positions: &'a Arc<Buffer>,
    /// Page tables of all sequences, i32 page indices.
    pub page_table: &'a Arc<Buffer>,
    /// Per query token, the index in `page_table` where its sequence's table starts.
    pub seq_base: &'a Arc<Buffer>,
    /// Cache rows per page.
    pub page_size: usize,
    /// Ring size of a window-only cache, 0 otherwise.
    pub ring: usize,
}

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
}

impl AttentionVariant {
    /// The variant combs picks: everywhere on CPU devices rows (uniform key
    /// loads); on GPUs tiled for decode and for prompts whose rows layout
    /// would give the GPU fewer than two workgroups per SM or so — on the
    /// H200, 512 tokens of SmolLM2's 9 heads: 122 µs tiled, 335 µs rows;
    /// of Llama-1B's 32: 401 and 367 µs (`combs kernel-bench --attention 512`).
    pub fn choose(ctx: &crate::gpu::GpuContext, n_tokens: usize, shape: AttentionShape) -> Self {
        if ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU {
            return AttentionVariant::Rows;
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
    if sg <= 1 || ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU {
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
/// (a subgroup size the driver may change, odd dimensions per invocation).
fn blocks_split(ctx: &crate::gpu::GpuContext, head_dim: usize) -> Option<(u32, u32)> {
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

/// Records the store of `n_tokens` rows of `width` floats from `src` into `cache` (f16).
///
/// # Errors
/// An odd width or a value beyond 32 bits.
pub fn record_kv_store(
    rec: &mut Recording,
    src: View<'_>,
    n_tokens: usize,
    width: usize,
    cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
) -> Result<()> {
    super::expect_f32("record_kv_store", &[src])?;
    if !width.is_multiple_of(2) {
        return Err(ModelError::invalid("kv width", format!("{width} is odd")));
    }
    let params = KvStoreParams {
        n_tokens: pc_u32("n_tokens", n_tokens)?,
        width: pc_u32("width", width)?,
        ld: pc_u32("ld", src.ld)?,
        offset: pc_u32("offset", src.offset)?,
        page_size: pc_u32("page_size", at.page_size)?,
        ring: pc_u32("ring", at.ring)?,
    };
    let n = pc_u32("kv_store threads", n_tokens * width / 2)?;
    let groups = groups_1d(rec.context(), n.div_ceil(ELEMENTWISE_WG));
    rec.dispatch(
        Kernel::KvStoreF32F16,
        &[ELEMENTWISE_WG],
        &[
            Binding::read(src.buf),
            Binding::write(cache),
            Binding::read(at.positions),
            Binding::read(at.page_table),
            Binding::read(at.seq_base),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
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

/// The new K and V rows of an attention call (f32, `n_tokens × n_head_kv ×
/// head_dim`), for the decode kernel to store into the cache itself.
#[derive(Clone, Copy)]
pub struct NewRows<'a> {
    /// Keys, roped.
    pub k: View<'a>,
    /// Values.
    pub v: View<'a>,
}

/// Records the store of the new K/V rows into the cache and the attention of
/// `n_tokens` queries over it. Where every token is the only new one of its
/// sequence (`one_per_sequence`: decode, batched decode) and the device runs
/// the decode kernel, that kernel stores the rows itself, one dispatch
/// instead of three; otherwise `kv_store` writes them first. Only that
/// kernel takes an f16 `o` (the next product's input in batched decode).
///
/// # Errors
/// As [`record_kv_store`] and [`record_attention_with`].
#[allow(clippy::too_many_arguments)]
pub fn record_store_and_attention(
    rec: &mut Recording,
    q: View<'_>,
    new: NewRows<'_>,
    o: View<'_>,
    n_tokens: usize,
    shape: AttentionShape,
    k_cache: &Arc<Buffer>,
    v_cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
    opts: AttentionOptions,
    one_per_sequence: bool,
) -> Result<()> {
    super::expect_f32("record_store_and_attention", &[q])?;
    let cpu = rec.context().caps().device_type == ash::vk::PhysicalDeviceType::CPU;
    let variant = if one_per_sequence && !cpu {
        AttentionVariant::Tiled
    } else {
        AttentionVariant::choose(rec.context(), n_tokens, shape)
    };
    if o.f16 && !(one_per_sequence && variant == AttentionVariant::Tiled) {
        return Err(ModelError::Internal(format!(
            "f16 output of {variant:?} attention: only the decode kernel on GPUs writes it"
        )));
    }
    if one_per_sequence && variant == AttentionVariant::Tiled {
        return record_decode_attention_storing(
            rec, q, new, o, n_tokens, shape, k_cache, v_cache, at, opts,
        );
    }
    let width = shape.n_head_kv * shape.head_dim;
    record_kv_store(rec, new.k, n_tokens, width, k_cache, at)?;
    record_kv_store(rec, new.v, n_tokens, width, v_cache, at)?;
    record_attention_with(
        rec, variant, q, o, n_tokens, shape, k_cache, v_cache, at, opts,
    )
}

/// Records attention of `n_tokens` query rows of `q` into `o` with the
/// variant [`AttentionVariant::choose`] picks.
///
/// # Errors
/// Head geometry the kernel does not support, or a value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_attention(
    rec: &mut Recording,
    q: View<'_>,
    o: View<'_>,
    n_tokens: usize,
    shape: AttentionShape,
    k_cache: &Arc<Buffer>,
    v_cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
    opts: AttentionOptions,
) -> Result<()> {
    super::expect_f32("record_attention", &[q, o])?;
    let variant = AttentionVariant::choose(rec.context(), n_tokens, shape);
    record_attention_with(
        rec, variant, q, o, n_tokens, shape, k_cache, v_cache, at, opts,
    )
}

/// Records attention with an explicit kernel variant.
///
/// # Errors
/// Head geometry the kernel does not support, or a value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_attention_with(
    rec: &mut Recording,
    variant: AttentionVariant,
    q: View<'_>,
    o: View<'_>,
    n_tokens: usize,
    shape: AttentionShape,
    k_cache: &Arc<Buffer>,
    v_cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
    opts: AttentionOptions,
) -> Result<()> {
    super::expect_f32("record_attention_with", &[q, o])?;
    record_attention_inner(
        rec, variant, q, o, n_tokens, shape, k_cache, v_cache, at, opts, None,
    )
}

/// Records the decode kernel storing `new` itself (each token the only new
/// one of its sequence; the caller guarantees it): the path
/// [`record_store_and_attention`] takes on GPUs, callable on any device;
/// `o` may be f16.
///
/// # Errors
/// As [`record_attention_with`].
#[allow(clippy::too_many_arguments)]
pub fn record_decode_attention_storing(
    rec: &mut Recording,
    q: View<'_>,
    new: NewRows<'_>,
    o: View<'_>,
    n_tokens: usize,
    shape: AttentionShape,
    k_cache: &Arc<Buffer>,
    v_cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
    opts: AttentionOptions,
) -> Result<()> {
    super::expect_f32("record_decode_attention_storing", &[q])?;
    record_attention_inner(
        rec,
        AttentionVariant::Tiled,
        q,
        o,
        n_tokens,
        shape,
        k_cache,
        v_cache,
        at,
        opts,
        Some(new),
    )
}

/// Records one attention dispatch. Only the decode kernel (`Tiled`) takes an
/// f16 `o`; the public entry points refuse it for the others.
#[allow(clippy::too_many_arguments)]
fn record_attention_inner(
    rec: &mut Recording,
    variant: AttentionVariant,
    q: View<'_>,
    o: View<'_>,
    n_tokens: usize,
    shape: AttentionShape,
    k_cache: &Arc<Buffer>,
    v_cache: &Arc<Buffer>,
    at: CacheAddressing<'_>,
    opts: AttentionOptions,
    new: Option<NewRows<'_>>,
) -> Result<()> {
    if let Some(n) = new
        && (variant != AttentionVariant::Tiled || n.k.ld != n.v.ld)
    {
        return Err(ModelError::Internal(format!(
            "{variant:?} attention cannot store new rows (strides {} and {})",
            n.k.ld, n.v.ld
        )));
    }
    if !shape.head_dim.is_multiple_of(2)
        || shape.head_dim > MAX_HEAD_DIM
        || shape.n_head_kv == 0
        || !shape.n_head.is_multiple_of(shape.n_head_kv)
    {
        return Err(ModelError::invalid(
            "attention shape",
            format!(
                "{} heads, {} KV heads, head dim {} (need an even head dim <= {MAX_HEAD_DIM} \
                 and KV heads dividing heads)",
                shape.n_head, shape.n_head_kv, shape.head_dim
            ),
        ));
    }
    let params = AttentionParams {
        n_tokens: pc_u32("n_tokens", n_tokens)?,
        n_head: pc_u32("n_head", shape.n_head)?,
        n_head_kv: pc_u32("n_head_kv", shape.n_head_kv)?,
        head_dim: pc_u32("head_dim", shape.head_dim)?,
        ld_q: pc_u32("ld_q", q.ld)?,
        q_offset: pc_u32("q_offset", q.offset)?,
        ld_o: pc_u32("ld_o", o.ld)?,
        o_offset: pc_u32("o_offset", o.offset)?,
        scale: opts.scale,
        softcap: opts.softcap,
        window: pc_u32("window", opts.window)?,
        page_size: pc_u32("page_size", at.page_size)?,
        ring: pc_u32("ring", at.ring)?,
        flags: u32::from(new.is_some()),
        ld_new: pc_u32("ld_new", new.map_or(0, |n| n.k.ld))?,
        k_new: pc_u32("k_new", new.map_or(0, |n| n.k.offset))?,
        v_new: pc_u32("v_new", new.map_or(0, |n| n.v.offset))?,
    };
    let ctx = rec.context().clone();
    let (kernel, spec, groups) = match variant {
        AttentionVariant::Tiled => {
            let (wg, ds) = keys_split(&ctx, shape.head_dim);
            (
                if o.f16 {
                    Kernel::AttentionF16F16
                } else {
                    Kernel::AttentionF16F32
                },
                vec![
                    wg,
                    kernel_subgroup(&ctx),
                    ds,
                    (shape.head_dim / ds as usize) as u32,
                    DECODE_KEYS_IN_FLIGHT,
                ],
                groups_1d(&ctx, pc_u32("attention groups", n_tokens * shape.n_head)?),
            )
        }
        AttentionVariant::Blocks => {
            let (qt, bc) = blocks_split(&ctx, shape.head_dim).ok_or_else(|| {
                ModelError::Internal(format!(
                    "no query-block layout for head dim {} on this device",
                    shape.head_dim
                ))
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
    rec.dispatch(
        kernel,
        &spec,
        &[
            Binding::read(q.buf),
            if new.is_some() {
                Binding::write(k_cache)
            } else {
                Binding::read(k_cache)
            },
            if new.is_some() {
                Binding::write(v_cache)
            } else {
                Binding::read(v_cache)
            },
            Binding::write(o.buf),
            Binding::read(at.positions),
            Binding::read(at.page_table),
            Binding::read(at.seq_base),
            Binding::read(new.map_or(q.buf, |n| n.k.buf)),
            Binding::read(new.map_or(q.buf, |n| n.v.buf)),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
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
