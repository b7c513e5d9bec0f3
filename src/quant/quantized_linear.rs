//! `QuantizedLinear`: `y = x · Wᵀ (+ b)` with `W` quantized to 4 bits when
//! the model loads (from F32, F16 or BF16 weights: Hugging Face
//! safetensors, F16 GGUF files), in GGUF's Q4_1 blocks so the fused Q4_1
//! kernels every device path has run it; and [`LoadQuant`], the choice
//! `--quant q4|f16|bf16` makes for a whole model.
//!
//! Why Q4_1 (groups of 32 along k, an f16 scale *and* an f16 minimum,
//! 20 bytes per 32 weights = 5 bits/weight) rather than Q4_0 (scale only,
//! 18 bytes = 4.5 bits/weight): on SmolLM2-135M (F16 weights from the Q8_0
//! file, GPL-3 text, 4 chunks of 512) Q4_0 raises perplexity from 18.11 to
//! 23.93 (+32%), Q4_1 to 18.15 (+0.2%); an asymmetric grid fits the skewed
//! rows of small models far better, for 11% more bytes. Decode speed
//! follows bytes read, so Q4_1 is ~10% slower than Q4_0 would be, and
//! still ~3× fewer bytes than F16.
//!
//! A whole model is quantized by the project's llama.cpp-exact requantizer
//! ([`crate::quant::requantize`] with [`FileType::Q4_1`]): the same tensors
//! and bytes as `llama-quantize IN OUT Q4_1` — block matrices in Q4_1, the
//! output head (or a tied embedding) in Q6_K or, where rows are not whole
//! 256-blocks, Q8_0, norms in F32.

use std::sync::Arc;

use half::{bf16, f16};

use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::{GpuContext, Uploader};
use crate::quant::requantize::{FileType, RequantizeOptions, requantize};
use crate::quant::{QuantType, QuantWeight, dequantize_vec, quantize};

/// How a model's float weights are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadQuant {
    /// Matrices in Q4_1 (see the module docs), as `llama-quantize … Q4_1`.
    Q4,
    /// Every matrix in f16.
    F16,
    /// Every matrix in bf16.
    BF16,
}

impl LoadQuant {
    /// Parses `q4`, `f16` or `bf16` (case-insensitive).
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "q4" | "q4_1" => Ok(LoadQuant::Q4),
            "f16" => Ok(LoadQuant::F16),
            "bf16" => Ok(LoadQuant::BF16),
            _ => Err(ModelError::invalid(
                "quant",
                format!("`{s}` is not one of q4, f16, bf16"),
            )),
        }
    }

    /// The requantizer's target.
    pub fn file_type(self) -> FileType {
        match self {
            LoadQuant::Q4 => FileType::Q4_1,
            LoadQuant::F16 => FileType::F16,
            LoadQuant::BF16 => FileType::BF16,
        }
    }

    /// `g` with its matrices converted to this choice, in memory.
    ///
    /// # Errors
    /// As [`requantize`].
    pub fn apply(self, g: &GgufFile) -> Result<GgufFile> {
        let w = requantize(g, self.file_type(), &RequantizeOptions::default())?;
        GgufFile::from_bytes(w.to_bytes())
    }
}

/// A linear layer quantized to 4 bits at load time (Q4_1, groups of 32 along k).
#[derive(Clone, Debug)]
pub struct QuantizedLinear {
    rows: usize,
    cols: usize,
    blocks: Vec<u8>,
    bias: Option<Vec<f32>>,
}

impl QuantizedLinear {
    /// The block format.
    pub const QTYPE: QuantType = QuantType::Q4_1;
    /// Weights per group (one scale and minimum each).
    pub const GROUP: usize = 32;
    /// Stored bits per weight.
    pub const BITS_PER_WEIGHT: f64 = 5.0;

    /// Quantizes the row-major `rows × cols` matrix `w` (`cols` a multiple of 32).
    ///
    /// # Errors
    /// `w` or `bias` of the wrong length, `cols` not a multiple of 32.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize, bias: Option<&[f32]>) -> Result<Self> {
        if !cols.is_multiple_of(Self::GROUP) || w.len() != rows * cols {
            return Err(ModelError::Shape {
                tensor: "QuantizedLinear".into(),
                expected: vec![cols.next_multiple_of(Self::GROUP) as u64, rows as u64],
                got: vec![cols as u64, (w.len() / cols.max(1)) as u64],
            });
        }
        if let Some(b) = bias
            && b.len() != rows
        {
            return Err(ModelError::Shape {
                tensor: "QuantizedLinear bias".into(),
                expected: vec![rows as u64],
                got: vec![b.len() as u64],
            });
        }
        Ok(QuantizedLinear {
            rows,
            cols,
            blocks: quantize(Self::QTYPE, w)?,
            bias: bias.map(<[f32]>::to_vec),
        })
    }

    /// As [`QuantizedLinear::from_f32`] from f16 weights.
    ///
    /// # Errors
    /// As [`QuantizedLinear::from_f32`].
    pub fn from_f16(w: &[f16], rows: usize, cols: usize, bias: Option<&[f32]>) -> Result<Self> {
        let v: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        Self::from_f32(&v, rows, cols, bias)
    }

    /// As [`QuantizedLinear::from_f32`] from bf16 weights.
    ///
    /// # Errors
    /// As [`QuantizedLinear::from_f32`].
    pub fn from_bf16(w: &[bf16], rows: usize, cols: usize, bias: Option<&[f32]>) -> Result<Self> {
        let v: Vec<f32> = w.iter().map(|x| x.to_f32()).collect();
        Self::from_f32(&v, rows, cols, bias)
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The Q4_1 blocks, row by row (GGUF's encoding).
    pub fn blocks(&self) -> &[u8] {
        &self.blocks
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The weights as the kernels see them, dequantized.
    ///
    /// # Errors
    /// Never for a value built by this type's constructors.
    pub fn dequantized(&self) -> Result<Vec<f32>> {
        dequantize_vec(Self::QTYPE, &self.blocks, self.rows * self.cols)
    }

    /// `x · Wᵀ + b` for one input row on the CPU, over the dequantized
    /// weights with f64 sums: what the fused kernels are tested against.
    ///
    /// # Errors
    /// `x` not of `cols` values.
    pub fn forward_ref(&self, x: &[f32]) -> Result<Vec<f32>> {
        if x.len() != self.cols {
            return Err(ModelError::Shape {
                tensor: "QuantizedLinear input".into(),
                expected: vec![self.cols as u64],
                got: vec![x.len() as u64],
            });
        }
        let w = self.dequantized()?;
        Ok(w.chunks_exact(self.cols)
            .enumerate()
            .map(|(r, row)| {
                let dot: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                (dot + self.bias.as_ref().map_or(0.0, |b| b[r] as f64)) as f32
            })
            .collect())
    }

    /// Uploads the weights in the device layout of the fused Q4_1 kernels.
    ///
    /// # Errors
    /// Device errors.
    pub fn upload(&self, ctx: &Arc<GpuContext>, name: &str) -> Result<QuantWeight> {
        let mut up = Uploader::for_new_buffers(ctx, 16 << 20)?;
        let w = QuantWeight::from_gguf_bytes(
            ctx,
            &mut up,
            name,
            Self::QTYPE,
            self.rows,
            self.cols,
            &self.blocks,
        )?;
        up.flush()?;
        Ok(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_linear_forward_is_close_to_f32() {
        let (rows, cols) = (8, 64);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 13 % 7) as f32 - 3.0) / 3.0)
            .collect();
        let bias: Vec<f32> = (0..rows).map(|r| r as f32 * 0.1).collect();
        let q = QuantizedLinear::from_f32(&w, rows, cols, Some(&bias)).expect("valid shape");
        assert_eq!(q.blocks().len(), rows * cols / 32 * 20);
        let y = q.forward_ref(&x).expect("valid input");
        for (r, &got) in y.iter().enumerate() {
            let want: f32 = w[r * cols..(r + 1) * cols]
                .iter()
                .zip(&x)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                + bias[r];
            // 4-bit steps of 2/15 over 64 products of |x| <= 1
            assert!((got - want).abs() < 0.5, "row {r}: {got} vs {want}");
        }
    }

    #[test]
    fn quantized_linear_rejects_ragged_cols() {
        assert!(QuantizedLinear::from_f32(&[0.0; 40], 1, 40, None).is_err());
    }

    #[test]
    fn load_quant_parses_names() {
        assert_eq!(LoadQuant::parse("Q4").ok(), Some(LoadQuant::Q4));
        assert_eq!(LoadQuant::parse("bf16").ok(), Some(LoadQuant::BF16));
        assert!(LoadQuant::parse("q3").is_err());
    }
}
