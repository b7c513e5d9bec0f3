//! `glu`: gated activations `d = act(g) * u` (SwiGLU with SiLU, GeGLU with
//! tanh-approximated GELU), llama.cpp `ggml_swiglu` / `ggml_geglu` numerics.

use bytemuck::{Pod, Zeroable};

use super::{ELEMENTWISE_WG, View, pc_u32};
use crate::error::Result;
use crate::gpu::{Binding, Kernel, Recording, groups_1d};

/// Push constants of `glsl/glu.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct GluParams {
    /// Tokens.
    pub n_tokens: u32,
    /// Elements per token.
    pub width: u32,
    /// Floats between tokens of g.
    pub ld_g: u32,
    /// Floats between tokens of u.
    pub ld_u: u32,
    /// Floats between tokens of d.
    pub ld_d: u32,
    /// Float index of g's token 0.
    pub g_offset: u32,
    /// Float index of u's token 0.
    pub u_offset: u32,
    /// Float index of d's token 0.
    pub d_offset: u32,
    /// Floats between consecutive columns of g and u (2: interleaved pairs).
    pub step: u32,
}
const _: () = assert!(std::mem::size_of::<GluParams>() == 36);

/// The gate's activation function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`.
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`.
    GeluTanh,
}

/// Records `d = act(g) * u` for `n_tokens` rows of `width`.
///
/// # Errors
/// A value beyond 32 bits.
pub fn record_glu(
    rec: &mut Recording,
    act: Activation,
    g: View<'_>,
    u: View<'_>,
    d: View<'_>,
    n_tokens: usize,
    width: usize,
) -> Result<()> {
    super::expect_f32("record_glu", &[g, u, d])?;
    record_glu_step(rec, act, g, u, d, n_tokens, width, 1)
}

/// Records `d[t, c] = act(gu[t, 2c]) * gu[t, 2c + 1]`: gate and up projections
/// computed by one weight whose rows alternate gate, up (see
/// `ops::linear::MatvecFusion::glu`).
///
/// # Errors
/// A value beyond 32 bits.
pub fn record_glu_interleaved(
    rec: &mut Recording,
    act: Activation,
    gu: View<'_>,
    d: View<'_>,
    n_tokens: usize,
    width: usize,
) -> Result<()> {
    super::expect_f32("record_glu_interleaved", &[gu, d])?;
    record_glu_step(rec, act, gu, gu.shift(1), d, n_tokens, width, 2)
}

#[allow(clippy::too_many_arguments)]
fn record_glu_step(
    rec: &mut Recording,
    act: Activation,
    g: View<'_>,
    u: View<'_>,
    d: View<'_>,
    n_tokens: usize,
    width: usize,
    step: u32,
) -> Result<()> {
    let params = GluParams {
        n_tokens: pc_u32("n_tokens", n_tokens)?,
        width: pc_u32("width", width)?,
        ld_g: pc_u32("ld_g", g.ld)?,
        ld_u: pc_u32("ld_u", u.ld)?,
        ld_d: pc_u32("ld_d", d.ld)?,
        g_offset: pc_u32("g_offset", g.offset)?,
        u_offset: pc_u32("u_offset", u.offset)?,
        d_offset: pc_u32("d_offset", d.offset)?,
        step,
    };
    let kernel = match act {
        Activation::Silu => Kernel::GluSiluF32,
        Activation::GeluTanh => Kernel::GluGeluF32,
    };
    let n = pc_u32("glu threads", n_tokens * width)?;
    let groups = groups_1d(rec.context(), n.div_ceil(ELEMENTWISE_WG));
    rec.dispatch(
        kernel,
        &[ELEMENTWISE_WG],
        &[
            Binding::read(g.buf),
            Binding::read(u.buf),
            Binding::write(d.buf),
        ],
        bytemuck::bytes_of(&params),
        groups,
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
