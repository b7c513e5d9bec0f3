//! Writes whisper.cpp model files from other sources: a CTranslate2 Whisper
//! directory ([`from_ct2`]: what faster-whisper loads) or another whisper.cpp
//! file of a different weight type ([`requantize_bin`], as whisper.cpp's
//! `quantize` tool). Which tensor gets which type follows whisper.cpp
//! ([`tensor_type`]): norms, biases and positional embeddings stay F32, the
//! conv kernels F16, and the 2-D matrices (attention, MLP, token embedding)
//! take the requested type.

mod from_ct2;

pub use from_ct2::{ct2_hparams, from_ct2};

use crate::error::{ModelError, Result};
use crate::formats::whisper_bin::{TensorRole, WhisperBinWriter, WhisperFile, expected_tensors};
use crate::quant::{QuantType, dequantize_vec, quantize};

/// The weight types `combs convert` writes (those whisper.cpp's converter
/// and `quantize` tool make, the K-quants included where rows are whole blocks).
pub const WEIGHT_TYPES: [QuantType; 12] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::Q8_0,
    QuantType::Q5_1,
    QuantType::Q5_0,
    QuantType::Q4_1,
    QuantType::Q4_0,
    QuantType::Q2K,
    QuantType::Q3K,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
];

/// The type whisper.cpp gives a tensor of `role` in a file of weight type
/// `weight_type`: `convert-pt-to-ggml.py` keeps 1-D tensors, the conv biases
/// and the positional embeddings F32 and the rest F16 (all F32 with
/// `use-f32`); `quantize` then quantizes the 2-D tensors except the conv
/// biases and positional embeddings, leaving the 3-D conv kernels F16.
pub fn tensor_type(role: TensorRole, weight_type: QuantType) -> QuantType {
    match (role, weight_type) {
        (TensorRole::Small, _) | (_, QuantType::F32) => QuantType::F32,
        (TensorRole::Conv, _) => QuantType::F16,
        (TensorRole::Matrix, t) => t,
    }
}

/// One tensor written, for progress lines.
#[derive(Clone, Debug)]
pub struct ConvertedTensor {
    /// whisper.cpp name.
    pub name: String,
    /// Shape, `ne[0]` first.
    pub ne: Vec<usize>,
    /// Source type (a CTranslate2 dtype name, or a ggml type name).
    pub from: String,
    /// Type written.
    pub to: QuantType,
    /// Bytes written.
    pub bytes: usize,
}

/// Refuses a type whose blocks would straddle rows of `ne[0]` values
/// (quantizing the flattened tensor would not notice).
fn check_rows(t: QuantType, ne: &[usize], name: &str) -> Result<()> {
    t.row_bytes(ne.first().copied().unwrap_or(1))
        .map(|_| ())
        .map_err(|e| e.context(format!("tensor `{name}`")))
}

/// Converts `values` to `t`, or copies `f16_bytes` when they already are
/// the F16 data asked for (bit for bit, no round trip through f32).
fn encode(t: QuantType, values: &[f32], f16_bytes: Option<&[u8]>) -> Result<Vec<u8>> {
    match (t, f16_bytes) {
        (QuantType::F16, Some(b)) => Ok(b.to_vec()),
        _ => quantize(t, values),
    }
}

/// Rewrites whisper.cpp file `src` with weight type `weight_type`, as
/// whisper.cpp's `quantize` tool does (also from quantized sources and to F16
/// or F32, through f32; tensors already of their target type are copied).
/// Calls `progress` after each tensor.
///
/// # Errors
/// A target type whose blocks do not divide a matrix's rows.
pub fn requantize_bin(
    src: &WhisperFile,
    weight_type: QuantType,
    mut progress: impl FnMut(&ConvertedTensor),
) -> Result<WhisperBinWriter> {
    let roles: std::collections::HashMap<String, TensorRole> = expected_tensors(&src.hparams)
        .into_iter()
        .map(|e| (e.name, e.role))
        .collect();
    let mut w = WhisperBinWriter::new(
        src.hparams,
        weight_type,
        src.mel_filters.clone(),
        src.vocab.pieces.clone(),
    )?;
    for t in src.tensors() {
        let role = roles
            .get(t.name)
            .copied()
            .ok_or_else(|| ModelError::Internal(format!("tensor `{}` has no role", t.name)))?;
        let to = tensor_type(role, weight_type);
        check_rows(to, t.ne, t.name)?;
        let bytes = if to == t.qtype {
            t.bytes.to_vec()
        } else {
            let values = dequantize_vec(t.qtype, t.bytes, t.n_elements())?;
            quantize(to, &values)?
        };
        let done = ConvertedTensor {
            name: t.name.to_string(),
            ne: t.ne.to_vec(),
            from: t.qtype.to_string(),
            to,
            bytes: bytes.len(),
        };
        w.add_tensor(t.name, to, t.ne, bytes)?;
        progress(&done);
    }
    Ok(w)
}
