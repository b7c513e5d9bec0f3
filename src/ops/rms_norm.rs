//! `rms_norm`: `d = x / sqrt(mean(x²) + eps) * w` per row (llama.cpp
//! `ggml_rms_norm` then `ggml_mul`), with Gemma's `(1 + w)` flavor, an
//! unweighted form, a residual form that adds the result into `d`, and
//! per-head norms of heads packed in wider rows.

use std::sync::Arc;

use super::params::RmsNormParams;
use super::{AnyMat, Mat, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};

/// How the normalized row is scaled.
///
/// ```
/// use combs::NormFlavor;
/// use combs::ops::rms_norm::rms_norm_ref;
///
/// // A zero-centred weight `w` scales as the plain weight `1 + w` does.
/// let x = [1.0f32, -2.0, 3.0, -4.0];
/// let w = [0.5f32, 0.0, -0.5, 1.0];
/// let w1: Vec<f32> = w.iter().map(|v| 1.0 + v).collect();
/// let a = rms_norm_ref(&x, Some(&w), NormFlavor::ZeroCentred, 1e-6);
/// let b = rms_norm_ref(&x, Some(&w1), NormFlavor::Plain, 1e-6);
/// assert_eq!(a, b);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormFlavor {
    /// `x̂ · w` (Llama, Qwen, Mistral, Phi-3; Gemma GGUFs store `1 + w` already).
    Plain,
    /// `x̂ · (1 + w)`, for weights stored zero-centred.
    ZeroCentred,
}

/// An RMS norm: its weight (`None`: normalize only), flavour and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct RmsNorm<'a> {
    /// The weight, one f32 per column.
    pub weight: Option<&'a Arc<Buffer>>,
    /// How the weight scales the normalized row.
    pub flavor: NormFlavor,
    /// Epsilon inside the square root.
    pub eps: f32,
}

/// A weighted RMS norm: the norms of a block, which the planner may fold
/// into the products reading their output.
#[derive(Clone, Copy, Debug)]
pub struct NormWeight<'a> {
    /// The weight, one f32 per column.
    pub weight: &'a Arc<Buffer>,
    /// How the weight scales the normalized row.
    pub flavor: NormFlavor,
    /// Epsilon inside the square root.
    pub eps: f32,
}

impl<'a> NormWeight<'a> {
    /// The norm as a dispatch of its own computes it.
    pub fn norm(&self) -> RmsNorm<'a> {
        RmsNorm {
            weight: Some(self.weight),
            flavor: self.flavor,
            eps: self.eps,
        }
    }
}

/// Where a norm's result goes. Only a stored result may be f16:
///
/// ```
/// # use combs::ops::rms_norm::NormOut;
/// # use combs::ops::{AnyMat, Mat};
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let out = NormOut::Store(AnyMat::F16(Mat::<half::f16>::new(b, 4, 64)));
/// let added = NormOut::Add(Mat::new(b, 4, 64));
/// # }
/// ```
///
/// A result added into its output is added into f32 rows:
///
/// ```compile_fail
/// # use combs::ops::rms_norm::NormOut;
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let out = NormOut::Add(Mat::<half::f16>::new(b, 4, 64)); // f16 rows to add into
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub enum NormOut<'a> {
    /// Written (rounded once to nearest where the view is f16).
    Store(AnyMat<'a>),
    /// Added into f32 rows (a post-norm on its way into the residual).
    Add(Mat<'a>),
}

/// An RMS norm of every row of `x` into `out`, or with `head_dim` of every
/// `head_dim`-wide piece of each row (per-head Q/K norms of heads packed in
/// wider rows; `out` may then be `x` itself).
#[derive(Clone, Copy, Debug)]
pub struct RmsNormCall<'a> {
    /// The rows to normalize.
    pub x: Mat<'a>,
    /// The norm.
    pub norm: RmsNorm<'a>,
    /// The result, of `x`'s shape.
    pub out: NormOut<'a>,
    /// Normalize each piece of this many columns on its own (`None`: whole rows).
    pub head_dim: Option<usize>,
}

impl<'a> RmsNormCall<'a> {
    /// The result's view.
    pub fn out(&self) -> AnyMat<'a> {
        match self.out {
            NormOut::Store(m) => m,
            NormOut::Add(m) => AnyMat::F32(m),
        }
    }

    /// Whether the result adds into the output.
    pub fn adds(&self) -> bool {
        matches!(self.out, NormOut::Add(_))
    }

    /// Checks the shapes and returns the width of each normalized piece.
    ///
    /// # Errors
    /// `out` not of `x`'s shape, `head_dim` not dividing the rows, views
    /// outside their buffers.
    pub fn check(&self) -> Result<usize> {
        let (x, out) = (self.x, self.out());
        if out.rows() != x.rows || out.cols() != x.cols {
            return Err(ModelError::Shape {
                tensor: "rms_norm output".into(),
                expected: vec![x.rows as u64, x.cols as u64],
                got: vec![out.rows() as u64, out.cols() as u64],
            });
        }
        x.check("rms_norm input")?;
        out.check("rms_norm output")?;
        match self.head_dim {
            None => Ok(x.cols),
            Some(hd) if hd > 0 && x.cols.is_multiple_of(hd) => Ok(hd),
            Some(hd) => Err(ModelError::invalid(
                "head_dim",
                format!("{hd} does not divide rows of {}", x.cols),
            )),
        }
    }
}

/// Invocations per row. A few rows (batched decode) take 256, so that each
/// invocation loads few elements: on the H200, 16 rows of 2048 in 8.8 µs
/// per dispatch against 11.4 with 128. Many rows (prompts) take just enough
/// for 16 elements each in registers, so that narrow rows do not leave
/// most of a wide workgroup idle.
fn workgroup_size(n_rows: usize, n_cols: usize) -> u32 {
    if n_rows <= 64 {
        return 256;
    }
    match n_cols {
        0..=1024 => 64,
        1025..=2048 => 128,
        _ => 256,
    }
}

/// Records an RMS norm.
///
/// # Errors
/// `out` not of `x`'s shape, `head_dim` not dividing the rows, views
/// outside their buffers, or a value beyond 32 bits.
pub fn record_rms_norm(rec: &mut Recording, call: &RmsNormCall<'_>) -> Result<()> {
    let (x, out, add) = (call.x, call.out(), call.adds());
    let (d_offset, _, _, d_ld) = out.layout();
    let width = call.check()?;
    // Rows in groups: row r lies at group r / group, member r % group.
    let (n_rows, n_cols, group, ld_x, ld_d, ld_group_x, ld_group_d) = if width == x.cols {
        (x.rows, x.cols, x.rows.max(1), x.ld, d_ld, 0, 0)
    } else {
        let heads = x.cols / width;
        (x.rows * heads, width, heads, width, width, x.ld, d_ld)
    };
    let mut flags = 0;
    if call.norm.flavor == NormFlavor::ZeroCentred {
        flags |= RmsNormParams::ZERO_CENTRED;
    }
    if add {
        flags |= RmsNormParams::ADD;
    }
    if call.norm.weight.is_none() {
        flags |= RmsNormParams::NO_WEIGHT;
    }
    let params = RmsNormParams {
        n_cols: pc_u32("n_cols", n_cols)?,
        n_rows: pc_u32("n_rows", n_rows)?,
        ld_x: pc_u32("ld_x", ld_x)?,
        ld_d: pc_u32("ld_d", ld_d)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        d_offset: pc_u32("d_offset", d_offset)?,
        eps: call.norm.eps,
        flags,
        group: pc_u32("group", group)?,
        ld_group_x: pc_u32("ld_group_x", ld_group_x)?,
        ld_group_d: pc_u32("ld_group_d", ld_group_d)?,
    };
    let ctx = rec.context().clone();
    let groups = groups_1d(&ctx, pc_u32("rows", n_rows)?);
    rec.dispatch(
        match out {
            AnyMat::F32(_) => Kernel::RmsNormF32,
            AnyMat::F16(_) => Kernel::RmsNormF32F16,
        },
        &[workgroup_size(n_rows, n_cols), kernel_subgroup(&ctx)],
        &[
            Binding::read(x.buf),
            Binding::read(call.norm.weight.unwrap_or(x.buf)),
            Binding::write(out.buf()),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// The spec's `rms_norm`: records `y = x / sqrt(mean(x²) + eps) * w` for
/// every row of `x` (eps inside the root; `w` as `flavor` says), into `y`
/// of `x`'s shape — [`record_rms_norm`] of a whole-row [`RmsNormCall`]. It
/// records only; the caller submits.
///
/// ```
/// use combs::gpu::{Buffer, GpuContext, MemoryKind, run_once};
/// use combs::ops::Mat;
/// use combs::ops::rms_norm::rms_norm_ref;
/// use combs::{NormFlavor, rms_norm};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     let (rows, cols) = (2, 64);
///     let x: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
///     let w: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 / 64.0).collect();
///     let xb = Buffer::new(&ctx, 4 * x.len() as u64, MemoryKind::Upload, "x")?;
///     let wb = Buffer::new(&ctx, 4 * w.len() as u64, MemoryKind::Upload, "w")?;
///     let yb = Buffer::new(&ctx, 4 * x.len() as u64, MemoryKind::Readback, "y")?;
///     xb.write_slice(0, &x)?;
///     wb.write_slice(0, &w)?;
///     run_once(&ctx, |rec| {
///         let (x, y) = (Mat::new(&xb, rows, cols), Mat::new(&yb, rows, cols));
///         rms_norm(rec, x, &wb, NormFlavor::Plain, 1e-6, y)
///     })?;
///     let mut y = vec![0.0f32; x.len()];
///     yb.read_slice(0, &mut y)?;
///     for (row, got) in x.chunks(cols).zip(y.chunks(cols)) {
///         let want = rms_norm_ref(row, Some(&w), NormFlavor::Plain, 1e-6);
///         assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5));
///     }
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `y` not of `x`'s shape, a weight shorter than a row, views outside
/// their buffers, or a value beyond 32 bits.
pub fn rms_norm(
    rec: &mut Recording,
    x: Mat<'_>,
    weight: &Arc<Buffer>,
    flavor: NormFlavor,
    eps: f32,
    y: Mat<'_>,
) -> Result<()> {
    if weight.size() < 4 * x.cols as u64 {
        return Err(ModelError::Shape {
            tensor: "rms_norm weight".into(),
            expected: vec![x.cols as u64],
            got: vec![weight.size() / 4],
        });
    }
    let call = RmsNormCall {
        x,
        norm: RmsNorm {
            weight: Some(weight),
            flavor,
            eps,
        },
        out: NormOut::Store(AnyMat::F32(y)),
        head_dim: None,
    };
    record_rms_norm(rec, &call)
}

/// Reference RMS norm of one row (f64 sum of squares, as ggml's CPU path).
pub fn rms_norm_ref(x: &[f32], w: Option<&[f32]>, flavor: NormFlavor, eps: f32) -> Vec<f32> {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let mut wi = w.map_or(1.0, |w| w[i]);
            if flavor == NormFlavor::ZeroCentred {
                wi += 1.0;
            }
            v * scale * wi
        })
        .collect()
}
