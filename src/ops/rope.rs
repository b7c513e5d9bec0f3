//! `rope`: rotary position embeddings applied in place (llama.cpp
//! `ggml_rope_ext`). The per-pair inverse frequencies, with the rope base,
//! frequency factors and linear / llama3 scaling folded in, are computed once
//! on the CPU ([`inv_freq`]) and read by the kernel, so every scaling scheme is
//! one kernel.

use std::sync::Arc;

use super::params::RopeParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording};

/// Which dimensions form rotation pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): Llama GGUFs (the converter permutes Q/K to this).
    Normal,
    /// Split halves (i, i + n_rot/2): GPT-NeoX, Qwen2, Gemma, Phi-3.
    Neox,
}

/// How frequencies are scaled for contexts beyond the trained one.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// No scaling.
    None,
    /// Positions divided by `factor` (`rope.scaling.type = linear`).
    Linear {
        /// The scale factor.
        factor: f32,
    },
    /// Per-dimension divisors (the `rope_freqs.weight` tensor of llama3-style
    /// models).
    FreqFactors(Vec<f32>),
    /// LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini): two sets of per-dimension
    /// divisors (`rope_factors_short.weight`, `rope_factors_long.weight`),
    /// the long set for contexts longer than the original one. Its
    /// magnitude correction is the spec's `rope_attn_factor`.
    LongRope {
        /// Divisors for contexts up to `n_ctx_orig`.
        short: Vec<f32>,
        /// Divisors for longer contexts.
        long: Vec<f32>,
        /// The context the model was pre-trained with.
        n_ctx_orig: usize,
    },
}

impl RopeScaling {
    /// The scaling a context of `n_ctx` positions uses: for LongRoPE the long
    /// factors when `n_ctx` exceeds the original context and the short ones
    /// otherwise (llama.cpp `llama_model::get_rope_factors`; transformers
    /// switches on the sequence's length instead, which agrees when the
    /// context is as long as the sequence); any other kind as it is.
    pub fn for_context(&self, n_ctx: usize) -> RopeScaling {
        match self {
            RopeScaling::LongRope {
                short,
                long,
                n_ctx_orig,
            } => RopeScaling::FreqFactors(if n_ctx > *n_ctx_orig {
                long.clone()
            } else {
                short.clone()
            }),
            other => other.clone(),
        }
    }
}

impl std::fmt::Display for RopeScaling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let range = |v: &[f32]| {
            let lo = v.iter().copied().fold(f32::INFINITY, f32::min);
            let hi = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            format!("{} factors in {lo}..{hi}", v.len())
        };
        match self {
            RopeScaling::None => write!(f, "none"),
            RopeScaling::Linear { factor } => write!(f, "linear, factor {factor}"),
            RopeScaling::FreqFactors(v) => write!(f, "frequency factors ({})", range(v)),
            RopeScaling::LongRope {
                short,
                long,
                n_ctx_orig,
            } => write!(
                f,
                "LongRoPE (short: {}; long: {}; long past {n_ctx_orig} positions of context)",
                range(short),
                range(long)
            ),
        }
    }
}

/// Inverse frequency of each rotation pair: `base^(-2i/n_rot) / factor_i`.
/// LongRoPE reads as its short factors here; resolve it with
/// [`RopeScaling::for_context`] first.
pub fn inv_freq(n_rot: usize, base: f32, scaling: &RopeScaling) -> Vec<f32> {
    let factor = |i: usize| -> f64 {
        let at = |v: &[f32]| f64::from(v.get(i).copied().unwrap_or(1.0));
        match scaling {
            RopeScaling::None => 1.0,
            RopeScaling::Linear { factor } => f64::from(*factor),
            RopeScaling::FreqFactors(ff) => at(ff),
            RopeScaling::LongRope { short, .. } => at(short),
        }
    };
    (0..n_rot / 2)
        .map(|i| {
            let f = f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
            (f / factor(i)) as f32
        })
        .collect()
}

/// A rope's settings: which pairs rotate, how many dimensions of each
/// head, at which positions and frequencies.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    /// Which dimensions form pairs.
    pub style: RopeStyle,
    /// Floats per head.
    pub head_dim: usize,
    /// Rotated dimensions per head (even, at most `head_dim`).
    pub n_rot: usize,
    /// Each token's position, one i32 per token.
    pub positions: &'a Arc<Buffer>,
    /// Inverse frequencies, `n_rot / 2` f32 ([`inv_freq`]).
    pub inv_freq: &'a Arc<Buffer>,
    /// Multiplier of cos and sin (YaRN / LongRoPE magnitude scaling; 1 otherwise).
    pub attn_factor: f32,
}

impl Rope<'_> {
    /// Checks the head geometry against rows of `cols` floats.
    ///
    /// # Errors
    /// An odd or oversized rotation, or heads that do not tile the rows.
    pub fn check(&self, cols: usize) -> Result<()> {
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || !self.n_rot.is_multiple_of(2)
            || self.n_rot > self.head_dim
            || !cols.is_multiple_of(self.head_dim)
        {
            return Err(ModelError::invalid(
                "rope",
                format!(
                    "head dim {}, n_rot {} over rows of {cols}",
                    self.head_dim, self.n_rot
                ),
            ));
        }
        Ok(())
    }
}

/// Rotates every head of the rows of `x` in place (tokens × heads × head_dim).
#[derive(Clone, Copy, Debug)]
pub struct RopeCall<'a> {
    /// The heads, `cols` a multiple of the head dimension.
    pub x: Mat<'a>,
    /// The rope.
    pub rope: Rope<'a>,
}

/// Records the rotation.
///
/// # Errors
/// Heads that do not tile the rows, a view outside its buffer, or a value
/// beyond 32 bits.
pub fn record_rope(rec: &mut Recording, call: &RopeCall<'_>) -> Result<()> {
    let (x, r) = (call.x, call.rope);
    r.check(x.cols)?;
    x.check("rope input")?;
    let n_heads = x.cols / r.head_dim;
    let params = RopeParams {
        n_tokens: pc_u32("n_tokens", x.rows)?,
        n_heads: pc_u32("n_heads", n_heads)?,
        head_dim: pc_u32("head_dim", r.head_dim)?,
        n_rot: pc_u32("n_rot", r.n_rot)?,
        ld: pc_u32("ld", x.ld)?,
        offset: pc_u32("offset", x.offset)?,
        flags: if r.style == RopeStyle::Neox {
            RopeParams::NEOX
        } else {
            0
        },
        attn_factor: r.attn_factor,
    };
    rec.dispatch_elementwise(
        Kernel::RopeF32,
        &[
            Binding::write(x.buf),
            Binding::read(r.positions),
            Binding::read(r.inv_freq),
        ],
        &params,
        pc_u32("rope threads", x.rows * n_heads * r.n_rot / 2)?,
    )
}

/// The (sin, cos) of each rotation pair's angle at `pos`, in f64: what
/// [`rope_ref`] rotates by, computed once for all heads of a token.
pub fn rope_angles(pos: i32, inv_freq: &[f32], n_rot: usize) -> Vec<(f64, f64)> {
    inv_freq
        .iter()
        .take(n_rot / 2)
        .map(|&f| (f64::from(pos) * f64::from(f)).sin_cos())
        .collect()
}

/// Rotates one head in place by [`rope_angles`] (the reference arithmetic).
pub fn rope_apply(head: &mut [f32], angles: &[(f64, f64)], style: RopeStyle, attn_factor: f32) {
    let half = angles.len();
    let af = f64::from(attn_factor);
    for (i, &(s, c)) in angles.iter().enumerate() {
        let (a, b) = match style {
            RopeStyle::Normal => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + half),
        };
        let (x0, x1) = (f64::from(head[a]), f64::from(head[b]));
        head[a] = ((x0 * c - x1 * s) * af) as f32;
        head[b] = ((x0 * s + x1 * c) * af) as f32;
    }
}

/// Reference rope of one head in place (f64 angles).
pub fn rope_ref(
    head: &mut [f32],
    pos: i32,
    inv_freq: &[f32],
    n_rot: usize,
    style: RopeStyle,
    attn_factor: f32,
) {
    rope_apply(head, &rope_angles(pos, inv_freq, n_rot), style, attn_factor);
}
