//! The symbol list both merging tokenizers (SentencePiece and BPE) work on:
//! byte ranges of the text, each linked to its neighbours, two adjacent ones
//! joined by a merge (llama.cpp's `llm_symbol` and the merge step of its SPM
//! and BPE tokenizer sessions).

/// Bytes `start..start + len` of the text (`len` 0 once merged into its left
/// neighbour), linked to the symbols before and after it.
#[derive(Clone, Copy)]
pub(super) struct Symbol {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) prev: Option<usize>,
    pub(super) next: Option<usize>,
}

impl Symbol {
    /// Symbol `i` of a text of `text_len` bytes: bytes `start..start + len`,
    /// linked to symbols `i - 1` and `i + 1` where they exist.
    pub(super) fn new(i: usize, start: usize, len: usize, text_len: usize) -> Symbol {
        Symbol {
            start,
            len,
            prev: i.checked_sub(1),
            next: (start + len < text_len).then_some(i + 1),
        }
    }
}

/// Joins symbol `r` onto its left neighbour `l`, unless the merge is stale:
/// one of them has grown or been absorbed since it was queued, which their
/// lengths no longer adding up to `size` shows (symbols only ever grow).
/// Returns the joined symbol's neighbours on each side, with which new pairs
/// form.
pub(super) fn merge(
    symbols: &mut [Symbol],
    l: usize,
    r: usize,
    size: usize,
) -> Option<(Option<usize>, Option<usize>)> {
    let (left, right) = (symbols[l], symbols[r]);
    if left.len == 0 || right.len == 0 || left.len + right.len != size {
        return None;
    }
    symbols[l].len += right.len;
    symbols[l].next = right.next;
    symbols[r].len = 0;
    if let Some(n) = right.next {
        symbols[n].prev = Some(l);
    }
    Some((left.prev, right.next))
}
