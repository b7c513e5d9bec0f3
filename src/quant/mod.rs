//! Weight formats: for each GGML type combs runs, the GGUF block struct, the
//! CPU reference dequantizer (what every kernel is tested against, bit for
//! bit), the reference quantizer, and the device layout written by
//! [`layout::repack`] (per format: [`repack_q4_0`] ... [`repack_q6_k`]).
//! [`weight`] holds the GPU-resident weight types ([`QuantWeight`], and
//! the statically typed [`Q40Weight`] ... [`Q6KWeight`]).

pub mod block;
pub mod kquant_search;
pub mod layout;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod quantized_linear;
pub mod requantize;
pub mod weight;
pub mod whisper_convert;
mod x86_cast;

use std::borrow::Cow;

use bytemuck::Pod;
use half::{bf16, f16};

use block::{Block, dequantize_row, quantize_row};

/// The GGML type table, which belongs to the file format (`crate::formats`).
pub use crate::formats::ggml_type as types;
pub use crate::formats::ggml_type::QuantType;
pub use layout::{DeviceLayout, RowSource, device_bytes, repack, repack_rows, repack_vec};
pub use q4_0::repack_q4_0;
pub use q4_k::repack_q4_k;
pub use q5_0::repack_q5_0;
pub use q5_k::repack_q5_k;
pub use q6_k::repack_q6_k;
pub use q8_0::repack_q8_0;
pub use weight::{
    Q4KWeight, Q5KWeight, Q6KWeight, Q40Weight, Q50Weight, Q80Weight, QWeight, QuantWeight,
    TensorBytes, WeightChunk, WeightFormat,
};

use crate::error::{ModelError, Result};

/// Views `bytes` as blocks, copying only when the bytes are not aligned for `T`.
fn blocks<T: Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

fn check_sizes(t: QuantType, bytes: usize, n: usize) -> Result<()> {
    let expected = t.row_bytes(n)?;
    if bytes != expected {
        return Err(ModelError::invalid(
            "data",
            format!("{bytes} bytes of {t} for {n} weights, expected {expected}"),
        ));
    }
    Ok(())
}

/// Expands `bytes` (GGUF blocks of `t`) into `out`, whose length is the number of weights.
///
/// # Errors
/// The byte length does not match `out.len()` weights of `t`.
pub fn dequantize(t: QuantType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    check_sizes(t, bytes.len(), out.len())?;
    match t {
        QuantType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        QuantType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        QuantType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        QuantType::Q4_0 => dequantize_row::<q4_0::BlockQ4_0>(&blocks(bytes), out),
        QuantType::Q4_1 => dequantize_row::<q4_1::BlockQ4_1>(&blocks(bytes), out),
        QuantType::Q5_0 => dequantize_row::<q5_0::BlockQ5_0>(&blocks(bytes), out),
        QuantType::Q5_1 => dequantize_row::<q5_1::BlockQ5_1>(&blocks(bytes), out),
        QuantType::Q8_0 => dequantize_row::<q8_0::BlockQ8_0>(&blocks(bytes), out),
        QuantType::Q2K => dequantize_row::<q2_k::BlockQ2K>(&blocks(bytes), out),
        QuantType::Q3K => dequantize_row::<q3_k::BlockQ3K>(&blocks(bytes), out),
        QuantType::Q4K => dequantize_row::<q4_k::BlockQ4K>(&blocks(bytes), out),
        QuantType::Q5K => dequantize_row::<q5_k::BlockQ5K>(&blocks(bytes), out),
        QuantType::Q6K => dequantize_row::<q6_k::BlockQ6K>(&blocks(bytes), out),
    }
    Ok(())
}

/// Dequantizes into a new vector of `n` weights.
///
/// # Errors
/// As [`dequantize`].
pub fn dequantize_vec(t: QuantType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    let mut out = vec![0.0f32; n];
    dequantize(t, bytes, &mut out)?;
    Ok(out)
}

fn quantize_blocks<B: Block>(x: &[f32]) -> Vec<u8> {
    let mut blocks = vec![B::zeroed(); x.len() / B::QK];
    quantize_row(x, &mut blocks);
    bytemuck::cast_slice(&blocks).to_vec()
}

/// Quantizes `x` into GGUF bytes of type `t`, as llama.cpp's reference
/// quantizers (`ggml_quantize_chunk` without an importance matrix) do: dense
/// types convert with round-to-nearest-even, the others block by block.
///
/// # Errors
/// `x.len()` is not a multiple of the block size of `t`.
pub fn quantize(t: QuantType, x: &[f32]) -> Result<Vec<u8>> {
    let n_bytes = t.row_bytes(x.len())?;
    let bytes = match t {
        QuantType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        QuantType::F16 => x
            .iter()
            .flat_map(|&v| kquant_search::fp32_to_fp16(v).to_le_bytes())
            .collect(),
        QuantType::BF16 => x
            .iter()
            .flat_map(|&v| kquant_search::fp32_to_bf16_bits(v).to_le_bytes())
            .collect(),
        QuantType::Q4_0 => quantize_blocks::<q4_0::BlockQ4_0>(x),
        QuantType::Q4_1 => quantize_blocks::<q4_1::BlockQ4_1>(x),
        QuantType::Q5_0 => quantize_blocks::<q5_0::BlockQ5_0>(x),
        QuantType::Q5_1 => quantize_blocks::<q5_1::BlockQ5_1>(x),
        QuantType::Q8_0 => quantize_blocks::<q8_0::BlockQ8_0>(x),
        QuantType::Q2K => quantize_blocks::<q2_k::BlockQ2K>(x),
        QuantType::Q3K => quantize_blocks::<q3_k::BlockQ3K>(x),
        QuantType::Q4K => quantize_blocks::<q4_k::BlockQ4K>(x),
        QuantType::Q5K => quantize_blocks::<q5_k::BlockQ5K>(x),
        QuantType::Q6K => quantize_blocks::<q6_k::BlockQ6K>(x),
    };
    debug_assert_eq!(bytes.len(), n_bytes);
    Ok(bytes)
}
