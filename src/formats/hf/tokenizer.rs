//! `tokenizer.json` (+ `tokenizer_config.json`) as the `tokenizer.ggml.*`
//! metadata llama.cpp's converter writes for the same tokenizer
//! (`gguf-py`'s `SpecialVocab` and `TextModel._set_vocab_gpt2`), so the
//! existing byte-level BPE implementation runs it.
//!
//! Supported: byte-level BPE (`model.type = "BPE"` without byte fallback, a
//! `ByteLevel` pre-tokenizer) — GPT-2, SmolLM, Qwen2/2.5/3, Llama 3. The
//! pre-tokenizer (a `Split` regex, `Digits`, `ByteLevel`'s own regex) is
//! matched to the `tokenizer.ggml.pre` name whose regex list is the same.
//! SentencePiece-style BPE (byte fallback, `▁` for spaces: Llama 2,
//! Mistral v0.1-0.3, Gemma, Phi-3) becomes `tokenizer.ggml.model = "llama"`
//! with scores derived from the merge ranks (`super::spm` says how and
//! where that differs from llama.cpp's converter). Unigram is refused: the
//! SPM tokenizer's greedy merging is not Unigram's best-path search.

use std::path::Path;

use serde_json::Value;

use super::key_err;
use super::spm::{TYPE_NORMAL, spm_vocab};
use crate::error::Result;
use crate::formats::gguf::{MetaArray, MetaValue};
use crate::tokenizer::METASPACE_KEY;

/// GPT-2's regex, as `ByteLevel { use_regex: true }` applies it.
const GPT2_RE: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
/// Llama 3's pattern as its tokenizer.json spells it.
const LLAMA3_RE: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Qwen2's pattern as its tokenizer.json spells it.
const QWEN2_RE: &str = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// `tokenizer.ggml.pre` of the regex list a pre-tokenizer applies (names
/// as llama.cpp's `convert_hf_to_gguf_update.py` assigns them).
fn pre_name(regexes: &[String]) -> Option<&'static str> {
    let r: Vec<&str> = regexes.iter().map(String::as_str).collect();
    Some(match r.as_slice() {
        [GPT2_RE] => "gpt2",
        ["\\p{N}", GPT2_RE] => "smollm",
        [LLAMA3_RE] => "llama-bpe",
        [QWEN2_RE] => "qwen2",
        _ => return None,
    })
}

/// The regexes a `pre_tokenizer` node splits with, in order; `None` for a
/// node this mapping does not know.
fn regexes_of(node: &Value, out: &mut Vec<String>) -> Option<()> {
    match node.get("type")?.as_str()? {
        "Sequence" => {
            for n in node.get("pretokenizers")?.as_array()? {
                regexes_of(n, out)?;
            }
        }
        "ByteLevel" => {
            if node
                .get("use_regex")
                .and_then(Value::as_bool)
                .unwrap_or(true)
            {
                out.push(GPT2_RE.to_string());
            }
            if node.get("add_prefix_space").and_then(Value::as_bool) == Some(true) {
                return None;
            }
        }
        "Digits" => {
            if node.get("individual_digits").and_then(Value::as_bool) != Some(true) {
                return None;
            }
            out.push("\\p{N}".to_string());
        }
        "Split" => {
            let re = node.get("pattern")?.get("Regex")?.as_str()?;
            if node.get("behavior").and_then(Value::as_str) != Some("Isolated")
                || node.get("invert").and_then(Value::as_bool) == Some(true)
            {
                return None;
            }
            out.push(re.to_string());
        }
        _ => return None,
    }
    Some(())
}

/// A special token given as a string or as `{"content": ...}`.
fn token_text(v: &Value) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Value::as_str))
}

/// The `tokenizer.ggml.*` (and `tokenizer.chat_template`) metadata of a
/// directory's tokenizer files. `config` supplies `bos_token_id` /
/// `eos_token_id` where `tokenizer_config.json` names no such token.
///
/// # Errors
/// A tokenizer this mapping does not support, or malformed entries, each
/// naming `tokenizer.json` (or `tokenizer_config.json`) and the key.
pub fn gguf_tokenizer_keys(
    dir: &Path,
    tokenizer: &Value,
    tokenizer_config: Option<&Value>,
    config: &Value,
    chat_template: Option<&str>,
) -> Result<Vec<(String, MetaValue)>> {
    let path = dir.join(super::TOKENIZER_FILE);
    let err = |key: &str, reason: &str| key_err(&path, key, reason);
    let model = tokenizer
        .get("model")
        .ok_or_else(|| err("model", "missing"))?;
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("BPE");
    if kind == "Unigram" {
        // llama.cpp's SPM merges greedily by score; Unigram picks the best
        // segmentation by total score (Viterbi), which can differ
        return Err(err(
            "model.type",
            "`Unigram` tokenizers are not supported (its best-path segmentation is not \
             the SPM tokenizer's greedy merging); BPE only",
        ));
    }
    if kind != "BPE" {
        return Err(err(
            "model.type",
            &format!("`{kind}` tokenizers are not supported (BPE only)"),
        ));
    }
    let sentencepiece = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| err("model.vocab", "missing or not an object"))?;
    let added: &[Value] = tokenizer
        .get("added_tokens")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);

    // ids: the vocabulary's, then the added tokens'
    let mut entries: Vec<(u64, String, i32)> = Vec::with_capacity(vocab.len() + added.len());
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| err(&format!("model.vocab.{text}"), "id is not an integer"))?;
        entries.push((id, text.clone(), TYPE_NORMAL));
    }
    for (i, t) in added.iter().enumerate() {
        let id = t.get("id").and_then(Value::as_u64);
        let text = t.get("content").and_then(Value::as_str);
        let (Some(id), Some(text)) = (id, text) else {
            return Err(err(
                &format!("added_tokens[{i}]"),
                "needs `id` and `content`",
            ));
        };
        // control for special tokens, user-defined for the others (llama.cpp)
        let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
        entries.push((id, text.to_string(), if special { 3 } else { 4 }));
    }
    // padded to the model's vocabulary with `[PADn]`, as the converter does
    let n_model = config
        .get("vocab_size")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let n = entries
        .iter()
        .map(|e| e.0 + 1)
        .max()
        .unwrap_or(0)
        .max(n_model.min(1 << 24));
    if n == 0 || n > (1 << 24) {
        return Err(err("model.vocab", &format!("{n} tokens is out of range")));
    }
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; n as usize];
    for (id, text, ty) in entries {
        // an added token may repeat a vocabulary entry; it decides the type
        tokens[id as usize] = Some((text, ty));
    }
    let (texts, mut types): (Vec<String>, Vec<i32>) = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| (format!("[PAD{i}]"), 5)))
        .unzip();

    let merges: Vec<(String, String)> = match model.get("merges").and_then(Value::as_array) {
        Some(list) => list
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let bad = || err(&format!("model.merges[{i}]"), "not a pair of strings");
                match m {
                    Value::String(s) => s
                        .split_once(' ')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .ok_or_else(bad),
                    Value::Array(pair) => match (pair.first(), pair.get(1)) {
                        (Some(Value::String(a)), Some(Value::String(b))) if pair.len() == 2 => {
                            Ok((a.clone(), b.clone()))
                        }
                        _ => Err(bad()),
                    },
                    _ => Err(err(&format!("model.merges[{i}]"), "not a merge")),
                }
            })
            .collect::<Result<_>>()?,
        None => return Err(err("model.merges", "missing")),
    };

    let mut out: Vec<(String, MetaValue)> = if sentencepiece {
        let unk = model.get("unk_token").and_then(Value::as_str).or_else(|| {
            tokenizer_config
                .and_then(|c| c.get("unk_token"))
                .and_then(token_text)
        });
        let sp = spm_vocab(&path, tokenizer, &texts, &mut types, &merges, unk)?;
        let mut keys = vec![
            ("tokenizer.ggml.model".into(), MetaValue::from("llama")),
            (
                "tokenizer.ggml.tokens".into(),
                MetaValue::Array(MetaArray::Str(texts.clone())),
            ),
            (
                "tokenizer.ggml.scores".into(),
                MetaValue::Array(MetaArray::F32(sp.scores)),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                MetaValue::Array(MetaArray::I32(types)),
            ),
            (
                "tokenizer.ggml.add_space_prefix".into(),
                MetaValue::Bool(sp.add_space_prefix),
            ),
        ];
        if let Some(scheme) = sp.metaspace {
            keys.push((METASPACE_KEY.into(), MetaValue::from(scheme)));
        }
        keys
    } else {
        byte_level_keys(&path, tokenizer, &texts, types, &merges)?
    };

    // special tokens: tokenizer_config.json names them, config.json has ids
    let id_of = |text: &str| texts.iter().position(|t| t == text).map(|i| i as u32);
    let cfg_path = dir.join(super::TOKENIZER_CONFIG_FILE);
    for (name, cfg_key) in [
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unknown", ""),
        ("padding", "pad_token_id"),
    ] {
        let tc_key = match name {
            "unknown" => "unk_token".to_string(),
            "padding" => "pad_token".to_string(),
            _ => format!("{name}_token"),
        };
        let named = tokenizer_config
            .and_then(|c| c.get(&tc_key))
            .filter(|v| !v.is_null());
        let id = match named {
            Some(v) => {
                let text =
                    token_text(v).ok_or_else(|| key_err(&cfg_path, &tc_key, "not a token"))?;
                Some(id_of(text).ok_or_else(|| {
                    key_err(
                        &cfg_path,
                        &tc_key,
                        format!("`{text}` is not in the vocabulary"),
                    )
                })?)
            }
            None => config
                .get(cfg_key)
                .and_then(|v| v.as_u64().or_else(|| v.get(0).and_then(Value::as_u64)))
                .filter(|&i| i < n)
                .map(|i| i as u32),
        };
        if let Some(id) = id {
            out.push((
                format!("tokenizer.ggml.{name}_token_id"),
                MetaValue::U32(id),
            ));
        }
    }
    let (add_bos, add_eos) = added_specials(tokenizer, tokenizer_config);
    out.push((
        "tokenizer.ggml.add_bos_token".into(),
        MetaValue::Bool(add_bos),
    ));
    out.push((
        "tokenizer.ggml.add_eos_token".into(),
        MetaValue::Bool(add_eos),
    ));
    if let Some(t) = chat_template {
        out.push(("tokenizer.chat_template".into(), MetaValue::from(t)));
    }
    Ok(out)
}

/// The keys of a byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`).
fn byte_level_keys(
    path: &Path,
    tokenizer: &Value,
    texts: &[String],
    types: Vec<i32>,
    merges: &[(String, String)],
) -> Result<Vec<(String, MetaValue)>> {
    let err = |key: &str, reason: &str| key_err(path, key, reason);
    let mut regexes = Vec::new();
    let pre_node = tokenizer.get("pre_tokenizer").unwrap_or(&Value::Null);
    let pre = regexes_of(pre_node, &mut regexes)
        .and_then(|()| pre_name(&regexes))
        .ok_or_else(|| {
            err(
                "pre_tokenizer",
                &format!("a pre-tokenizer combs has no match for: {pre_node}"),
            )
        })?;
    if !tokenizer.get("normalizer").is_none_or(Value::is_null) {
        return Err(err(
            "normalizer",
            "byte-level BPE with a normalizer is not supported",
        ));
    }
    let merges = merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
    Ok(vec![
        ("tokenizer.ggml.model".into(), MetaValue::from("gpt2")),
        ("tokenizer.ggml.pre".into(), MetaValue::from(pre)),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(MetaArray::Str(texts.to_vec())),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(MetaArray::I32(types)),
        ),
        (
            "tokenizer.ggml.merges".into(),
            MetaValue::Array(MetaArray::Str(merges)),
        ),
    ])
}

/// Whether encoding adds BOS / EOS: `add_bos_token` / `add_eos_token` of
/// tokenizer_config.json, else whether the post-processor's template for
/// one sequence starts / ends with a special token (as `SpecialVocab` reads
/// it).
fn added_specials(tokenizer: &Value, tokenizer_config: Option<&Value>) -> (bool, bool) {
    let single = tokenizer
        .get("post_processor")
        .and_then(|p| p.get("single"))
        .and_then(Value::as_array);
    let special_at = |i: Option<&Value>| i.is_some_and(|v| v.get("SpecialToken").is_some());
    let from_template = single.map_or((false, false), |s| {
        (special_at(s.first()), s.len() > 1 && special_at(s.last()))
    });
    let flag = |k: &str| {
        tokenizer_config
            .and_then(|c| c.get(k))
            .and_then(Value::as_bool)
    };
    (
        flag("add_bos_token").unwrap_or(from_template.0),
        flag("add_eos_token").unwrap_or(from_template.1),
    )
}
