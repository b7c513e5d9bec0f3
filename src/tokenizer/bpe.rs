//! Byte-level BPE: merging the characters of one pre-tokenized word by merge
//! rank, as llama.cpp's `llm_tokenizer_bpe_session::tokenize` does.
//!
//! llama.cpp keys its merge table by string pairs. Here every string that
//! takes part in a merge (both halves and their concatenation) is interned to
//! a small id once, so a merge lookup is a hash of two integers and each
//! symbol keeps the id of its text beside it. A queued pair is stale exactly
//! when one of its symbols has grown or been absorbed since, which the byte
//! lengths show (symbols only ever grow), the same test llama.cpp makes by
//! comparing texts.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::hash::FxHashMap;
use super::symbols::{Symbol, merge};
use super::vocab::Vocab;
use crate::error::{ModelError, Result};

/// Merge ranks of a BPE vocabulary.
#[derive(Debug)]
pub(crate) struct BpeRanks {
    /// Interned merge strings.
    sym_ids: FxHashMap<Box<str>, u32>,
    /// Token id of each interned string, if it is a token.
    sym_token: Vec<Option<u32>>,
    /// (left, right) → (rank, merged string).
    merges: FxHashMap<u64, (u32, u32)>,
}

impl BpeRanks {
    /// Reads `tokenizer.ggml.merges` ("left right" per entry; the first space
    /// after the first byte separates the halves, as in llama.cpp).
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when there are more merges than fit in `u32`.
    pub(crate) fn new(merges: &[String], vocab: &Vocab) -> Result<BpeRanks> {
        if merges.len() > u32::MAX as usize / 2 {
            return Err(ModelError::Metadata {
                key: "tokenizer.ggml.merges".into(),
                reason: "too many merges".into(),
            });
        }
        let mut ranks = BpeRanks {
            sym_ids: FxHashMap::default(),
            sym_token: Vec::with_capacity(merges.len() * 2),
            merges: FxHashMap::default(),
        };
        ranks.sym_ids.reserve(merges.len() * 2);
        ranks.merges.reserve(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            let split = m
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1);
            let (first, second) = match split {
                Some(p) => (&m[..p], &m[p + 1..]),
                None => ("", ""),
            };
            let l = ranks.intern(first, vocab);
            let r = ranks.intern(second, vocab);
            joined.clear();
            joined.push_str(first);
            joined.push_str(second);
            let j = ranks.intern(&joined, vocab);
            // llama.cpp `emplace`s: the first rank of a repeated pair stays.
            ranks
                .merges
                .entry(pair_key(l, r))
                .or_insert((rank as u32, j));
        }
        Ok(ranks)
    }

    fn intern(&mut self, s: &str, vocab: &Vocab) -> u32 {
        if let Some(&id) = self.sym_ids.get(s) {
            return id;
        }
        let id = self.sym_token.len() as u32;
        self.sym_ids.insert(s.into(), id);
        self.sym_token.push(vocab.id(s.as_bytes()));
        id
    }
}

fn pair_key(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

/// Queued merge: ordered by rank, then by left position (smallest first).
type Bigram = Reverse<(u32, usize, usize, usize, u32)>;

/// Tokenizes the words of one `encode` call, reusing buffers and the
/// result of words already seen (a word always gives the same tokens).
pub(crate) struct BpeSession<'a> {
    ranks: &'a BpeRanks,
    vocab: &'a Vocab,
    ignore_merges: bool,
    symbols: Vec<Symbol>,
    /// The interned string of each symbol's text, if it takes part in a merge.
    syms: Vec<Option<u32>>,
    queue: BinaryHeap<Bigram>,
    cache: FxHashMap<String, Vec<u32>>,
}

impl<'a> BpeSession<'a> {
    /// A session over one vocabulary; `ignore_merges` as llama.cpp's flag.
    pub(crate) fn new(ranks: &'a BpeRanks, vocab: &'a Vocab, ignore_merges: bool) -> Self {
        BpeSession {
            ranks,
            vocab,
            ignore_merges,
            symbols: Vec::new(),
            syms: Vec::new(),
            queue: BinaryHeap::new(),
            cache: FxHashMap::default(),
        }
    }

    /// Tokenizes one word (already in the byte alphabet) and appends its ids.
    pub(crate) fn word(&mut self, word: &str, out: &mut Vec<u32>) {
        if let Some(ids) = self.cache.get(word) {
            out.extend_from_slice(ids);
            return;
        }
        let start = out.len();
        self.merge_word(word, out);
        if self.cache.len() < 1 << 16 {
            self.cache.insert(word.to_string(), out[start..].to_vec());
        }
    }

    fn push(&mut self, l: usize, r: usize) {
        let (Some(a), Some(b)) = (self.syms[l], self.syms[r]) else {
            return;
        };
        if let Some(&(rank, merged)) = self.ranks.merges.get(&pair_key(a, b)) {
            let size = self.symbols[l].len + self.symbols[r].len;
            self.queue.push(Reverse((rank, l, r, size, merged)));
        }
    }

    fn merge_word(&mut self, word: &str, out: &mut Vec<u32>) {
        let (ranks, vocab) = (self.ranks, self.vocab);
        if word.is_empty() {
            return;
        }
        if self.ignore_merges
            && let Some(id) = vocab.id(word.as_bytes())
        {
            out.push(id);
            return;
        }
        self.symbols.clear();
        self.syms.clear();
        self.queue.clear();
        for (i, (start, c)) in word.char_indices().enumerate() {
            let len = c.len_utf8();
            self.symbols.push(Symbol::new(i, start, len, word.len()));
            self.syms
                .push(ranks.sym_ids.get(&word[start..start + len]).copied());
        }
        for i in 1..self.symbols.len() {
            self.push(i - 1, i);
        }
        while let Some(Reverse((_, l, r, size, merged))) = self.queue.pop() {
            let Some((prev, next)) = merge(&mut self.symbols, l, r, size) else {
                continue;
            };
            self.syms[l] = Some(merged);
            if let Some(p) = prev {
                self.push(p, l);
            }
            if let Some(n) = next {
                self.push(l, n);
            }
        }
        for (s, &sym) in self
            .symbols
            .iter()
            .zip(&self.syms)
            .filter(|(s, _)| s.len > 0)
        {
            let text = &word[s.start..s.start + s.len];
            let token = match sym {
                Some(sym) => ranks.sym_token[sym as usize],
                None => vocab.id(text.as_bytes()),
            };
            match token {
                Some(t) => out.push(t),
                None => {
                    // llama.cpp looks each raw byte up as a one-byte token and
                    // drops the ones that are not.
                    for &b in text.as_bytes() {
                        if let Some(t) = vocab.id(&[b]) {
                            out.push(t);
                        }
                    }
                }
            }
        }
    }
}
