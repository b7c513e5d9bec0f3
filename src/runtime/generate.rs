//! The generation loop: sample from the session's last logits, stop at an
//! end-of-generation token or when the caller says so, stream each token's
//! text (UTF-8 reassembled across tokens), decode it, repeat.

use std::time::{Duration, Instant};

use super::sampler::Sampler;
use super::session::Session;
use crate::error::Result;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` were produced.
    MaxTokens,
    /// The callback returned false.
    Callback,
    /// The context is full.
    ContextFull,
}

/// What a generation call did.
#[derive(Clone, Debug)]
pub struct GenerationStats {
    /// Tokens produced (the end-of-generation token not counted).
    pub n_tokens: usize,
    /// Time spent sampling and decoding.
    pub elapsed: Duration,
    /// Why it stopped.
    pub stop: StopReason,
}

impl GenerationStats {
    /// Tokens per second of the loop.
    pub fn tokens_per_second(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.n_tokens as f64 / s
        } else {
            0.0
        }
    }
}

/// Generates up to `max_tokens` after what the session holds (its logits must
/// be those of the last prompt token). `on_token(id, text)` receives each token
/// with the complete UTF-8 text it finishes (possibly empty: a character split
/// across tokens arrives with the token that completes it; one left incomplete
/// when generation stops is dropped) and returns false to stop. Each step
/// draws the next token with it ([`Session::decode_sample`]: on the device
/// where the sampler's chain needs only the best logits), so after a stop
/// the session's logits may be empty; [`Session::sample`] (and another call
/// of this function) still draws from the step's kept candidates.
///
/// # Errors
/// Device errors while decoding; a session whose last step sampled on the
/// device with a sampler that needs more of the row than it kept.
pub fn generate(
    session: &mut Session,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    max_tokens: usize,
    mut on_token: impl FnMut(u32, &str) -> bool,
) -> Result<GenerationStats> {
    let start = Instant::now();
    let mut stream = StreamDecoder::new();
    let mut n = 0;
    // The token each step drew with it (on the device where the sampler's
    // chain allows: only its best logits leave the GPU).
    let mut drawn: Option<u32> = None;
    let stop = loop {
        if n >= max_tokens {
            break StopReason::MaxTokens;
        }
        let t = match drawn.take() {
            Some(t) => t,
            None => session.sample(sampler)?,
        };
        if tokenizer.is_eog(t) {
            break StopReason::EndOfGeneration;
        }
        n += 1;
        let text = stream.push(&tokenizer.token_to_piece(t)?);
        if !on_token(t, &text) {
            break StopReason::Callback;
        }
        if session.len() >= session.n_ctx() {
            break StopReason::ContextFull;
        }
        if n >= max_tokens {
            // The last token: evaluated, nothing drawn after it.
            session.decode(t)?;
        } else {
            drawn = Some(session.decode_sample(t, sampler)?);
        }
    };
    Ok(GenerationStats {
        n_tokens: n,
        elapsed: start.elapsed(),
        stop,
    })
}
