//! The token side of decoding: the start-of-transcript sequence, the tokens
//! suppressed at every step, prompts, and token ids back to text — as
//! openai-whisper's `Tokenizer` and `DecodingTask` compute them.

use super::options::Task;
use crate::error::{ModelError, Result};
use crate::tokenizer::whisper::{WhisperSpecials, WhisperVocab};
use crate::tokenizer::whisper_bpe::WhisperBpe;

/// One model's vocabulary as decoding needs it.
#[derive(Debug)]
pub struct DecodeTokens<'v> {
    vocab: &'v WhisperVocab,
    bpe: WhisperBpe,
    /// `encode(" ")`: suppressed with end-of-text as a window's first token.
    pub blank: Vec<u32>,
    /// openai-whisper's `non_speech_tokens`.
    pub non_speech: Vec<u32>,
}

impl<'v> DecodeTokens<'v> {
    /// The decoding view of `vocab`.
    ///
    /// # Errors
    /// A vocabulary whose special ids do not fit its size.
    pub fn new(vocab: &'v WhisperVocab) -> Result<Self> {
        let s = vocab.specials;
        if s.timestamp_begin as usize >= vocab.n_vocab {
            return Err(ModelError::Format {
                format: "Whisper vocabulary",
                offset: 0,
                reason: format!(
                    "first timestamp token {} is past the vocabulary ({} tokens)",
                    s.timestamp_begin, vocab.n_vocab
                ),
            });
        }
        let bpe = WhisperBpe::new(vocab)?;
        let blank = bpe.encode(" ");
        let non_speech = bpe.non_speech_tokens();
        Ok(DecodeTokens {
            vocab,
            bpe,
            blank,
            non_speech,
        })
    }

    /// The special ids.
    pub fn specials(&self) -> WhisperSpecials {
        self.vocab.specials
    }

    /// Size of the output head.
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_vocab
    }

    /// Language tokens of the vocabulary (0 for English-only models).
    pub fn n_languages(&self) -> usize {
        self.vocab.n_languages
    }

    /// Whether the vocabulary has language and task tokens.
    pub fn multilingual(&self) -> bool {
        self.vocab.n_languages > 0
    }

    /// Token ids of `text`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode(text)
    }

    /// `<|startoftranscript|>`, then for multilingual models the language
    /// and task tokens, then `<|notimestamps|>` when timestamps are off.
    pub fn sot_sequence(&self, language: usize, task: Task, timestamps: bool) -> Vec<u32> {
        let s = self.specials();
        let mut seq = vec![s.sot];
        if self.multilingual() {
            seq.push(s.first_language + language as u32);
            seq.push(match task {
                Task::Transcribe => s.transcribe,
                Task::Translate => s.translate,
            });
        }
        if !timestamps {
            seq.push(s.no_timestamps);
        }
        seq
    }

    /// Every token id never sampled: openai-whisper's `_get_suppress_tokens`
    /// (the non-speech symbols when asked, `extra`, the task and
    /// start tokens, and `<|nospeech|>`, whose probability is read apart).
    pub fn suppress_tokens(&self, non_speech: bool, extra: &[u32]) -> Vec<u32> {
        let s = self.specials();
        let mut t: Vec<u32> = if non_speech {
            self.non_speech.clone()
        } else {
            Vec::new()
        };
        t.extend(
            extra
                .iter()
                .copied()
                .filter(|&id| (id as usize) < self.n_vocab()),
        );
        t.extend([
            s.transcribe,
            s.translate,
            s.sot,
            s.prev,
            s.solm,
            s.no_speech,
        ]);
        t.sort_unstable();
        t.dedup();
        t
    }

    /// The text of `tokens` as openai-whisper's `Tokenizer.decode` gives it:
    /// timestamp tokens dropped, the pieces' bytes joined, invalid UTF-8
    /// replaced (only once the bytes are joined, so characters split across
    /// tokens survive). Not stripped.
    pub fn text(&self, tokens: &[u32]) -> String {
        let ts = self.specials().timestamp_begin;
        let mut bytes = Vec::new();
        for &t in tokens.iter().filter(|&&t| t < ts) {
            if let Some(p) = self.vocab.pieces.get(t as usize) {
                bytes.extend_from_slice(p);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `s` without leading and trailing whitespace as Python's `str.strip()`
/// sees it (Unicode white space plus the ASCII separators U+001C..U+001F).
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// openai-whisper's `compression_ratio`: UTF-8 bytes of `text` over the
/// bytes of its zlib compression at the default level (the same zlib Python
/// links, so ratios near the threshold fall the same way).
pub fn compression_ratio(text: &str) -> f32 {
    use std::io::Write;
    let bytes = text.as_bytes();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing to a Vec cannot fail.
    let compressed = z.write_all(bytes).and_then(|()| z.finish());
    match compressed {
        Ok(c) if !c.is_empty() => bytes.len() as f32 / c.len() as f32,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_ratio_matches_python_zlib() {
        // (len(b), len(zlib.compress(b))) from Python 3.11 with zlib 1.2.13.
        let cases = [
            ("hello hello hello hello hello hello hello hello", 47, 17),
            (
                " And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country.",
                108,
                79,
            ),
            (
                "the the the the the the the the the the the the the the the the the the the the the the",
                87,
                15,
            ),
        ];
        for (text, n, z) in cases {
            let r = compression_ratio(text);
            assert!((r - n as f32 / z as f32).abs() < 1e-6, "{text}: {r}");
        }
        assert_eq!(compression_ratio(""), 0.0);
    }

    #[test]
    fn py_strip_strips_python_whitespace() {
        assert_eq!(py_strip(" \t hi there\n\u{1f}"), "hi there");
        assert_eq!(py_strip("\u{3000}x\u{a0}"), "x");
    }
}
