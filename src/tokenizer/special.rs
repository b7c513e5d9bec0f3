//! Splitting special tokens out of the input text before the vocabulary's
//! own algorithm runs, as llama.cpp's `tokenizer_st_partition` does: each
//! special token in turn (longest text first) is searched in every piece of
//! text still unprocessed, and each occurrence becomes a token of its own.
//!
//! Control and unknown tokens take part only when the caller asks for special
//! tokens to be parsed; user-defined tokens always do.

use memchr::memmem;

use super::hash::FxHashMap;
use super::vocab::{Vocab, attr};

/// A piece of the input: raw text (a byte range) or an already-known token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Bytes `start..start + len` of the input, still to be tokenized.
    Text { start: usize, len: usize },
    /// A special token found in the input.
    Token(u32),
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Length of the prefix that groups special tokens for a quick presence test.
const PREFIX_LEN: usize = 4;

/// The special tokens of a vocabulary, grouped by their first bytes so that
/// one search tells whether any token of a group can occur in a text (a
/// vocabulary like Gemma's has 6000 `<unusedN>` tokens sharing one prefix).
#[derive(Debug, Default)]
pub(crate) struct SpecialIndex {
    /// Distinct prefixes of the special tokens' texts.
    prefixes: Vec<Vec<u8>>,
    /// Prefix number of each entry of `Vocab::special_cache`.
    prefix_of: Vec<u32>,
}

impl SpecialIndex {
    /// Groups the special-token cache of `vocab`.
    pub(crate) fn new(vocab: &Vocab) -> SpecialIndex {
        let mut index = SpecialIndex::default();
        let mut seen: FxHashMap<&[u8], u32> = FxHashMap::default();
        for &id in &vocab.special_cache {
            let text = vocab.tokens[id as usize].text.as_slice();
            let prefix = &text[..text.len().min(PREFIX_LEN)];
            let n = index.prefixes.len() as u32;
            let k = *seen.entry(prefix).or_insert_with(|| {
                index.prefixes.push(prefix.to_vec());
                n
            });
            index.prefix_of.push(k);
        }
        index
    }
}

/// Splits `text` into fragments around the special tokens of `vocab`.
pub(crate) fn partition(
    vocab: &Vocab,
    index: &SpecialIndex,
    text: &[u8],
    parse_special: bool,
) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text {
        start: 0,
        len: text.len(),
    });
    // None: not searched yet.
    let mut present: Vec<Option<bool>> = vec![None; index.prefixes.len()];
    let mut next = Vec::new();
    for (k, &id) in vocab.special_cache.iter().enumerate() {
        let data = &vocab.tokens[id as usize];
        if !parse_special && data.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let p = index.prefix_of[k] as usize;
        let has_prefix =
            *present[p].get_or_insert_with(|| memmem::find(text, &index.prefixes[p]).is_some());
        if !has_prefix {
            continue;
        }
        let needle = data.text.as_slice();
        if memmem::find(text, needle).is_none() {
            continue;
        }
        let finder = memmem::Finder::new(needle);
        next.clear();
        for &frag in &frags {
            let Fragment::Text { start, len } = frag else {
                next.push(frag);
                continue;
            };
            split_fragment(text, start, len, id, data.attr, &finder, &mut next);
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}

/// Replaces one text fragment by its pieces around every occurrence of one token.
fn split_fragment(
    text: &[u8],
    mut start: usize,
    mut len: usize,
    id: u32,
    token_attr: u32,
    finder: &memmem::Finder<'_>,
    out: &mut Vec<Fragment>,
) {
    let tlen = finder.needle().len();
    loop {
        let Some(rel) = finder.find(&text[start..start + len]) else {
            if len > 0 {
                out.push(Fragment::Text { start, len });
            }
            return;
        };
        let at = start + rel;
        if at > start {
            let mut left_len = at - start;
            if token_attr & attr::LSTRIP != 0 {
                while left_len > 0 && is_c_space(text[start + left_len - 1]) {
                    left_len -= 1;
                }
            }
            if left_len > 0 {
                out.push(Fragment::Text {
                    start,
                    len: left_len,
                });
            }
        }
        out.push(Fragment::Token(id));
        let end = start + len;
        if at + tlen >= end {
            return;
        }
        let mut right = at + tlen;
        let mut right_len = end - right;
        if token_attr & attr::RSTRIP != 0 {
            while right_len > 0 && is_c_space(text[right]) {
                right += 1;
                right_len -= 1;
            }
        }
        start = right;
        len = right_len;
    }
}
