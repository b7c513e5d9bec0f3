//! CTranslate2 Whisper (`WhisperSpec`, as CTranslate2's Transformers
//! converter writes it) to whisper.cpp. The variable names map onto
//! openai-whisper's: `encoder/layer_{i}/self_attention/linear_0` is the
//! fused query/key/value projection (rows in that order), the decoder's
//! `attention/linear_0` the cross-attention query and `attention/linear_1` its
//! fused key/value, `linear_1`/`linear_2` the output projections, `ffn/linear_0`
//! and `ffn/linear_1` the MLP, `layer_norm/gamma`/`beta` the norms. The fused
//! biases hold zeros for the key rows (Hugging Face's key projection has no
//! bias, CTranslate2 pads it); whisper.cpp has no key bias, and softmax
//! would cancel one anyway, so those rows are dropped. The output projection
//! is an alias of the token embedding, as whisper.cpp ties them.
//!
//! CTranslate2 files hold no mel filterbank: it is computed as openai-whisper's
//! `mel_filters.npz` holds it. The vocabulary's GPT-2 pieces become bytes as
//! whisper.cpp's `convert-pt-to-ggml.py` writes them: the ordinary tokens
//! only, ids below `<|endoftext|>`.

use super::{ConvertedTensor, check_rows, encode, tensor_type};
use crate::error::{ModelError, Result};
use crate::formats::ctranslate2::{Ct2Directory, Ct2Dtype, Ct2Model, Ct2Variable};
use crate::formats::whisper_bin::{WhisperBinWriter, expected_tensors, mel_filters};
use crate::models::speech::WhisperHparams;
use crate::quant::QuantType;
use crate::tokenizer::whisper::{WhisperVocab, gpt2_piece_bytes};

fn bad(reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "CTranslate2 Whisper",
        offset: 0,
        reason: reason.into(),
    }
}

fn dim(v: &Ct2Variable<'_>, i: usize) -> Result<usize> {
    v.shape
        .get(i)
        .copied()
        .filter(|&d| d > 0)
        .ok_or_else(|| bad(format!("`{}` has shape {:?}", v.name, v.shape)))
}

fn count_layers(m: &Ct2Model, prefix: &str) -> usize {
    (0..)
        .take_while(|i| {
            m.variable(&format!("{prefix}/layer_{i}/ffn/layer_norm/gamma"))
                .is_some()
        })
        .count()
}

fn heads(m: &Ct2Model, name: &str) -> Result<usize> {
    let v = m.require(name)?;
    v.scalar_int()
        .and_then(|h| usize::try_from(h).ok())
        .filter(|&h| h > 0)
        .ok_or_else(|| bad(format!("`{name}` is not a positive integer scalar")))
}

/// A Whisper model's dimensions from its CTranslate2 variables.
///
/// # Errors
/// [`ModelError::MissingTensor`] or [`ModelError::Format`] when the model is
/// not a CTranslate2 Whisper model.
pub fn ct2_hparams(m: &Ct2Model) -> Result<WhisperHparams> {
    if !m.spec.is_empty() && m.spec != "WhisperSpec" {
        return Err(bad(format!("spec `{}` is not WhisperSpec", m.spec)));
    }
    let conv1 = m.require("encoder/conv1/weight")?;
    let enc_pos = m.require("encoder/position_encodings/encodings")?;
    let emb = m.require("decoder/embeddings/weight")?;
    let dec_pos = m.require("decoder/position_encodings/encodings")?;
    Ok(WhisperHparams {
        n_vocab: dim(&emb, 0)?,
        n_audio_ctx: dim(&enc_pos, 0)?,
        n_audio_state: dim(&conv1, 0)?,
        n_audio_head: heads(m, "encoder/num_heads")?,
        n_audio_layer: count_layers(m, "encoder"),
        n_text_ctx: dim(&dec_pos, 0)?,
        n_text_state: dim(&emb, 1)?,
        n_text_head: heads(m, "decoder/num_heads")?,
        n_text_layer: count_layers(m, "decoder"),
        n_mels: dim(&conv1, 1)?,
    })
}

/// Where a whisper.cpp tensor comes from: a CTranslate2 variable, or part
/// `part` of `parts` equal slices of its rows.
struct Source {
    var: String,
    part: usize,
    parts: usize,
}

fn norm_part(p: &str) -> &'static str {
    if p == "weight" { "gamma" } else { "beta" }
}

/// The CTranslate2 source of whisper.cpp tensor `name`.
fn source_of(name: &str) -> Option<Source> {
    let whole = |var: String| {
        Some(Source {
            var,
            part: 0,
            parts: 1,
        })
    };
    if let Some(side) = name.strip_suffix(".positional_embedding") {
        return whole(format!("{side}/position_encodings/encodings"));
    }
    let (head, part) = name.rsplit_once('.')?; // part: weight | bias
    match head {
        "encoder.conv1" | "encoder.conv2" => {
            return whole(format!("encoder/{}/{part}", &head[8..]));
        }
        "encoder.ln_post" => return whole(format!("encoder/layer_norm/{}", norm_part(part))),
        "decoder.ln" => return whole(format!("decoder/layer_norm/{}", norm_part(part))),
        "decoder.token_embedding" => return whole("decoder/embeddings/weight".into()),
        _ => {}
    }
    // {encoder|decoder}.blocks.{i}.{rest}
    let (side, rest) = head.split_once(".blocks.")?;
    let (layer, rest) = rest.split_once('.')?;
    let p = format!("{side}/layer_{layer}");
    let sliced = |var: String, part_i: usize, parts: usize| {
        Some(Source {
            var,
            part: part_i,
            parts,
        })
    };
    match rest {
        "attn.query" | "attn.key" | "attn.value" => {
            let i = ["attn.query", "attn.key", "attn.value"]
                .iter()
                .position(|&r| r == rest)?;
            sliced(format!("{p}/self_attention/linear_0/{part}"), i, 3)
        }
        "attn.out" => whole(format!("{p}/self_attention/linear_1/{part}")),
        "attn_ln" => whole(format!("{p}/self_attention/layer_norm/{}", norm_part(part))),
        "cross_attn.query" => whole(format!("{p}/attention/linear_0/{part}")),
        "cross_attn.key" => sliced(format!("{p}/attention/linear_1/{part}"), 0, 2),
        "cross_attn.value" => sliced(format!("{p}/attention/linear_1/{part}"), 1, 2),
        "cross_attn.out" => whole(format!("{p}/attention/linear_2/{part}")),
        "cross_attn_ln" => whole(format!("{p}/attention/layer_norm/{}", norm_part(part))),
        "mlp.0" => whole(format!("{p}/ffn/linear_0/{part}")),
        "mlp.2" => whole(format!("{p}/ffn/linear_1/{part}")),
        "mlp_ln" => whole(format!("{p}/ffn/layer_norm/{}", norm_part(part))),
        _ => None,
    }
}

/// The values of `v` as f32; int8 weights are scaled back with their `*_scale` rows.
fn values_f32(m: &Ct2Model, v: &Ct2Variable<'_>) -> Result<Vec<f32>> {
    if v.dtype != Ct2Dtype::I8 {
        return v.to_f32();
    }
    let scale = m.require(&format!("{}_scale", v.name))?.to_f32()?;
    let rows = v.shape.first().copied().unwrap_or(1);
    if scale.len() != rows || rows == 0 {
        return Err(bad(format!(
            "`{}_scale` has {} values for {rows} rows",
            v.name,
            scale.len()
        )));
    }
    let cols = v.n_elements() / rows;
    Ok(v.bytes
        .iter()
        .enumerate()
        .map(|(i, &q)| f32::from(q as i8) / scale[i / cols.max(1)])
        .collect())
}

/// Token bytes for the file: ids below `<|endoftext|>`, from GPT-2 pieces.
fn words(vocabulary: &[String], vocab: &WhisperVocab) -> Result<Vec<Vec<u8>>> {
    let eot = vocab.specials.eot as usize;
    if vocabulary.len() <= eot || vocabulary[eot] != "<|endoftext|>" {
        return Err(bad(format!(
            "the vocabulary ({} tokens) has no <|endoftext|> at id {eot}",
            vocabulary.len()
        )));
    }
    vocabulary[..eot]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            gpt2_piece_bytes(p)
                .ok_or_else(|| bad(format!("token {i} ({p:?}) is not a GPT-2 byte-level piece")))
        })
        .collect()
}

/// Converts the CTranslate2 Whisper model in `dir` to a whisper.cpp file of
/// weight type `weight_type`; F16 weights of an F16 source are copied bit for
/// bit. Calls `progress` after each tensor.
///
/// # Errors
/// A directory that is not a CTranslate2 Whisper model (missing variables,
/// shapes that disagree, an output projection not tied to the token
/// embedding), a vocabulary that is not Whisper's, or a weight type whose
/// blocks do not divide the rows.
pub fn from_ct2(
    dir: &Ct2Directory,
    weight_type: QuantType,
    mut progress: impl FnMut(&ConvertedTensor),
) -> Result<WhisperBinWriter> {
    let m = &dir.model;
    let h = ct2_hparams(m)?;
    if let Some(proj) = m.variable("decoder/projection/weight")
        && proj.name != "decoder/embeddings/weight"
        && proj.bytes != m.require("decoder/embeddings/weight")?.bytes
    {
        return Err(bad(
            "decoder/projection/weight differs from the token embedding; whisper.cpp ties them",
        ));
    }
    let vocab = WhisperVocab::new(Vec::new(), h.n_vocab)?;
    let mut w = WhisperBinWriter::new(
        h,
        weight_type,
        mel_filters(h.n_mels),
        words(&dir.vocabulary, &vocab)?,
    )?;
    for e in expected_tensors(&h) {
        let src = source_of(&e.name).ok_or_else(|| {
            ModelError::Internal(format!("no CTranslate2 source for `{}`", e.name))
        })?;
        let v = m.require(&src.var)?;
        let n: usize = e.ne.iter().product();
        if v.n_elements() != n * src.parts {
            return Err(ModelError::Shape {
                tensor: src.var.clone(),
                expected: e.ne.iter().rev().map(|&d| d as u64).collect(),
                got: v.shape.iter().map(|&d| d as u64).collect(),
            });
        }
        let to = tensor_type(e.role, weight_type);
        check_rows(to, &e.ne, &e.name)?;
        let range = src.part * n..(src.part + 1) * n;
        let short = || bad(format!("`{}` is shorter than its shape", src.var));
        let bytes = if to == QuantType::F16 && v.dtype == Ct2Dtype::F16 {
            let b = v
                .bytes
                .get(range.start * 2..range.end * 2)
                .ok_or_else(short)?;
            encode(to, &[], Some(b))?
        } else {
            let all = values_f32(m, &v)?;
            let part = all.get(range).ok_or_else(short)?;
            encode(to, part, None)?
        };
        let done = ConvertedTensor {
            name: e.name.clone(),
            ne: e.ne.clone(),
            from: format!("{:?}", v.dtype).to_lowercase(),
            to,
            bytes: bytes.len(),
        };
        w.add_tensor(&e.name, to, &e.ne, bytes)?;
        progress(&done);
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_whisper_cpp_tensor_has_a_ct2_source() {
        let h = WhisperHparams {
            n_vocab: 51865,
            n_audio_ctx: 1500,
            n_audio_state: 512,
            n_audio_head: 8,
            n_audio_layer: 2,
            n_text_ctx: 448,
            n_text_state: 512,
            n_text_head: 8,
            n_text_layer: 2,
            n_mels: 80,
        };
        for e in expected_tensors(&h) {
            assert!(source_of(&e.name).is_some(), "{}", e.name);
        }
        let s = source_of("decoder.blocks.1.cross_attn.value.bias").expect("source");
        assert_eq!(s.var, "decoder/layer_1/attention/linear_1/bias");
        assert_eq!((s.part, s.parts), (1, 2));
        let s = source_of("encoder.blocks.0.attn.key.weight").expect("source");
        assert_eq!(s.var, "encoder/layer_0/self_attention/linear_0/weight");
        assert_eq!((s.part, s.parts), (1, 3));
        let s = source_of("encoder.conv2.bias").expect("source");
        assert_eq!(s.var, "encoder/conv2/bias");
        let s = source_of("decoder.positional_embedding").expect("source");
        assert_eq!(s.var, "decoder/position_encodings/encodings");
        let s = source_of("encoder.ln_post.bias").expect("source");
        assert_eq!(s.var, "encoder/layer_norm/beta");
        let s = source_of("decoder.blocks.0.mlp_ln.weight").expect("source");
        assert_eq!(s.var, "decoder/layer_0/ffn/layer_norm/gamma");
    }
}
