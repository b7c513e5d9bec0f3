//! `glu`: gated activations `d = act(g) * u` (SwiGLU with SiLU, GeGLU with
//! tanh-approximated GELU), llama.cpp `ggml_swiglu` / `ggml_geglu` numerics.

use super::params::GluParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};

/// The gate's activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`.
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
}

/// The gate and up values a gated activation reads.
#[derive(Clone, Copy, Debug)]
pub enum GluInput<'a> {
    /// Gate and up in two matrices of the output's shape.
    Separate {
        /// The gate.
        gate: Mat<'a>,
        /// The up projection.
        up: Mat<'a>,
    },
    /// One matrix whose columns alternate gate, up (twice the output's
    /// width): a weight whose rows alternate them.
    Interleaved(Mat<'a>),
}

/// `out = act(gate) * up` for every token. Gate, up and output are f32:
///
/// ```
/// # use combs::ops::glu::{Activation, GluCall, GluInput};
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let gate = Mat::new(b, 4, 64);
/// let up = Mat::new(b, 4, 64);
/// let call = GluCall {
///     act: Activation::Silu,
///     input: GluInput::Separate { gate, up },
///     out: up,
/// };
/// # }
/// ```
///
/// f16 activations cannot be handed to it:
///
/// ```compile_fail
/// # use combs::ops::glu::{Activation, GluCall, GluInput};
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let gate = Mat::<half::f16>::new(b, 4, 64);
/// let up = Mat::new(b, 4, 64);
/// let call = GluCall {
///     act: Activation::Silu,
///     input: GluInput::Separate { gate, up }, // a Mat<f16> where Mat<f32> goes
///     out: up,
/// };
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GluCall<'a> {
    /// The gate's activation.
    pub act: Activation,
    /// Gate and up.
    pub input: GluInput<'a>,
    /// The result (tokens × width).
    pub out: Mat<'a>,
}

/// Records the gated activation.
///
/// # Errors
/// Inputs not of the output's shape (twice its width, interleaved), views
/// outside their buffers, or a value beyond 32 bits.
pub fn record_glu(rec: &mut Recording, call: &GluCall<'_>) -> Result<()> {
    let d = call.out;
    let shape_err = |m: &Mat<'_>, cols: usize| ModelError::Shape {
        tensor: "glu input".into(),
        expected: vec![d.rows as u64, cols as u64],
        got: vec![m.rows as u64, m.cols as u64],
    };
    let (g, u, step) = match call.input {
        GluInput::Separate { gate, up } => {
            for m in [&gate, &up] {
                if m.rows != d.rows || m.cols != d.cols {
                    return Err(shape_err(m, d.cols));
                }
            }
            (gate, up, 1)
        }
        GluInput::Interleaved(gu) => {
            if gu.rows != d.rows || gu.cols != 2 * d.cols {
                return Err(shape_err(&gu, 2 * d.cols));
            }
            (gu, gu.cols_at(1, gu.cols.saturating_sub(1)), 2)
        }
    };
    let width = d.cols;
    for (m, what) in [(g, "glu gate"), (u, "glu up"), (d, "glu output")] {
        m.check(what)?;
    }
    let params = GluParams {
        n_tokens: pc_u32("n_tokens", d.rows)?,
        width: pc_u32("width", width)?,
        ld_g: pc_u32("ld_g", g.ld)?,
        ld_u: pc_u32("ld_u", u.ld)?,
        ld_d: pc_u32("ld_d", d.ld)?,
        g_offset: pc_u32("g_offset", g.offset)?,
        u_offset: pc_u32("u_offset", u.offset)?,
        d_offset: pc_u32("d_offset", d.offset)?,
        step,
    };
    let kernel = match call.act {
        Activation::Silu => Kernel::GluSiluF32,
        Activation::GeluTanh => Kernel::GluGeluF32,
    };
    rec.dispatch_elementwise(
        kernel,
        &[
            Binding::read(g.buf),
            Binding::read(u.buf),
            Binding::write(d.buf),
        ],
        &params,
        pc_u32("glu threads", d.rows * width)?,
    )
}

/// Reference activation in f64.
pub fn act_ref(act: Activation, x: f32) -> f32 {
    let x = f64::from(x);
    let y = match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            let k = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }
    };
    y as f32
}
