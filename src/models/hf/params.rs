//! `config.json` → the `{arch}.*` GGUF hyperparameters llama.cpp's converter
//! writes (`TextModel.set_gguf_parameters` and the families' overrides),
//! read from either spelling transformers uses: top-level `rope_theta` /
//! `rope_scaling` (4.x) or `rope_parameters` (5.x, per layer type for
//! Gemma 3).

use serde_json::Value;

use super::gguf_arch;
use super::names::{Kind, Role};
use crate::error::Result;
use crate::formats::gguf::MetaValue;
use crate::formats::hf::{HfDir, key_err};
use crate::models::spec::Family;

/// The hyperparameters of a directory, resolved.
#[derive(Clone, Debug)]
pub struct HfParams {
    /// GGUF architecture name.
    pub arch: &'static str,
    /// Family.
    pub family: Family,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// FFN inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Floats per head.
    pub head_dim: usize,
    /// Added to every norm weight (Gemma 3: 1).
    pub norm_shift: f32,
    meta: Vec<(String, MetaValue)>,
    extra: Vec<(String, Vec<f32>)>,
}

struct Cfg<'a> {
    v: &'a Value,
    path: std::path::PathBuf,
}

impl Cfg<'_> {
    fn get(&self, k: &str) -> Option<&Value> {
        self.v.get(k).filter(|v| !v.is_null())
    }
    fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&n| n > 0 && n <= 1 << 31)
                .map(|n| Some(n as usize))
                .ok_or_else(|| key_err(&self.path, k, format!("{v} is not a positive integer"))),
        }
    }
    fn usize_req(&self, k: &str) -> Result<usize> {
        self.usize_opt(k)?
            .ok_or_else(|| key_err(&self.path, k, "missing"))
    }
    fn f64_opt(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| key_err(&self.path, k, format!("{v} is not a number"))),
        }
    }
}

impl HfParams {
    /// Reads `dir`'s `config.json` as a model of `family`.
    ///
    /// # Errors
    /// Missing or out-of-range keys, head counts that do not divide,
    /// unsupported rope scaling; each naming `config.json` and the key.
    pub fn from_config(dir: &HfDir, family: Family) -> Result<Self> {
        let c = Cfg {
            v: dir.config(),
            path: dir.config_path(),
        };
        let arch = gguf_arch(family);
        let n_embd = c.usize_req("hidden_size")?;
        let n_layer = c.usize_req("num_hidden_layers")?;
        let n_ff = c.usize_req("intermediate_size")?;
        let n_head = c.usize_req("num_attention_heads")?;
        let n_head_kv = c.usize_opt("num_key_value_heads")?.unwrap_or(n_head);
        if n_head % n_head_kv != 0 {
            return Err(key_err(
                &c.path,
                "num_key_value_heads",
                format!("{n_head_kv} KV heads do not divide {n_head} heads"),
            ));
        }
        let head_dim = c.usize_opt("head_dim")?.unwrap_or(n_embd / n_head);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(key_err(
                &c.path,
                "head_dim",
                format!("{head_dim} is not even"),
            ));
        }
        // rope settings: rope_parameters (transformers 5; per layer type for
        // Gemma 3) or rope_theta / rope_scaling (4.x)
        let rope_params = c.get("rope_parameters");
        let rope_global = rope_params
            .and_then(|r| r.get("full_attention"))
            .or(rope_params);
        let rope_theta = rope_global
            .and_then(|r| r.get("rope_theta"))
            .and_then(Value::as_f64)
            .or(c.f64_opt("rope_theta")?)
            .unwrap_or(if family == Family::Gemma3 { 1e6 } else { 1e4 });
        let scaling = c.get("rope_scaling").or(rope_global);
        let partial = scaling
            .and_then(|r| r.get("partial_rotary_factor"))
            .and_then(Value::as_f64)
            .or(c.f64_opt("partial_rotary_factor")?)
            .unwrap_or(1.0);
        // as the converter: Phi-3 from the hidden size, the others per head
        let n_rot = if family == Family::Phi3 {
            (partial * n_embd as f64) as usize / n_head
        } else {
            (partial * head_dim as f64) as usize
        };
        if n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(key_err(
                &c.path,
                "partial_rotary_factor",
                format!("{n_rot} rotated dims with head dim {head_dim}"),
            ));
        }
        let n_ctx = c.usize_opt("max_position_embeddings")?.unwrap_or(2048);
        let k = |s: &str| format!("{arch}.{s}");
        let mut meta: Vec<(String, MetaValue)> = vec![
            ("general.architecture".into(), MetaValue::from(arch)),
            (k("context_length"), MetaValue::U32(n_ctx as u32)),
            (k("embedding_length"), MetaValue::U32(n_embd as u32)),
            (k("block_count"), MetaValue::U32(n_layer as u32)),
            (k("feed_forward_length"), MetaValue::U32(n_ff as u32)),
            (k("attention.head_count"), MetaValue::U32(n_head as u32)),
            (
                k("attention.head_count_kv"),
                MetaValue::U32(n_head_kv as u32),
            ),
            (k("attention.key_length"), MetaValue::U32(head_dim as u32)),
            (k("attention.value_length"), MetaValue::U32(head_dim as u32)),
            (k("rope.dimension_count"), MetaValue::U32(n_rot as u32)),
            (k("rope.freq_base"), MetaValue::F32(rope_theta as f32)),
        ];
        let eps_default = if family == Family::Gemma3 { 1e-6 } else { 1e-5 };
        let eps = c.f64_opt("rms_norm_eps")?.unwrap_or(eps_default);
        meta.push((
            k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(eps as f32),
        ));
        let window = match family {
            // Qwen2 configs carry a window they do not use
            // (`use_sliding_window: false`); so does the converter.
            Family::Qwen2 | Family::Qwen3 | Family::Llama => None,
            _ => c.usize_opt("sliding_window")?,
        };
        if let Some(wnd) = window {
            meta.push((k("attention.sliding_window"), MetaValue::U32(wnd as u32)));
        }
        let mut extra = Vec::new();
        if family == Family::Gemma3 {
            if let Some(s) = c.f64_opt("query_pre_attn_scalar")? {
                meta.push((
                    k("attention.scale"),
                    MetaValue::F32((1.0 / s.sqrt()) as f32),
                ));
            }
            let local = rope_params
                .and_then(|r| r.get("sliding_attention"))
                .and_then(|r| r.get("rope_theta"))
                .and_then(Value::as_f64)
                .or(c.f64_opt("rope_local_base_freq")?);
            if let Some(b) = local {
                meta.push((k("rope.freq_base_swa"), MetaValue::F32(b as f32)));
            }
            if let Some(cap) = c.f64_opt("final_logit_softcapping")? {
                meta.push((k("final_logit_softcapping"), MetaValue::F32(cap as f32)));
            }
            if c.f64_opt("attn_logit_softcapping")?.is_some() {
                return Err(key_err(
                    &c.path,
                    "attn_logit_softcapping",
                    "not used by Gemma 3",
                ));
            }
        }
        rope_scaling(
            &c, scaling, family, n_rot, n_ctx, rope_theta, &mut meta, &mut extra,
        )?;
        Ok(HfParams {
            arch,
            family,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            norm_shift: if family == Family::Gemma3 { 1.0 } else { 0.0 },
            meta,
            extra,
        })
    }

    /// The `{arch}.*` and `general.architecture` metadata.
    pub fn metadata(&self) -> Vec<(String, MetaValue)> {
        self.meta.clone()
    }

    /// F32 tensors the converter derives from the config (rope factors).
    pub fn extra_tensors(&self) -> Vec<(String, Vec<f32>)> {
        self.extra.clone()
    }

    /// The shape (PyTorch order) a tensor of this role must have; `None`
    /// where any size goes (the vocabulary).
    pub(crate) fn expected_shape(&self, role: &Role) -> Vec<Option<usize>> {
        let (e, ff) = (self.n_embd, self.n_ff);
        let (q, kv) = (self.n_head * self.head_dim, self.n_head_kv * self.head_dim);
        match role.kind {
            Kind::Embd | Kind::Output => vec![None, Some(e)],
            Kind::Q => vec![Some(q), Some(e)],
            Kind::K | Kind::V => vec![Some(kv), Some(e)],
            Kind::O => vec![Some(e), Some(q)],
            Kind::QBias => vec![Some(q)],
            Kind::KBias | Kind::VBias => vec![Some(kv)],
            Kind::Qkv => vec![Some(q + 2 * kv), Some(e)],
            Kind::HeadNorm => vec![Some(self.head_dim)],
            Kind::Norm => vec![Some(e)],
            Kind::GateOrUp => vec![Some(ff), Some(e)],
            Kind::GateUp => vec![Some(2 * ff), Some(e)],
            Kind::Down => vec![Some(e), Some(ff)],
        }
    }

    /// The heads whose rows [`super::names::permute_rows`] reorders for
    /// this role: Q and K weights of the families with GGUF's interleaved
    /// rope (Llama, Mistral).
    pub(crate) fn permute_heads(&self, role: &Role) -> Option<usize> {
        if !matches!(self.family, Family::Llama | Family::Mistral) {
            return None;
        }
        match role.kind {
            Kind::Q => Some(self.n_head),
            Kind::K => Some(self.n_head_kv),
            _ => None,
        }
    }
}

/// Rope scaling as the converter writes it: `linear` as metadata, `llama3`
/// as per-pair frequency factors (`rope_freqs.weight`), `longrope` / `su`
/// as the short and long factors with LongRoPE's attention factor.
#[allow(clippy::too_many_arguments)]
fn rope_scaling(
    c: &Cfg<'_>,
    scaling: Option<&Value>,
    family: Family,
    n_rot: usize,
    n_ctx: usize,
    theta: f64,
    meta: &mut Vec<(String, MetaValue)>,
    extra: &mut Vec<(String, Vec<f32>)>,
) -> Result<()> {
    let arch = gguf_arch(family);
    let Some(s) = scaling else {
        return Ok(());
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    let factors = |k: &str| -> Result<Vec<f32>> {
        let list = s
            .get(k)
            .and_then(Value::as_array)
            .ok_or_else(|| key_err(&c.path, &format!("rope_scaling.{k}"), "missing"))?;
        let v: Vec<f32> = list
            .iter()
            .filter_map(Value::as_f64)
            .map(|x| x as f32)
            .collect();
        if v.len() != list.len() || v.len() != n_rot / 2 {
            return Err(key_err(
                &c.path,
                &format!("rope_scaling.{k}"),
                format!("{} factors, expected {}", list.len(), n_rot / 2),
            ));
        }
        Ok(v)
    };
    match kind {
        "default" => {}
        "linear" => {
            let f = num("factor").unwrap_or(1.0);
            meta.push((
                format!("{arch}.rope.scaling.type"),
                MetaValue::from("linear"),
            ));
            meta.push((
                format!("{arch}.rope.scaling.factor"),
                MetaValue::F32(f as f32),
            ));
        }
        "llama3" => {
            let factor = num("factor").unwrap_or(8.0);
            let low = num("low_freq_factor").unwrap_or(1.0);
            let high = num("high_freq_factor").unwrap_or(4.0);
            let old = num("original_max_position_embeddings").unwrap_or(8192.0);
            let (low_wl, high_wl) = (old / low, old / high);
            let ff = (0..n_rot / 2)
                .map(|i| {
                    let freq = 1.0 / theta.powf(2.0 * i as f64 / n_rot as f64);
                    let wl = 2.0 * std::f64::consts::PI / freq;
                    let f = if wl < high_wl {
                        1.0
                    } else if wl > low_wl {
                        factor
                    } else {
                        let smooth = (old / wl - low) / (high - low);
                        1.0 / ((1.0 - smooth) / factor + smooth)
                    };
                    f as f32
                })
                .collect();
            extra.push(("rope_freqs.weight".into(), ff));
        }
        "longrope" | "su" => {
            let orig = num("original_max_position_embeddings")
                .map(|x| x as usize)
                .or(c.usize_opt("original_max_position_embeddings")?)
                .ok_or_else(|| key_err(&c.path, "original_max_position_embeddings", "missing"))?;
            let scale = n_ctx as f64 / orig as f64;
            let attn = if scale > 1.0 {
                (1.0 + scale.ln() / (orig as f64).ln()).sqrt()
            } else {
                1.0
            };
            meta.push((
                format!("{arch}.rope.scaling.original_context_length"),
                MetaValue::U32(orig as u32),
            ));
            meta.push((
                format!("{arch}.rope.scaling.attn_factor"),
                MetaValue::F32(attn as f32),
            ));
            extra.push(("rope_factors_long.weight".into(), factors("long_factor")?));
            extra.push(("rope_factors_short.weight".into(), factors("short_factor")?));
        }
        other => {
            return Err(key_err(
                &c.path,
                "rope_scaling.rope_type",
                format!("rope scaling `{other}` is not supported"),
            ));
        }
    }
    Ok(())
}
