//! Writes whisper.cpp model files: the header, filterbank and vocabulary as
//! `convert-pt-to-ggml.py` writes them, then the tensors in the order added.
//! A quantized weight type carries the quantization version in the ftype
//! field (`2 * 1000 + ftype`) as whisper.cpp's `quantize` tool writes it; F32
//! and F16 files carry the plain ftype, as the converter writes them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{GGML_FILE_MAGIC, GGML_QNT_VERSION, GGML_QNT_VERSION_FACTOR, ftype_of_weight_type};
use crate::error::{ModelError, Result};
use crate::formats::ggml_type::QuantType;
use crate::models::speech::{N_FFT, WhisperHparams};

struct PendingTensor {
    name: String,
    qtype: QuantType,
    ne: Vec<usize>,
    bytes: Vec<u8>,
}

/// A whisper.cpp model file being assembled in memory.
pub struct WhisperBinWriter {
    hparams: WhisperHparams,
    weight_type: QuantType,
    mel_filters: Vec<f32>,
    words: Vec<Vec<u8>>,
    tensors: Vec<PendingTensor>,
}

fn i32_field(name: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| ModelError::invalid(name, format!("{v} does not fit in an i32")))
}

impl WhisperBinWriter {
    /// A file of dimensions `hparams` whose matrices are `weight_type` (this
    /// sets the header's ftype), with the filterbank `mel_filters`
    /// (`n_mels` rows of `N_FFT / 2 + 1`) and the token bytes `words`.
    ///
    /// # Errors
    /// A dimension that does not fit the header's i32 fields, or a
    /// filterbank of another size.
    pub fn new(
        hparams: WhisperHparams,
        weight_type: QuantType,
        mel_filters: Vec<f32>,
        words: Vec<Vec<u8>>,
    ) -> Result<Self> {
        let h = &hparams;
        for (name, v) in [
            ("n_vocab", h.n_vocab),
            ("n_audio_ctx", h.n_audio_ctx),
            ("n_audio_state", h.n_audio_state),
            ("n_audio_head", h.n_audio_head),
            ("n_audio_layer", h.n_audio_layer),
            ("n_text_ctx", h.n_text_ctx),
            ("n_text_state", h.n_text_state),
            ("n_text_head", h.n_text_head),
            ("n_text_layer", h.n_text_layer),
            ("n_mels", h.n_mels),
        ] {
            i32_field(name, v)?;
        }
        let n_filters = h.n_mels * (N_FFT / 2 + 1);
        if mel_filters.len() != n_filters {
            return Err(ModelError::invalid(
                "mel_filters",
                format!(
                    "{} values, expected n_mels x (N_FFT/2+1) = {n_filters}",
                    mel_filters.len()
                ),
            ));
        }
        Ok(WhisperBinWriter {
            hparams,
            weight_type,
            mel_filters,
            words,
            tensors: Vec::new(),
        })
    }

    /// Appends a tensor: `ne` innermost first, `bytes` its data in `qtype`.
    ///
    /// # Errors
    /// More than four dimensions, a dimension beyond i32, or a byte length
    /// that does not match `ne` in `qtype`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        qtype: QuantType,
        ne: &[usize],
        bytes: Vec<u8>,
    ) -> Result<()> {
        if ne.len() > 4 {
            return Err(ModelError::invalid(
                "ne",
                format!("tensor `{name}` has {} dimensions, at most 4", ne.len()),
            ));
        }
        for &d in ne {
            i32_field("ne", d)?;
        }
        let cols = ne.first().copied().unwrap_or(1);
        let rows: usize = ne.iter().skip(1).product();
        let expected = qtype.row_bytes(cols)? * rows;
        if bytes.len() != expected {
            return Err(ModelError::invalid(
                "bytes",
                format!(
                    "tensor `{name}`: {} bytes for {ne:?} of {qtype}, expected {expected}",
                    bytes.len()
                ),
            ));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            qtype,
            ne: ne.to_vec(),
            bytes,
        });
        Ok(())
    }

    /// The header's ftype field.
    fn raw_ftype(&self) -> u32 {
        let ftype = ftype_of_weight_type(self.weight_type);
        if self.weight_type.is_dense() {
            ftype
        } else {
            GGML_QNT_VERSION * GGML_QNT_VERSION_FACTOR + ftype
        }
    }

    /// Writes the whole file to `w`.
    ///
    /// # Errors
    /// What `w` reports.
    pub fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        let h = &self.hparams;
        // Sizes were checked to fit in i32 when they were given.
        let i = |v: usize| (v as i32).to_le_bytes();
        w.write_all(&GGML_FILE_MAGIC.to_le_bytes())?;
        for v in [
            h.n_vocab,
            h.n_audio_ctx,
            h.n_audio_state,
            h.n_audio_head,
            h.n_audio_layer,
            h.n_text_ctx,
            h.n_text_state,
            h.n_text_head,
            h.n_text_layer,
            h.n_mels,
        ] {
            w.write_all(&i(v))?;
        }
        w.write_all(&self.raw_ftype().to_le_bytes())?;
        let n_fft = N_FFT / 2 + 1;
        w.write_all(&i(h.n_mels))?;
        w.write_all(&i(n_fft))?;
        for v in &self.mel_filters {
            w.write_all(&v.to_le_bytes())?;
        }
        w.write_all(&i(self.words.len()))?;
        for word in &self.words {
            w.write_all(&(word.len() as u32).to_le_bytes())?;
            w.write_all(word)?;
        }
        for t in &self.tensors {
            w.write_all(&i(t.ne.len()))?;
            w.write_all(&i(t.name.len()))?;
            w.write_all(&t.qtype.id().to_le_bytes())?;
            for &d in &t.ne {
                w.write_all(&i(d))?;
            }
            w.write_all(t.name.as_bytes())?;
            w.write_all(&t.bytes)?;
        }
        Ok(())
    }

    /// The whole file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        // Writing to a Vec cannot fail.
        let _ = self.write_to(&mut v);
        v
    }

    /// Writes the file to `path` (replaced if it exists).
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be created or written.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut w = BufWriter::new(File::create(path).map_err(io)?);
        self.write_to(&mut w).map_err(io)?;
        w.into_inner()
            .map_err(|e| io(e.into_error()))?
            .sync_all()
            .map_err(io)
    }
}
