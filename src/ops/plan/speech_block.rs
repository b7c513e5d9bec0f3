//! What a speech model (Whisper) asks the planner to compute: a convolution
//! stem, pre-LayerNorm encoder blocks over every position at once (also
//! SigLIP's, the vision encoder of SmolVLM), and
//! decoder blocks with causal self-attention, cross-attention over the
//! encoder's keys and values, and a GELU MLP. Weights and settings only,
//! as [`super::DecoderBlock`] for the Llama family.

use std::sync::Arc;

use crate::gpu::Buffer;
use crate::ops::im2col::Conv1d;
use crate::ops::layer_norm::LayerNorm;
use crate::ops::linear::Linear;
use crate::ops::unary::UnaryOp;

/// Two 1-D convolutions with GELU after each, then the positional
/// embedding added: `x = gelu(conv2(gelu(conv1(mel)))) + pos`.
#[derive(Clone, Copy)]
pub struct ConvStem<'a> {
    /// The first convolution's geometry.
    pub conv1: Conv1d,
    /// Its weight, `[d, conv1.width()]` (taps of a channel adjacent,
    /// zero columns past `channels * kernel`), and bias.
    pub conv1_w: &'a Linear,
    /// The second convolution's geometry.
    pub conv2: Conv1d,
    /// Its weight, `[d, conv2.width()]`, and bias.
    pub conv2_w: &'a Linear,
    /// The positional embedding, `[positions, d]` f32.
    pub positions: &'a Arc<Buffer>,
}

/// Multi-head attention's head geometry and scale (every head its own K/V).
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Heads.
    pub n_head: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Multiplier of q·k.
    pub scale: f32,
}

/// Self-attention behind a layer norm: `x += out(attn(q, k, v of ln(x)))`.
#[derive(Clone, Copy)]
pub struct LnSelfAttention<'a> {
    /// The norm before it.
    pub norm: LayerNorm<'a>,
    /// Queries.
    pub q: &'a Linear,
    /// Keys.
    pub k: &'a Linear,
    /// Values.
    pub v: &'a Linear,
    /// The output projection.
    pub out: &'a Linear,
    /// Heads.
    pub heads: Heads,
}

/// Cross-attention behind a layer norm: queries from `ln(x)`, keys and
/// values from the encoder (computed once per window, [`super::FullKv`]).
#[derive(Clone, Copy)]
pub struct LnCrossAttention<'a> {
    /// The norm before it.
    pub norm: LayerNorm<'a>,
    /// Queries.
    pub q: &'a Linear,
    /// The output projection.
    pub out: &'a Linear,
    /// Heads.
    pub heads: Heads,
}

/// The MLP behind a layer norm: `x += down(act(up(ln(x))))`, the exact
/// GELU for Whisper, the tanh one for SigLIP.
#[derive(Clone, Copy)]
pub struct LnMlp<'a> {
    /// The norm before it.
    pub norm: LayerNorm<'a>,
    /// The activation between the two products.
    pub act: UnaryOp,
    /// `d → 4d`.
    pub up: &'a Linear,
    /// `4d → d`.
    pub down: &'a Linear,
}

/// An encoder block: every position attends to every position.
#[derive(Clone, Copy)]
pub struct EncoderBlock<'a> {
    /// Self-attention.
    pub attn: LnSelfAttention<'a>,
    /// MLP.
    pub mlp: LnMlp<'a>,
}

/// A decoder block: causal self-attention over the sequence's cache, then
/// cross-attention over the encoder output, then the MLP.
#[derive(Clone, Copy)]
pub struct CrossDecoderBlock<'a> {
    /// Self-attention.
    pub attn: LnSelfAttention<'a>,
    /// Cross-attention.
    pub cross: LnCrossAttention<'a>,
    /// MLP.
    pub mlp: LnMlp<'a>,
}
