//! The whisper.cpp model file parser, from untrusted bytes. Reads what
//! `whisper_model_load` (whisper.cpp `src/whisper.cpp`) reads, in its order:
//! magic, eleven i32 hyperparameters (the last one the ftype, carrying the
//! quantization version as `qntvr * 1000 + ftype`), the mel filterbank
//! (`n_mel`, `n_fft`, f32 data), the vocabulary (a count, then `u32` length
//! and bytes per token), then tensors until the end of the file (`n_dims`,
//! name length, ggml type, `ne[n_dims]`, name, data). Tensor data follows its
//! name directly: whisper.cpp files are not padded or aligned.
//!
//! Stricter than whisper.cpp where it only guesses: a partial tensor header
//! at the end of the file, an ftype or count out of range, a tensor the
//! dimensions do not call for, a missing or duplicate one, a shape or type
//! that does not fit, each is an error here. Every count and size is checked
//! against the bytes that remain before anything is allocated for it.

use std::collections::HashMap;

use super::layout::{TensorRole, expected_tensors};
use super::{GGML_FILE_MAGIC, GGML_QNT_VERSION_FACTOR, TensorEntry, weight_type_of_ftype};
use crate::error::{ModelError, Result};
use crate::formats::ggml_type::{QuantType, ggml_type_name};
use crate::models::speech::{N_FFT, WhisperHparams};

/// Largest value accepted for any one hyperparameter; far above every
/// Whisper model and low enough that products of a few of them cannot overflow.
const MAX_HPARAM: i32 = 1 << 20;

pub(super) fn format_err(offset: usize, reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "whisper.cpp",
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Everything the file says, validated.
pub(super) struct Parsed {
    pub hparams: WhisperHparams,
    pub ftype: u32,
    pub qntvr: u32,
    pub weight_type: QuantType,
    pub mel_filters: Vec<f32>,
    pub words: Vec<Vec<u8>>,
    pub tensors: Vec<TensorEntry>,
    pub index: HashMap<String, usize>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(format_err(
                self.pos,
                format!(
                    "unexpected end of file reading {what}: {n} bytes needed, {} left",
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn i32(&mut self, what: &str) -> Result<i32> {
        let s = self.take(4, what)?;
        Ok(i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    /// An i32 that must lie in `lo..=hi`, as usize.
    fn count(&mut self, what: &str, lo: i32, hi: i32) -> Result<usize> {
        let at = self.pos;
        let v = self.i32(what)?;
        if v < lo || v > hi {
            return Err(format_err(
                at,
                format!("{what} = {v} is out of range ({lo}..={hi})"),
            ));
        }
        // lo >= 0 at every call site, so the value is not negative.
        usize::try_from(v).map_err(|_| format_err(at, format!("{what} = {v} is negative")))
    }
}

fn read_hparams(c: &mut Cursor<'_>) -> Result<(WhisperHparams, i32)> {
    let mut next = |what: &str| c.count(what, 1, MAX_HPARAM);
    let h = WhisperHparams {
        n_vocab: next("n_vocab")?,
        n_audio_ctx: next("n_audio_ctx")?,
        n_audio_state: next("n_audio_state")?,
        n_audio_head: next("n_audio_head")?,
        n_audio_layer: next("n_audio_layer")?,
        n_text_ctx: next("n_text_ctx")?,
        n_text_state: next("n_text_state")?,
        n_text_head: next("n_text_head")?,
        n_text_layer: next("n_text_layer")?,
        n_mels: next("n_mels")?,
    };
    let at = c.pos;
    let ftype = c.i32("ftype")?;
    let bad = |reason: String| Err(format_err(4, reason));
    if h.n_vocab < 51864 {
        return bad(format!(
            "n_vocab = {} is smaller than any Whisper vocabulary (51864)",
            h.n_vocab
        ));
    }
    if h.n_text_state != h.n_audio_state {
        // whisper.cpp asserts this; cross-attention reads encoder states at decoder width.
        return bad(format!(
            "n_text_state = {} differs from n_audio_state = {}",
            h.n_text_state, h.n_audio_state
        ));
    }
    for (what, state, head) in [
        ("n_audio_head", h.n_audio_state, h.n_audio_head),
        ("n_text_head", h.n_text_state, h.n_text_head),
    ] {
        if !state.is_multiple_of(head) {
            return bad(format!("{what} = {head} does not divide the width {state}"));
        }
    }
    if ftype < 0 {
        return Err(format_err(at, format!("ftype = {ftype} is negative")));
    }
    Ok((h, ftype))
}

fn read_filters(c: &mut Cursor<'_>, h: &WhisperHparams) -> Result<Vec<f32>> {
    let at = c.pos;
    let n_mel = c.count("mel filter rows", 0, MAX_HPARAM)?;
    let n_fft = c.count("mel filter columns", 0, MAX_HPARAM)?;
    if n_mel != h.n_mels || n_fft != N_FFT / 2 + 1 {
        return Err(format_err(
            at,
            format!(
                "mel filters are {n_mel} x {n_fft}, expected n_mels x (N_FFT/2+1) = {} x {}",
                h.n_mels,
                N_FFT / 2 + 1
            ),
        ));
    }
    let bytes = c.take(n_mel * n_fft * 4, "mel filters")?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

fn read_vocab(c: &mut Cursor<'_>, h: &WhisperHparams) -> Result<Vec<Vec<u8>>> {
    let at = c.pos;
    let n_words = c.count("vocabulary size", 0, i32::MAX)?;
    if n_words > h.n_vocab {
        return Err(format_err(
            at,
            format!("{n_words} vocabulary entries for n_vocab = {}", h.n_vocab),
        ));
    }
    // Each entry takes at least its 4-byte length.
    if n_words > c.remaining() / 4 {
        return Err(format_err(
            at,
            format!(
                "{n_words} vocabulary entries cannot fit in the {} bytes left",
                c.remaining()
            ),
        ));
    }
    let mut words = Vec::with_capacity(n_words);
    for i in 0..n_words {
        let len = c.u32("token length")? as usize;
        words.push(c.take(len, &format!("token {i}"))?.to_vec());
    }
    Ok(words)
}

/// Which types a tensor of `role` may have. Stricter than this, whisper.cpp
/// wants every matrix in the ftype's type; combs runs a mix as well.
fn type_allowed(role: TensorRole, t: QuantType) -> bool {
    match role {
        TensorRole::Small => t == QuantType::F32,
        TensorRole::Conv => matches!(t, QuantType::F16 | QuantType::F32),
        TensorRole::Matrix => true,
    }
}

fn read_tensors(
    c: &mut Cursor<'_>,
    h: &WhisperHparams,
) -> Result<(Vec<TensorEntry>, HashMap<String, usize>)> {
    // Each tensor takes at least a 12-byte header, a dimension and a name:
    // refuse layer counts the file cannot hold before listing their tensors.
    let n_expected = 11 + 15 * h.n_audio_layer + 24 * h.n_text_layer;
    if n_expected > c.remaining() / 17 {
        return Err(format_err(
            c.pos,
            format!(
                "{} + {} layers need {n_expected} tensors, more than the {} bytes left can hold",
                h.n_audio_layer,
                h.n_text_layer,
                c.remaining()
            ),
        ));
    }
    let expected = expected_tensors(h);
    let by_name: HashMap<&str, usize> = expected
        .iter()
        .enumerate()
        .map(|(i, e)| (e.name.as_str(), i))
        .collect();
    let mut tensors: Vec<TensorEntry> = Vec::with_capacity(expected.len());
    let mut index = HashMap::with_capacity(expected.len());
    while c.remaining() > 0 {
        let start = c.pos;
        let n_dims = c.count("tensor n_dims", 0, 4)?;
        let name_len = c.count("tensor name length", 1, 4096)?;
        let type_at = c.pos;
        let ttype = c.i32("tensor type")?;
        let mut ne = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            ne.push(c.count("tensor dimension", 1, i32::MAX)?);
        }
        let name_at = c.pos;
        let name = std::str::from_utf8(c.take(name_len, "tensor name")?)
            .map_err(|_| format_err(name_at, "tensor name is not UTF-8"))?
            .to_string();
        let Some(&e) = by_name.get(name.as_str()) else {
            return Err(format_err(
                start,
                format!("unknown tensor `{name}` for these dimensions"),
            ));
        };
        let exp = &expected[e];
        if index.contains_key(&name) {
            return Err(format_err(start, format!("duplicate tensor `{name}`")));
        }
        // Compare as whisper.cpp does: shapes padded with ones to four dimensions.
        let pad = |d: &[usize]| {
            let mut p = [1usize; 4];
            p[..d.len()].copy_from_slice(d);
            p
        };
        if pad(&ne) != pad(&exp.ne) {
            return Err(ModelError::Shape {
                tensor: name,
                expected: exp.ne.iter().map(|&d| d as u64).collect(),
                got: ne.iter().map(|&d| d as u64).collect(),
            });
        }
        let qtype = u32::try_from(ttype)
            .ok()
            .and_then(QuantType::from_id)
            .ok_or_else(|| ModelError::UnsupportedTensorType {
                tensor: name.clone(),
                ggml_type: u32::try_from(ttype).map_or_else(|_| ttype.to_string(), ggml_type_name),
            })?;
        if !type_allowed(exp.role, qtype) {
            return Err(format_err(
                type_at,
                format!("tensor `{name}` cannot be {qtype} ({:?} tensor)", exp.role),
            ));
        }
        let cols = pad(&ne)[0];
        let n_bytes = ne
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|n| qtype.row_bytes(cols).ok()?.checked_mul(n / cols))
            .ok_or_else(|| {
                format_err(
                    type_at,
                    format!("tensor `{name}`: rows of {cols} are not whole {qtype} blocks"),
                )
            })?;
        let offset = c.pos;
        c.take(n_bytes, &format!("data of tensor `{name}`"))?;
        index.insert(name.clone(), tensors.len());
        tensors.push(TensorEntry {
            name,
            qtype,
            ne,
            offset,
            n_bytes,
        });
    }
    if let Some(missing) = expected.iter().find(|e| !index.contains_key(&e.name)) {
        return Err(ModelError::MissingTensor {
            name: missing.name.clone(),
        });
    }
    Ok((tensors, index))
}

/// Parses and validates a whole file.
pub(super) fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.u32("magic")?;
    if magic != GGML_FILE_MAGIC {
        return Err(format_err(
            0,
            format!("bad magic {magic:#010x}, expected {GGML_FILE_MAGIC:#010x} (\"ggml\")"),
        ));
    }
    let (hparams, raw_ftype) = read_hparams(&mut c)?;
    // whisper.cpp: ftype % 1000 is the ggml ftype, the quotient the quantization version.
    let qntvr = raw_ftype as u32 / GGML_QNT_VERSION_FACTOR;
    let ftype = raw_ftype as u32 % GGML_QNT_VERSION_FACTOR;
    let weight_type = weight_type_of_ftype(ftype).ok_or_else(|| {
        format_err(
            4 * 11,
            format!("ftype {ftype} names no weight type whisper.cpp and combs can load"),
        )
    })?;
    let mel_filters = read_filters(&mut c, &hparams)?;
    let words = read_vocab(&mut c, &hparams)?;
    let (tensors, index) = read_tensors(&mut c, &hparams)?;
    Ok(Parsed {
        hparams,
        ftype,
        qntvr,
        weight_type,
        mel_filters,
        words,
        tensors,
        index,
    })
}
