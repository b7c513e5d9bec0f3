//! Perplexity with llama.cpp's method (`tools/perplexity`): the text is cut
//! into chunks of `n_ctx` tokens, each evaluated from an empty cache with its
//! first token replaced by BOS where the model adds one, and the negative
//! log-likelihood is summed over the second half of each chunk.

use super::session::Session;
use crate::error::{ModelError, Result};

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
    mut on_chunk: impl FnMut(usize, f64),
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
    let n_vocab = session.model().spec().n_vocab;
    let first = n_ctx / 2;
    let mut nll = 0.0f64;
    let mut nll2 = 0.0f64;
    let mut count = 0usize;
    let mut per_chunk = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        session.clear();
        let logits = session.prefill_all_logits(&chunk)?;
        for j in first..n_ctx - 1 {
            let target = tokens[c * n_ctx + j + 1] as usize;
            let lp = log_prob(&logits[j * n_vocab..(j + 1) * n_vocab], target);
            nll -= lp;
            nll2 += lp * lp;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        per_chunk.push(ppl);
        on_chunk(c, ppl);
    }
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
