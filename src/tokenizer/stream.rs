//! Incremental decoding of token pieces into text: a token's bytes may end in
//! the middle of a UTF-8 character (byte-fallback and byte-level tokens split
//! emoji and CJK across tokens), so bytes are held back until the character
//! they start is complete.

/// Turns a stream of token pieces into complete UTF-8 text.
///
/// Bytes that can never form a character are replaced by U+FFFD, as
/// [`String::from_utf8_lossy`] does; a character still incomplete at the end
/// is released (as U+FFFD) by [`StreamDecoder::flush`].
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the bytes of one piece and returns the text that is now complete.
    pub fn push(&mut self, piece: &[u8]) -> String {
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // The prefix was just checked to be valid UTF-8.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &tail[n..];
                        }
                        None => {
                            // An incomplete character at the end: keep it.
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let drop = self.pending.len() - keep;
        self.pending.drain(..drop);
        out
    }

    /// Releases whatever is pending (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// `true` while bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_decoder_joins_split_characters() {
        let text = "a😀é日";
        let bytes = text.as_bytes();
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&d.push(std::slice::from_ref(b)));
        }
        out.push_str(&d.flush());
        assert_eq!(out, text);
    }

    #[test]
    fn stream_decoder_replaces_invalid_bytes() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(b"a\xFFb"), "a\u{FFFD}b");
        assert_eq!(d.push(b"\xF0\x9F"), "");
        assert!(d.has_pending());
        assert_eq!(d.flush(), "\u{FFFD}");
    }
}
