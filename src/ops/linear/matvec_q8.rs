//! The integer matvec family (`glsl/matvec_q8.comp`): decode products of
//! Q4_0 / Q8_0 weights with activations quantized to 8-bit blocks
//! ([`crate::ops::quantize_q8_1`]), multiplied with packed 4x8-bit integer
//! dot products as llama.cpp's CUDA and Vulkan backends do (`mul_mat_vec_q`,
//! dp4a). Its value is ggml-cpu's `vec_dot_q4_0_q8_0` / `vec_dot_q8_0_q8_0`
//! up to f32 summation order, so it replaces `act_round` + the f32 matvec
//! under [`crate::ops::act_round::Numerics::LlamaCppCpu`]. The layout is
//! the f32 matvec's ([`MatvecShape`]: row groups, rows per group, column
//! slices, units in flight) without staging x, which at 36 bytes per 32
//! columns is read through cache; it folds the same epilogues (bias,
//! accumulation, gated rows, rope rows) and the RMS norm (in the quantizer
//! dispatch, or in each workgroup's quantization of x · w with 1 / rms
//! applied to its sums: see [`Q8Input::F32`]).

use std::sync::Arc;

use super::coop::rope_fold;
use super::{Input, LinearCall, MATVEC_MAX_TOKENS, MatvecShape, unsupported};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, Recording, groups_1d};
use crate::ops::Mat;
use crate::ops::glu::Activation;
use crate::ops::params::MatvecQ8Params;
use crate::ops::quantize_q8_1::{Q8Rows, check_f32_rows, record_quantize_q8_1};
use crate::ops::rms_norm::{NormFlavor, NormWeight};
use crate::ops::{kernel_subgroup, pc_u32};
use crate::quant::{QuantType, QuantWeight};

/// Whether the integer matvec can run on this device (Vulkan 1.3's
/// `shaderIntegerDotProduct`; fast only where
/// [`crate::gpu::DeviceCaps::int_dot_accelerated`] says so).
pub fn available(ctx: &GpuContext) -> bool {
    ctx.caps().int_dot
}

/// Whether the integer matvec takes weights of type `t` (Q4_K only with
/// x quantized in the workgroup: see [`takes`]).
pub fn supports(t: QuantType) -> bool {
    matches!(t, QuantType::Q4_0 | QuantType::Q8_0 | QuantType::Q4K)
}

/// Whether `t` has no quantizer kernel of its own (Q4_K's q8_K blocks are
/// made only inside the matvec's workgroups).
fn in_workgroup_only(t: QuantType) -> bool {
    t == QuantType::Q4K
}

/// The most rows of one chunk of `w` (one dispatch each).
fn max_chunk_rows(w: &QuantWeight) -> usize {
    w.chunks().iter().map(|c| c.n_rows).max().unwrap_or(0)
}

/// Whether [`record_quantized`] can record a decode product of `w`: a type
/// the integer matvec takes, and for Q4_K a row of x that every workgroup
/// can quantize itself.
pub fn takes(ctx: &GpuContext, w: &QuantWeight) -> bool {
    supports(w.qtype())
        && (!in_workgroup_only(w.qtype())
            || quantizes_in_workgroup(ctx, max_chunk_rows(w), w.cols()))
}

/// Whether a call of `n` tokens of `t` can take the integer path.
pub fn fits(t: QuantType, n: usize) -> bool {
    supports(t) && (1..=MATVEC_MAX_TOKENS).contains(&n)
}

/// Bytes of scratch [`record_quantized`] needs for `n` tokens of `cols`.
pub fn scratch_bytes(n: usize, cols: usize) -> u64 {
    4 * (n * Q8Rows::row_words(cols)) as u64
}

/// The layout for a chunk of `rows` × `cols` on a device with subgroups of
/// `sg` (1: unknown): the f32 matvec's shapes without staging, and two
/// column slices for long rows (`combs kernel-bench --q8 --shapes` sweeps
/// them; H200 figures in docs/perf-notes.md).
fn q8_shape(sg: u32, rows: usize, cols: usize) -> MatvecShape {
    let s = |tpr, nr| MatvecShape::new(tpr, nr);
    if sg <= 1 {
        return s(32, 1);
    }
    let units = cols / 32;
    if sg == 32 && cols >= 8192 && rows < 16384 {
        // Long rows (the down projections): two column slices of 128
        // invocations each. 8B down 4096×14336 on the H200, µs: q4_0
        // 20.0 → 19.1 quantizing in the workgroup (21.6 → 17.2 without),
        // q4_k 26.8 → 22.9 (`combs kernel-bench --q8 --shapes 32x4x2x2x256`).
        return MatvecShape {
            ks: 2,
            un: 2,
            wg: 256,
            ..s(32, 4)
        };
    }
    if sg == 32 {
        let un = if units >= 128 { 2 } else { 1 };
        let (nr, wg) = if rows >= 16384 {
            (4, 256)
        } else if rows >= 4096 {
            (4, 128)
        } else {
            (2, 128)
        };
        return MatvecShape {
            un,
            wg,
            ..s(32, nr)
        };
    }
    s(sg.min(32), if rows >= 1024 { 2 } else { 1 })
}

/// The shape combs picks for a chunk of `rows` × `cols` on this device.
pub fn choose_shape(ctx: &GpuContext, rows: usize, cols: usize) -> MatvecShape {
    q8_shape(kernel_subgroup(ctx), rows, cols)
}

/// What the integer matvec reads as its input.
#[derive(Clone, Copy, Debug)]
pub enum Q8Input<'a> {
    /// Rows [`record_quantize_q8_1`] wrote.
    Quantized(Q8Rows<'a>),
    /// f32 rows that every workgroup quantizes into shared memory itself,
    /// the quantizer's arithmetic without its dispatch; or the raw residual
    /// of a folded RMS norm, of which the workgroups quantize x · w and
    /// apply 1 / rms to their sums (the normed row's quants but at rounding
    /// ties, f32 block scales: `glsl/matvec_q8.comp`).
    F32 {
        /// The rows (16-byte aligned).
        x: Mat<'a>,
        /// The norm folded in.
        norm: Option<NormWeight<'a>>,
    },
}

impl Q8Input<'_> {
    fn rows_cols(&self) -> (usize, usize) {
        match self {
            Q8Input::Quantized(q) => (q.rows, q.cols),
            Q8Input::F32 { x, .. } => (x.rows, x.cols),
        }
    }
}

/// Bytes of shared memory the in-workgroup quantizer of `cols` columns
/// takes next to the reduction slots of `shape`: per 32 columns 32 quants,
/// a word of scale and sum, and an f32 scale (Q4_K: the unit's extreme,
/// and a scale per 256), and the subgroups' sums of squares (a slot for
/// each subgroup of 4+ invocations).
fn shared_bytes(shape: &MatvecShape, cols: usize) -> usize {
    cols / 32 * 40
        + cols / 256 * 4
        + 4 * shape.wg as usize * shape.nr as usize
        + 4 * shape.wg.div_ceil(4) as usize
}

/// Most workgroups per token that each quantize the row themselves, past
/// which the repeated quantization would cost more than the quantizer's
/// own dispatch. Not reached on the H200 yet: the 8B's head (4008
/// workgroups of 4096 columns) ran in 83.1 µs quantizing in each against
/// 84.7 µs after a quantizer dispatch (`combs kernel-bench --q8`).
const MAX_QUANTIZING_WORKGROUPS: usize = 16384;

/// Whether every workgroup of a `rows` × `cols` product should quantize
/// its row of x for itself: its shared memory holds the row's 36 bytes per
/// 32 columns, and there are few enough workgroups.
pub fn quantizes_in_workgroup(ctx: &GpuContext, rows: usize, cols: usize) -> bool {
    let shape = choose_shape(ctx, rows, cols);
    let mut wide = shape;
    wide.nr += wide.nr % 2;
    shared_bytes(&wide, cols) <= ctx.caps().max_shared_memory as usize
        && rows.div_ceil(wide.rows_per_workgroup()) <= MAX_QUANTIZING_WORKGROUPS
}

/// Records `call` on the integer path: the matvec quantizing its f32 input
/// in every workgroup where shared memory holds the row, else the input
/// quantized into `scratch` first (with the norm of an [`Input::Normed`]
/// folded into the quantizer either way).
///
/// # Errors
/// As [`record_matvec_q8`]; a scratch buffer smaller than
/// [`scratch_bytes`]; an input other than f32 or normed f32.
pub fn record_quantized(
    rec: &mut Recording,
    call: &LinearCall<'_>,
    scratch: &Arc<Buffer>,
) -> Result<()> {
    let (x, norm) = match call.input {
        Input::F32(x) => (x, None),
        Input::Normed { x, norm } => (x, Some(norm)),
        Input::F16(_) | Input::NormedBySquares { .. } => {
            return Err(unsupported("matvec_q8", call));
        }
    };
    let rows = max_chunk_rows(call.weight);
    if in_workgroup_only(call.weight.qtype())
        || (call.matvec_shape.is_none() && quantizes_in_workgroup(rec.context(), rows, x.cols))
    {
        return record_matvec_q8(rec, call, Q8Input::F32 { x, norm });
    }
    let xq = Q8Rows::new(scratch, x.rows, x.cols);
    record_quantize_q8_1(rec, x, norm, xq)?;
    record_matvec_q8(rec, call, Q8Input::Quantized(xq))
}

/// Records the integer matvec of `call`'s weight with input `x`: quantized
/// rows (what [`record_quantize_q8_1`] wrote of `call`'s input, which gives
/// the shapes and is not read) or f32 rows each workgroup quantizes, one
/// dispatch per chunk.
///
/// # Errors
/// A weight other than Q4_0 / Q8_0, more tokens than
/// [`MATVEC_MAX_TOKENS`], operands that do not match, an output the kernel
/// does not fold, a device without integer dot products, an invalid
/// layout, or a value beyond 32 bits.
pub fn record_matvec_q8(rec: &mut Recording, call: &LinearCall<'_>, x: Q8Input<'_>) -> Result<()> {
    call.check()?;
    let w = call.weight;
    let n = call.n();
    if !fits(w.qtype(), n) {
        return Err(ModelError::kernel(
            "matvec_q8",
            format!(
                "`{}`: {} weights, {n} tokens (Q4_0 / Q8_0 / Q4_K, 1..={MATVEC_MAX_TOKENS})",
                w.name(),
                w.qtype()
            ),
        ));
    }
    if !available(rec.context()) {
        return Err(ModelError::kernel(
            "matvec_q8",
            "no integer dot products (shaderIntegerDotProduct) on this device",
        ));
    }
    let (x_rows, x_cols) = x.rows_cols();
    if x_rows != n || x_cols != w.cols() {
        return Err(ModelError::Shape {
            tensor: format!("`{}` quantized input", w.name()),
            expected: vec![n as u64, w.cols() as u64],
            got: vec![x_rows as u64, x_cols as u64],
        });
    }
    // (buffer, offset, stride) in the kernel's units (words or vec4s),
    // whether the workgroups quantize, and the norm they fold in.
    let (x_buf, x_offset, ld_x, in_wg, norm) = match x {
        Q8Input::Quantized(xq) => {
            xq.check("matvec_q8 input")?;
            (xq.buf, xq.offset, xq.ld, false, None)
        }
        Q8Input::F32 { x, norm } => {
            check_f32_rows("matvec_q8", "matvec_q8 input", x, norm)?;
            (x.buf, x.offset / 4, x.ld / 4, true, norm)
        }
    };
    if in_workgroup_only(w.qtype()) && !in_wg {
        return Err(ModelError::kernel(
            "matvec_q8",
            format!(
                "`{}`: {} weights take x in f32 (quantized to q8_K in the workgroup)",
                w.name(),
                w.qtype()
            ),
        ));
    }
    let (glu, rope) = super::matvec::epilogue(call, "matvec_q8")?;
    let mut flags = call.store_flags(MatvecQ8Params::ACCUMULATE, MatvecQ8Params::BIAS);
    if rope.is_some() {
        flags |= MatvecQ8Params::ROPE;
    }
    if let Some(act) = glu {
        flags |= MatvecQ8Params::GLU;
        if act == Activation::GeluTanh {
            flags |= MatvecQ8Params::GELU;
        }
    }
    if let Some(nm) = norm {
        flags |= MatvecQ8Params::NORM;
        if nm.flavor == NormFlavor::ZeroCentred {
            flags |= MatvecQ8Params::NORM_ZERO_CENTRED;
        }
    }
    let kernel = match (w.qtype(), in_wg) {
        (QuantType::Q8_0, false) => Kernel::MatvecQ80Q81,
        (QuantType::Q8_0, true) => Kernel::MatvecQ80Q81Xf32,
        (QuantType::Q4K, _) => Kernel::MatvecQ4KQ8KXf32,
        (_, false) => Kernel::MatvecQ40Q81,
        (_, true) => Kernel::MatvecQ40Q81Xf32,
    };
    let ctx = rec.context().clone();
    let sg = kernel_subgroup(&ctx);
    let k = w.cols();
    let out = call.output.out();
    let (d_off, _, _, d_ld) = out.layout();
    for chunk in w.chunks() {
        let mut shape = call
            .matvec_shape
            .unwrap_or_else(|| q8_shape(sg, chunk.n_rows, k));
        if !shape.valid() {
            return Err(ModelError::kernel("matvec_q8", format!("layout {shape:?}")));
        }
        if (glu.is_some() || rope.is_some()) && shape.nr % 2 == 1 {
            shape.nr += 1;
        }
        // Q4_K steps 64 columns at a time unless the layout asks for
        // 32-column units (as the f32 matvec's `narrow`).
        let kernel = if kernel == Kernel::MatvecQ4KQ8KXf32 && shape.narrow {
            Kernel::MatvecQ4KU32Q8KXf32
        } else {
            kernel
        };
        if in_wg && shared_bytes(&shape, k) > ctx.caps().max_shared_memory as usize {
            return Err(ModelError::kernel(
                "matvec_q8",
                format!(
                    "{k} columns quantized in a workgroup of {shape:?}: {} bytes of shared memory, the device has {}",
                    shared_bytes(&shape, k),
                    ctx.caps().max_shared_memory
                ),
            ));
        }
        let r = rope.map(|r| *r.rope());
        let params = MatvecQ8Params {
            k: pc_u32("k", k)?,
            m: pc_u32("m", chunk.n_rows)?,
            nb: pc_u32("nb", chunk.n_rows * k / w.qtype().block_size())?,
            row_offset: pc_u32("row_offset", chunk.row_start)?,
            x_offset: pc_u32("x_offset", x_offset)?,
            d_offset: pc_u32("d_offset", d_off)?,
            flags,
            rope: rope_fold(rope)?,
            n_tok: pc_u32("n_tok", n)?,
            ld_x: pc_u32("ld_x", ld_x)?,
            ld_d: pc_u32("ld_d", d_ld)?,
            eps: norm.map_or(0.0, |nm| nm.eps),
        };
        let groups = groups_1d(
            &ctx,
            pc_u32(
                "groups",
                chunk.n_rows.div_ceil(shape.rows_per_workgroup()) * n,
            )?,
        );
        rec.dispatch(
            kernel,
            &[
                shape.wg,
                sg,
                shape.tpr,
                shape.nr,
                shape.ks,
                shape.un,
                // Only the in-workgroup quantizer sizes shared memory by it.
                if in_wg { pc_u32("units", k / 32)? } else { 1 },
            ],
            &[
                Binding::read(&chunk.buffer),
                Binding::read(x_buf),
                Binding::write(out.buf()),
                Binding::read(call.bias.unwrap_or(x_buf)),
                Binding::read(r.map_or(x_buf, |r| r.positions)),
                Binding::read(r.map_or(x_buf, |r| r.inv_freq)),
                Binding::read(norm.map_or(x_buf, |nm| nm.weight)),
            ],
            bytemuck::bytes_of(&params),
            groups,
        )?;
    }
    Ok(())
}

/// CPU reference of the kernel's arithmetic for one token: per row and
/// 32-block, the exact integer sum times `d_w · d_x` (`w` in GGUF blocks
/// of `t`, rows × cols), summed in f64: each block's term is the kernel's
/// bit for bit (`(sumi · d_w) · d_x` in f32), only their sum's order differs.
pub fn matvec_q8_ref(
    t: QuantType,
    w: &[u8],
    rows: usize,
    cols: usize,
    xq: &[crate::ops::quantize_q8_1::BlockQ8_1],
) -> Vec<f32> {
    use half::f16;
    let nb = cols / 32;
    let bs = t.block_bytes();
    (0..rows)
        .map(|r| {
            let mut s = 0.0f64;
            for (b, x) in xq.iter().enumerate().take(nb) {
                let blk = &w[(r * nb + b) * bs..(r * nb + b + 1) * bs];
                let dw = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
                let sumi: i32 = match t {
                    QuantType::Q4_0 => (0..32)
                        .map(|j| {
                            let byte = blk[2 + (j % 16)];
                            let q = if j < 16 { byte & 15 } else { byte >> 4 };
                            (i32::from(q) - 8) * i32::from(x.qs[j])
                        })
                        .sum(),
                    _ => (0..32)
                        .map(|j| i32::from(blk[2 + j] as i8) * i32::from(x.qs[j]))
                        .sum(),
                };
                s += f64::from(sumi as f32 * dw * x.d.to_f32());
            }
            s as f32
        })
        .collect()
}
