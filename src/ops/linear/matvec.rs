//! The matvec family (`glsl/matvec.comp`): one token (decode) or a few
//! (batched decode of several sequences, each workgroup taking one token's
//! share of the rows), a row group of lanes per few rows, x read through
//! cache or staged in shared memory. It folds an RMS norm into its input
//! (each workgroup sums its token's squares as it loads x) and a rope or a
//! gated activation into its stores, per token.

use super::coop::rope_fold;
use super::{FoldedRope, Input, LinearCall, Output, unsupported};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, GpuContext, Kernel, Recording, groups_1d};
use crate::ops::glu::Activation;
use crate::ops::params::MatvecParams;
use crate::ops::rms_norm::NormFlavor;
use crate::ops::{AnyMat, Mat, kernel_subgroup, pc_u32};
use crate::quant::QuantType;

const MATVEC_WG: u32 = 128;
/// Most tokens [`super::LinearVariant::choose`] gives the matvec kernel on GPUs:
/// batched decode of a few sequences reads each weight once through L2
/// rather than through the prefill tiles, which leave most of a large GPU
/// idle at a handful of tokens. On the H200 (aggregate decode tok/s,
/// smollm2-135m / llama-1b q4_0): 4 sequences 900 / 807 against 563 / 376
/// with the cooperative-matrix tiles; 16 sequences 2271 / 1249 against
/// 1993 / 1346. With this round's kernels (folds in the matvec, K-split
/// 16-row cooperative tiles) 16 sequences through the matvec ran 5789 /
/// 2166 against 6270 / 3947 through the tiles.
pub const MATVEC_MAX_TOKENS: usize = 8;
/// The `matvec.comp` layout for a weight of `rows` × `cols` of `qtype` on a
/// device with subgroups of `sg` (1: unknown).
///
/// Subgroups of 32 (NVIDIA), from `combs kernel-bench` on the H200
/// (2026-12-01, µs per dispatch in a chain with barriers, the previous
/// rule's figure first): x staged in shared memory wins almost everywhere
/// (smollm2-135m q4_0 down 576×1536: 7.5 → 6.3; llama-1b q4_0 out
/// 2048×2048: 9.8 → 7.4); matrices of 16384+ rows take workgroups of 256
/// (llama-1b gate/up 16384×2048: 21.6 → 14.3, llama-8b 28672×4096:
/// 44.5 → 37.6); 4096+ rows of 128+ units take two units in flight
/// (llama-8b q4_0 out 4096×4096: 18.2 → 11.1); long rows (down
/// projections) stage x in chunks, per the branches below. Other subgroup
/// sizes keep the layouts measured before: one row group of min(sg, 32)
/// invocations with 1, 2 or 4 rows.
fn matvec_shape(sg: u32, qtype: QuantType, rows: usize, cols: usize) -> MatvecShape {
    let s = |tpr, nr| MatvecShape::new(tpr, nr);
    if sg <= 1 {
        return s(32, 1);
    }
    if sg == 32 {
        let units = cols / unit_columns(qtype, false);
        // Q4_K over 32-column units where x is staged: as fast or faster
        // at the 1B's sizes (llama-1b q4_k out 2048×2048 8.99 → 7.46 µs);
        // 8B-sized weights take 64-column units (below).
        let staged = |tpr, nr, un, wg| MatvecShape {
            un,
            wg,
            stage_x: true,
            narrow: true,
            ..s(tpr, nr)
        };
        // 8B-sized weights (session 21, after the f16 dequantization: the
        // registers, not the arithmetic, now limit these layouts). Q4_K
        // over 64-column units: llama-8b Q/K/V 14.5 → 11.0 µs, output 10.2
        // → 9.0, gate/up 39.0 → 37.6, down 27.6 → 23.9, head 157 → 149;
        // the down projection of the other formats on 64-wide row groups
        // (Q4_0 23.8 → 19.5; the 32 × 4 groups in 256 it had until then
        // took it 36.1 → 26.6 in session 10). Whole decodes (tg128):
        // llama-8b Q4_0 311 → 326, Q4_K 269 → 293, Q6_K 233 → 240 tok/s.
        let wide_units = |tpr, nr, un, wg| MatvecShape {
            narrow: false,
            ..staged(tpr, nr, un, wg)
        };
        if cols >= 4096 && rows >= 4096 {
            if qtype == QuantType::Q4K {
                return if cols > 6144 {
                    wide_units(32, 4, 1, 256)
                } else {
                    wide_units(32, 4, 1, 128)
                };
            }
            if cols > 6144 {
                return staged(64, 4, 1, 256);
            }
        }
        return if cols > 6144 {
            // llama-1b down 2048×8192: q4_0 18.1 → 12.0, q4_k 15.0 → 13.1
            staged(64, 4, 2, 128)
        } else if rows >= 16384 {
            // 8 rows per group at short rows: llama-1b gate/up 16.0 → 14.3,
            // its head 74 → 71 (q4_0), 16384×2048 q4_k 17.8 → 16.5
            staged(32, if cols <= 2048 { 8 } else { 4 }, 1, 256)
        } else if rows >= 4096 && units >= 128 {
            staged(32, 4, 2, 128)
        } else {
            staged(32, 2, 1, 128)
        };
    }
    if rows >= 4096 && cols >= 4096 && sg <= 64 {
        return s(64, 8);
    }
    let tpr = sg.min(32);
    let nr = if rows >= 8192 {
        4
    } else if rows >= 1024 {
        2
    } else {
        1
    };
    s(tpr, nr)
}

/// Columns one invocation of `matvec.comp` takes at a time (a unit).
fn unit_columns(qtype: QuantType, narrow: bool) -> usize {
    if qtype == QuantType::Q4K && !narrow {
        64
    } else {
        32
    }
}

/// How `matvec.comp` lays a workgroup over a weight: `ks` column slices of
/// row groups of `tpr` invocations, each group holding `nr` rows and each
/// invocation `un` units of columns in flight at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecShape {
    /// Invocations per row group (a power of two, at most `wg`).
    pub tpr: u32,
    /// Rows per row group (1..=8).
    pub nr: u32,
    /// Column slices (a power of two; `tpr * ks` at most `wg`).
    pub ks: u32,
    /// Units (32 columns, 64 for Q4_K) each invocation loads per step (1..=4).
    pub un: u32,
    /// Invocations per workgroup (64, 128 or 256).
    pub wg: u32,
    /// Stage x in shared memory once per workgroup (in chunks where it is long).
    pub stage_x: bool,
    /// Q4_K: units of 32 columns (one sub-block) instead of 64.
    pub narrow: bool,
}

impl MatvecShape {
    /// `ks` = 1, one unit per step, workgroups of 128, x read from cache.
    pub fn new(tpr: u32, nr: u32) -> Self {
        MatvecShape {
            tpr,
            nr,
            ks: 1,
            un: 1,
            wg: MATVEC_WG,
            stage_x: false,
            narrow: false,
        }
    }

    /// The shape combs picks for a chunk of `rows` × `cols` of `qtype` on this device.
    pub fn choose(ctx: &GpuContext, qtype: QuantType, rows: usize, cols: usize) -> Self {
        matvec_shape(kernel_subgroup(ctx), qtype, rows, cols)
    }

    /// Rows one workgroup covers.
    pub fn rows_per_workgroup(&self) -> usize {
        (self.wg / (self.tpr * self.ks) * self.nr) as usize
    }

    /// Whether the kernel can run this layout.
    pub fn valid(&self) -> bool {
        matches!(self.wg, 64 | 128 | 256)
            && self.tpr.is_power_of_two()
            && self.ks.is_power_of_two()
            && self.tpr * self.ks <= self.wg
            && (1..=8).contains(&self.nr)
            && (1..=4).contains(&self.un)
    }
}

/// Bytes of shared memory `matvec.comp` may give to a staged x.
const MATVEC_STAGE_BYTES: usize = 40 << 10;

/// Whether the matvec kernel can read `n` tokens of `x` (vec4 loads).
pub(super) fn fits(n: usize, x: Mat<'_>) -> bool {
    x.offset.is_multiple_of(4) && (n == 1 || x.ld.is_multiple_of(4))
}

/// Records a product on the matvec kernel, one dispatch per chunk.
///
/// # Errors
/// f16 input or output, folded sums of squares, columns not a multiple of
/// the weight's block, an unaligned `x`, an invalid layout, or a value
/// beyond 32 bits.
/// What a matvec folds after its dot products (the f32 matvec and the
/// integer one alike): the gated activation of a gated f32 output, or the
/// rope of a roped one. `kernel` names the refusing kernel otherwise.
pub(super) fn epilogue<'a>(
    call: &LinearCall<'a>,
    kernel: &'static str,
) -> Result<(Option<Activation>, Option<FoldedRope<'a>>)> {
    Ok(match call.output {
        Output::Store(_) | Output::Accumulate(_) => (None, None),
        Output::Roped { rope, .. } => (None, Some(rope)),
        Output::Gated {
            out: AnyMat::F32(_),
            act,
        } => (Some(act), None),
        Output::Gated { .. } | Output::AccumulateSquares { .. } => {
            return Err(unsupported(kernel, call));
        }
    })
}

pub(super) fn record(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    let (x, norm) = match call.input {
        Input::F32(x) => (x, None),
        Input::Normed { x, norm } => (x, Some(norm)),
        Input::F16(_) | Input::NormedBySquares { .. } => return Err(unsupported("matvec", call)),
    };
    let (glu, rope) = epilogue(call, "matvec")?;
    let n = call.n();
    if !fits(n, x) {
        return Err(ModelError::kernel(
            "matvec",
            format!(
                "{n} tokens at float {} stride {} (not multiples of 4)",
                x.offset, x.ld
            ),
        ));
    }
    let w = call.weight;
    let k = w.cols();
    if !k.is_multiple_of(w.qtype().block_size()) {
        return Err(ModelError::Shape {
            tensor: w.name().to_string(),
            expected: vec![k.next_multiple_of(w.qtype().block_size()) as u64],
            got: vec![k as u64],
        });
    }
    let mut flags = call.store_flags(MatvecParams::ACCUMULATE, MatvecParams::BIAS);
    if let Some(nm) = norm {
        flags |= MatvecParams::NORM;
        if nm.flavor == NormFlavor::ZeroCentred {
            flags |= MatvecParams::NORM_ZERO_CENTRED;
        }
    }
    if rope.is_some() {
        flags |= MatvecParams::ROPE;
    }
    if let Some(act) = glu {
        flags |= MatvecParams::GLU;
        if act == Activation::GeluTanh {
            flags |= MatvecParams::GELU;
        }
    }
    let ctx = rec.context().clone();
    let sg = kernel_subgroup(&ctx);
    for chunk in w.chunks() {
        let mut shape = call
            .matvec_shape
            .unwrap_or_else(|| matvec_shape(sg, w.qtype(), chunk.n_rows, k));
        if !shape.valid() {
            return Err(ModelError::kernel("matvec", format!("layout {shape:?}")));
        }
        if (glu.is_some() || rope.is_some()) && shape.nr % 2 == 1 {
            shape.nr += 1;
        }
        let xsv = staged_x_vec4s(&ctx, w.qtype(), shape, k)?;
        let d = super::chunk_dims(call, chunk, 4)?;
        let r = rope.map(|r| *r.rope());
        let params = MatvecParams {
            k: d.k,
            m: d.m,
            nb: d.nb,
            row_offset: d.row_offset,
            x_offset: d.x_offset,
            d_offset: d.d_offset,
            flags,
            eps: norm.map_or(0.0, |nm| nm.eps),
            rope: rope_fold(rope)?,
            n_tok: pc_u32("n_tok", n.max(1))?,
            ld_x: d.ld_x,
            ld_d: d.ld_d,
        };
        let groups = groups_1d(
            &ctx,
            pc_u32(
                "groups",
                chunk.n_rows.div_ceil(shape.rows_per_workgroup()) * n.max(1),
            )?,
        );
        rec.dispatch(
            kernel(w.qtype(), shape),
            &[shape.wg, sg, shape.tpr, shape.nr, shape.ks, shape.un, xsv],
            &[
                Binding::read(&chunk.buffer),
                Binding::read(x.buf),
                Binding::write(call.output.out().buf()),
                Binding::read(call.bias.unwrap_or(x.buf)),
                Binding::read(norm.map_or(x.buf, |nm| nm.weight)),
                Binding::read(r.map_or(x.buf, |r| r.positions)),
                Binding::read(r.map_or(x.buf, |r| r.inv_freq)),
            ],
            bytemuck::bytes_of(&params),
            groups,
        )?;
    }
    Ok(())
}

/// The variant for `t` in layout `shape`: Q4_K has one over 32-column units.
fn kernel(t: QuantType, shape: MatvecShape) -> Kernel {
    if shape.narrow && t == QuantType::Q4K {
        Kernel::MatvecQ4KU32F32
    } else {
        Kernel::matvec(t)
    }
}

/// vec4s of x staged in shared memory at a time (1: x read through cache):
/// chunks of whole units that fit the shared memory left beside the
/// reduction's, as few and as even as possible.
fn staged_x_vec4s(ctx: &GpuContext, t: QuantType, shape: MatvecShape, k: usize) -> Result<u32> {
    if !shape.stage_x {
        return Ok(1);
    }
    let unit_vec4 = unit_columns(t, shape.narrow) / 4;
    // The row groups' partials, and a sum of squares per subgroup of 4+.
    let red = 4 * (shape.wg * (shape.nr + 2)) as usize + 4 * shape.wg.div_ceil(4) as usize;
    let budget =
        MATVEC_STAGE_BYTES.min((ctx.caps().max_shared_memory as usize).saturating_sub(red));
    let max_vec4 = budget / 16 / unit_vec4 * unit_vec4;
    if max_vec4 < unit_vec4 {
        return Ok(1);
    }
    let total = k / 4;
    let chunks = total.div_ceil(max_vec4);
    pc_u32("k", total.div_ceil(chunks).next_multiple_of(unit_vec4))
}
