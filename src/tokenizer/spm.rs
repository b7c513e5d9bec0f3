//! SentencePiece-style tokenization of a text fragment, as llama.cpp's
//! `llm_tokenizer_spm_session::tokenize` does: start from UTF-8 characters,
//! repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring token (leftmost on ties), and write any piece that is not
//! a token as byte tokens (`<0xXX>`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::symbols::{Symbol, merge};
use super::unicode::utf8_len;
use super::vocab::Vocab;
use crate::error::Result;

/// A candidate merge: the best score first, then the leftmost.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already escaped as `▁`) and appends the ids.
///
/// # Errors
/// [`crate::ModelError::Metadata`] when a byte has no token to fall back to.
pub(crate) fn tokenize(text: &[u8], vocab: &Vocab, out: &mut Vec<u32>) -> Result<()> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        symbols.push(Symbol::new(symbols.len(), offs, len, text.len()));
        offs += len;
    }
    if symbols.is_empty() {
        return Ok(());
    }

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], l: usize, r: usize| {
        let start = symbols[l].start;
        let size = symbols[l].len + symbols[r].len;
        if let Some(id) = vocab.id(&text[start..start + size]) {
            queue.push(Bigram {
                score: vocab.tokens[id as usize].score,
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let Some((prev, next)) = merge(&mut symbols, b.left, b.right, b.size) else {
            continue;
        };
        if let Some(p) = prev {
            try_add(&mut queue, &symbols, p, b.left);
        }
        if let Some(n) = next {
            try_add(&mut queue, &symbols, b.left, n);
        }
    }

    // Every merged symbol is a token; an unmerged character may not be.
    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        let piece = &text[s.start..s.start + s.len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece {
                    out.push(vocab.byte_to_token(b)?);
                }
            }
        }
        i = s.next;
    }
    Ok(())
}
