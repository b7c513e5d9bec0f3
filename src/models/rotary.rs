//! `RotaryEmbedding`: the rotary position embedding of one layer of an
//! `ArchSpec` as tables a caller can read (per-pair inverse frequencies,
//! cos/sin at given positions) and apply on the CPU. The reference forward
//! (`reference.rs`) rotates its queries and keys through it; the GPU model
//! uploads the same inverse frequencies ([`crate::ops::rope::inv_freq`]) for
//! the rope kernel. The arithmetic is `ops::rope`'s reference (llama.cpp
//! `ggml_rope_ext`: f64 angles, pairs adjacent or split in halves).

use super::spec::{ArchSpec, Family, LayerKind};
use crate::error::{ModelError, Result};
use crate::ops::rope::{RopeScaling, RopeStyle, inv_freq, rope_angles, rope_apply};

/// The cos/sin tables of one layer's rope settings: which dimensions pair
/// up, how many rotate, each pair's inverse frequency (base, frequency
/// factors and linear scaling folded in) and the magnitude factor.
///
/// ```
/// use combs::RotaryEmbedding;
/// use combs::ops::rope::{RopeScaling, RopeStyle};
///
/// # fn main() -> combs::Result<()> {
/// let rope = RotaryEmbedding::new(RopeStyle::Neox, 8, 10000.0, &RopeScaling::None, 1.0);
/// let (cos, sin) = rope.cos_sin(&[0, 5]); // [2 positions, 4 pairs] each
/// assert_eq!((cos.len(), sin.len()), (8, 8));
/// assert_eq!((cos[0], sin[0]), (1.0, 0.0)); // position 0 does not rotate
/// assert!((cos[4] - 5f32.cos()).abs() < 1e-6); // pair 0 turns one radian per position
///
/// let mut head: Vec<f32> = (0..8).map(|i| i as f32).collect();
/// let before: f32 = head.iter().map(|v| v * v).sum();
/// rope.apply(&mut head, 5)?;
/// let after: f32 = head.iter().map(|v| v * v).sum();
/// assert!((before - after).abs() < 1e-3 * before); // a rotation keeps the norm
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct RotaryEmbedding {
    style: RopeStyle,
    n_rot: usize,
    inv_freq: Vec<f32>,
    attn_factor: f32,
}

impl RotaryEmbedding {
    /// The rope rotating the first `n_rot` dimensions of each head in
    /// `style`'s pairs, at base `base` scaled by `scaling` (LongRoPE reads as
    /// its short factors here: resolve it with [`RopeScaling::for_context`]
    /// first), cos and sin multiplied by `attn_factor`.
    pub fn new(
        style: RopeStyle,
        n_rot: usize,
        base: f32,
        scaling: &RopeScaling,
        attn_factor: f32,
    ) -> Self {
        RotaryEmbedding {
            style,
            n_rot,
            inv_freq: inv_freq(n_rot, base, scaling),
            attn_factor,
        }
    }

    /// The rope of layer `il` of `spec` in a context of `n_ctx` positions:
    /// Gemma 3's sliding-window layers take the local base without
    /// scaling, every other layer the global base and the spec's scaling
    /// (LongRoPE's factor set picked by `n_ctx`).
    ///
    /// ```
    /// use combs::formats::gguf::GgufFile;
    /// use combs::models::synth::{SynthConfig, synth_gguf};
    /// use combs::quant::QuantType;
    /// use combs::{ModelRegistry, RotaryEmbedding};
    ///
    /// fn main() -> combs::Result<()> {
    ///     let cfg = SynthConfig::preset("tiny", QuantType::F32)?;
    ///     let g = GgufFile::from_bytes(synth_gguf(&cfg)?.to_bytes())?;
    ///     let spec = ModelRegistry::new().resolve(&g)?;
    ///     let rope = RotaryEmbedding::for_layer(&spec, 0, 256);
    ///     assert_eq!(rope.n_rot(), spec.n_rot);
    ///     assert_eq!(rope.inv_freq().len(), spec.n_rot / 2);
    ///     Ok(())
    /// }
    /// ```
    pub fn for_layer(spec: &ArchSpec, il: usize, n_ctx: usize) -> Self {
        let local = spec.family == Family::Gemma3
            && matches!(spec.layers.get(il), Some(LayerKind::SlidingWindow { .. }));
        let (base, scaling) = if local {
            (spec.rope_base_local, RopeScaling::None)
        } else {
            (spec.rope_base, spec.rope_scaling.for_context(n_ctx))
        };
        Self::new(
            spec.rope_style,
            spec.n_rot,
            base,
            &scaling,
            spec.rope_attn_factor,
        )
    }

    /// Which dimensions form pairs.
    pub fn style(&self) -> RopeStyle {
        self.style
    }

    /// Rotated dimensions per head.
    pub fn n_rot(&self) -> usize {
        self.n_rot
    }

    /// Inverse frequency of each pair (`n_rot / 2`), what the GPU kernel reads.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Multiplier of cos and sin.
    pub fn attn_factor(&self) -> f32 {
        self.attn_factor
    }

    /// The cos and sin tables at `positions`: `[positions.len(), n_rot / 2]`
    /// each, row-major, the magnitude factor folded in (as transformers'
    /// rotary embeddings return them, one value per pair rather than
    /// repeated over the pair's two dimensions).
    pub fn cos_sin(&self, positions: &[i32]) -> (Vec<f32>, Vec<f32>) {
        let af = f64::from(self.attn_factor);
        let half = self.n_rot / 2;
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for (s, c) in rope_angles(p, &self.inv_freq, self.n_rot) {
                cos.push((c * af) as f32);
                sin.push((s * af) as f32);
            }
        }
        (cos, sin)
    }

    /// Rotates one head (at least `n_rot` floats) in place to position `pos`.
    ///
    /// # Errors
    /// A head shorter than the rotated dimensions.
    pub fn apply(&self, head: &mut [f32], pos: i32) -> Result<()> {
        let n = head.len();
        self.apply_heads(head, n, pos)
    }

    /// Rotates every `head_dim`-wide head of `heads` in place to position
    /// `pos` (the angles computed once for all of them).
    ///
    /// # Errors
    /// `head_dim` below the rotated dimensions or not dividing `heads`.
    pub fn apply_heads(&self, heads: &mut [f32], head_dim: usize, pos: i32) -> Result<()> {
        if head_dim < self.n_rot || head_dim == 0 || !heads.len().is_multiple_of(head_dim) {
            return Err(ModelError::invalid(
                "rope",
                format!(
                    "heads of {head_dim} over {} floats, {} rotated dimensions",
                    heads.len(),
                    self.n_rot
                ),
            ));
        }
        let angles = rope_angles(pos, &self.inv_freq, self.n_rot);
        for h in heads.chunks_mut(head_dim) {
            rope_apply(h, &angles, self.style, self.attn_factor);
        }
        Ok(())
    }
}
