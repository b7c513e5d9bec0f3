//! How the next tokens are chosen from filtered logits: openai-whisper's
//! `GreedyDecoder` (argmax at temperature 0, a seeded draw above it, for a
//! group of independent samples) and `BeamSearchDecoder` (beam search with
//! patience), their `finalize`, and `MaximumLikelihoodRanker` without a
//! length penalty (sum of log-probabilities over the length). Sums are kept
//! in f32 as openai-whisper's tensors keep them.

use std::collections::HashMap;

use super::filters::{log_softmax, logsumexp};
use crate::error::Result;
use crate::models::speech::SpeechDecoder;
use crate::runtime::rng::Rng;

/// A finished sequence: its sampled tokens (no end-of-text) and the sum of
/// their log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Tokens after the prompt, up to the first end-of-text.
    pub tokens: Vec<u32>,
    /// Sum of the chosen tokens' log-probabilities.
    pub sum_logprob: f32,
}

/// Greedy or sampled decoding of a group of independent sequences.
pub struct Greedy<'r> {
    /// 0: argmax; otherwise a draw from `softmax(logits / temperature)`.
    pub temperature: f32,
    /// The draws' random source.
    pub rng: &'r mut Rng,
    /// End-of-text id.
    pub eot: u32,
}

/// Beam search over `beam_size` sequences.
pub struct Beam {
    /// Sequences kept at each step.
    pub beam_size: usize,
    /// Finished candidates collected before stopping.
    pub max_candidates: usize,
    /// End-of-text id.
    pub eot: u32,
    /// Finished sequences (whole token lists, end-of-text last) and their
    /// scores, in the order found.
    finished: Vec<(Vec<u32>, f32)>,
}

/// A token chooser: updates the sequences from one step's logits.
pub enum Search<'r> {
    /// Greedy or sampling.
    Greedy(Greedy<'r>),
    /// Beam search.
    Beam(Beam),
}

impl Beam {
    /// Beam search with `beam_size` beams and patience `patience`.
    pub fn new(beam_size: usize, patience: f32, eot: u32) -> Self {
        let max_candidates = ((beam_size as f32 * patience).round() as usize).max(1);
        Beam {
            beam_size,
            max_candidates,
            eot,
            finished: Vec::new(),
        }
    }
}

/// The index of the largest value (the first of equals; NaN never wins).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in row.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best
}

/// A draw from `softmax(row / temperature)`.
fn sample(row: &[f32], temperature: f32, rng: &mut Rng) -> usize {
    let scaled: Vec<f64> = row.iter().map(|&l| f64::from(l / temperature)).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return argmax(row);
    }
    let weights: Vec<f64> = scaled.iter().map(|&s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.next_f64() * total;
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i;
        }
        u -= w;
    }
    // Rounding left u past the last weight: the last token with any weight.
    weights.iter().rposition(|&w| w > 0.0).unwrap_or(0)
}

impl Search<'_> {
    /// Appends the next token to each sequence given the filtered `logits`
    /// (`seqs.len()` rows of `n_vocab`), updating `sums`; beam search also
    /// reorders `decoder`'s sequences to follow their beams. Returns whether
    /// decoding is complete.
    ///
    /// # Errors
    /// The decoder's reorder failing.
    pub fn update(
        &mut self,
        seqs: &mut Vec<Vec<u32>>,
        logits: &[f32],
        sums: &mut Vec<f32>,
        decoder: &mut dyn SpeechDecoder,
    ) -> Result<bool> {
        let n_vocab = logits.len() / seqs.len().max(1);
        match self {
            Search::Greedy(g) => {
                for (k, seq) in seqs.iter_mut().enumerate() {
                    let row = &logits[k * n_vocab..(k + 1) * n_vocab];
                    let last_eot = seq.last() == Some(&g.eot);
                    let mut next = if g.temperature == 0.0 {
                        argmax(row)
                    } else {
                        sample(row, g.temperature, g.rng)
                    };
                    if !last_eot {
                        sums[k] += row[next] - logsumexp(row);
                    } else {
                        next = g.eot as usize;
                    }
                    seq.push(next as u32);
                }
                Ok(seqs.iter().all(|s| s.last() == Some(&g.eot)))
            }
            Search::Beam(b) => b.update(seqs, logits, n_vocab, sums, decoder),
        }
    }

    /// The finished candidates, prompt (`sample_begin` tokens) removed.
    pub fn finalize(self, seqs: &[Vec<u32>], sums: &[f32], sample_begin: usize) -> Vec<Candidate> {
        let cut = |seq: &[u32], eot: u32| -> Vec<u32> {
            let body = seq.get(sample_begin..).unwrap_or(&[]);
            let end = body.iter().position(|&t| t == eot).unwrap_or(body.len());
            body[..end].to_vec()
        };
        match self {
            Search::Greedy(g) => seqs
                .iter()
                .zip(sums)
                .map(|(s, &sum)| Candidate {
                    tokens: cut(s, g.eot),
                    sum_logprob: sum,
                })
                .collect(),
            Search::Beam(mut b) => {
                if b.finished.len() < b.beam_size {
                    // Not enough finished: add the live beams, best first.
                    let mut order: Vec<usize> = (0..seqs.len()).collect();
                    order.sort_by(|&x, &y| sums[y].total_cmp(&sums[x]));
                    for j in order {
                        let mut seq = seqs[j].clone();
                        seq.push(b.eot);
                        match b.finished.iter_mut().find(|(s, _)| *s == seq) {
                            Some(entry) => entry.1 = sums[j],
                            None => b.finished.push((seq, sums[j])),
                        }
                        if b.finished.len() >= b.beam_size {
                            break;
                        }
                    }
                }
                b.finished
                    .iter()
                    .map(|(s, score)| Candidate {
                        tokens: cut(s, b.eot),
                        sum_logprob: *score,
                    })
                    .collect()
            }
        }
    }
}

impl Beam {
    fn update(
        &mut self,
        seqs: &mut Vec<Vec<u32>>,
        logits: &[f32],
        n_vocab: usize,
        sums: &mut Vec<f32>,
        decoder: &mut dyn SpeechDecoder,
    ) -> Result<bool> {
        // Candidates in insertion order; a repeated sequence (identical beams
        // at the first step) keeps its place and takes the later score and
        // source, as a Python dict assignment does.
        let mut cands: Vec<(Vec<u32>, f32, usize)> = Vec::new();
        let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
        for (j, prefix) in seqs.iter().enumerate() {
            let lp = log_softmax(&logits[j * n_vocab..(j + 1) * n_vocab]);
            for tok in top_k(&lp, self.beam_size + 1) {
                let mut seq = prefix.clone();
                seq.push(tok as u32);
                let score = sums[j] + lp[tok];
                match index.get(&seq) {
                    Some(&i) => {
                        cands[i].1 = score;
                        cands[i].2 = j;
                    }
                    None => {
                        index.insert(seq.clone(), cands.len());
                        cands.push((seq, score, j));
                    }
                }
            }
        }
        // Stable, best first (Python's sorted(..., reverse=True) is stable).
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&x, &y| cands[y].1.total_cmp(&cands[x].1));
        let mut next = Vec::with_capacity(self.beam_size);
        let mut next_sums = Vec::with_capacity(self.beam_size);
        let mut sources = Vec::with_capacity(self.beam_size);
        let mut newly_finished: Vec<(Vec<u32>, f32)> = Vec::new();
        for &i in &order {
            let (seq, score, src) = &cands[i];
            if seq.last() == Some(&self.eot) {
                newly_finished.push((seq.clone(), *score));
            } else {
                next.push(seq.clone());
                next_sums.push(*score);
                sources.push(*src);
                if next.len() == self.beam_size {
                    break;
                }
            }
        }
        decoder.reorder(&sources)?;
        *seqs = next;
        *sums = next_sums;
        // newly_finished is already best first.
        for (seq, score) in newly_finished {
            if self.finished.len() >= self.max_candidates {
                break;
            }
            match self.finished.iter_mut().find(|(s, _)| *s == seq) {
                Some(entry) => entry.1 = score,
                None => self.finished.push((seq, score)),
            }
        }
        Ok(self.finished.len() >= self.max_candidates)
    }
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    let k = k.min(row.len());
    if k == 0 {
        return Vec::new();
    }
    let cmp = |a: &usize, b: &usize| row[*b].total_cmp(&row[*a]).then(a.cmp(b));
    idx.select_nth_unstable_by(k - 1, cmp);
    idx.truncate(k);
    idx.sort_by(cmp);
    idx
}

/// openai-whisper's `MaximumLikelihoodRanker` without a length penalty:
/// the candidate with the best sum of log-probabilities per token (the
/// first of equals).
pub fn rank(cands: &[Candidate]) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in cands.iter().enumerate() {
        let score = f64::from(c.sum_logprob) / c.tokens.len() as f64;
        if best.is_none_or(|(_, b)| score > b) {
            best = Some((i, score));
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_largest_first() {
        let row = [0.5, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_k(&row, 3), vec![1, 3, 4]);
        assert_eq!(top_k(&row, 9).len(), 5);
    }

    #[test]
    fn rank_prefers_best_average() {
        let c = |n: usize, s: f32| Candidate {
            tokens: vec![1; n],
            sum_logprob: s,
        };
        // -3/2 = -1.5 vs -4/4 = -1.0: the longer one wins on average.
        assert_eq!(rank(&[c(2, -3.0), c(4, -4.0)]), Some(1));
        assert_eq!(rank(&[]), None);
    }

    #[test]
    fn sample_follows_distribution() {
        let mut rng = Rng::new(7);
        let row = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let n = 20000;
        let ones = (0..n).filter(|_| sample(&row, 1.0, &mut rng) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 0.75).abs() < 0.02, "{frac}");
        // Temperature 0.5 squares the odds: 9:1.
        let ones = (0..n).filter(|_| sample(&row, 0.5, &mut rng) == 1).count();
        assert!((ones as f64 / n as f64 - 0.9).abs() < 0.02);
    }
}
