//! `QuantType`: the GGML tensor types combs can hold, with their GGUF ids,
//! block sizes and byte sizes (ggml.c's `type_traits` table), and the names
//! and block geometry of the GGML types it only lists. A fact of the file
//! format, so it lives here; the `quant` module re-exports it.

use super::id_enum::id_enum;
use crate::error::{ModelError, Result};

id_enum! {
    /// A weight storage format. The discriminant is the GGUF/GGML type id.
    pub enum QuantType {
        /// 32-bit float.
        F32 = 0,
        /// IEEE half.
        F16 = 1,
        /// bfloat16.
        BF16 = 30,
        /// 4-bit, 32 per block, scale.
        Q4_0 = 2,
        /// 4-bit, 32 per block, scale and min.
        Q4_1 = 3,
        /// 5-bit, 32 per block, scale.
        Q5_0 = 6,
        /// 5-bit, 32 per block, scale and min.
        Q5_1 = 7,
        /// 8-bit, 32 per block, scale.
        Q8_0 = 8,
        /// 2-bit K-quant, 256 per block.
        Q2K = 10,
        /// 3-bit K-quant, 256 per block.
        Q3K = 11,
        /// 4-bit K-quant, 256 per block.
        Q4K = 12,
        /// 5-bit K-quant, 256 per block.
        Q5K = 13,
        /// 6-bit K-quant, 256 per block.
        Q6K = 14,
    }
}

impl QuantType {
    /// The type for a name as llama.cpp and the CLI spell it (`q4_k`, `Q4_K`, `f16`, ...).
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        Self::ALL.iter().copied().find(|t| t.name() == lower)
    }

    /// The lower-case name used in kernel variants and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "f32",
            QuantType::F16 => "f16",
            QuantType::BF16 => "bf16",
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q2K => "q2_k",
            QuantType::Q3K => "q3_k",
            QuantType::Q4K => "q4_k",
            QuantType::Q5K => "q5_k",
            QuantType::Q6K => "q6_k",
        }
    }

    /// Weights per block (1 for dense types).
    pub fn block_size(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0 => 32,
            QuantType::Q2K | QuantType::Q3K | QuantType::Q4K | QuantType::Q5K | QuantType::Q6K => {
                256
            }
        }
    }

    /// Bytes per block in GGUF.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q2K => 84,
            QuantType::Q3K => 110,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
        }
    }

    /// Whether the type is a dense float type.
    pub fn is_dense(self) -> bool {
        matches!(self, QuantType::F32 | QuantType::F16 | QuantType::BF16)
    }

    /// Bytes a row of `n` weights occupies in GGUF.
    ///
    /// # Errors
    /// `n` is not a multiple of the block size.
    pub fn row_bytes(self, n: usize) -> Result<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return Err(ModelError::invalid(
                "row length",
                format!(
                    "{n} is not a multiple of the {} block size {}",
                    self.name(),
                    self.block_size()
                ),
            ));
        }
        Ok(n / self.block_size() * self.block_bytes())
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name().to_ascii_uppercase())
    }
}

/// The name of a GGML type id, including types combs does not support (for `combs info`).
pub fn ggml_type_name(id: u32) -> String {
    if let Some(t) = QuantType::from_id(id) {
        return t.to_string();
    }
    let name = match id {
        9 => "Q8_1",
        15 => "Q8_K",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => return format!("type#{id}"),
    };
    name.to_string()
}

/// (block size, block bytes) of GGML types combs does not compute with but must
/// still size correctly when reading a file's tensor table; `None` for unknown ids.
pub fn ggml_block_geometry(id: u32) -> Option<(usize, usize)> {
    if let Some(t) = QuantType::from_id(id) {
        return Some((t.block_size(), t.block_bytes()));
    }
    Some(match id {
        9 => (32, 36),
        15 => (256, 292),
        16 => (256, 66),
        17 => (256, 74),
        18 => (256, 98),
        19 => (256, 50),
        20 => (32, 18),
        21 => (256, 110),
        22 => (256, 82),
        23 => (256, 136),
        24 => (1, 1),
        25 => (1, 2),
        26 => (1, 4),
        27 => (1, 8),
        28 => (1, 8),
        29 => (256, 56),
        34 => (256, 54),
        35 => (256, 66),
        39 => (32, 17),
        _ => return None,
    })
}
