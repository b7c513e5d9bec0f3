//! llama.cpp's KL-divergence base file: what `llama-perplexity
//! --kl-divergence-base FILE` writes when it scores a text, and reads back
//! with `--kl-divergence` to compare another model (or engine) with the one
//! that wrote it (`tools/perplexity/perplexity.cpp`, `perplexity()` and
//! `kl_divergence()`, llama.cpp 0c1e570).
//!
//! Layout, all little-endian:
//!
//! ```text
//! "_logits_"                         8 bytes
//! n_ctx                              i32 (read back as u32)
//! n_vocab, n_chunk                   i32, i32
//! tokens                             n_chunk × n_ctx i32: the tokenized text
//!                                    (each chunk's first token as tokenized,
//!                                    not the BOS that replaces it when scored)
//! per chunk, per scored position     n_ctx − 1 − n_ctx/2 rows of nv u16,
//!                                    nv = 2·⌈n_vocab/2⌉ + 4:
//!     scale, min_log_prob            two f32 in the first four u16
//!     q[0..n_vocab]                  log p[i] ≈ scale·q[i] + min_log_prob
//!     (one u16 of zero padding when n_vocab is odd)
//! ```
//!
//! Row `j` of a chunk holds the distribution the model predicts at position
//! `n_ctx/2 + j` (of the token at `n_ctx/2 + j + 1`). The quantization
//! (llama.cpp's `log_softmax(n_vocab, logits, log_prob, tok)`) spans the 16
//! nats below the largest logit; everything below is stored as 0. It is
//! reproduced here operation for operation in f32 (f64 only where llama.cpp
//! sums in double), so that the same logits give the same bytes.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};

/// The file's first eight bytes.
pub const KLD_MAGIC: &[u8; 8] = b"_logits_";

/// The format's name in [`ModelError::Format`] errors.
const FORMAT: &str = "llama.cpp KL-divergence base";

/// Bytes before the tokens: magic, n_ctx, n_vocab, n_chunk.
const HEADER_BYTES: u64 = 8 + 3 * 4;

/// u16 values per stored row for a vocabulary of `n_vocab`: two f32, then
/// the vocabulary padded to an even count (llama.cpp's `nv`).
pub fn row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Positions scored per chunk of `n_ctx` (the second half, less the last
/// token, whose successor is not in the chunk).
pub fn rows_per_chunk(n_ctx: usize) -> usize {
    n_ctx - 1 - n_ctx / 2
}

/// What a base file says before its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KldHeader {
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Vocabulary size of the model that wrote it.
    pub n_vocab: usize,
    /// Chunks stored.
    pub n_chunk: usize,
    /// The evaluated text, `n_chunk × n_ctx` tokens.
    pub tokens: Vec<u32>,
}

impl KldHeader {
    /// Total size in bytes of a file with this header.
    fn file_bytes(&self) -> Option<u64> {
        let rows = (self.n_chunk as u64).checked_mul(rows_per_chunk(self.n_ctx) as u64)?;
        let row_bytes = 2 * row_len(self.n_vocab) as u64;
        let tokens = 4 * (self.n_ctx as u64).checked_mul(self.n_chunk as u64)?;
        HEADER_BYTES
            .checked_add(tokens)?
            .checked_add(rows.checked_mul(row_bytes)?)
    }
}

/// `nearest_int` of llama.cpp's perplexity tool: round to nearest, ties to
/// even, by adding 1.5·2²³ in f32 (valid for |x| < 2²²).
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes one row of logits into `out` (`row_len(logits.len())` values)
/// and returns the row's negative log-likelihood of `target` as llama.cpp
/// computes it there (in f32): llama.cpp's `log_softmax(n_vocab, logits,
/// log_prob, tok)`.
pub fn quantize_row(logits: &[f32], target: usize, out: &mut [u16]) -> f64 {
    let mut max = logits[0];
    let mut min = logits[0];
    for &l in &logits[1..] {
        // std::max / std::min: the first argument unless the second is larger / smaller
        if max < l {
            max = l;
        }
        if l < min {
            min = l;
        }
    }
    if min < max - 16.0 {
        min = max - 16.0;
    }
    let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    let log_sum_exp = sum_exp.ln() as f32;
    let min_log_prob = min - max - log_sum_exp;
    let scale = (max - min) / 65535.0;
    let s = scale.to_le_bytes();
    let m = min_log_prob.to_le_bytes();
    out[0] = u16::from_le_bytes([s[0], s[1]]);
    out[1] = u16::from_le_bytes([s[2], s[3]]);
    out[2] = u16::from_le_bytes([m[0], m[1]]);
    out[3] = u16::from_le_bytes([m[2], m[3]]);
    let q = &mut out[4..4 + logits.len()];
    if scale != 0.0 {
        let inv_scale = 1.0 / scale;
        for (q, &l) in q.iter_mut().zip(logits) {
            *q = if l > min {
                nearest_int(inv_scale * (l - min)) as u16
            } else {
                0
            };
        }
    } else {
        q.fill(0);
    }
    f64::from(max + log_sum_exp - logits[target])
}

/// The two f32 at the head of a stored row: `(scale, min_log_prob)`.
pub fn row_scale(row: &[u16]) -> (f32, f32) {
    let f = |a: u16, b: u16| {
        let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
        f32::from_le_bytes([a[0], a[1], b[0], b[1]])
    };
    (f(row[0], row[1]), f(row[2], row[3]))
}

/// Writes a base file chunk by chunk, as `llama-perplexity
/// --kl-divergence-base` does.
pub struct KldWriter {
    out: BufWriter<File>,
    path: PathBuf,
    header: KldHeader,
    chunks_written: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl KldWriter {
    /// Creates `path` and writes the header: `tokens` must hold `n_chunk ×
    /// n_ctx` ids below `n_vocab`.
    ///
    /// # Errors
    /// Sizes that do not fit the format, or the file cannot be written.
    pub fn create(path: &Path, header: KldHeader) -> Result<Self> {
        let fits = |n: usize| i32::try_from(n).is_ok();
        if header.n_ctx < 4 || header.n_vocab == 0 || header.n_chunk == 0 {
            return Err(ModelError::invalid(
                "kl-divergence-base",
                format!(
                    "n_ctx {} (at least 4), n_vocab {}, n_chunk {} cannot be written",
                    header.n_ctx, header.n_vocab, header.n_chunk
                ),
            ));
        }
        if !fits(header.n_ctx) || !fits(header.n_vocab) || !fits(header.n_chunk) {
            return Err(ModelError::invalid(
                "kl-divergence-base",
                "sizes do not fit the format's 32-bit fields",
            ));
        }
        if header.tokens.len() != header.n_chunk * header.n_ctx {
            return Err(ModelError::Internal(format!(
                "KL-divergence base: {} tokens for {} chunks of {}",
                header.tokens.len(),
                header.n_chunk,
                header.n_ctx
            )));
        }
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        let mut head = Vec::with_capacity(HEADER_BYTES as usize + 4 * header.tokens.len());
        head.extend_from_slice(KLD_MAGIC);
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            head.extend_from_slice(&(v as i32).to_le_bytes());
        }
        for &t in &header.tokens {
            head.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&head).map_err(io)?;
        let nv = row_len(header.n_vocab);
        Ok(KldWriter {
            out,
            path: path.to_path_buf(),
            chunks_written: 0,
            // llama.cpp's row buffer starts zeroed and its padding is never written
            row: vec![0; nv],
            bytes: Vec::with_capacity(2 * nv),
            header,
        })
    }

    /// Appends the next chunk: `logits` holds its `rows_per_chunk(n_ctx)`
    /// scored rows (positions `n_ctx/2 ..`, each `n_vocab` wide), whose
    /// targets are the header's tokens. Returns the sum of the rows'
    /// negative log-likelihoods as llama.cpp computes them (f32 per row).
    ///
    /// # Errors
    /// More chunks than the header announced, rows of the wrong size, or a
    /// write error.
    pub fn write_chunk(&mut self, logits: &[f32]) -> Result<f64> {
        let h = &self.header;
        let (n_rows, n_vocab) = (rows_per_chunk(h.n_ctx), h.n_vocab);
        if self.chunks_written >= h.n_chunk || logits.len() != n_rows * n_vocab {
            return Err(ModelError::Internal(format!(
                "KL-divergence base: chunk {} of {} with {} logits (want {n_rows} rows of {n_vocab})",
                self.chunks_written + 1,
                h.n_chunk,
                logits.len()
            )));
        }
        let start = self.chunks_written * h.n_ctx + h.n_ctx / 2;
        let mut nll = 0.0;
        for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
            let target = h.tokens[start + j + 1] as usize;
            if target >= n_vocab {
                return Err(ModelError::TokenOutOfRange {
                    token: i64::from(h.tokens[start + j + 1]),
                    n_vocab,
                });
            }
            nll += quantize_row(row, target, &mut self.row);
            self.bytes.clear();
            self.bytes
                .extend(self.row.iter().flat_map(|v| v.to_le_bytes()));
            self.out
                .write_all(&self.bytes)
                .map_err(|source| ModelError::Io {
                    path: self.path.clone(),
                    source,
                })?;
        }
        self.chunks_written += 1;
        Ok(nll)
    }

    /// Flushes the file; every announced chunk must have been written.
    ///
    /// # Errors
    /// Missing chunks or a write error.
    pub fn finish(mut self) -> Result<()> {
        if self.chunks_written != self.header.n_chunk {
            return Err(ModelError::Internal(format!(
                "KL-divergence base: {} of {} chunks written",
                self.chunks_written, self.header.n_chunk
            )));
        }
        self.out.flush().map_err(|source| ModelError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// Reads a base file chunk by chunk, checking its structure first.
pub struct KldReader {
    input: BufReader<File>,
    path: PathBuf,
    header: KldHeader,
    chunks_read: usize,
    bytes: Vec<u8>,
}

impl KldReader {
    /// Opens `path` and reads its header and tokens; the file's size must
    /// be exactly what the header describes.
    ///
    /// # Errors
    /// The file cannot be read, is not a base file (magic), has impossible
    /// sizes or token ids, or is truncated or longer than its header says.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut input = BufReader::new(file);
        let bad = |offset: u64, reason: String| ModelError::Format {
            format: FORMAT,
            offset,
            reason,
        };
        let mut head = [0u8; HEADER_BYTES as usize];
        if len < HEADER_BYTES {
            return Err(bad(
                0,
                format!("{len} bytes, shorter than the {HEADER_BYTES}-byte header"),
            ));
        }
        input.read_exact(&mut head).map_err(io)?;
        if &head[..8] != KLD_MAGIC {
            return Err(bad(
                0,
                format!(
                    "starts with {:?}, not {:?} (not a file of log-probabilities written by \
                     `llama-perplexity --kl-divergence-base` or `combs perplexity \
                     --kl-divergence-base`)",
                    String::from_utf8_lossy(&head[..8]),
                    String::from_utf8_lossy(KLD_MAGIC)
                ),
            ));
        }
        let field = |i: usize| i32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        // llama.cpp reads n_ctx as u32; a negative i32 is an impossible size either way
        let (n_ctx, n_vocab, n_chunk) = (field(8), field(12), field(16));
        if n_ctx < 4 || n_vocab < 1 || n_chunk < 1 {
            return Err(bad(
                8,
                format!("n_ctx {n_ctx} (at least 4), n_vocab {n_vocab}, n_chunk {n_chunk}"),
            ));
        }
        let mut header = KldHeader {
            n_ctx: n_ctx as usize,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
            tokens: Vec::new(),
        };
        let want = header.file_bytes().ok_or_else(|| {
            bad(
                8,
                format!("n_ctx {n_ctx} × n_chunk {n_chunk} × n_vocab {n_vocab} overflows"),
            )
        })?;
        if len != want {
            let what = if len < want { "truncated" } else { "too long" };
            return Err(bad(
                len.min(want),
                format!(
                    "{what}: {len} bytes, while n_ctx {n_ctx}, n_vocab {n_vocab} and n_chunk \
                     {n_chunk} make {want}"
                ),
            ));
        }
        let n_tokens = header.n_ctx * header.n_chunk;
        let mut raw = vec![0u8; 4 * n_tokens];
        input.read_exact(&mut raw).map_err(io)?;
        header.tokens = Vec::with_capacity(n_tokens);
        for (i, b) in raw.chunks_exact(4).enumerate() {
            let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            if t < 0 || t >= n_vocab {
                return Err(bad(
                    HEADER_BYTES + 4 * i as u64,
                    format!("token {i} is {t}, outside the vocabulary of {n_vocab}"),
                ));
            }
            header.tokens.push(t as u32);
        }
        Ok(KldReader {
            input,
            path: path.to_path_buf(),
            header,
            chunks_read: 0,
            bytes: Vec::new(),
        })
    }

    /// The header and tokens.
    pub fn header(&self) -> &KldHeader {
        &self.header
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the next chunk's `rows_per_chunk(n_ctx)` rows of
    /// `row_len(n_vocab)` values into `rows`.
    ///
    /// # Errors
    /// All chunks were read already, or a read error.
    pub fn read_chunk(&mut self, rows: &mut Vec<u16>) -> Result<()> {
        let h = &self.header;
        if self.chunks_read >= h.n_chunk {
            return Err(ModelError::Internal(format!(
                "KL-divergence base: reading chunk {} of {}",
                self.chunks_read + 1,
                h.n_chunk
            )));
        }
        let n = rows_per_chunk(h.n_ctx) * row_len(h.n_vocab);
        self.bytes.resize(2 * n, 0);
        self.input
            .read_exact(&mut self.bytes)
            .map_err(|source| ModelError::Io {
                path: self.path.clone(),
                source,
            })?;
        rows.clear();
        rows.extend(
            self.bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]])),
        );
        self.chunks_read += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(0.0), 0);
    }

    #[test]
    fn quantize_row_spans_16_nats_below_the_max() {
        let logits = [0.0f32, -3.0, 2.0, -40.0, 1.0];
        let mut row = vec![0u16; row_len(logits.len())];
        assert_eq!(row.len(), 10);
        let nll = quantize_row(&logits, 2, &mut row);
        let (scale, min_lp) = row_scale(&row);
        assert_eq!(scale, 16.0 / 65535.0);
        assert_eq!(row[4 + 2], 65535);
        assert_eq!(row[4 + 3], 0, "below max − 16 is stored as 0");
        let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        assert!((nll - (lse - 2.0)).abs() < 1e-6);
        let lp0 = scale * f32::from(row[4]) + min_lp;
        assert!((f64::from(lp0) - (0.0 - lse)).abs() < 2.0 * f64::from(scale));
    }
}
