//! What a model asks the planner to compute: a decoder block of the Llama
//! family and its relatives, and the output head. Only weights and
//! settings — no kernel, view or fusion appears here; the planner decides
//! those ([`super::Forward`]).

use std::sync::Arc;

use crate::gpu::Buffer;
use crate::ops::glu::Activation;
use crate::ops::linear::Linear;
use crate::ops::rms_norm::NormWeight;
use crate::ops::rope::RopeStyle;

/// The attention projections: separate Q/K/V, or one weight whose rows are
/// Q's, then K's, then V's.
#[derive(Clone, Copy)]
pub enum Qkv<'a> {
    /// Three weights.
    Separate {
        /// Queries.
        q: &'a Linear,
        /// Keys.
        k: &'a Linear,
        /// Values.
        v: &'a Linear,
    },
    /// One weight, Q then K then V rows.
    Stacked(&'a Linear),
}

/// The FFN's input projections and the gate's activation.
#[derive(Clone, Copy)]
pub enum Ffn<'a> {
    /// Separate gate and up weights.
    Separate {
        /// The gate.
        gate: &'a Linear,
        /// The up projection.
        up: &'a Linear,
        /// The gate's activation.
        act: Activation,
    },
    /// One weight: gate rows, then up rows.
    Stacked {
        /// Gate then up.
        gate_up: &'a Linear,
        /// The gate's activation.
        act: Activation,
    },
    /// One weight whose rows alternate gate, up (what lets a product fold
    /// the activation into its stores).
    Interleaved {
        /// Gate and up, alternating.
        gate_up: &'a Linear,
        /// The gate's activation.
        act: Activation,
    },
}

impl<'a> Qkv<'a> {
    /// The weights reading the attention norm's output.
    pub fn weights(&self) -> Vec<&'a Linear> {
        match *self {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Stacked(w) => vec![w],
        }
    }
}

impl<'a> Ffn<'a> {
    /// The weights reading the FFN norm's output.
    pub fn weights(&self) -> Vec<&'a Linear> {
        match *self {
            Ffn::Separate { gate, up, .. } => vec![gate, up],
            Ffn::Stacked { gate_up, .. } | Ffn::Interleaved { gate_up, .. } => vec![gate_up],
        }
    }
}

/// Per-head RMS norms of the queries and keys (Qwen3, Gemma 3).
#[derive(Clone, Copy)]
pub struct QkNorm<'a> {
    /// The queries' norm, `head_dim` weights.
    pub q: NormWeight<'a>,
    /// The keys' norm.
    pub k: NormWeight<'a>,
}

/// The rope of a block's queries and keys (the positions come from the call).
#[derive(Clone, Copy)]
pub struct RopeSpec<'a> {
    /// Which dimensions pair.
    pub style: RopeStyle,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Inverse frequencies, `n_rot / 2` f32.
    pub inv_freq: &'a Arc<Buffer>,
    /// Multiplier of cos and sin.
    pub attn_factor: f32,
}

/// A block's self-attention over its KV cache.
#[derive(Clone, Copy, Debug)]
pub struct AttentionSpec {
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Multiplier of q·k.
    pub scale: f32,
    /// Soft-cap of the scores (0: none).
    pub softcap: f32,
    /// Sliding window (0: full causal).
    pub window: usize,
}

/// A pre-norm decoder block: `x += attn_out(attention(rope(qkv(norm(x)))))`
/// (post-normed where `post_attn_norm` is set), then
/// `x += ffn_out(act(gate) * up)` of `norm(x)` likewise.
#[derive(Clone, Copy)]
pub struct DecoderBlock<'a> {
    /// The norm before attention.
    pub attn_norm: NormWeight<'a>,
    /// The attention projections.
    pub qkv: Qkv<'a>,
    /// Per-head norms of queries and keys, before the rope.
    pub qk_norm: Option<QkNorm<'a>>,
    /// The rope.
    pub rope: RopeSpec<'a>,
    /// The attention.
    pub attention: AttentionSpec,
    /// The output projection.
    pub attn_out: &'a Linear,
    /// A norm of the output projection's result before the residual add.
    pub post_attn_norm: Option<NormWeight<'a>>,
    /// The norm before the FFN.
    pub ffn_norm: NormWeight<'a>,
    /// The FFN's input projections.
    pub ffn: Ffn<'a>,
    /// The FFN's output projection.
    pub ffn_out: &'a Linear,
    /// A norm of the FFN's result before the residual add.
    pub post_ffn_norm: Option<NormWeight<'a>>,
}

/// The output head: final norm, projection to the vocabulary, soft-cap.
#[derive(Clone, Copy)]
pub struct OutputHead<'a> {
    /// The final norm.
    pub norm: NormWeight<'a>,
    /// The projection (`[n_vocab, n_embd]`).
    pub weight: &'a Linear,
    /// `cap * tanh(logit / cap)` where positive.
    pub softcap: f32,
}
