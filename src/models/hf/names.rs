//! Safetensors tensor names → GGUF tensor names (llama.cpp's
//! `gguf-py/gguf/tensor_mapping.py` for the families combs runs), and the
//! Q/K row permutation of `LlamaModel.permute`.

use crate::models::spec::Family;

/// What a tensor is, for its expected shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Token embedding `[n_vocab, n_embd]`.
    Embd,
    /// Output head `[n_vocab, n_embd]`.
    Output,
    /// Q projection.
    Q,
    /// K projection.
    K,
    /// V projection.
    V,
    /// Attention output projection.
    O,
    /// Bias of Q.
    QBias,
    /// Bias of K.
    KBias,
    /// Bias of V.
    VBias,
    /// Fused Q, K, V (Phi-3).
    Qkv,
    /// Per-head norm of Q or K.
    HeadNorm,
    /// A norm over `n_embd`.
    Norm,
    /// FFN gate or up.
    GateOrUp,
    /// Fused gate and up (Phi-3).
    GateUp,
    /// FFN down.
    Down,
}

/// A mapped tensor.
#[derive(Clone, Debug)]
pub(crate) struct Role {
    /// GGUF name.
    pub gguf: String,
    /// What it is.
    pub kind: Kind,
}

/// Tensors a checkpoint may carry that the model does not use.
pub(crate) fn ignored(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// The GGUF name and kind of the HF tensor `name` in a model of `family`.
pub(crate) fn map(name: &str, family: Family) -> Option<Role> {
    let role = |gguf: String, kind| Some(Role { gguf, kind });
    match name {
        "model.embed_tokens.weight" => return role("token_embd.weight".into(), Kind::Embd),
        "lm_head.weight" => return role("output.weight".into(), Kind::Output),
        "model.norm.weight" => return role("output_norm.weight".into(), Kind::Norm),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (il, rest) = rest.split_once('.')?;
    let il: usize = il.parse().ok()?;
    let gemma = family == Family::Gemma3;
    let (g, kind) = match rest {
        "input_layernorm.weight" => ("attn_norm.weight", Kind::Norm),
        "post_attention_layernorm.weight" if gemma => ("post_attention_norm.weight", Kind::Norm),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", Kind::Norm),
        "pre_feedforward_layernorm.weight" if gemma => ("ffn_norm.weight", Kind::Norm),
        "post_feedforward_layernorm.weight" if gemma => ("post_ffw_norm.weight", Kind::Norm),
        "self_attn.q_proj.weight" => ("attn_q.weight", Kind::Q),
        "self_attn.k_proj.weight" => ("attn_k.weight", Kind::K),
        "self_attn.v_proj.weight" => ("attn_v.weight", Kind::V),
        "self_attn.o_proj.weight" => ("attn_output.weight", Kind::O),
        "self_attn.q_proj.bias" => ("attn_q.bias", Kind::QBias),
        "self_attn.k_proj.bias" => ("attn_k.bias", Kind::KBias),
        "self_attn.v_proj.bias" => ("attn_v.bias", Kind::VBias),
        "self_attn.qkv_proj.weight" if family == Family::Phi3 => ("attn_qkv.weight", Kind::Qkv),
        "self_attn.q_norm.weight" => ("attn_q_norm.weight", Kind::HeadNorm),
        "self_attn.k_norm.weight" => ("attn_k_norm.weight", Kind::HeadNorm),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", Kind::GateOrUp),
        "mlp.up_proj.weight" => ("ffn_up.weight", Kind::GateOrUp),
        "mlp.gate_up_proj.weight" if family == Family::Phi3 => ("ffn_up.weight", Kind::GateUp),
        "mlp.down_proj.weight" => ("ffn_down.weight", Kind::Down),
        _ => return None,
    };
    role(format!("blk.{il}.{g}"), kind)
}

/// `LlamaModel.permute` of llama.cpp's converter on a row-major matrix of
/// `rows` rows stored as `data`: within each of `n_head` heads, HF's rope
/// layout (first half of the head's rows, then the second) becomes GGUF's
/// interleaved one, so row `2i + s` of a head is HF's row `s·hd/2 + i`.
pub(crate) fn permute_rows(data: &[u8], rows: usize, n_head: usize) -> Vec<u8> {
    let row_bytes = data.len() / rows.max(1);
    let hd = rows / n_head.max(1);
    let half = hd / 2;
    let mut out = Vec::with_capacity(data.len());
    for h in 0..n_head {
        for i in 0..half {
            for s in 0..2 {
                let src = h * hd + s * half + i;
                out.extend_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permute_rows_interleaves_halves_of_each_head() {
        // 2 heads of 4 rows, one byte per row
        let data = [0u8, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(permute_rows(&data, 8, 2), vec![0, 2, 1, 3, 4, 6, 5, 7]);
    }

    #[test]
    fn map_gemma3_norms_are_post_norms() {
        let r = map(
            "model.layers.3.post_attention_layernorm.weight",
            Family::Gemma3,
        );
        assert_eq!(
            r.map(|r| r.gguf).as_deref(),
            Some("blk.3.post_attention_norm.weight")
        );
        let r = map(
            "model.layers.3.post_attention_layernorm.weight",
            Family::Llama,
        );
        assert_eq!(r.map(|r| r.gguf).as_deref(), Some("blk.3.ffn_norm.weight"));
    }
}
