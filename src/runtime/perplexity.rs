//! Perplexity with llama.cpp's method (`tools/perplexity`): the text is cut
//! into chunks of `n_ctx` tokens, each evaluated from an empty cache with its
//! first token replaced by BOS where the model adds one, and the negative
//! log-likelihood is summed over the second half of each chunk. The same
//! chunks, rows and targets feed the KL-divergence base file and
//! statistics (`kld_file`, `kld`).

use super::session::Session;
use crate::error::{ModelError, Result};
use crate::models::reference::ReferenceModel;

/// Result of a perplexity run.
#[derive(Clone, Debug)]
pub struct PerplexityReport {
    /// exp(mean NLL).
    pub ppl: f64,
    /// Standard error of the PPL estimate (llama.cpp's formula).
    pub ppl_err: f64,
    /// Chunks evaluated.
    pub n_chunks: usize,
    /// Tokens scored.
    pub n_scored: usize,
    /// Running PPL after each chunk.
    pub per_chunk: Vec<f64>,
}

/// Log-softmax probability of `target` under `logits`, in f64.
pub fn log_prob(logits: &[f32], target: usize) -> f64 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - m).exp()).sum();
    f64::from(logits[target] - m) - sum.ln()
}

/// What evaluates a chunk: a session on the device, or the CPU reference
/// forward ([`ReferenceModel`]).
pub trait ChunkLogits {
    /// Width of a row of logits.
    fn n_vocab(&self) -> usize;

    /// Evaluates `chunk` from an empty context and returns the logits of
    /// positions `first..chunk.len()` (row-major, `n_vocab` wide).
    ///
    /// # Errors
    /// Token ids out of range, a chunk longer than the context, device errors.
    fn chunk_logits(&mut self, chunk: &[u32], first: usize) -> Result<Vec<f32>>;
}

impl ChunkLogits for Session {
    fn n_vocab(&self) -> usize {
        self.model().spec().n_vocab
    }

    fn chunk_logits(&mut self, chunk: &[u32], first: usize) -> Result<Vec<f32>> {
        self.clear();
        // the first half needs no output head
        if first > 0 {
            self.prefill(&chunk[..first])?;
        }
        self.prefill_all_logits(&chunk[first..])
    }
}

impl ChunkLogits for ReferenceModel {
    fn n_vocab(&self) -> usize {
        self.spec().n_vocab
    }

    fn chunk_logits(&mut self, chunk: &[u32], first: usize) -> Result<Vec<f32>> {
        self.clear();
        let mut out = Vec::with_capacity((chunk.len() - first) * self.spec().n_vocab);
        for (i, &t) in chunk.iter().enumerate() {
            if i < first {
                self.advance(t)?;
            } else {
                out.extend(self.step(t)?);
            }
        }
        Ok(out)
    }
}

/// Evaluates `n_chunks` chunks of `n_ctx` tokens of `tokens` as llama.cpp's
/// perplexity tool does (`bos` replaces each chunk's first token when
/// given) and hands each chunk's scored rows to `on_chunk(i, rows,
/// targets)`: the logits of positions `n_ctx/2 .. n_ctx − 1` (`n_ctx − 1 −
/// n_ctx/2` rows) and the tokens they predict.
///
/// # Errors
/// Fewer tokens than the chunks need, `n_ctx` below 4, evaluation errors,
/// or an error of `on_chunk`.
pub fn for_each_chunk(
    src: &mut dyn ChunkLogits,
    tokens: &[u32],
    n_ctx: usize,
    n_chunks: usize,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, &[f32], &[u32]) -> Result<()>,
) -> Result<()> {
    if n_ctx < 4 || tokens.len() < n_chunks * n_ctx {
        return Err(ModelError::invalid(
            "text",
            format!(
                "{} tokens cannot make {n_chunks} chunks of n_ctx = {n_ctx} (at least 4)",
                tokens.len()
            ),
        ));
    }
    let n_vocab = src.n_vocab();
    let first = n_ctx / 2;
    let n_rows = n_ctx - 1 - first;
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let logits = src.chunk_logits(&chunk, first)?;
        let targets = &tokens[c * n_ctx + first + 1..(c + 1) * n_ctx];
        on_chunk(c, &logits[..n_rows * n_vocab], targets)?;
    }
    Ok(())
}

/// Runs the method over `tokens` with chunks of `n_ctx`; `bos` replaces each
/// chunk's first token when given. `on_chunk(i, running_ppl)` reports progress.
///
/// # Errors
/// Fewer than 2 × n_ctx tokens, or evaluation errors.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityReport> {
    perplexity_of(session, tokens, n_ctx, bos, on_chunk)
}

/// [`perplexity`] of any [`ChunkLogits`] (the CPU reference forward too).
///
/// # Errors
/// Fewer than 2 × n_ctx tokens, or evaluation errors.
pub fn perplexity_of(
    src: &mut dyn ChunkLogits,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityReport> {
    if n_ctx < 4 || tokens.len() < 2 * n_ctx {
        return Err(ModelError::invalid(
            "text",
            format!(
                "{} tokens; perplexity needs at least 2 × n_ctx = {} tokens",
                tokens.len(),
                2 * n_ctx
            ),
        ));
    }
    let n_chunks = tokens.len() / n_ctx;
    perplexity_chunks(
        src,
        tokens,
        n_ctx,
        n_chunks,
        bos,
        on_chunk,
        |_, _, _| Ok(()),
    )
}

/// The perplexity of the first `n_chunks` chunks (at least one) that also
/// hands every chunk's scored rows to `on_rows(i, rows, targets)` (as
/// [`for_each_chunk`] does), e.g. to write a KL-divergence base file in the
/// same pass; `on_chunk(i, running_ppl)` reports progress.
///
/// # Errors
/// Fewer tokens than the chunks need, evaluation errors, or an error of
/// `on_rows`.
pub fn perplexity_chunks(
    src: &mut dyn ChunkLogits,
    tokens: &[u32],
    n_ctx: usize,
    n_chunks: usize,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, f64),
    mut on_rows: impl FnMut(usize, &[f32], &[u32]) -> Result<()>,
) -> Result<PerplexityReport> {
    if n_chunks == 0 {
        return Err(ModelError::invalid("chunks", "nothing to score: 0 chunks"));
    }
    let n_vocab = src.n_vocab();
    let mut nll = 0.0f64;
    let mut nll2 = 0.0f64;
    let mut count = 0usize;
    let mut per_chunk = Vec::with_capacity(n_chunks);
    for_each_chunk(src, tokens, n_ctx, n_chunks, bos, |c, rows, targets| {
        for (row, &target) in rows.chunks_exact(n_vocab).zip(targets) {
            let lp = log_prob(row, target as usize);
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        per_chunk.push(ppl);
        on_chunk(c, ppl);
        on_rows(c, rows, targets)
    })?;
    let mean = nll / count as f64;
    let var = (nll2 / count as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    let ppl_err = if count > 1 {
        ppl * (var / (count as f64 - 1.0)).sqrt()
    } else {
        0.0
    };
    Ok(PerplexityReport {
        ppl,
        ppl_err,
        n_chunks,
        n_scored: count,
        per_chunk,
    })
}
