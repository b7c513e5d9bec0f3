//! The tensors a whisper.cpp model file must hold for given dimensions: their
//! names (openai-whisper's state-dict names, which whisper.cpp keeps), their
//! `ne` shapes (innermost first, as `whisper_model_load` creates them) and
//! which storage types each may have. The order is openai-whisper's
//! state-dict order, the order whisper.cpp's `convert-pt-to-ggml.py` writes.

use crate::models::speech::WhisperHparams;

/// What storage types a tensor may have, by its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// Norms, biases and positional embeddings: always F32 (whisper.cpp
    /// creates them F32 and its size check rejects anything else).
    Small,
    /// The two convolution kernels of the stem: F16, or F32 in an all-F32
    /// file (whisper.cpp's `vtype`); the `quantize` tool never touches them
    /// (it quantizes only 2-D tensors).
    Conv,
    /// The 2-D weight matrices (attention, MLP, token embedding): the file's
    /// weight type, F32, F16 or a block-quantized type.
    Matrix,
}

/// One tensor the loader expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedTensor {
    /// Name as in the file (`encoder.blocks.0.attn.query.weight`).
    pub name: String,
    /// Shape, `ne[0]` (the contiguous dimension) first.
    pub ne: Vec<usize>,
    /// Which types it may have.
    pub role: TensorRole,
}

/// Names of the tensors of one attention block, prefixed by `p` (`...attn` or `...cross_attn`).
fn attention(p: &str, n: usize, out: &mut Vec<ExpectedTensor>) {
    use TensorRole::{Matrix, Small};
    let mut t = |suffix: &str, ne: Vec<usize>, role| {
        out.push(ExpectedTensor {
            name: format!("{p}.{suffix}"),
            ne,
            role,
        })
    };
    t("query.weight", vec![n, n], Matrix);
    t("query.bias", vec![n], Small);
    // Whisper's key projection has no bias: a bias on the keys adds the same
    // q·b to every score of a query row, which softmax cancels.
    t("key.weight", vec![n, n], Matrix);
    t("value.weight", vec![n, n], Matrix);
    t("value.bias", vec![n], Small);
    t("out.weight", vec![n, n], Matrix);
    t("out.bias", vec![n], Small);
}

fn layer_norm(name: &str, n: usize, out: &mut Vec<ExpectedTensor>) {
    for part in ["weight", "bias"] {
        out.push(ExpectedTensor {
            name: format!("{name}.{part}"),
            ne: vec![n],
            role: TensorRole::Small,
        });
    }
}

fn mlp(p: &str, n: usize, out: &mut Vec<ExpectedTensor>) {
    use TensorRole::{Matrix, Small};
    let n_mlp = 4 * n;
    let mut t = |suffix: &str, ne: Vec<usize>, role| {
        out.push(ExpectedTensor {
            name: format!("{p}.{suffix}"),
            ne,
            role,
        })
    };
    t("mlp.0.weight", vec![n, n_mlp], Matrix);
    t("mlp.0.bias", vec![n_mlp], Small);
    t("mlp.2.weight", vec![n_mlp, n], Matrix);
    t("mlp.2.bias", vec![n], Small);
}

/// Every tensor of a model of dimensions `h`, in openai-whisper's state-dict order.
pub fn expected_tensors(h: &WhisperHparams) -> Vec<ExpectedTensor> {
    use TensorRole::{Conv, Matrix, Small};
    let mut out = Vec::with_capacity(10 + 15 * h.n_audio_layer + 24 * h.n_text_layer);
    let t = |out: &mut Vec<ExpectedTensor>, name: &str, ne: Vec<usize>, role| {
        out.push(ExpectedTensor {
            name: name.to_string(),
            ne,
            role,
        })
    };
    let (na, nt) = (h.n_audio_state, h.n_text_state);
    t(
        &mut out,
        "encoder.positional_embedding",
        vec![na, h.n_audio_ctx],
        Small,
    );
    t(
        &mut out,
        "encoder.conv1.weight",
        vec![3, h.n_mels, na],
        Conv,
    );
    // The converter reshapes the conv biases to [n, 1] so they broadcast over time.
    t(&mut out, "encoder.conv1.bias", vec![1, na], Small);
    t(&mut out, "encoder.conv2.weight", vec![3, na, na], Conv);
    t(&mut out, "encoder.conv2.bias", vec![1, na], Small);
    for i in 0..h.n_audio_layer {
        let p = format!("encoder.blocks.{i}");
        attention(&format!("{p}.attn"), na, &mut out);
        layer_norm(&format!("{p}.attn_ln"), na, &mut out);
        mlp(&p, na, &mut out);
        layer_norm(&format!("{p}.mlp_ln"), na, &mut out);
    }
    layer_norm("encoder.ln_post", na, &mut out);
    t(
        &mut out,
        "decoder.positional_embedding",
        vec![nt, h.n_text_ctx],
        Small,
    );
    t(
        &mut out,
        "decoder.token_embedding.weight",
        vec![nt, h.n_vocab],
        Matrix,
    );
    for i in 0..h.n_text_layer {
        let p = format!("decoder.blocks.{i}");
        attention(&format!("{p}.attn"), nt, &mut out);
        layer_norm(&format!("{p}.attn_ln"), nt, &mut out);
        attention(&format!("{p}.cross_attn"), nt, &mut out);
        layer_norm(&format!("{p}.cross_attn_ln"), nt, &mut out);
        mlp(&p, nt, &mut out);
        layer_norm(&format!("{p}.mlp_ln"), nt, &mut out);
    }
    layer_norm("decoder.ln", nt, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_tensor_count_matches_whisper_cpp() {
        let h = WhisperHparams {
            n_vocab: 51864,
            n_audio_ctx: 1500,
            n_audio_state: 384,
            n_audio_head: 6,
            n_audio_layer: 4,
            n_text_ctx: 448,
            n_text_state: 384,
            n_text_head: 6,
            n_text_layer: 4,
            n_mels: 80,
        };
        let t = expected_tensors(&h);
        // whisper.cpp: 7 encoder-wide + 15 per encoder block + 4 decoder-wide + 24 per decoder block
        assert_eq!(t.len(), 7 + 15 * 4 + 4 + 24 * 4);
        let mut names: Vec<&str> = t.iter().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), t.len());
    }
}
