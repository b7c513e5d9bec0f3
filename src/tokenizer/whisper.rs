//! Whisper's vocabulary as whisper.cpp's model files hold it: each token id's
//! bytes (GPT-2 byte-level BPE pieces, already decoded to bytes), then the
//! special tokens, whose ids follow from the vocabulary size the way
//! whisper.cpp and openai-whisper place them.

use crate::error::{ModelError, Result};

/// Special token ids of one Whisper vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhisperSpecials {
    /// `<|endoftext|>`.
    pub eot: u32,
    /// `<|startoftranscript|>`.
    pub sot: u32,
    /// `<|en|>`, the first language token (multilingual vocabularies).
    pub first_language: u32,
    /// `<|translate|>`.
    pub translate: u32,
    /// `<|transcribe|>`.
    pub transcribe: u32,
    /// `<|startoflm|>`.
    pub solm: u32,
    /// `<|startofprev|>`.
    pub prev: u32,
    /// `<|nospeech|>` (`<|nocaptions|>` in older vocabularies).
    pub no_speech: u32,
    /// `<|notimestamps|>`.
    pub no_timestamps: u32,
    /// `<|0.00|>`, the first timestamp token; timestamp `i` is `timestamp_begin + i`
    /// and stands for `i * 0.02` seconds.
    pub timestamp_begin: u32,
}

/// The token pieces of a Whisper model and its special ids.
#[derive(Clone, Debug)]
pub struct WhisperVocab {
    /// Bytes of each ordinary token, by id (`0..eot`, plus any the file lists past it).
    pub pieces: Vec<Vec<u8>>,
    /// Vocabulary size of the model's output head.
    pub n_vocab: usize,
    /// Special token ids.
    pub specials: WhisperSpecials,
    /// Language tokens in the vocabulary (0 for English-only models).
    pub n_languages: usize,
}

impl WhisperVocab {
    /// A vocabulary of `n_vocab` ids whose first pieces are `pieces`.
    ///
    /// # Errors
    /// A vocabulary size no Whisper model has (below 51864).
    pub fn new(pieces: Vec<Vec<u8>>, n_vocab: usize) -> Result<Self> {
        if n_vocab < 51864 {
            return Err(ModelError::InvalidArgument {
                name: "n_vocab",
                reason: format!("{n_vocab} is smaller than any Whisper vocabulary (51864)"),
            });
        }
        let multilingual = n_vocab >= 51865;
        // 51865 ids for 99 languages; large-v3 has one language more (51866).
        let n_languages = if multilingual { n_vocab - 51765 - 1 } else { 0 };
        let shift = u32::from(multilingual);
        // whisper.cpp: eot and sot move by one; the tokens after the languages by
        // the number of languages past 98.
        let dt = if multilingual {
            n_languages as u32 - 98
        } else {
            0
        };
        let at = |base: u32| base + dt;
        let specials = WhisperSpecials {
            eot: 50256 + shift,
            sot: 50257 + shift,
            first_language: 50258 + shift,
            translate: at(50357),
            transcribe: at(50358),
            solm: at(50359),
            prev: at(50360),
            no_speech: at(50361),
            no_timestamps: at(50362),
            timestamp_begin: at(50363),
        };
        Ok(WhisperVocab {
            pieces,
            n_vocab,
            specials,
            n_languages,
        })
    }
}

/// The bytes a GPT-2 byte-level piece stands for (`"Ġthe"` is `b" the"`), as
/// whisper.cpp's `convert-pt-to-ggml.py` decodes Hugging Face vocabularies
/// with its `bytes_to_unicode` table; `None` when a character is outside
/// that 256-character alphabet (special tokens such as `<|en|>` are inside
/// it, so callers decide which ids are ordinary).
pub fn gpt2_piece_bytes(piece: &str) -> Option<Vec<u8>> {
    piece.chars().map(super::unicode::char_to_byte).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_ids_match_openai_whisper() {
        // tiny.en / base.en
        let en = WhisperVocab::new(Vec::new(), 51864).expect("vocab");
        assert_eq!(en.specials.eot, 50256);
        assert_eq!(en.specials.sot, 50257);
        assert_eq!(en.specials.translate, 50357);
        assert_eq!(en.specials.transcribe, 50358);
        assert_eq!(en.specials.prev, 50360);
        assert_eq!(en.specials.no_speech, 50361);
        assert_eq!(en.specials.no_timestamps, 50362);
        assert_eq!(en.specials.timestamp_begin, 50363);
        // multilingual tiny..large-v2
        let m = WhisperVocab::new(Vec::new(), 51865).expect("vocab");
        assert_eq!(m.n_languages, 99);
        assert_eq!(m.specials.eot, 50257);
        assert_eq!(m.specials.sot, 50258);
        assert_eq!(m.specials.first_language, 50259);
        assert_eq!(m.specials.translate, 50358);
        assert_eq!(m.specials.transcribe, 50359);
        assert_eq!(m.specials.no_speech, 50362);
        assert_eq!(m.specials.no_timestamps, 50363);
        assert_eq!(m.specials.timestamp_begin, 50364);
        // large-v3: one more language
        let v3 = WhisperVocab::new(Vec::new(), 51866).expect("vocab");
        assert_eq!(v3.n_languages, 100);
        assert_eq!(v3.specials.transcribe, 50360);
        assert_eq!(v3.specials.timestamp_begin, 50365);
    }

    #[test]
    fn gpt2_piece_bytes_inverts_the_byte_alphabet() {
        assert_eq!(gpt2_piece_bytes("Ġthe").as_deref(), Some(&b" the"[..]));
        assert_eq!(gpt2_piece_bytes("ĊĠ").as_deref(), Some(&b"\n "[..]));
        // "Ã©" is how the alphabet spells the UTF-8 bytes of "é"
        assert_eq!(gpt2_piece_bytes("Ã©").as_deref(), Some("é".as_bytes()));
        assert_eq!(gpt2_piece_bytes(""), Some(Vec::new()));
        assert_eq!(gpt2_piece_bytes("日本"), None);
    }
}
