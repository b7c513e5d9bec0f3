//! SentencePiece-style `tokenizer.json` (model `BPE` with `byte_fallback`,
//! `▁` for spaces, `<0xXX>` byte tokens: Llama 2, Mistral v0.1-0.3, Phi-3,
//! Gemma) as the GGUF SPM metadata (`tokenizer.ggml.model = "llama"`) that
//! [`crate::tokenizer`]'s SentencePiece implementation reads.
//!
//! Scores. llama.cpp's SPM tokenizer merges, again and again, the adjacent
//! pair whose concatenation is the highest-scoring token (leftmost on ties);
//! HF's BPE merges the adjacent pair of lowest merge rank. Giving each piece
//! the score `-(rank of the first merge that makes it)` turns the one into
//! the other: the best-scoring candidate is the lowest-ranked merge. Pieces
//! no merge makes (single characters, byte tokens, specials) get a score
//! below every merged piece. transformers' converter (`generate_merges`)
//! lists the merges in the order of the pieces' sentencepiece ids, which is
//! sentencepiece's own score order, so for a converted `tokenizer.model`
//! these scores rank the pieces as its scores do.
//!
//! Where combs differs from llama.cpp: `convert_hf_to_gguf.py` reads a
//! `tokenizer.model` when there is one (`_set_vocab_sentencepiece`, its real
//! scores); from a tokenizer.json alone (`gguf-py`'s `LlamaHfVocab`) it
//! writes `-1000` for every score, so llama.cpp then merges leftmost-first
//! instead of in merge order. combs derives the scores from the merges
//! instead, which is what makes its ids equal transformers'.
//!
//! Where the two algorithms can still part (none occurs in the fixture's
//! texts): (1) two merges that make the same piece from different splits
//! (`aa`+`a` and `a`+`aa`) both applicable at once: HF takes the lower rank,
//! SPM the leftmost; (2) a multi-character vocabulary piece no merge makes
//! is still merged by SPM (last, with the lowest score), never by HF;
//! (3) none here: a `Metaspace` pre-tokenizer prepends `▁` only to text
//! not starting with a space (and with `prepend_scheme: "first"` only at
//! the start of the input), llama.cpp's `add_space_prefix` to every text at
//! the start or after a special token; combs records the scheme under its
//! own key [`crate::tokenizer::METASPACE_KEY`] and follows Metaspace.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use super::key_err;
use crate::error::{ModelError, Result};

/// GGUF token types (llama.cpp's `llama_token_type`).
pub(super) const TYPE_NORMAL: i32 = 1;
const TYPE_UNKNOWN: i32 = 2;
const TYPE_BYTE: i32 = 6;

/// `▁`, SentencePiece's escaped space.
const SPACE: &str = "\u{2581}";

/// The SPM-specific keys: per-token scores, token types corrected for byte
/// and unknown tokens, and whether a `▁` is prepended to the text.
pub(super) struct SpmVocab {
    /// `tokenizer.ggml.scores`, one per token.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: bool,
    /// [`crate::tokenizer::METASPACE_KEY`]: the Metaspace pre-tokenizer's
    /// prepend scheme when it is what prepends the `▁`.
    pub metaspace: Option<&'static str>,
}

/// Whether `text` is a byte token `<0xXX>`; its byte if so.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The normalizer's contribution: `(prepends ▁, escapes spaces)`.
fn normalizer_flags(node: &Value, path: &Path) -> Result<(bool, bool)> {
    let err = |reason: String| key_err(path, "normalizer", reason);
    match node.get("type").and_then(Value::as_str) {
        None if node.is_null() => Ok((false, false)),
        Some("Sequence") => {
            let mut flags = (false, false);
            for n in node
                .get("normalizers")
                .and_then(Value::as_array)
                .ok_or_else(|| err("a Sequence without `normalizers`".into()))?
            {
                let (p, r) = normalizer_flags(n, path)?;
                flags = (flags.0 | p, flags.1 | r);
            }
            Ok(flags)
        }
        Some("Prepend") if node.get("prepend").and_then(Value::as_str) == Some(SPACE) => {
            Ok((true, false))
        }
        Some("Replace")
            if node
                .get("pattern")
                .and_then(|p| p.get("String"))
                .and_then(Value::as_str)
                == Some(" ")
                && node.get("content").and_then(Value::as_str) == Some(SPACE) =>
        {
            Ok((false, true))
        }
        _ => Err(err(format!(
            "a normalizer SentencePiece-style BPE has no match for in combs \
             (only Prepend(\"▁\") and Replace(\" \", \"▁\")): {node}"
        ))),
    }
}

/// The pre-tokenizer's contribution: `(prepend scheme, escapes spaces)`.
fn pre_tokenizer_flags(node: &Value, path: &Path) -> Result<(Option<&'static str>, bool)> {
    let err = |reason: String| key_err(path, "pre_tokenizer", reason);
    match node.get("type").and_then(Value::as_str) {
        None if node.is_null() => Ok((None, false)),
        Some("Metaspace") => {
            if node.get("replacement").and_then(Value::as_str) != Some(SPACE) {
                return Err(err(format!("a Metaspace replacement other than ▁: {node}")));
            }
            // split: true cuts the text at every ▁ before merging, which
            // llama.cpp's SPM never does
            if node.get("split").and_then(Value::as_bool) == Some(true) {
                return Err(err(
                    "Metaspace with `split: true` is not supported (SPM merges across ▁)".into(),
                ));
            }
            // older tokenizers say `add_prefix_space`, newer `prepend_scheme`
            let prepend = match node.get("prepend_scheme").and_then(Value::as_str) {
                Some("always") => Some("always"),
                Some("first") => Some("first"),
                Some("never") => None,
                Some(other) => return Err(err(format!("unknown prepend_scheme `{other}`"))),
                None => node
                    .get("add_prefix_space")
                    .and_then(Value::as_bool)
                    .unwrap_or(true)
                    .then_some("always"),
            };
            Ok((prepend, true))
        }
        _ => Err(err(format!(
            "a pre-tokenizer SentencePiece-style BPE has no match for in combs \
             (only Metaspace without split): {node}"
        ))),
    }
}

/// Checks a SentencePiece-style BPE tokenizer and derives its scores and
/// `add_space_prefix`; sets the types of byte tokens and of `unk` in
/// `types`.
///
/// `texts` / `types` are the whole vocabulary by id (added tokens already
/// typed control / user-defined), `merges` the model's merges in rank
/// order, `unk` the unknown token's text if one is named.
///
/// # Errors
/// A missing byte token, a merge naming a piece not in the vocabulary, or
/// a normalizer / pre-tokenizer with no SPM equivalent; each naming
/// `tokenizer.json` and the key.
pub(super) fn spm_vocab(
    path: &Path,
    tokenizer: &Value,
    texts: &[String],
    types: &mut [i32],
    merges: &[(String, String)],
    unk: Option<&str>,
) -> Result<SpmVocab> {
    let err = |key: &str, reason: String| key_err(path, key, reason);
    let id_of: HashMap<&str, usize> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();

    // every byte must have its token: SPM writes any piece that is not a
    // token as bytes, and has no `<unk>` path for a missing one
    let mut have = [false; 256];
    for (i, t) in texts.iter().enumerate() {
        if let Some(b) = byte_of(t) {
            have[b as usize] = true;
            types[i] = TYPE_BYTE;
        }
    }
    if let Some(b) = have.iter().position(|&h| !h) {
        return Err(err(
            "model.vocab",
            format!("`byte_fallback` is set but the byte token `<0x{b:02X}>` is missing"),
        ));
    }
    if let Some(&i) = unk.and_then(|u| id_of.get(u)) {
        types[i] = TYPE_UNKNOWN;
    }

    // score = -(rank of the first merge making the piece); see the module doc
    let unmerged = -(merges.len() as f32) - 1.0;
    let mut scores = vec![unmerged; texts.len()];
    let mut scored = vec![false; texts.len()];
    for (rank, (a, b)) in merges.iter().enumerate() {
        let key = format!("model.merges[{rank}]");
        for part in [a, b] {
            if !id_of.contains_key(part.as_str()) {
                return Err(err(&key, format!("`{part}` is not in the vocabulary")));
            }
        }
        let joined = format!("{a}{b}");
        let &id = id_of.get(joined.as_str()).ok_or_else(|| {
            err(
                &key,
                format!("the merged piece `{joined}` is not in the vocabulary"),
            )
        })?;
        if !scored[id] {
            scored[id] = true;
            scores[id] = -(rank as f32);
        }
    }

    let norm = tokenizer.get("normalizer").unwrap_or(&Value::Null);
    let pre = tokenizer.get("pre_tokenizer").unwrap_or(&Value::Null);
    let (n_prepend, n_escape) = normalizer_flags(norm, path)?;
    let (p_prepend, p_escape) = pre_tokenizer_flags(pre, path)?;
    if !(n_escape || p_escape) {
        return Err(ModelError::Metadata {
            key: format!("{}: normalizer", path.display()),
            reason: "SentencePiece-style BPE whose spaces are not escaped as ▁ \
                     (no Replace(\" \", \"▁\") normalizer or Metaspace pre-tokenizer)"
                .into(),
        });
    }
    Ok(SpmVocab {
        scores,
        add_space_prefix: n_prepend || p_prepend.is_some(),
        // a Prepend normalizer prepends to every text, as llama.cpp does
        metaspace: if n_prepend { None } else { p_prepend },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_tokens_are_recognised() {
        assert_eq!(byte_of("<0x0A>"), Some(10));
        assert_eq!(byte_of("<0xff>"), Some(255));
        assert_eq!(byte_of("<0x1>"), None);
        assert_eq!(byte_of("0x41"), None);
    }

    #[test]
    fn prepend_and_escape_come_from_normalizer_or_metaspace() {
        let p = Path::new("tokenizer.json");
        let legacy = serde_json::json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]});
        assert_eq!(normalizer_flags(&legacy, p).ok(), Some((true, true)));
        let meta = serde_json::json!({"type": "Metaspace", "replacement": "▁",
            "prepend_scheme": "never", "split": false});
        assert_eq!(pre_tokenizer_flags(&meta, p).ok(), Some((None, true)));
        let nfkc = serde_json::json!({"type": "NFKC"});
        assert!(normalizer_flags(&nfkc, p).is_err());
    }
}
