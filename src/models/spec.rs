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

// Upper bounds past which a value is taken for corruption rather than a
// model: each is well above every released model (Llama 3.1 405B: 126
// blocks, 128 heads, n_embd 16384, n_ff 53248; Gemma 3: 262144 tokens;
// contexts of 1-2 M positions) and well below where sizes derived
// from it overflow or allocate absurdly.
/// Most transformer blocks a file may declare.
pub const MAX_BLOCKS: usize = 4096;
/// Most attention heads (query or KV) a file may declare.
pub const MAX_HEADS: usize = 4096;
/// Largest head dimension: the attention kernels' limit (Gemma's 256 is the
/// largest of the supported families), so a file that no kernel could run
/// is refused at load rather than at its first attention call.
pub const MAX_HEAD_DIM: usize = crate::ops::attention::MAX_HEAD_DIM;
/// Largest hidden size.
pub const MAX_EMBD: usize = 1 << 17;
/// Largest feed-forward size.
pub const MAX_FF: usize = 1 << 20;
/// Largest trained context (and sliding window).
pub const MAX_CTX: usize = 1 << 24;
/// Largest vocabulary.
pub const MAX_VOCAB: usize = 1 << 24;

fn out_of_range(k: &str, reason: String) -> ModelError {
    ModelError::Metadata {
        key: k.to_string(),
        reason,
    }
}

/// Required key `k` in `1..=max`.
fn bounded(g: &GgufFile, k: &str, max: usize) -> Result<usize> {
    let v = g.require_u64(k)?;
    if v == 0 || v > max as u64 {
        return Err(out_of_range(k, format!("{v} is out of range 1..={max}")));
    }
    usize_of(v, k)
}

/// Optional key `k`: absent, or in `1..=max`.
fn opt_bounded(g: &GgufFile, k: &str, max: usize) -> Result<Option<usize>> {
    match g.get_u64(k)? {
        None => Ok(None),
        Some(v) if v == 0 || v > max as u64 => {
            Err(out_of_range(k, format!("{v} is out of range 1..={max}")))
        }
        Some(v) => usize_of(v, k).map(Some),
    }
}

/// Optional float `k` (else `default`) that must be finite and positive
/// (rope bases and scaling factors: a zero or NaN base turns every rotated
/// value into NaN).
fn opt_positive_f32(g: &GgufFile, k: &str, default: f32) -> Result<f32> {
    let v = g.get_f32(k)?.unwrap_or(default);
    if !(v.is_finite() && v > 0.0) {
        return Err(out_of_range(k, format!("{v} is not a positive number")));
    }
    Ok(v)
}

/// Optional float `k` (else `default`) that must be finite and not negative.
/// Norm epsilons may be 0: the norm is still defined for every row that is
/// not all zeros, and `synth::exact_gguf` relies on it for exact logits.
fn opt_non_negative_f32(g: &GgufFile, k: &str, default: f32) -> Result<f32> {
    let v = g.get_f32(k)?.unwrap_or(default);
    if !(v.is_finite() && v >= 0.0) {
        return Err(out_of_range(k, format!("{v} is not a non-negative number")));
    }
    Ok(v)
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
        let n_embd = bounded(g, &key(a, "embedding_length"), MAX_EMBD)?;
        let n_layer = bounded(g, &key(a, "block_count"), MAX_BLOCKS)?;
        let n_ff = bounded(g, &key(a, "feed_forward_length"), MAX_FF)?;
        let head_count_key = key(a, "attention.head_count");
        let n_head = bounded(g, &head_count_key, MAX_HEADS)?;
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
        let key_length_key = key(a, "attention.key_length");
        let head_dim = match opt_bounded(g, &key_length_key, MAX_HEAD_DIM)? {
            Some(d) => d,
            // Without an explicit head size the heads split the hidden state.
            None if n_embd % n_head != 0 || n_embd / n_head > MAX_HEAD_DIM => {
                return Err(out_of_range(
                    &head_count_key,
                    format!(
                        "{n_head} heads do not split n_embd {n_embd} into heads of at most {MAX_HEAD_DIM}"
                    ),
                ));
            }
            None => n_embd / n_head,
        };
        // Rope rotates pairs and the attention kernels read heads as vec2s.
        if head_dim % 2 != 0 {
            return Err(out_of_range(
                &key_length_key,
                format!("head dim {head_dim} is odd"),
            ));
        }
        // One head size serves K and V throughout the forward pass.
        let value_length_key = key(a, "attention.value_length");
        if let Some(v) = opt_usize(g, &value_length_key)?
            && v != head_dim
        {
            return Err(out_of_range(
                &value_length_key,
                format!("{v} differs from the key head dim {head_dim}"),
            ));
        }
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
        let n_vocab = tok.dims.get(1).copied().unwrap_or(0);
        if n_vocab == 0 || n_vocab > MAX_VOCAB as u64 || tok.dims[0] != n_embd as u64 {
            return Err(ModelError::Shape {
                tensor: "token_embd.weight".into(),
                expected: vec![n_embd as u64, n_vocab.clamp(1, MAX_VOCAB as u64)],
                got: tok.dims.clone(),
            });
        }
        let n_vocab = n_vocab as usize;
        // A stated vocabulary larger than the embedding names ids the model
        // cannot embed (a smaller one is the padded-embedding case).
        let vocab_size_key = key(a, "vocab_size");
        if let Some(v) = g.get_u64(&vocab_size_key)?
            && v > n_vocab as u64
        {
            return Err(out_of_range(
                &vocab_size_key,
                format!("{v} tokens but token_embd.weight has {n_vocab} rows"),
            ));
        }
        let rope_base = opt_positive_f32(g, &key(a, "rope.freq_base"), 10000.0)?;
        let n_ctx_train = opt_bounded(g, &key(a, "context_length"), MAX_CTX)?.unwrap_or(2048);
        let eps_key = key(a, "attention.layer_norm_rms_epsilon");
        let norm_eps = opt_non_negative_f32(g, &eps_key, 1e-5)?;
        let rope_scaling = Self::rope_scaling(g, a, n_rot, n_ctx_train)?;
        // LongRoPE's (and YaRN's) magnitude correction of cos/sin; llama.cpp
        // reads it for every architecture.
        let rope_attn_factor = opt_positive_f32(g, &key(a, "rope.scaling.attn_factor"), 1.0)?;
        let window = match opt_usize(g, &key(a, "attention.sliding_window"))? {
            Some(w) if w > MAX_CTX => {
                return Err(out_of_range(
                    &key(a, "attention.sliding_window"),
                    format!("{w} is out of range 0..={MAX_CTX}"),
                ));
            }
            w => w.unwrap_or(0),
        };
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
            attn_scale: opt_positive_f32(
                g,
                &key(a, "attention.scale"),
                1.0 / (head_dim as f32).sqrt(),
            )?,
            attn_softcap: opt_non_negative_f32(g, &key(a, "attn_logit_softcapping"), 0.0)?,
            final_softcap: opt_non_negative_f32(g, &key(a, "final_logit_softcapping"), 0.0)?,
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
                spec.norm_eps = opt_non_negative_f32(g, &eps_key, 1e-6)?;
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
                spec.rope_base_local = opt_positive_f32(g, &key(a, "rope.freq_base_swa"), 10000.0)?;
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
        if t.qtype != Some(crate::quant::QuantType::F32) {
            return Err(ModelError::UnsupportedTensorType {
                tensor: name.into(),
                ggml_type: format!("{} (rope factors must be F32)", t.type_name()),
            });
        }
        let data = g.tensor_data(t);
        if data.len() != 4 * (n_rot / 2) {
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
                let n_ctx_orig =
                    opt_bounded(g, &key(a, "rope.scaling.original_context_length"), MAX_CTX)?
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
        let factor = opt_positive_f32(g, &key(a, "rope.scaling.factor"), 1.0)?;
        match kind {
            "none" | "" => Ok(RopeScaling::None),
            "linear" if factor != 1.0 => Ok(RopeScaling::Linear { factor }),
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
