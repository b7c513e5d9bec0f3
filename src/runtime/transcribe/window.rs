//! One window decoded at one temperature: openai-whisper's `DecodingTask`
//! (`decoding.py`) over a [`SpeechDecoder`] — the initial tokens (prompt,
//! start-of-transcript sequence), the no-speech probability read at the
//! start-of-transcript position, the filtered step loop, and the chosen
//! candidate with its average log-probability, text and compression ratio.
//! Also language detection (`detect_language`).
//!
//! [`SpeechDecoder`]: crate::models::speech::SpeechDecoder

use super::filters::{LogitFilters, log_softmax};
use super::search::{Beam, Greedy, Search, rank};
use super::tokens::{DecodeTokens, compression_ratio, py_strip};
use crate::error::{ModelError, Result};
use crate::models::speech::{AudioStates, SpeechToTextModel};
use crate::runtime::rng::Rng;

/// What decoding one window gave.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowResult {
    /// Sampled tokens (text and timestamps, no end-of-text).
    pub tokens: Vec<u32>,
    /// Their text, stripped.
    pub text: String,
    /// Sum of log-probabilities over (tokens + 1).
    pub avg_logprob: f32,
    /// Probability of `<|nospeech|>` at the start-of-transcript position.
    pub no_speech_prob: f32,
    /// Temperature it was decoded at.
    pub temperature: f32,
    /// zlib compression ratio of the text.
    pub compression_ratio: f32,
    /// Decoder steps run (each advances every sequence by one token).
    pub n_steps: usize,
}

/// How tokens are chosen for one decode.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// `n` independent sequences, greedy at temperature 0, sampled above.
    Sample {
        /// Temperature.
        temperature: f32,
        /// Sequences (best-of).
        n: usize,
    },
    /// Beam search.
    Beam {
        /// Beams.
        beam_size: usize,
        /// Patience.
        patience: f32,
    },
}

/// The fixed parts of one window's decoding.
pub struct WindowTask<'a> {
    /// The vocabulary.
    pub tokens: &'a DecodeTokens<'a>,
    /// Prompt + start-of-transcript sequence.
    pub initial: Vec<u32>,
    /// Index of `<|startoftranscript|>` in `initial`.
    pub sot_index: usize,
    /// The logit filters.
    pub filters: LogitFilters,
    /// Tokens sampled at most.
    pub sample_len: usize,
    /// Decoder positions.
    pub n_ctx: usize,
}

impl WindowTask<'_> {
    /// Decodes the window whose encoder states are `audio`.
    ///
    /// # Errors
    /// Decoder and device errors; a prompt that leaves no room in the
    /// decoder's context.
    pub fn run(
        &self,
        model: &dyn SpeechToTextModel,
        audio: &AudioStates,
        strategy: Strategy,
        rng: &mut Rng,
    ) -> Result<WindowResult> {
        let specials = self.tokens.specials();
        let n_vocab = self.tokens.n_vocab();
        if self.initial.len() >= self.n_ctx || self.sot_index >= self.initial.len() {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx,
                requested: self.initial.len() + 1,
            });
        }
        let (n_group, temperature, mut search) = match strategy {
            Strategy::Sample { temperature, n } => (
                n,
                temperature,
                Search::Greedy(Greedy {
                    temperature,
                    rng,
                    eot: specials.eot,
                }),
            ),
            Strategy::Beam {
                beam_size,
                patience,
            } => (
                beam_size,
                0.0,
                Search::Beam(Beam::new(beam_size, patience, specials.eot)),
            ),
        };
        let mut decoder = model.decoder(audio, n_group)?;
        // The start-of-transcript position's logits give the no-speech
        // probability, so the prompt is fed in two steps when one precedes it.
        let (head, tail) = self.initial.split_at(self.sot_index + 1);
        let at_sot = decoder.step(&vec![head; n_group])?;
        check_rows(&at_sot, n_group, n_vocab)?;
        let no_speech_prob = log_softmax(&at_sot[..n_vocab])
            .get(specials.no_speech as usize)
            .map_or(f32::NAN, |lp| lp.exp());
        let mut logits = if tail.is_empty() {
            at_sot
        } else {
            decoder.step(&vec![tail; n_group])?
        };
        let mut seqs = vec![self.initial.clone(); n_group];
        let mut sums = vec![0.0f32; n_group];
        let mut n_steps = 0;
        for i in 0..self.sample_len {
            if i > 0 {
                let last: Vec<[u32; 1]> = seqs
                    .iter()
                    .map(|s| [s.last().copied().unwrap_or(specials.eot)])
                    .collect();
                let refs: Vec<&[u32]> = last.iter().map(|t| &t[..]).collect();
                logits = decoder.step(&refs)?;
            }
            check_rows(&logits, seqs.len(), n_vocab)?;
            n_steps += 1;
            for (k, seq) in seqs.iter().enumerate() {
                self.filters
                    .apply(&mut logits[k * n_vocab..(k + 1) * n_vocab], seq);
            }
            let completed = search.update(&mut seqs, &logits, &mut sums, decoder.as_mut())?;
            // As openai-whisper: stop once the sequences outgrow the context
            // (the last token is then never fed).
            if completed || seqs.first().is_none_or(|s| s.len() > self.n_ctx) {
                break;
            }
        }
        let cands = search.finalize(&seqs, &sums, self.initial.len());
        let best = rank(&cands)
            .and_then(|i| cands.get(i))
            .ok_or_else(|| ModelError::Internal("decoding produced no candidate".into()))?;
        let text = py_strip(&self.tokens.text(&best.tokens)).to_string();
        Ok(WindowResult {
            avg_logprob: best.sum_logprob / (best.tokens.len() + 1) as f32,
            compression_ratio: compression_ratio(&text),
            tokens: best.tokens.clone(),
            text,
            no_speech_prob,
            temperature,
            n_steps,
        })
    }
}

/// The decoder gave `rows` rows of `n_vocab` logits.
fn check_rows(logits: &[f32], rows: usize, n_vocab: usize) -> Result<()> {
    if logits.len() != rows * n_vocab {
        return Err(ModelError::Shape {
            tensor: "decoder logits".into(),
            expected: vec![rows as u64, n_vocab as u64],
            got: vec![logits.len() as u64],
        });
    }
    Ok(())
}

/// openai-whisper's `detect_language`: the language token most likely
/// after `<|startoftranscript|>`, and every language's probability (softmax
/// over the language tokens only).
///
/// # Errors
/// An English-only vocabulary; decoder and device errors.
pub fn detect_language(
    model: &dyn SpeechToTextModel,
    audio: &AudioStates,
    tokens: &DecodeTokens<'_>,
) -> Result<(usize, Vec<f32>)> {
    let s = tokens.specials();
    let n = tokens.n_languages();
    if n == 0 {
        return Err(ModelError::invalid(
            "language",
            "an English-only model cannot detect the language",
        ));
    }
    let mut decoder = model.decoder(audio, 1)?;
    let logits = decoder.step(&[&[s.sot]])?;
    check_rows(&logits, 1, tokens.n_vocab())?;
    let first = s.first_language as usize;
    let langs = logits.get(first..first + n).ok_or_else(|| {
        ModelError::Internal(format!(
            "language tokens past the vocabulary ({n} from {first})"
        ))
    })?;
    let probs: Vec<f32> = log_softmax(langs).iter().map(|l| l.exp()).collect();
    Ok((super::search::argmax(langs), probs))
}
