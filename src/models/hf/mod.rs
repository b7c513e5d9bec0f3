//! Hugging Face model directories as the GGUF file llama.cpp's
//! `convert_hf_to_gguf.py` would write for them, built in memory, so the
//! GGUF loader, `ArchSpec::from_gguf` and the GGUF tokenizer serve both
//! formats (one forward pass, one set of tests behind both).
//!
//! What the converter does and this module repeats (`conversion/llama.py`,
//! `qwen.py`, `gemma.py`, `phi.py` of llama.cpp's converter):
//! - `config.json` → `{arch}.*` hyperparameters (`params`);
//! - safetensors names → GGUF names, and layouts (`names`): the Q/K rows of
//!   Llama and Mistral permuted from HF's half-split rope layout to GGUF's
//!   interleaved one (`LlamaModel.permute`; Qwen, Gemma 3 and Phi-3 use
//!   the NEOX layout in both and are copied), Gemma 3's norm weights shifted
//!   by +1 (`Gemma3RMSNorm` multiplies by `1 + w`), Phi-3's fused `qkv_proj`
//!   and `gate_up_proj` kept fused;
//! - `tokenizer.json` → `tokenizer.ggml.*` ([`crate::formats::hf::tokenizer`]).
//!
//! Matrices keep their stored type (F32, F16, BF16); norms and biases become
//! F32. The cost is one copy of the weights in host memory while loading,
//! which the GGUF path does not have (it uploads from the mapping); the
//! permutation and the optional requantization rewrite most bytes anyway.

pub mod export;
mod names;
mod params;

use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::gguf_writer::GgufWriter;
use crate::formats::hf::{HfDir, StDtype, tokenizer::gguf_tokenizer_keys};
use crate::models::spec::Family;

pub use params::HfParams;

/// The GGUF architecture name combs writes for a family.
pub fn gguf_arch(family: Family) -> &'static str {
    match family {
        Family::Llama => "llama",
        Family::Mistral => "mistral",
        Family::Qwen2 => "qwen2",
        Family::Qwen3 => "qwen3",
        Family::Gemma3 => "gemma3",
        Family::Phi3 => "phi3",
    }
}

/// The GGUF file a converter would write for `dir` of family `family`
/// (weights in their stored types).
///
/// # Errors
/// `config.json` keys missing or out of range, tensors missing, of the
/// wrong shape or not part of the architecture, an unsupported tokenizer;
/// each naming the file and the key or tensor.
pub fn to_gguf(dir: &HfDir, family: Family) -> Result<GgufFile> {
    let p = HfParams::from_config(dir, family)?;
    let mut w = GgufWriter::new();
    for (k, v) in p.metadata() {
        w.add(k, v)?;
    }
    let tok = gguf_tokenizer_keys(
        dir.dir(),
        dir.tokenizer(),
        dir.tokenizer_config(),
        dir.config(),
        dir.chat_template(),
    )?;
    for (k, v) in tok {
        w.add(k, v)?;
    }
    for (name, data) in p.extra_tensors() {
        let dims = [data.len() as u64];
        w.add_tensor(name, 0, &dims, bytemuck::cast_slice(&data).to_vec())?;
    }
    let st = dir.tensors();
    let mut seen_embd = false;
    for t in st.tensors() {
        let Some(role) = names::map(&t.name, family) else {
            if names::ignored(&t.name) {
                continue;
            }
            return Err(ModelError::Format {
                format: "safetensors",
                offset: 0,
                reason: format!("tensor `{}` is not part of a {} model", t.name, p.arch),
            }
            .context(st.path_of(t).display().to_string()));
        };
        let shape_err = |expected: Vec<u64>| ModelError::Shape {
            tensor: format!("{} ({})", t.name, st.path_of(t).display()),
            expected,
            got: t.shape.iter().map(|&d| d as u64).collect(),
        };
        let expected = p.expected_shape(&role);
        let ok = t.shape.len() == expected.len()
            && t.shape
                .iter()
                .zip(&expected)
                .all(|(&a, b)| b.is_none_or(|b| a == b));
        if !ok {
            return Err(shape_err(
                expected.iter().map(|d| d.unwrap_or(0) as u64).collect(),
            ));
        }
        seen_embd |= role.gguf == "token_embd.weight";
        let dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        if t.shape.len() == 1 {
            let mut v = st.to_f32(t);
            if p.norm_shift != 0.0 && t.name.ends_with("norm.weight") {
                v.iter_mut().for_each(|x| *x += p.norm_shift);
            }
            w.add_tensor(role.gguf, 0, &dims, bytemuck::cast_slice(&v).to_vec())?;
            continue;
        }
        let ggml_type = match t.dtype {
            StDtype::F32 => 0,
            StDtype::F16 => 1,
            StDtype::BF16 => 30,
        };
        let data = st.data(t);
        let data = match p.permute_heads(&role) {
            Some(n_head) => names::permute_rows(data, t.shape[0], n_head),
            None => data.to_vec(),
        };
        w.add_tensor(role.gguf, ggml_type, &dims, data)?;
    }
    if !seen_embd {
        return Err(ModelError::MissingTensor {
            name: format!("model.embed_tokens.weight (in {})", dir.dir().display()),
        });
    }
    GgufFile::from_bytes(w.to_bytes())
}
