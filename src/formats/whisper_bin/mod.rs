//! whisper.cpp's model files (`ggml-tiny.en.bin`, `ggml-base-q8_0.bin`, ...):
//! the reader, over memmap2 with zero-copy tensor views like the GGUF reader,
//! and the writer. The format is the one `whisper_model_load` in whisper.cpp's
//! `src/whisper.cpp` reads (see `parse.rs` for the layout and checks), the
//! tensors those `layout.rs` lists for the file's dimensions.
//!
//! ```no_run
//! # fn main() -> combs::Result<()> {
//! use combs::formats::whisper_bin::WhisperFile;
//! let f = WhisperFile::open(std::path::Path::new("ggml-tiny.en.bin"))?;
//! let q = f.require_tensor("encoder.blocks.0.attn.query.weight")?;
//! assert_eq!(q.ne, &[f.hparams.n_audio_state, f.hparams.n_audio_state]);
//! # Ok(()) }
//! ```

mod layout;
mod mel_filters;
mod parse;
mod writer;

use crate::formats::backing::Backing;
use std::collections::HashMap;
use std::path::Path;

pub use layout::{ExpectedTensor, TensorRole, expected_tensors};
pub use mel_filters::mel_filters;
pub use writer::WhisperBinWriter;

use crate::error::{ModelError, Result};
use crate::formats::ggml_type::QuantType;
use crate::models::speech::WhisperHparams;
use crate::tokenizer::whisper::WhisperVocab;

/// `GGML_FILE_MAGIC`: "ggml" as a little-endian u32.
pub const GGML_FILE_MAGIC: u32 = 0x6767_6d6c;
/// `GGML_QNT_VERSION`: the quantization version whisper.cpp's `quantize` writes.
pub const GGML_QNT_VERSION: u32 = 2;
/// `GGML_QNT_VERSION_FACTOR`: the header's ftype is `qntvr * 1000 + ftype`.
pub const GGML_QNT_VERSION_FACTOR: u32 = 1000;

/// The weight type of a ggml `ftype` (`ggml_ftype_to_ggml_type`), for the
/// types combs holds; `None` for the others and for unknown values.
pub fn weight_type_of_ftype(ftype: u32) -> Option<QuantType> {
    Some(match ftype {
        0 => QuantType::F32,
        1 => QuantType::F16,
        2 => QuantType::Q4_0,
        3 => QuantType::Q4_1,
        7 => QuantType::Q8_0,
        8 => QuantType::Q5_0,
        9 => QuantType::Q5_1,
        10 => QuantType::Q2K,
        11 => QuantType::Q3K,
        12 => QuantType::Q4K,
        13 => QuantType::Q5K,
        14 => QuantType::Q6K,
        24 => QuantType::BF16,
        _ => return None,
    })
}

/// The ggml `ftype` whose weight type is `t` (`GGML_FTYPE_MOSTLY_*`, `ALL_F32` for F32).
pub fn ftype_of_weight_type(t: QuantType) -> u32 {
    match t {
        QuantType::F32 => 0,
        QuantType::F16 => 1,
        QuantType::Q4_0 => 2,
        QuantType::Q4_1 => 3,
        QuantType::Q8_0 => 7,
        QuantType::Q5_0 => 8,
        QuantType::Q5_1 => 9,
        QuantType::Q2K => 10,
        QuantType::Q3K => 11,
        QuantType::Q4K => 12,
        QuantType::Q5K => 13,
        QuantType::Q6K => 14,
        QuantType::BF16 => 24,
    }
}

/// Where one tensor lies in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TensorEntry {
    name: String,
    qtype: QuantType,
    ne: Vec<usize>,
    offset: usize,
    n_bytes: usize,
}

/// A view of one tensor of an open [`WhisperFile`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhisperTensor<'a> {
    /// Name as in the file (`decoder.token_embedding.weight`).
    pub name: &'a str,
    /// Storage type; its GGML type id is `qtype.id()`.
    pub qtype: QuantType,
    /// Shape as whisper.cpp orders it: `ne[0]` is the contiguous dimension
    /// (a PyTorch `[out, in]` matrix is `ne = [in, out]`); as many entries as
    /// the file's `n_dims` (the conv biases have two: `[1, n_state]`).
    pub ne: &'a [usize],
    /// The data, straight from the file (not aligned: whisper.cpp files do
    /// not pad); GGUF block layout for quantized types, little-endian.
    pub bytes: &'a [u8],
}

impl WhisperTensor<'_> {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Length of a row, `ne[0]` (1 for a tensor without dimensions).
    pub fn cols(&self) -> usize {
        self.ne.first().copied().unwrap_or(1)
    }

    /// Number of rows: the product of every dimension after the first.
    pub fn rows(&self) -> usize {
        self.ne.iter().skip(1).product()
    }
}

/// An opened, validated whisper.cpp model file. Every tensor the
/// dimensions call for is present with the right shape and a type its role
/// allows (see [`TensorRole`]), and no other tensor is.
pub struct WhisperFile {
    backing: Backing,
    /// The model's dimensions.
    pub hparams: WhisperHparams,
    /// ggml `ftype` of the file (the header value modulo 1000): 0 all F32,
    /// 1 F16, 2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0, 9 Q5_1, ...
    pub ftype: u32,
    /// Quantization version (the header's ftype divided by 1000): 0 for files
    /// straight from the converter, [`GGML_QNT_VERSION`] after `quantize`.
    pub qntvr: u32,
    /// The weight type the ftype names (what whisper.cpp makes the matrices).
    pub weight_type: QuantType,
    /// The mel filterbank: `n_mels` rows of `N_FFT / 2 + 1` weights.
    pub mel_filters: Vec<f32>,
    /// The vocabulary: the file's token bytes and the special ids.
    pub vocab: WhisperVocab,
    tensors: Vec<TensorEntry>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for WhisperFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhisperFile")
            .field("hparams", &self.hparams)
            .field("ftype", &self.ftype)
            .field("qntvr", &self.qntvr)
            .field("bytes", &self.data().len())
            .field("words", &self.vocab.pieces.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl WhisperFile {
    /// Maps the file at `path` and validates all of it.
    ///
    /// The mapping is read-only; as with every memory-mapped reader, the file
    /// must not be truncated or rewritten by another process while it is open.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be opened or mapped;
    /// [`ModelError::Format`], [`ModelError::MissingTensor`],
    /// [`ModelError::Shape`] or [`ModelError::UnsupportedTensorType`] when it
    /// is not a whisper.cpp model file combs can load.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_backing(Backing::open(path)?)
    }

    /// Validates a file held in memory (tests, files just written).
    ///
    /// # Errors
    /// As [`WhisperFile::open`], without the I/O errors.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_backing(Backing::Owned(bytes))
    }

    /// Whether `bytes` start like a whisper.cpp model file (the ggml magic).
    pub fn has_magic(bytes: &[u8]) -> bool {
        bytes.get(..4) == Some(&GGML_FILE_MAGIC.to_le_bytes()[..])
    }

    fn from_backing(backing: Backing) -> Result<Self> {
        let p = parse::parse(backing.bytes())?;
        let vocab = WhisperVocab::new(p.words, p.hparams.n_vocab)?;
        Ok(WhisperFile {
            backing,
            hparams: p.hparams,
            ftype: p.ftype,
            qntvr: p.qntvr,
            weight_type: p.weight_type,
            mel_filters: p.mel_filters,
            vocab,
            tensors: p.tensors,
            index: p.index,
        })
    }

    fn view<'a>(&'a self, e: &'a TensorEntry) -> WhisperTensor<'a> {
        WhisperTensor {
            name: &e.name,
            qtype: e.qtype,
            ne: &e.ne,
            // The range was checked against the file when it was parsed.
            bytes: self
                .data()
                .get(e.offset..e.offset + e.n_bytes)
                .unwrap_or_default(),
        }
    }

    /// The tensor named `name`, if the file has it.
    pub fn tensor(&self, name: &str) -> Option<WhisperTensor<'_>> {
        self.index.get(name).map(|&i| self.view(&self.tensors[i]))
    }

    /// The tensor named `name`.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] when the file has none of that name
    /// (never for the names [`expected_tensors`] lists: opening checked them).
    pub fn require_tensor(&self, name: &str) -> Result<WhisperTensor<'_>> {
        self.tensor(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = WhisperTensor<'_>> + '_ {
        self.tensors.iter().map(|e| self.view(e))
    }

    /// Absolute byte offset of a tensor's data in the file.
    pub fn tensor_offset(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|&i| self.tensors[i].offset)
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        self.backing.bytes()
    }
}
