//! SentencePiece-style `tokenizer.json` (BPE with byte fallback, `▁`,
//! `<0xXX>` byte tokens) mapped onto GGUF SPM metadata by
//! `formats::hf::tokenizer`, against transformers' fast tokenizer.
//!
//! Fixture `tests/fixtures/hf/spm_tokenizer/` (made by
//! `scripts/make-spm-tokenizer-fixture.py`): a 600-piece BPE SentencePiece
//! model trained with `byte_fallback=True`, converted by transformers 5.17,
//! and `cases.json` with transformers' ids (without and with BOS), its
//! decode, and sentencepiece's own ids for each text. combs must give
//! transformers' ids on every text, and decode them to what transformers
//! decodes. Bad tokenizer.json files are errors naming the key. No device
//! needed.

use std::path::{Path, PathBuf};

use combs::formats::hf::tokenizer::gguf_tokenizer_keys;
use combs::formats::{GgufFile, GgufWriter};
use combs::tokenizer::Tokenizer;
use serde_json::{Value, json};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/spm_tokenizer")
}

fn read(name: &str) -> Value {
    let p = fixture().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// combs' tokenizer for a tokenizer.json (with the fixture's
/// tokenizer_config.json), through the same metadata an HF directory gets.
fn tokenizer_of(tok: &Value) -> combs::Result<Tokenizer> {
    let tc = read("tokenizer_config.json");
    let keys = gguf_tokenizer_keys(&fixture(), tok, Some(&tc), &json!({}), None)?;
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w.add(k, v)?;
    }
    Tokenizer::from_gguf(&GgufFile::from_bytes(w.to_bytes())?)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn spm_tokenizer_json_matches_transformers_ids() {
    let t = tokenizer_of(&read("tokenizer.json")).expect("tokenizer");
    assert_eq!(t.n_vocab(), 600);
    let cases = read("cases.json");
    let cases = cases["cases"].as_array().expect("cases");
    let (mut same_as_spm, mut tokens) = (0, 0);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let got = t.encode(text, false, true).expect("encode");
        assert_eq!(got, want, "{text:?}");
        let got = t.encode(text, true, true).expect("encode");
        assert_eq!(got, ids(&case["ids_special"]), "{text:?} with BOS");
        let decoded = case["decoded"].as_str().expect("decoded");
        assert_eq!(t.decode(&want), decoded, "decode of {text:?}");
        same_as_spm += usize::from(want == ids(&case["spm_ids"]));
        tokens += want.len();
    }
    eprintln!(
        "{} texts, {tokens} tokens equal to transformers'; sentencepiece agrees on {same_as_spm}",
        cases.len()
    );
}

/// The error text of a modified tokenizer.json.
fn err_of(edit: impl FnOnce(&mut Value)) -> String {
    let mut tok = read("tokenizer.json");
    edit(&mut tok);
    match tokenizer_of(&tok) {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn spm_tokenizer_json_without_byte_tokens_is_an_error() {
    let e = err_of(|t| {
        let vocab = t["model"]["vocab"].as_object_mut().expect("vocab");
        vocab.retain(|k, _| !k.starts_with("<0x"));
    });
    assert!(e.contains("model.vocab") && e.contains("<0x00>"), "{e}");
}

#[test]
fn spm_merge_naming_unknown_piece_is_an_error() {
    let e = err_of(|t| {
        let merges = t["model"]["merges"].as_array_mut().expect("merges");
        merges.push(json!(["▁the", "zebra"]));
    });
    assert!(e.contains("model.merges[") && e.contains("`zebra`"), "{e}");
    let e = err_of(|t| {
        let merges = t["model"]["merges"].as_array_mut().expect("merges");
        merges.push(json!(["q", "q"]));
    });
    assert!(e.contains("model.merges[") && e.contains("`qq`"), "{e}");
}

#[test]
fn spm_unsupported_normalizer_and_unigram_are_errors() {
    let e = err_of(|t| t["normalizer"] = json!({"type": "NFKC"}));
    assert!(e.contains("normalizer") && e.contains("NFKC"), "{e}");
    let e = err_of(|t| {
        t["pre_tokenizer"] = Value::Null;
    });
    assert!(e.contains("not escaped"), "{e}");
    let e = err_of(|t| t["model"]["type"] = json!("Unigram"));
    assert!(e.contains("model.type") && e.contains("Unigram"), "{e}");
}

/// Optional wider check: `COMBS_SPM_EXTRA_CASES=FILE` (a cases.json-shaped
/// file of transformers' ids for more texts, e.g. every line and 3000-byte
/// chunk of /usr/share/common-licenses/*, made with this fixture's
/// tokenizer) counts the texts where combs' ids differ; none may.
#[test]
fn spm_tokenizer_json_matches_transformers_on_extra_cases() {
    let Ok(path) = std::env::var("COMBS_SPM_EXTRA_CASES") else {
        return;
    };
    let t = tokenizer_of(&read("tokenizer.json")).expect("tokenizer");
    let text = std::fs::read_to_string(&path).expect("extra cases");
    let v: Value = serde_json::from_str(&text).expect("extra cases json");
    let cases = v["cases"].as_array().expect("cases");
    let (mut differ, mut tokens) = (0, 0);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        tokens += want.len();
        if t.encode(text, false, true).expect("encode") != want {
            differ += 1;
            if differ <= 5 {
                eprintln!("differs: {text:?}");
            }
        }
    }
    eprintln!("{} texts, {tokens} tokens: {differ} differ", cases.len());
    assert_eq!(differ, 0);
}
