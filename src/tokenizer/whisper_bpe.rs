//! Text to token ids over a [`WhisperVocab`], as openai-whisper's tokenizer
//! (tiktoken) encodes: GPT-2's pre-tokenizer regex, then byte-pair merges
//! where a token's rank is its id (tiktoken's `_byte_pair_merge`: merge the
//! adjacent pair whose bytes have the lowest rank, leftmost first, until no
//! pair is a token). whisper.cpp's files carry no merge list; with ranks
//! equal to ids none is needed. Used for prompts and for the token lists
//! decoding suppresses (`" "`, openai-whisper's `non_speech_tokens`).

use std::collections::HashMap;

use super::whisper::WhisperVocab;
use crate::error::{ModelError, Result};

/// GPT-2's pre-tokenizer (tiktoken's `gpt2` pattern).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// An encoder over the ordinary tokens (`0..eot`) of one vocabulary.
#[derive(Debug)]
pub struct WhisperBpe {
    ranks: HashMap<Vec<u8>, u32>,
    pre: fancy_regex::Regex,
}

impl WhisperBpe {
    /// The encoder of `vocab`'s ordinary tokens. Every GPT-2 vocabulary
    /// has a token for each byte; with one that lacks some (a placeholder
    /// vocabulary), text bytes without a token are left out.
    ///
    /// # Errors
    /// None in practice: the GPT-2 pattern is fixed and compiles.
    pub fn new(vocab: &WhisperVocab) -> Result<Self> {
        let eot = vocab.specials.eot as usize;
        let mut ranks = HashMap::with_capacity(eot);
        for (id, piece) in vocab.pieces.iter().enumerate().take(eot) {
            // The first id wins, as tiktoken's rank table has one id per piece.
            ranks.entry(piece.clone()).or_insert(id as u32);
        }
        let pre = fancy_regex::Regex::new(GPT2_PATTERN)
            .map_err(|e| ModelError::Internal(format!("GPT-2 pattern: {e}")))?;
        Ok(WhisperBpe { ranks, pre })
    }

    /// The id of a piece that is one token, if it is.
    pub fn token(&self, piece: &[u8]) -> Option<u32> {
        self.ranks.get(piece).copied()
    }

    /// Token ids of `text` (no special tokens are recognized in it).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            // The pattern matches every character (`\s+` or a class), so a
            // failed or empty match only happens on a regex backtracking limit:
            // take the rest as one piece rather than lose text.
            let end = match self.pre.find_from_pos(text, pos) {
                Ok(Some(m)) if m.start() == pos && m.end() > pos => m.end(),
                _ => text.len(),
            };
            self.merge(&text.as_bytes()[pos..end], &mut out);
            pos = end;
        }
        out
    }

    /// Byte-pair merges of one pre-token, appended to `out`.
    fn merge(&self, bytes: &[u8], out: &mut Vec<u32>) {
        if let Some(id) = self.token(bytes) {
            out.push(id);
            return;
        }
        // Boundaries of the current parts: part i is bytes[b[i]..b[i + 1]].
        let mut b: Vec<usize> = (0..=bytes.len()).collect();
        loop {
            let mut best: Option<(u32, usize)> = None;
            for i in 0..b.len().saturating_sub(2) {
                if let Some(r) = self.token(&bytes[b[i]..b[i + 2]])
                    && best.is_none_or(|(br, _)| r < br)
                {
                    best = Some((r, i));
                }
            }
            match best {
                Some((_, i)) => {
                    b.remove(i + 1);
                }
                None => break,
            }
        }
        for w in b.windows(2) {
            // A byte without a token (placeholder vocabularies only) is left out.
            if let Some(id) = self.token(&bytes[w[0]..w[1]]) {
                out.push(id);
            }
        }
    }

    /// openai-whisper's `Tokenizer.non_speech_tokens`: the tokens of symbols
    /// that mark speaker tags or non-speech annotations (`♪`, `(`, `[`, …),
    /// with and without a leading space, that decoding suppresses by default;
    /// `" -"` and `" '"` too (hyphens and quotes only inside words).
    pub fn non_speech_tokens(&self) -> Vec<u32> {
        let mut symbols: Vec<String> = "\"#()*+/:;<=>@[\\]^_`{|}~「」『』"
            .chars()
            .map(String::from)
            .collect();
        symbols.extend(
            "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪"
                .split(' ')
                .map(String::from),
        );
        // Miscellaneous symbols (U+2640..U+267F) share their first two UTF-8
        // bytes, so the first token of their encoding is safe to suppress.
        let miscellaneous = ["♩", "♪", "♫", "♬", "♭", "♮", "♯"];
        let mut result = Vec::new();
        for s in [" -", " '"] {
            if let Some(&t) = self.encode(s).first() {
                result.push(t);
            }
        }
        let all = symbols
            .iter()
            .map(|s| (s.as_str(), false))
            .chain(miscellaneous.iter().map(|s| (*s, true)));
        for (symbol, misc) in all {
            for text in [symbol.to_string(), format!(" {symbol}")] {
                let tokens = self.encode(&text);
                if tokens.len() == 1 || (misc && !tokens.is_empty()) {
                    result.push(tokens[0]);
                }
            }
        }
        result.sort_unstable();
        result.dedup();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary whose first 256 ids are the single bytes, then `extra`.
    fn vocab(extra: &[&[u8]]) -> WhisperVocab {
        let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        pieces.extend(extra.iter().map(|p| p.to_vec()));
        while pieces.len() < 50256 {
            pieces.push(format!("\u{1}filler{}", pieces.len()).into_bytes());
        }
        WhisperVocab::new(pieces, 51864).expect("vocab")
    }

    #[test]
    fn bpe_merges_lowest_rank_first() {
        // "abc": "bc" (257) ranks before "ab" (258), so a + bc, never ab + c.
        let v = vocab(&[b"zz", b"bc", b"ab", b" a"]);
        let bpe = WhisperBpe::new(&v).expect("bpe");
        assert_eq!(bpe.encode("abc"), vec![u32::from(b'a'), 257]);
        // " abc" is one pre-token: "bc" (257) first, then " a" (259).
        assert_eq!(bpe.encode(" abc"), vec![259, 257]);
        // Two words, a space run, digits: split by the GPT-2 pattern.
        assert_eq!(
            bpe.encode("ab  1"),
            vec![258, u32::from(b' '), u32::from(b' '), u32::from(b'1')]
        );
    }

    #[test]
    fn non_speech_tokens_single_pieces_and_first_of_misc() {
        let note = "♪".as_bytes();
        let v = vocab(&[b" -", b" '", b"((", &note[..2], b" (", b"-("]);
        let bpe = WhisperBpe::new(&v).expect("bpe");
        let ns = bpe.non_speech_tokens();
        for want in [256u32, 257, 258, 259, 260, 261] {
            assert!(ns.contains(&want), "{want} missing from {ns:?}");
        }
        // Single-byte symbols are single tokens.
        assert!(ns.contains(&u32::from(b'"')) && ns.contains(&u32::from(b'~')));
        // Letters and ordinary punctuation are kept.
        assert!(!ns.contains(&u32::from(b'.')) && !ns.contains(&u32::from(b',')));
        assert!(!ns.contains(&u32::from(b'a')) && !ns.contains(&u32::from(b'-')));
    }
}
