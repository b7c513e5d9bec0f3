//! `ArchSpec`: everything about a model's architecture that the forward pass
//! needs, resolved once from GGUF metadata (keys as llama.cpp's
//! `llama-arch.cpp` names them, defaults as `llama-model.cpp` applies them),
//! so one forward pass serves every Llama-family variant.

use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::ops::glu::Activation;
use crate::ops::rms_norm::NormFlavor;
use crate::ops::rope::{RopeScaling, RopeStyle};

/// The architecture family a file belongs to (after alias resolution).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Llama 1/2/3, SmolLM, TinyLlama and other `llama` GGUFs.
    Llama,
    /// Mistral (Llama with a sliding window where set).
    Mistral,
    /// Qwen2 / Qwen2.5 (QKV bias).
    Qwen2,
    /// Qwen3 (per-head Q/K norm).
    Qwen3,
    /// Gemma 3 text.
    Gemma3,
    /// Phi-3 (fused QKV and gate/up).
    Phi3,
}

/// Attention kind of one layer.
///
/// ```
/// use combs::formats::gguf::GgufFile;
/// use combs::models::synth::{SynthConfig, synth_gguf};
/// use combs::quant::QuantType;
/// use combs::{LayerKind, ModelRegistry};
///
/// fn main() -> combs::Result<()> {
///     let mut cfg = SynthConfig::preset("tiny", QuantType::F32)?;
///     cfg.arch = "mistral".into();
///     cfg.sliding_window = 16;
///     let g = GgufFile::from_bytes(synth_gguf(&cfg)?.to_bytes())?;
///     let spec = ModelRegistry::new().resolve(&g)?;
///     assert_eq!(spec.layers[0], LayerKind::SlidingWindow { window: 16 });
///     assert_eq!(spec.window_of(0), 16);
///     Ok(())
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Causal attention over the whole context.
    Full,
    /// Causal attention over the last `window` positions.
    SlidingWindow {
        /// Positions visible, the current one included.
        window: usize,
    },
}

/// The resolved architecture of a model.
#[derive(Clone, Debug)]
pub struct ArchSpec {
    /// `general.architecture` as written in the file.
    pub arch: String,
    /// Resolved family.
    pub family: Family,
    /// Vocabulary size (rows of the token embedding).
    pub n_vocab: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Feed-forward inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Rope layout.
    pub rope_style: RopeStyle,
    /// Rope base of full-attention layers.
    pub rope_base: f32,
    /// Rope base of sliding-window layers (Gemma 3 uses a separate one).
    pub rope_base_local: f32,
    /// Frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Multiplier of rope's cos/sin.
    pub rope_attn_factor: f32,
    /// Context length the model was trained with.
    pub n_ctx_train: usize,
    /// RMS norm epsilon.
    pub norm_eps: f32,
    /// How norm weights apply.
    pub norm_flavor: NormFlavor,
    /// Per-layer attention kind.
    pub layers: Vec<LayerKind>,
    /// Biases on Q, K and V.
    pub qkv_bias: bool,
    /// RMS norm of each Q and K head before rope.
    pub qk_norm: bool,
    /// Norms after attention and after the FFN, before the residual add.
    pub post_norms: bool,
    /// Multiplier of token embeddings.
    pub embed_scale: f32,
    /// Gate activation of the FFN.
    pub activation: Activation,
    /// Multiplier of q·k.
    pub attn_scale: f32,
    /// Soft-cap of attention scores (0: none).
    pub attn_softcap: f32,
    /// Soft-cap of output logits (0: none).
    pub final_softcap: f32,
    /// Q, K and V come from one fused tensor.
    pub fused_qkv: bool,
    /// Gate and up come from one fused tensor.
    pub fused_gate_up: bool,
    /// The output head reuses the token embedding.
    pub tied_embeddings: bool,
}

fn key(arch: &str, suffix: &str) -> String {
    format!("{arch}.{suffix}")
}

fn usize_of(v: u64, k: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| ModelError::Metadata {
        key: k.to_string(),
        reason: format!("{v} is out of range"),
    })
}

fn positive(g: &GgufFile, k: &str) -> Result<usize> {
    let v = g.require_u64(k)?;
    if v == 0 || v > (1 << 31) {
        return Err(ModelError::Metadata {
            key: k.to_string(),
            reason: format!("{v} is out of range"),
        });
    }
    usize_of(v, k)
}

fn opt_usize(g: &GgufFile, k: &str) -> Result<Option<usize>> {
    g.get_u64(k)?.map(|v| usize_of(v, k)).transpose()
}

impl ArchSpec {
    /// Resolves the spec of `family` from the file's metadata and tensor table.
    ///
    /// # Errors
    /// Missing or out-of-range metadata, inconsistent head counts.
    pub fn from_gguf(g: &GgufFile, family: Family) -> Result<Self> {
        let arch = g.architecture()?.to_string();
        let a = arch.as_str();
        let n_embd = positive(g, &key(a, "embedding_length"))?;
        let n_layer = positive(g, &key(a, "block_count"))?;
        let n_ff = positive(g, &key(a, "feed_forward_length"))?;
        let n_head = positive(g, &key(a, "attention.head_count"))?;
        let n_head_kv = match opt_usize(g, &key(a, "attention.head_count_kv"))? {
            Some(0) | None => n_head,
            Some(v) => v,
        };
        if n_head % n_head_kv != 0 {
            return Err(ModelError::Metadata {
                key: key(a, "attention.head_count_kv"),
                reason: format!("{n_head_kv} KV heads do not divide {n_head} heads"),
            });
        }
        let head_dim = opt_usize(g, &key(a, "attention.key_length"))?.unwrap_or(n_embd / n_head);
        let n_rot = opt_usize(g, &key(a, "rope.dimension_count"))?.unwrap_or(head_dim);
        if head_dim == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::Metadata {
                key: key(a, "rope.dimension_count"),
                reason: format!("{n_rot} rotated dims with head dim {head_dim}"),
            });
        }
        let tok = g
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor {
                name: "token_embd.weight".into(),
            })?;
        let n_vocab = tok.dims.get(1).copied().unwrap_or(0) as usize;
        if n_vocab == 0 {
            return Err(ModelError::Shape {
                tensor: "token_embd.weight".into(),
                expected: vec![n_embd as u64, 1],
                got: tok.dims.clone(),
            });
        }
        let rope_base = g.get_f32(&key(a, "rope.freq_base"))?.unwrap_or(10000.0);
        let n_ctx_train = opt_usize(g, &key(a, "context_length"))?.unwrap_or(2048);
        let norm_eps = g
            .get_f32(&key(a, "attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        let rope_scaling = Self::rope_scaling(g, a, n_rot, n_ctx_train)?;
        // LongRoPE's (and YaRN's) magnitude correction of cos/sin; llama.cpp
        // reads it for every architecture.
        let attn_factor_key = key(a, "rope.scaling.attn_factor");
        let rope_attn_factor = g.get_f32(&attn_factor_key)?.unwrap_or(1.0);
        if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
            return Err(ModelError::Metadata {
                key: attn_factor_key,
                reason: format!("{rope_attn_factor} is not a positive number"),
            });
        }
        let window = opt_usize(g, &key(a, "attention.sliding_window"))?.unwrap_or(0);
        let tied_embeddings = g.tensor("output.weight").is_none();

        let mut spec = ArchSpec {
            arch: arch.clone(),
            family,
            n_vocab,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_style: RopeStyle::Normal,
            rope_base,
            rope_base_local: rope_base,
            rope_scaling,
            rope_attn_factor,
            n_ctx_train,
            norm_eps,
            norm_flavor: NormFlavor::Plain,
            layers: vec![LayerKind::Full; n_layer],
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embed_scale: 1.0,
            activation: Activation::Silu,
            // llama.cpp's `attention.scale` where the file states one (the
            // HF path writes Gemma 3's `query_pre_attn_scalar` there)
            attn_scale: g
                .get_f32(&key(a, "attention.scale"))?
                .unwrap_or(1.0 / (head_dim as f32).sqrt()),
            attn_softcap: g.get_f32(&key(a, "attn_logit_softcapping"))?.unwrap_or(0.0),
            final_softcap: g
                .get_f32(&key(a, "final_logit_softcapping"))?
                .unwrap_or(0.0),
            fused_qkv: false,
            fused_gate_up: false,
            tied_embeddings,
        };
        match family {
            Family::Llama => {}
            Family::Mistral => {
                if window > 0 {
                    spec.layers = vec![LayerKind::SlidingWindow { window }; n_layer];
                }
            }
            Family::Qwen2 => {
                spec.rope_style = RopeStyle::Neox;
                spec.qkv_bias = true;
            }
            Family::Qwen3 => {
                spec.rope_style = RopeStyle::Neox;
                spec.qk_norm = true;
            }
            Family::Phi3 => {
                spec.rope_style = RopeStyle::Neox;
                spec.fused_qkv = g.tensor("blk.0.attn_qkv.weight").is_some();
                spec.fused_gate_up = g.tensor("blk.0.ffn_gate.weight").is_none();
                // transformers applies `sliding_window` on every layer
                // (Phi-3-mini-4k: 2047); llama.cpp currently ignores it for
                // phi3 and attends to the full context. A window past the
                // trained context (Phi-3.5: 262144) is full attention.
                if window > 0 && window < n_ctx_train {
                    spec.layers = vec![LayerKind::SlidingWindow { window }; n_layer];
                }
            }
            Family::Gemma3 => {
                spec.rope_style = RopeStyle::Neox;
                spec.qk_norm = true;
                spec.post_norms = true;
                spec.embed_scale = (n_embd as f32).sqrt();
                spec.activation = Activation::GeluTanh;
                spec.norm_eps = g
                    .get_f32(&key(a, "attention.layer_norm_rms_epsilon"))?
                    .unwrap_or(1e-6);
                // Every sixth layer is global; the rest slide (llama.cpp: swa pattern 6).
                let pattern = 6;
                let window = if window == 0 { 4096 } else { window };
                spec.layers = (0..n_layer)
                    .map(|il| {
                        if (il + 1) % pattern == 0 {
                            LayerKind::Full
                        } else {
                            LayerKind::SlidingWindow { window }
                        }
                    })
                    .collect();
                spec.rope_base_local = g.get_f32(&key(a, "rope.freq_base_swa"))?.unwrap_or(10000.0);
                // Scaling applies to the global layers only.
            }
        }
        Ok(spec)
    }

    /// Per-pair rope factors stored as the f32 tensor `name`, if the file has it.
    fn rope_factors(g: &GgufFile, name: &str, n_rot: usize) -> Result<Option<Vec<f32>>> {
        let Some(t) = g.tensor(name) else {
            return Ok(None);
        };
        let data = g.tensor_data(t);
        if t.qtype != Some(crate::quant::QuantType::F32) || data.len() != 4 * (n_rot / 2) {
            return Err(ModelError::Shape {
                tensor: name.into(),
                expected: vec![(n_rot / 2) as u64],
                got: t.dims.clone(),
            });
        }
        let ff: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if let Some(bad) = ff.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(ModelError::Metadata {
                key: name.into(),
                reason: format!("rope factor {bad} is not a positive number"),
            });
        }
        Ok(Some(ff))
    }

    fn rope_scaling(
        g: &GgufFile,
        a: &str,
        n_rot: usize,
        n_ctx_train: usize,
    ) -> Result<RopeScaling> {
        if let Some(ff) = Self::rope_factors(g, "rope_freqs.weight", n_rot)? {
            return Ok(RopeScaling::FreqFactors(ff));
        }
        // LongRoPE as llama.cpp's converter writes it (Phi-3): both factor
        // sets as global tensors, the original context in metadata.
        let short = Self::rope_factors(g, "rope_factors_short.weight", n_rot)?;
        let long = Self::rope_factors(g, "rope_factors_long.weight", n_rot)?;
        match (short, long) {
            (Some(short), Some(long)) => {
                let n_ctx_orig = opt_usize(g, &key(a, "rope.scaling.original_context_length"))?
                    .unwrap_or(n_ctx_train);
                return Ok(RopeScaling::LongRope {
                    short,
                    long,
                    n_ctx_orig,
                });
            }
            (Some(_), None) | (None, Some(_)) => {
                let missing = if g.tensor("rope_factors_short.weight").is_none() {
                    "rope_factors_short.weight"
                } else {
                    "rope_factors_long.weight"
                };
                return Err(ModelError::MissingTensor {
                    name: missing.into(),
                });
            }
            (None, None) => {}
        }
        let kind = g.get_str(&key(a, "rope.scaling.type"))?.unwrap_or("none");
        let factor = g.get_f32(&key(a, "rope.scaling.factor"))?.unwrap_or(1.0);
        match kind {
            "none" | "" => Ok(RopeScaling::None),
            "linear" if factor > 0.0 && factor != 1.0 => Ok(RopeScaling::Linear { factor }),
            "linear" => Ok(RopeScaling::None),
            other => Err(ModelError::Metadata {
                key: key(a, "rope.scaling.type"),
                reason: format!("rope scaling `{other}` is not supported yet"),
            }),
        }
    }

    /// Rope base of layer `il`.
    pub fn rope_base_of(&self, il: usize) -> f32 {
        match self.layers.get(il) {
            Some(LayerKind::SlidingWindow { .. }) if self.family == Family::Gemma3 => {
                self.rope_base_local
            }
            _ => self.rope_base,
        }
    }

    /// Sliding window of layer `il` (0 for full attention).
    pub fn window_of(&self, il: usize) -> usize {
        match self.layers.get(il) {
            Some(LayerKind::SlidingWindow { window }) => *window,
            _ => 0,
        }
    }

    /// Floats of Q per token.
    pub fn n_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Floats of K (or V) per token.
    pub fn n_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
