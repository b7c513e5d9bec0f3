//! [`FileType`]: the whole-file quantization targets of llama.cpp's
//! `llama_ftype` (`include/llama.h`) that combs can produce, with the names
//! `llama-quantize` accepts (`tools/quantize/quantize.cpp`, `QUANT_OPTIONS`)
//! and the default tensor type of each (`llama_ftype_get_default_type` in
//! `src/llama-quant.cpp`).
//!
//! Left out: the IQ*, TQ*, MXFP4 and Q1_0/Q2_0 targets (combs has no
//! quantizer for those types) and Q2_K_S (it needs an importance matrix).

use crate::error::{ModelError, Result};
use crate::formats::id_enum::id_enum;
use crate::quant::QuantType;

id_enum! {
    /// A file-level quantization target; the discriminant is the `llama_ftype`
    /// value written to `general.file_type`. Declared in `llama-quantize`'s
    /// order of its list of types.
    pub enum FileType {
        /// Weight matrices in Q4_0.
        Q4_0 = 2,
        /// Weight matrices in Q4_1.
        Q4_1 = 3,
        /// Weight matrices in Q5_0.
        Q5_0 = 8,
        /// Weight matrices in Q5_1.
        Q5_1 = 9,
        /// Q2_K mix ("Q2_K - Medium").
        Q2K = 10,
        /// Q3_K small mix.
        Q3KS = 11,
        /// Q3_K medium mix.
        Q3KM = 12,
        /// Q3_K large mix.
        Q3KL = 13,
        /// Q4_K small mix.
        Q4KS = 14,
        /// Q4_K medium mix.
        Q4KM = 15,
        /// Q5_K small mix.
        Q5KS = 16,
        /// Q5_K medium mix.
        Q5KM = 17,
        /// Weight matrices in Q6_K.
        Q6K = 18,
        /// Weight matrices in Q8_0.
        Q8_0 = 7,
        /// Weight matrices in f16.
        F16 = 1,
        /// Weight matrices in bfloat16.
        BF16 = 32,
        /// Every weight matrix in f32 (`LLAMA_FTYPE_ALL_F32`).
        F32 = 0,
    }
}

/// Names as `llama-quantize` spells them, including its aliases, in its order.
const NAMES: [(&str, FileType); 20] = [
    ("Q4_0", FileType::Q4_0),
    ("Q4_1", FileType::Q4_1),
    ("Q5_0", FileType::Q5_0),
    ("Q5_1", FileType::Q5_1),
    ("Q2_K", FileType::Q2K),
    ("Q3_K", FileType::Q3KM),
    ("Q3_K_S", FileType::Q3KS),
    ("Q3_K_M", FileType::Q3KM),
    ("Q3_K_L", FileType::Q3KL),
    ("Q4_K", FileType::Q4KM),
    ("Q4_K_S", FileType::Q4KS),
    ("Q4_K_M", FileType::Q4KM),
    ("Q5_K", FileType::Q5KM),
    ("Q5_K_S", FileType::Q5KS),
    ("Q5_K_M", FileType::Q5KM),
    ("Q6_K", FileType::Q6K),
    ("Q8_0", FileType::Q8_0),
    ("F16", FileType::F16),
    ("BF16", FileType::BF16),
    ("F32", FileType::F32),
];

impl FileType {
    /// Parses a name as `llama-quantize` does: case-insensitive (`q4_k_m`,
    /// `Q4_K`), or the numeric `llama_ftype` value (`15`).
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] naming the accepted types.
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(&(_, t)) = NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(s)) {
            return Ok(t);
        }
        if let Ok(id) = s.parse::<u32>()
            && let Some(t) = Self::from_id(id)
        {
            return Ok(t);
        }
        let names: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        Err(ModelError::invalid(
            "type",
            format!(
                "unknown quantization type `{s}` (one of {})",
                names.join(", ")
            ),
        ))
    }

    /// The canonical `llama-quantize` name (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            FileType::F32 => "F32",
            FileType::F16 => "F16",
            FileType::BF16 => "BF16",
            FileType::Q4_0 => "Q4_0",
            FileType::Q4_1 => "Q4_1",
            FileType::Q5_0 => "Q5_0",
            FileType::Q5_1 => "Q5_1",
            FileType::Q8_0 => "Q8_0",
            FileType::Q2K => "Q2_K",
            FileType::Q3KS => "Q3_K_S",
            FileType::Q3KM => "Q3_K_M",
            FileType::Q3KL => "Q3_K_L",
            FileType::Q4KS => "Q4_K_S",
            FileType::Q4KM => "Q4_K_M",
            FileType::Q5KS => "Q5_K_S",
            FileType::Q5KM => "Q5_K_M",
            FileType::Q6K => "Q6_K",
        }
    }

    /// The tensor type weight matrices get before the per-tensor rules adjust
    /// it (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> QuantType {
        match self {
            FileType::F32 => QuantType::F32,
            FileType::F16 => QuantType::F16,
            FileType::BF16 => QuantType::BF16,
            FileType::Q4_0 => QuantType::Q4_0,
            FileType::Q4_1 => QuantType::Q4_1,
            FileType::Q5_0 => QuantType::Q5_0,
            FileType::Q5_1 => QuantType::Q5_1,
            FileType::Q8_0 => QuantType::Q8_0,
            FileType::Q2K => QuantType::Q2K,
            FileType::Q3KS | FileType::Q3KM | FileType::Q3KL => QuantType::Q3K,
            FileType::Q4KS | FileType::Q4KM => QuantType::Q4K,
            FileType::Q5KS | FileType::Q5KM => QuantType::Q5K,
            FileType::Q6K => QuantType::Q6K,
        }
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for FileType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_type_names_round_trip() {
        for t in FileType::ALL {
            assert_eq!(FileType::parse(t.name()).ok(), Some(t));
            assert_eq!(FileType::parse(&t.name().to_lowercase()).ok(), Some(t));
            assert_eq!(FileType::parse(&t.id().to_string()).ok(), Some(t));
        }
        assert_eq!(FileType::parse("q4_k").ok(), Some(FileType::Q4KM));
        assert!(FileType::parse("IQ2_XXS").is_err());
        assert!(FileType::parse("19").is_err());
    }
}
