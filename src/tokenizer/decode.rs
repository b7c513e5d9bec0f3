//! Tokens back to bytes: one token's piece (`llama_vocab::impl::token_to_piece`)
//! and a whole sequence (`llama_vocab::impl::detokenize`, including its
//! `clean_spaces` passes), both following llama.cpp.

use super::unicode::{char_to_byte, str_lossy};
use super::vocab::{Vocab, VocabKind, attr};

/// The settings of the vocabulary that shape decoding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeFlags {
    pub(crate) add_space_prefix: bool,
    pub(crate) clean_spaces: bool,
}

/// `strtol(text.substr(3, 2), 16)` of a `<0xXX>` token.
fn token_to_byte(text: &[u8]) -> u8 {
    let digits = text.get(3..text.len().min(5)).unwrap_or(&[]);
    let mut v: u32 = 0;
    for &d in digits {
        match (d as char).to_digit(16) {
            Some(x) => v = v * 16 + x,
            None => break,
        }
    }
    v as u8
}

/// `llama_decode_text`: a token written in the GPT-2 byte alphabet to raw bytes.
fn decode_byte_alphabet(text: &[u8], out: &mut Vec<u8>) {
    let mut buf = [0u8; 4];
    for c in str_lossy(text).chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
}

/// Appends the bytes of one token; `special` renders control tokens' text.
pub(crate) fn push_piece(vocab: &Vocab, token: u32, special: bool, out: &mut Vec<u8>) {
    let Some(data) = vocab.tokens.get(token as usize) else {
        return;
    };
    let a = data.attr;
    if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
        return;
    }
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(&data.text);
    } else if a & attr::NORMAL != 0 {
        match vocab.kind {
            VocabKind::Spm => unescape_whitespace(&data.text, out),
            VocabKind::Bpe => decode_byte_alphabet(&data.text, out),
        }
    } else if a & attr::BYTE != 0 {
        out.push(token_to_byte(&data.text));
    }
}

/// `▁` (U+2581) back to a space.
fn unescape_whitespace(text: &[u8], out: &mut Vec<u8>) {
    const ESC: &[u8] = "\u{2581}".as_bytes();
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(ESC) {
            out.push(b' ');
            i += ESC.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
}

/// `llama_detokenize(remove_special = false, unparse_special = special)`.
pub(crate) fn detokenize(
    vocab: &Vocab,
    flags: DecodeFlags,
    tokens: &[u32],
    special: bool,
) -> Vec<u8> {
    let mut text = Vec::new();
    let mut remove_space = flags.add_space_prefix;
    let mut piece = Vec::new();
    for &t in tokens {
        piece.clear();
        push_piece(vocab, t, special, &mut piece);
        let skip = usize::from(remove_space && piece.first() == Some(&b' '));
        text.extend_from_slice(&piece[skip..]);
        remove_space = false;
    }
    if flags.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// The three in-place passes of llama.cpp's `clean_spaces`, byte for byte.
fn clean_spaces(text: &mut Vec<u8>) {
    // " ?", " !", " .", " ,": drop the space.
    let total1 = text.len();
    let mut total = usize::from(total1 > 0);
    for i in 1..total1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // " ' ": drop both spaces around a lone apostrophe.
    let total2 = total;
    total = usize::from(total2 > 0);
    let mut i = 1;
    while i < total2 {
        let x = text[i];
        if x == b'\'' && i + 1 < total2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // " 's", " 'm", " 're", " 've": drop the space.
    let total3 = total;
    total = usize::from(total3 > 0);
    for i in 1..total3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < total3 {
            let x1 = text[i + 1];
            if x1 == b't' || x1 == b'd' {
                // " 't", " 'd": kept
            } else if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if i + 2 < total3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).expect("ascii")
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_rules() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("he 's we 're I 'd"), "he's we're I 'd");
        assert_eq!(clean(""), "");
    }

    #[test]
    fn byte_token_text_parses_hex() {
        assert_eq!(token_to_byte(b"<0x41>"), 0x41);
        assert_eq!(token_to_byte(b"<0xFF>"), 0xFF);
        assert_eq!(token_to_byte(b"<0x0A>"), 0x0A);
    }
}
