//! `layer_norm`: `d = (x - mean) / sqrt(var + eps) * w + b` per row, with
//! the biased variance (PyTorch's `nn.LayerNorm`, Whisper's pre-norms).

use std::sync::Arc;

use super::params::LayerNormParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};

/// A layer norm's parameters: weight and bias (one f32 per column each) and epsilon.
#[derive(Clone, Copy, Debug)]
pub struct LayerNorm<'a> {
    /// The weight.
    pub weight: &'a Arc<Buffer>,
    /// The bias.
    pub bias: &'a Arc<Buffer>,
    /// Epsilon added to the variance.
    pub eps: f32,
}

/// A layer norm of every row of `x` into `out` (of `x`'s shape; it may be `x`).
#[derive(Clone, Copy, Debug)]
pub struct LayerNormCall<'a> {
    /// The rows.
    pub x: Mat<'a>,
    /// The norm.
    pub norm: LayerNorm<'a>,
    /// The result.
    pub out: Mat<'a>,
}

impl LayerNormCall<'_> {
    /// Checks the shapes.
    ///
    /// # Errors
    /// `out` not of `x`'s shape, empty rows, a weight or bias shorter than a
    /// row, views outside their buffers.
    pub fn check(&self) -> Result<()> {
        let (x, out) = (self.x, self.out);
        if out.rows != x.rows || out.cols != x.cols {
            return Err(ModelError::Shape {
                tensor: "layer_norm output".into(),
                expected: vec![x.rows as u64, x.cols as u64],
                got: vec![out.rows as u64, out.cols as u64],
            });
        }
        if x.cols == 0 {
            return Err(ModelError::invalid("layer_norm", "rows of no columns"));
        }
        let need = 4 * x.cols as u64;
        if self.norm.weight.size() < need || self.norm.bias.size() < need {
            return Err(ModelError::invalid(
                "layer_norm",
                format!("weight or bias shorter than rows of {}", x.cols),
            ));
        }
        x.check("layer_norm input")?;
        out.check("layer_norm output")
    }
}

/// Invocations per row.
const WG: u32 = 128;

/// Records the norm.
///
/// # Errors
/// As [`LayerNormCall::check`], or a value beyond 32 bits.
pub fn record_layer_norm(rec: &mut Recording, call: &LayerNormCall<'_>) -> Result<()> {
    call.check()?;
    let (x, out) = (call.x, call.out);
    let params = LayerNormParams {
        n_rows: pc_u32("n_rows", x.rows)?,
        n_cols: pc_u32("n_cols", x.cols)?,
        ld_x: pc_u32("ld_x", x.ld)?,
        ld_d: pc_u32("ld_d", out.ld)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        d_offset: pc_u32("d_offset", out.offset)?,
        eps: call.norm.eps,
    };
    let groups = groups_1d(rec.context(), pc_u32("rows", x.rows)?);
    rec.dispatch(
        Kernel::LayerNormF32,
        &[WG],
        &[
            Binding::read(x.buf),
            Binding::read(call.norm.weight),
            Binding::read(call.norm.bias),
            Binding::write(out.buf),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// Reference layer norm of one row, in f64.
pub fn layer_norm_ref(x: &[f32], w: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let n = x.len().max(1) as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let scale = 1.0 / (var + f64::from(eps)).sqrt();
    x.iter()
        .zip(w.iter().zip(b))
        .map(|(&v, (&wi, &bi))| {
            ((f64::from(v) - mean) * scale * f64::from(wi) + f64::from(bi)) as f32
        })
        .collect()
}
