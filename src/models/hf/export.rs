//! The reverse of [`super::to_gguf`] for Llama-family GGUF files with a
//! byte-level BPE vocabulary (SmolLM2): a Hugging Face directory with every
//! matrix dequantized to F16 safetensors, Q/K rows permuted back to HF's
//! rope layout, `config.json`, `tokenizer.json` and `tokenizer_config.json`.
//! It exists to make real weights in safetensors form for the slow
//! perplexity check (`tests/hf_dir.rs`, `COMBS_SLOW_TESTS=1`).

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::quant::dequantize_vec;

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Inverse of `names::permute_rows` (GGUF's interleaved rows back to HF's halves).
fn unpermute_rows(data: &[u8], rows: usize, n_head: usize) -> Vec<u8> {
    let row_bytes = data.len() / rows.max(1);
    let hd = rows / n_head.max(1);
    let half = hd / 2;
    let mut out = vec![0u8; data.len()];
    for h in 0..n_head {
        for i in 0..half {
            for s in 0..2 {
                let (dst, src) = (h * hd + s * half + i, h * hd + 2 * i + s);
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

fn hf_name(gguf: &str) -> Option<String> {
    Some(match gguf {
        "token_embd.weight" => "model.embed_tokens.weight".into(),
        "output.weight" => "lm_head.weight".into(),
        "output_norm.weight" => "model.norm.weight".into(),
        _ => {
            let rest = gguf.strip_prefix("blk.")?;
            let (il, rest) = rest.split_once('.')?;
            let t = match rest {
                "attn_norm.weight" => "input_layernorm.weight",
                "ffn_norm.weight" => "post_attention_layernorm.weight",
                "attn_q.weight" => "self_attn.q_proj.weight",
                "attn_k.weight" => "self_attn.k_proj.weight",
                "attn_v.weight" => "self_attn.v_proj.weight",
                "attn_output.weight" => "self_attn.o_proj.weight",
                "ffn_gate.weight" => "mlp.gate_proj.weight",
                "ffn_up.weight" => "mlp.up_proj.weight",
                "ffn_down.weight" => "mlp.down_proj.weight",
                _ => return None,
            };
            format!("model.layers.{il}.{t}")
        }
    })
}

/// Writes `g` (general.architecture `llama`, `tokenizer.ggml.model` gpt2)
/// as an F16 Hugging Face directory `out`.
///
/// # Errors
/// Another architecture or tokenizer, tensors of unknown names or types,
/// I/O errors.
pub fn export_llama_f16(g: &GgufFile, out: &Path) -> Result<()> {
    let arch = g.architecture()?;
    if arch != "llama" {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{arch} (export writes llama only)"
        )));
    }
    if g.get_str("tokenizer.ggml.model")? != Some("gpt2") {
        return Err(ModelError::Metadata {
            key: "tokenizer.ggml.model".into(),
            reason: "export writes byte-level BPE (gpt2) vocabularies only".into(),
        });
    }
    let u = |k: &str| -> Result<u64> { g.require_u64(&format!("llama.{k}")) };
    let n_head = u("attention.head_count")? as usize;
    let n_head_kv = g
        .get_u64("llama.attention.head_count_kv")?
        .map_or(n_head, |v| v as usize);
    std::fs::create_dir_all(out).map_err(io(out))?;

    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for t in g.tensors() {
        let name = hf_name(&t.name).ok_or_else(|| ModelError::MissingTensor {
            name: format!("{} (no HF name)", t.name),
        })?;
        let qtype = t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
            tensor: t.name.clone(),
            ggml_type: t.type_name(),
        })?;
        let v = dequantize_vec(qtype, g.tensor_data(t), t.n_elements as usize)?;
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect();
        let bytes = if t.name.ends_with("attn_q.weight") {
            unpermute_rows(&bytes, shape[0], n_head)
        } else if t.name.ends_with("attn_k.weight") {
            unpermute_rows(&bytes, shape[0], n_head_kv)
        } else {
            bytes
        };
        tensors.push((name, shape, bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F16, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| ModelError::invalid("tensor", format!("{n}: {e}")))
        })
        .collect::<Result<_>>()?;
    let st_path = out.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &st_path).map_err(|e| ModelError::Format {
        format: "safetensors",
        offset: 0,
        reason: format!("{}: {e}", st_path.display()),
    })?;

    let tied = g.tensor("output.weight").is_none();
    let bos = g.get_u32("tokenizer.ggml.bos_token_id")?;
    let eos = g.get_u32("tokenizer.ggml.eos_token_id")?;
    let head_dim = g
        .get_u64("llama.attention.key_length")?
        .map_or(u("embedding_length")? as usize / n_head, |v| v as usize);
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": u("embedding_length")?,
        "intermediate_size": u("feed_forward_length")?,
        "num_hidden_layers": u("block_count")?,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_head_kv,
        "head_dim": head_dim,
        "max_position_embeddings": u("context_length")?,
        "rms_norm_eps": g.get_f32("llama.attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        "rope_theta": g.get_f32("llama.rope.freq_base")?.unwrap_or(10000.0),
        "tie_word_embeddings": tied,
        "vocab_size": g.tensor("token_embd.weight").map_or(0, |t| t.dims[1]),
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float16",
    });
    write_json(&out.join("config.json"), &config)?;

    let tokens = g.require_arr_str("tokenizer.ggml.tokens")?;
    let types = g.get_arr_i32("tokenizer.ggml.token_type")?;
    let merges = g.get_arr_str("tokenizer.ggml.merges")?.unwrap_or(&[]);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.as_ref().and_then(|v| v.get(i).copied()).unwrap_or(1);
        if ty == 3 || ty == 4 {
            added.push(
                json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": ty == 4, "special": ty == 3}),
            );
        }
        vocab.insert(t.clone(), json!(i));
    }
    let pre = match g.get_str("tokenizer.ggml.pre")?.unwrap_or("gpt2") {
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]}),
        "gpt2" => {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
        }
        other => {
            return Err(ModelError::Metadata {
                key: "tokenizer.ggml.pre".into(),
                reason: format!("export writes gpt2 and smollm pre-tokenizers, not {other}"),
            });
        }
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": null, "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
    });
    write_json(&out.join("tokenizer.json"), &tokenizer)?;
    let name = |id: Option<u32>| id.and_then(|i| tokens.get(i as usize)).cloned();
    let mut tc: HashMap<&str, Value> = HashMap::new();
    tc.insert("bos_token", json!(name(bos)));
    tc.insert("eos_token", json!(name(eos)));
    tc.insert(
        "add_bos_token",
        json!(g.get_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false)),
    );
    if let Some(t) = g.get_str("tokenizer.chat_template")? {
        tc.insert("chat_template", json!(t));
    }
    write_json(&out.join("tokenizer_config.json"), &json!(tc))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    std::fs::write(path, v.to_string()).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_rows_inverts_permute_rows() {
        let data: Vec<u8> = (0..24).collect();
        let p = super::super::names::permute_rows(&data, 12, 3);
        assert_eq!(unpermute_rows(&p, 12, 3), data);
    }
}
