//! The tokenizers of the real models against llama.cpp: token ids for every
//! corpus entry in every (add_special, parse_special) mode, detokenized text,
//! single-token pieces and the end-of-generation set, all from
//! `tests/fixtures/tokenizer/{smollm2,gemma3}.json` (written by
//! `scripts/make-tokenizer-fixtures.py` from llama.cpp's libllama). Also
//! round trips, [`StreamDecoder`] on split UTF-8, and encoding speed.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use combs::formats::gguf::GgufFile;
use combs::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::Value;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn models_dir() -> PathBuf {
    match std::env::var_os("COMBS_MODELS") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/combs/models")
        }
    }
}

fn load(file: &str) -> Tokenizer {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh (or set COMBS_MODELS)",
        path.display()
    );
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn smollm2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(SMOLLM2))
}

fn gemma3() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load(GEMMA3))
}

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/make-tokenizer-fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn cases(fx: &Value) -> &Vec<Value> {
    fx["cases"].as_array().expect("cases")
}

fn input(case: &Value) -> &str {
    case["input"].as_str().expect("input")
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Every corpus entry in all four modes; all mismatches are listed at once.
fn check_encode(tok: &Tokenizer, name: &str) {
    let fx = fixture(name);
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in cases(&fx) {
        let text = input(case);
        for (mode, add_special, parse_special) in [
            ("11", true, true),
            ("10", true, false),
            ("01", false, true),
            ("00", false, false),
        ] {
            let want = ids(&case["ids"][mode]);
            let got = tok
                .encode(text, add_special, parse_special)
                .unwrap_or_else(|e| panic!("{name}: encode({text:?}): {e}"));
            checked += 1;
            if got != want {
                failures.push(format!(
                    "{name} mode {mode} {text:?}\n  llama.cpp {want:?}\n  combs     {got:?}"
                ));
            }
        }
    }
    assert!(checked >= 200, "{name}: only {checked} encodings checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} encodings differ from llama.cpp:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn check_decode(tok: &Tokenizer, name: &str) {
    let fx = fixture(name);
    let mut failures = Vec::new();
    for case in cases(&fx) {
        let toks = ids(&case["ids"]["11"]);
        let got = tok.decode(&toks);
        let want = match case["decoded"]["text"].as_str() {
            Some(t) => t.to_string(),
            None => String::from_utf8_lossy(&hex_bytes(
                case["decoded"]["hex"].as_str().expect("decoded hex"),
            ))
            .into_owned(),
        };
        if got != want {
            failures.push(format!(
                "{name} {toks:?}\n  llama.cpp {want:?}\n  combs     {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "decode differs:\n{}",
        failures.join("\n")
    );
}

fn check_pieces(tok: &Tokenizer, name: &str) {
    let fx = fixture(name);
    let pieces = fx["pieces_hex"].as_object().expect("pieces");
    assert!(pieces.len() > 500, "{name}: too few pieces in the fixture");
    let mut failures = Vec::new();
    for (id, hex) in pieces {
        let id: u32 = id.parse().expect("token id");
        let want = hex_bytes(hex.as_str().expect("hex"));
        let got = tok.token_to_piece(id).expect("id in range");
        if got != want {
            failures.push(format!(
                "{name} token {id}: llama.cpp {want:?} combs {got:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "pieces differ:\n{}",
        failures.join("\n")
    );
}

fn check_special_ids(tok: &Tokenizer, name: &str) {
    let fx = fixture(name);
    assert_eq!(
        tok.n_vocab() as u64,
        fx["n_vocab"].as_u64().expect("n_vocab")
    );
    assert_eq!(tok.bos().map(u64::from), fx["bos"].as_u64());
    assert_eq!(tok.eos().map(u64::from), fx["eos"].as_u64());
    assert_eq!(tok.add_bos(), fx["add_bos"].as_bool().expect("add_bos"));
    let eog = ids(&fx["eog"]);
    assert_eq!(tok.eog_tokens(), eog, "{name}: EOG set");
    for t in 0..tok.n_vocab() as u32 {
        assert_eq!(tok.is_eog(t), eog.contains(&t), "{name}: is_eog({t})");
    }
}

fn check_round_trip(tok: &Tokenizer, name: &str) {
    for case in cases(&fixture(name)) {
        let text = input(case);
        // SentencePiece vocabularies write spaces as U+2581, so a literal
        // U+2581 in the input comes back as a space (in llama.cpp too).
        if text.contains('\u{2581}') {
            continue;
        }
        let toks = tok.encode(text, false, false).expect("encode");
        assert_eq!(tok.decode(&toks), text, "{name}: round trip of {text:?}");
    }
}

/// Pieces pushed one at a time come out as whole characters only.
fn check_stream(tok: &Tokenizer, name: &str) {
    let text = "emoji 😀👍🏽 👨‍👩‍👧‍👦 日本語 é ٣ \u{1FAE9}\u{10D40} end";
    let toks = tok.encode(text, false, false).expect("encode");
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    let mut split_seen = false;
    for &t in &toks {
        let piece = tok.token_to_piece(t).expect("piece");
        split_seen |= std::str::from_utf8(&piece).is_err();
        let part = d.push(&piece);
        assert!(
            !part.contains('\u{FFFD}'),
            "{name}: replacement char in {part:?}"
        );
        out.push_str(&part);
    }
    out.push_str(&d.flush());
    assert_eq!(out, text, "{name}: streamed text");
    assert!(
        split_seen,
        "{name}: no token split a character; the test proves nothing"
    );
}

fn english_text(bytes: usize) -> String {
    let para = "The committee met on Tuesday to review the proposal. After a long \
        discussion about costs, schedules and the risks of delay, they agreed that \
        the first phase should start in March, while the second would wait until \
        the results were known. Nobody expected it to be easy; still, everyone \
        seemed relieved that a decision had finally been made.\n\n";
    let mut s = String::with_capacity(bytes + para.len());
    while s.len() < bytes {
        s.push_str(para);
    }
    s
}

fn check_speed(tok: &Tokenizer, name: &str) {
    let text = english_text(100 * 1024);
    tok.encode(&text[..4096], true, false).expect("warm-up");
    let t0 = Instant::now();
    let toks = tok.encode(&text, true, false).expect("encode");
    let dt = t0.elapsed();
    eprintln!(
        "{name}: {} bytes -> {} tokens in {dt:?}",
        text.len(),
        toks.len()
    );
    assert!(toks.len() > 15_000, "{name}: {} tokens", toks.len());
    assert!(
        dt.as_secs_f64() < 1.0,
        "{name}: 100 KB took {dt:?} (must be well under a second in release)"
    );
}

#[test]
fn smollm2_encode_matches_llama_cpp() {
    check_encode(smollm2(), "smollm2");
}

#[test]
fn gemma3_encode_matches_llama_cpp() {
    check_encode(gemma3(), "gemma3");
}

#[test]
fn smollm2_decode_matches_llama_cpp() {
    check_decode(smollm2(), "smollm2");
}

#[test]
fn gemma3_decode_matches_llama_cpp() {
    check_decode(gemma3(), "gemma3");
}

#[test]
fn smollm2_pieces_match_llama_cpp() {
    check_pieces(smollm2(), "smollm2");
}

#[test]
fn gemma3_pieces_match_llama_cpp() {
    check_pieces(gemma3(), "gemma3");
}

#[test]
fn smollm2_special_ids_and_eog_match_llama_cpp() {
    check_special_ids(smollm2(), "smollm2");
    let t = smollm2();
    let im_end = t.encode("<|im_end|>", false, true).expect("encode");
    assert_eq!(im_end.len(), 1);
    assert!(t.is_eog(im_end[0]), "<|im_end|> ends generation");
}

#[test]
fn gemma3_special_ids_and_eog_match_llama_cpp() {
    check_special_ids(gemma3(), "gemma3");
    let t = gemma3();
    let eot = t.encode("<end_of_turn>", false, true).expect("encode");
    assert_eq!(eot.len(), 1);
    assert!(t.is_eog(eot[0]), "<end_of_turn> ends generation");
    assert!(!t.is_eog(t.bos().expect("bos")));
}

#[test]
fn smollm2_decode_round_trips_corpus() {
    check_round_trip(smollm2(), "smollm2");
}

#[test]
fn gemma3_decode_round_trips_corpus() {
    check_round_trip(gemma3(), "gemma3");
}

#[test]
fn smollm2_stream_decoder_joins_split_utf8() {
    check_stream(smollm2(), "smollm2");
}

#[test]
fn gemma3_stream_decoder_joins_split_utf8() {
    check_stream(gemma3(), "gemma3");
}

#[test]
fn smollm2_encode_100kb_is_fast() {
    check_speed(smollm2(), "smollm2");
}

#[test]
fn gemma3_encode_100kb_is_fast() {
    check_speed(gemma3(), "gemma3");
}

fn open_gguf(file: &str) -> GgufFile {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every pre-tokenizer combs implements, on SmolLM2's vocabulary with
/// `tokenizer.ggml.pre` swapped (fixture `variants.json`).
#[test]
fn pre_types_match_llama_cpp_on_smollm2_vocab() {
    let fx = fixture("variants");
    let g = open_gguf(fx["bpe_base"].as_str().expect("base model"));
    let texts = fx["texts"].as_array().expect("texts");
    let all = fx["pre_types"].as_object().expect("pre types");
    assert!(all.len() >= 20, "too few pre types in the fixture");
    let mut failures = Vec::new();
    for (pre, per_text) in all {
        let tok = Tokenizer::from_gguf_with_overrides(&g, Some(pre), None)
            .unwrap_or_else(|e| panic!("{pre}: {e}"));
        for (text, want) in texts.iter().zip(per_text.as_array().expect("per text")) {
            let text = text.as_str().expect("text");
            let got = tok.encode(text, false, false).expect("encode");
            if got != ids(want) {
                failures.push(format!(
                    "{pre} {text:?}\n  llama.cpp {want}\n  combs     {got:?}"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "pre-tokenizers differ:\n{}",
        failures.join("\n")
    );
}

/// Gemma's SentencePiece vocabulary with `add_space_prefix` on (Llama 2 style):
/// the prefix after BOS and after each special token, and its removal on decode.
#[test]
fn spm_space_prefix_matches_llama_cpp_on_gemma3_vocab() {
    let fx = fixture("variants");
    let g = open_gguf(fx["spm_base"].as_str().expect("base model"));
    let tok = Tokenizer::from_gguf_with_overrides(&g, None, Some(true)).expect("tokenizer");
    let texts = fx["spm_texts"].as_array().expect("texts");
    let v = &fx["spm_space_prefix"];
    for (i, text) in texts.iter().enumerate() {
        let text = text.as_str().expect("text");
        for (mode, add, parse) in [("11", true, true), ("00", false, false)] {
            let want = ids(&v[mode][i]);
            let got = tok.encode(text, add, parse).expect("encode");
            assert_eq!(got, want, "mode {mode} {text:?}");
        }
        let want = v["decoded"][i].as_str().expect("decoded");
        assert_eq!(tok.decode(&ids(&v["11"][i])), want, "decode of {text:?}");
    }
}

#[test]
fn token_to_piece_out_of_range_is_an_error() {
    let t = smollm2();
    let n = t.n_vocab() as u32;
    assert!(t.token_to_piece(n).is_err());
    assert!(t.token_to_piece(u32::MAX).is_err());
    assert_eq!(t.decode(&[n, u32::MAX]), "", "out-of-range ids are skipped");
}
