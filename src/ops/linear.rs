//! `linear`: y = W x (+ bias) (+ y) for N tokens with a GPU-resident weight of
//! any format, dequantized on the fly: the matvec kernel for one token
//! (decode), the tiled matmul kernel for several (prefill, batches). Weights
//! split into row chunks get one dispatch per chunk.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{View, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, Recording, groups_1d};
use crate::quant::QuantWeight;

/// Push constants of `glsl/matvec.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct MatvecParams {
    /// Columns.
    pub k: u32,
    /// Rows in the chunk.
    pub m: u32,
    /// Blocks in the chunk.
    pub nb: u32,
    /// Output index of the chunk's first row.
    pub row_offset: u32,
    /// vec4 index of the input vector.
    pub x_offset: u32,
    /// Output index of row 0.
    pub d_offset: u32,
    /// 1: accumulate, 2: bias.
    pub flags: u32,
}
const _: () = assert!(std::mem::size_of::<MatvecParams>() == 28);

/// Push constants of `glsl/matmul.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct MatmulParams {
    /// Columns.
    pub k: u32,
    /// Rows in the chunk.
    pub m: u32,
    /// Blocks in the chunk.
    pub nb: u32,
    /// Output column of the chunk's first row.
    pub row_offset: u32,
    /// Tokens.
    pub n: u32,
    /// Floats between tokens of X.
    pub ld_x: u32,
    /// Floats between tokens of D.
    pub ld_d: u32,
    /// Float index of X[0, 0].
    pub x_offset: u32,
    /// Float index of D[0, 0].
    pub d_offset: u32,
    /// 1: accumulate, 2: bias.
    pub flags: u32,
}
const _: () = assert!(std::mem::size_of::<MatmulParams>() == 40);

const FLAG_ACCUMULATE: u32 = 1;
const FLAG_BIAS: u32 = 2;
const MATVEC_WG: u32 = 128;
const MATMUL_BM: usize = 64;
const MATMUL_BN: usize = 32;
const COOP_BM: usize = 64;
const COOP_BN: usize = 64;
/// `matmul_rows.comp`: invocations per workgroup.
const ROWS_WG: usize = 64;

/// (tokens per tile, rows per invocation) of `matmul_rows.comp` for `n` tokens:
/// tiles as wide as the batch (up to a register budget) so each weight is
/// dequantized once per tile.
fn rows_tiling(n: usize) -> (usize, usize) {
    // Wider tiles ran somewhat faster on lavapipe (16 rows per invocation for
    // one token, 16 tokens × 8 rows for batches) but LLVM then takes minutes
    // to compile the 13 weight formats' pipelines, which every process pays.
    match n {
        1 => (1, 8),
        2..=8 => (8, 4),
        _ => (16, 4),
    }
}

/// (invocations per row, rows per invocation group) of `matvec.comp` for a
/// weight of `rows` rows on a device with subgroups of `sg` (1: unknown).
/// A whole subgroup per row (halving it for short rows was slower on the
/// H200); large matrices share each load of x across several rows while
/// still giving every SM several workgroups. Measured on the H200, tg128 of
/// llama-8b q4_0: 75 tok/s with one row, 98 with two, 106 with 4 for 8192+
/// rows, 92 with 8.
fn matvec_shape(sg: u32, rows: usize) -> (u32, u32) {
    if sg <= 1 {
        return (32, 1);
    }
    let tpr = sg.min(32);
    let nr = if rows >= 8192 {
        4
    } else if rows >= 1024 {
        2
    } else {
        1
    };
    (tpr, nr)
}

/// A linear layer: a weight `[out, in]` and an optional f32 bias `[out]`.
pub struct Linear {
    /// The weight, `rows` = output features, `cols` = input features.
    pub weight: QuantWeight,
    /// Optional bias on the device.
    pub bias: Option<Arc<Buffer>>,
}

impl Linear {
    /// Input features.
    pub fn n_in(&self) -> usize {
        self.weight.cols()
    }

    /// Output features.
    pub fn n_out(&self) -> usize {
        self.weight.rows()
    }

    /// Records `out[t] (+)= W x[t] (+ bias)` for `n` tokens.
    ///
    /// # Errors
    /// Shapes that do not fit the kernels (input width not a multiple of 32).
    pub fn record(
        &self,
        rec: &mut Recording,
        x: View<'_>,
        n: usize,
        out: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        record_linear(rec, &self.weight, self.bias.as_ref(), x, n, out, accumulate)
    }
}

fn kernel(family: &str, w: &QuantWeight) -> Result<Kernel> {
    Kernel::by_name(&format!("{family}_{}_f32", w.qtype().name())).ok_or_else(|| {
        ModelError::UnsupportedTensorType {
            tensor: w.name().to_string(),
            ggml_type: w.qtype().to_string(),
        }
    })
}

/// The kernel a linear layer runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearVariant {
    /// One token, a subgroup's lanes sharing each row (`matvec.comp`).
    Matvec,
    /// Tiled through shared memory (`matmul.comp`).
    Tiled,
    /// One invocation per row with uniform activation loads (`matmul_rows.comp`),
    /// for CPU devices such as lavapipe.
    Rows,
    /// Cooperative-matrix tiles, f16 inputs and f32 accumulation
    /// (`matmul_coop.comp`), where the device has 16×16×16 f16 matrices and
    /// subgroups of 32.
    Coop,
}

impl LinearVariant {
    /// Whether [`LinearVariant::Coop`] can run on this device.
    pub fn coop_available(ctx: &GpuContext) -> bool {
        ctx.caps().has_coop_mat_16x16x16()
            && ctx.caps().shader_float16
            && kernel_subgroup(ctx) == 32
    }

    /// The variant combs picks for `n` tokens on this device.
    pub fn choose(ctx: &GpuContext, n: usize, x: View<'_>) -> Self {
        let cpu = ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU;
        if n > 1 && !cpu && Self::coop_available(ctx) {
            LinearVariant::Coop
        } else {
            Self::choose_f32(ctx, n, x)
        }
    }

    /// The variant combs picks among those that keep f32 inputs (no f16
    /// rounding of weights or activations).
    pub fn choose_f32(ctx: &GpuContext, n: usize, x: View<'_>) -> Self {
        let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
        if aligned && ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU {
            LinearVariant::Rows
        } else if n == 1 && x.offset.is_multiple_of(4) {
            LinearVariant::Matvec
        } else {
            LinearVariant::Tiled
        }
    }
}

/// Records `out[t, :] (+)= W x[t, :] (+ bias)` for tokens `t < n` with the
/// variant [`LinearVariant::choose`] picks.
///
/// # Errors
/// Input width not a multiple of 32, or a value beyond 32 bits.
pub fn record_linear(
    rec: &mut Recording,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
) -> Result<()> {
    let variant = LinearVariant::choose(rec.context(), n, x);
    record_linear_with(rec, variant, w, bias, x, n, out, accumulate)
}

/// Records a linear layer with an explicit kernel variant.
///
/// # Errors
/// Input width not a multiple of 32, a variant that cannot take these
/// operands (matvec with several tokens, unaligned rows), or a value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_linear_with(
    rec: &mut Recording,
    variant: LinearVariant,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
) -> Result<()> {
    let k = w.cols();
    if !k.is_multiple_of(32) {
        return Err(ModelError::Shape {
            tensor: w.name().to_string(),
            expected: vec![k.next_multiple_of(32) as u64],
            got: vec![k as u64],
        });
    }
    let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
    let fits = match variant {
        LinearVariant::Matvec => n == 1 && x.offset.is_multiple_of(4),
        LinearVariant::Rows => aligned,
        LinearVariant::Tiled => true,
        LinearVariant::Coop => LinearVariant::coop_available(rec.context()),
    };
    if !fits {
        return Err(ModelError::Internal(format!(
            "{variant:?} linear cannot take {n} tokens at offset {} stride {}",
            x.offset, x.ld
        )));
    }
    let flags =
        if accumulate { FLAG_ACCUMULATE } else { 0 } | if bias.is_some() { FLAG_BIAS } else { 0 };
    let bias_buf = bias.unwrap_or(x.buf);
    let ctx = rec.context().clone();
    let sg = kernel_subgroup(&ctx);
    for chunk in w.chunks() {
        let nb = chunk.n_rows * k / w.qtype().block_size();
        let bindings = [
            Binding::read(&chunk.buffer),
            Binding::read(x.buf),
            Binding::write(out.buf),
            Binding::read(bias_buf),
        ];
        let mm_params = |x_unit: usize| -> Result<MatmulParams> {
            Ok(MatmulParams {
                k: pc_u32("k", k)?,
                m: pc_u32("m", chunk.n_rows)?,
                nb: pc_u32("nb", nb)?,
                row_offset: pc_u32("row_offset", chunk.row_start)?,
                n: pc_u32("n", n)?,
                ld_x: pc_u32("ld_x", x.ld / x_unit)?,
                ld_d: pc_u32("ld_d", out.ld)?,
                x_offset: pc_u32("x_offset", x.offset / x_unit)?,
                d_offset: pc_u32("d_offset", out.offset)?,
                flags,
            })
        };
        match variant {
            LinearVariant::Rows => {
                let (tn, rpi) = rows_tiling(n);
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(ROWS_WG * rpi))?,
                    pc_u32("groups", n.div_ceil(tn))?,
                    1,
                ];
                rec.dispatch(
                    kernel("matmul_rows", w)?,
                    &[ROWS_WG as u32, tn as u32, rpi as u32],
                    &bindings,
                    bytemuck::bytes_of(&mm_params(4)?),
                    groups,
                )?;
            }
            LinearVariant::Matvec => {
                let (tpr, nr) = matvec_shape(sg, chunk.n_rows);
                let params = MatvecParams {
                    k: pc_u32("k", k)?,
                    m: pc_u32("m", chunk.n_rows)?,
                    nb: pc_u32("nb", nb)?,
                    row_offset: pc_u32("row_offset", chunk.row_start)?,
                    x_offset: pc_u32("x_offset", x.offset / 4)?,
                    d_offset: pc_u32("d_offset", out.offset)?,
                    flags,
                };
                let rows_per_wg = (MATVEC_WG / tpr * nr) as usize;
                let groups = groups_1d(&ctx, pc_u32("groups", chunk.n_rows.div_ceil(rows_per_wg))?);
                rec.dispatch(
                    kernel("matvec", w)?,
                    &[MATVEC_WG, sg, tpr, nr],
                    &bindings,
                    bytemuck::bytes_of(&params),
                    groups,
                )?;
            }
            LinearVariant::Coop => {
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(COOP_BM))?,
                    pc_u32("groups", n.div_ceil(COOP_BN))?,
                    1,
                ];
                rec.dispatch(
                    kernel("matmul_coop", w)?,
                    &[128, 32],
                    &bindings,
                    bytemuck::bytes_of(&mm_params(1)?),
                    groups,
                )?;
            }
            LinearVariant::Tiled => {
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(MATMUL_BM))?,
                    pc_u32("groups", n.div_ceil(MATMUL_BN))?,
                    1,
                ];
                rec.dispatch(
                    kernel("matmul", w)?,
                    &[],
                    &bindings,
                    bytemuck::bytes_of(&mm_params(1)?),
                    groups,
                )?;
            }
        }
    }
    Ok(())
}

/// Reference: `out[t * rows + r] = sum_c w[r * cols + c] * x[t * cols + c]` in f64.
pub fn linear_ref(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * rows];
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let s: f64 = wr
                .iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            out[t * rows + r] = s as f32;
        }
    }
    out
}
