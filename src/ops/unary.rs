//! `unary`: `d = f(x)` or `d += f(x)` elementwise — the exact (erf) GELU of
//! Whisper's MLP and convolution stem, the tanh-approximated GELU of
//! SigLIP's MLP, and the plain copy whose adding form sums two matrices
//! (positional embeddings into the residual).

use super::params::UnaryParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};

/// The function applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `x * (1 + erf(x / √2)) / 2`, PyTorch's `nn.GELU()`.
    GeluErf,
    /// `x (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2`, PyTorch's
    /// `gelu_pytorch_tanh` (SigLIP) and ggml's `ggml_gelu`.
    GeluTanh,
    /// `x`.
    Copy,
}

/// `out = op(x)`, or `out += op(x)` where `add`; `out` may be `x` itself.
#[derive(Clone, Copy, Debug)]
pub struct UnaryCall<'a> {
    /// The function.
    pub op: UnaryOp,
    /// The input.
    pub x: Mat<'a>,
    /// The result, of `x`'s shape.
    pub out: Mat<'a>,
    /// Whether the result adds into `out`.
    pub add: bool,
}

impl UnaryCall<'_> {
    /// Checks the shapes.
    ///
    /// # Errors
    /// `out` not of `x`'s shape, views outside their buffers.
    pub fn check(&self) -> Result<()> {
        let (x, out) = (self.x, self.out);
        if out.rows != x.rows || out.cols != x.cols {
            return Err(ModelError::Shape {
                tensor: "unary output".into(),
                expected: vec![x.rows as u64, x.cols as u64],
                got: vec![out.rows as u64, out.cols as u64],
            });
        }
        x.check("unary input")?;
        out.check("unary output")
    }
}

/// Records the step.
///
/// # Errors
/// As [`UnaryCall::check`], or a value beyond 32 bits.
pub fn record_unary(rec: &mut Recording, call: &UnaryCall<'_>) -> Result<()> {
    call.check()?;
    let (x, out) = (call.x, call.out);
    let params = UnaryParams {
        n_rows: pc_u32("n_rows", x.rows)?,
        width: pc_u32("width", x.cols)?,
        ld_x: pc_u32("ld_x", x.ld)?,
        ld_d: pc_u32("ld_d", out.ld)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        d_offset: pc_u32("d_offset", out.offset)?,
        flags: if call.add { UnaryParams::ADD } else { 0 },
    };
    let kernel = match call.op {
        UnaryOp::GeluErf => Kernel::UnaryGeluErfF32,
        UnaryOp::GeluTanh => Kernel::UnaryGeluTanhF32,
        UnaryOp::Copy => Kernel::UnaryCopyF32,
    };
    rec.dispatch_elementwise(
        kernel,
        &[Binding::read(x.buf), Binding::write(out.buf)],
        &params,
        pc_u32("unary threads", x.rows * x.cols)?,
    )
}

/// Reference of one value, in f64.
pub fn unary_ref(op: UnaryOp, x: f32) -> f32 {
    match op {
        UnaryOp::GeluErf => gelu_erf(f64::from(x)) as f32,
        UnaryOp::GeluTanh => super::glu::act_ref(super::glu::Activation::GeluTanh, x),
        UnaryOp::Copy => x,
    }
}

/// The exact GELU in f64.
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}
