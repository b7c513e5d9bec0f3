//! Chat templates rendered by minijinja against Python jinja2: the fixtures
//! `tests/fixtures/tokenizer/chat_{smollm2,gemma3}.json` hold the models'
//! templates (ChatML, llama.cpp's fallback, where a model has none) and the
//! text jinja2 renders for a few conversations (scripts/make-tokenizer-fixtures.py).

use std::path::PathBuf;

use combs::formats::gguf::GgufFile;
use combs::tokenizer::{CHATML_TEMPLATE, ChatMessage, Tokenizer, apply_chat_template};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(format!("chat_{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (scripts/make-tokenizer-fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn load(file: &str) -> Tokenizer {
    let dir = match std::env::var_os("COMBS_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
            .join(".cache/combs/models"),
    };
    let path = dir.join(file);
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh (or set COMBS_MODELS)",
        path.display()
    );
    let g = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn messages(conv: &Value) -> Vec<ChatMessage> {
    conv["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            ChatMessage::new(
                m["role"].as_str().expect("role"),
                m["content"].as_str().expect("content"),
            )
        })
        .collect()
}

/// The free function and the model's own method both give jinja2's text.
fn check(name: &str, file: &str) {
    let fx = fixture(name);
    let template = fx["template_used"].as_str().expect("template");
    let bos = fx["bos"].as_str().expect("bos");
    let eos = fx["eos"].as_str().expect("eos");
    let tok = load(file);
    assert_eq!(
        tok.chat_template(),
        fx["model_template"].as_str(),
        "{name}: template"
    );
    if tok.chat_template().is_none() {
        assert_eq!(
            template, CHATML_TEMPLATE,
            "{name}: fallback is llama.cpp's ChatML"
        );
    }
    let convs = fx["conversations"].as_array().expect("conversations");
    assert!(!convs.is_empty());
    for conv in convs {
        let msgs = messages(conv);
        let agp = conv["add_generation_prompt"].as_bool().expect("flag");
        let want = conv["expected"].as_str().expect("expected");
        let got = apply_chat_template(template, &msgs, agp, bos, eos)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, want, "{name}: {msgs:?}");
        let via_model = tok
            .apply_chat_template(&msgs, agp)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_model = if tok.add_bos() {
            want.strip_prefix(bos).unwrap_or(want)
        } else {
            want
        };
        assert_eq!(via_model, want_model, "{name}: model template for {msgs:?}");
    }
}

#[test]
fn smollm2_chat_template_matches_jinja2() {
    check("smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

#[test]
fn gemma3_chat_template_matches_jinja2() {
    check("gemma3", "gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn hf_style_template_features_render() {
    // Features Hugging Face templates use: loop controls, namespace, Python
    // string methods, raise_exception, tojson and strftime_now.
    let template = "{%- set ns = namespace(n=0) -%}\
        {%- for m in messages -%}\
          {%- if m.role == 'skip' %}{% continue %}{% endif -%}\
          {%- set ns.n = ns.n + 1 -%}\
          [{{ m.role.upper() }}]{{ m.content.strip() }}{{ '|' if m.content.startswith(' ') }}\n\
        {%- endfor -%}\
        {{ ns.n }} {{ messages[0] | tojson }} {{ strftime_now('%Y') | length }}";
    let msgs = [
        ChatMessage::new("user", " hi "),
        ChatMessage::new("skip", "x"),
        ChatMessage::new("assistant", "yo"),
    ];
    let out = apply_chat_template(template, &msgs, false, "<s>", "</s>").expect("renders");
    // What Python jinja2 renders for the same template and messages.
    assert_eq!(
        out,
        "[USER]hi|[ASSISTANT]yo2 {\"role\": \"user\", \"content\": \" hi \"} 4"
    );
}

#[test]
fn template_raising_is_invalid_argument() {
    let template = "{% if messages[0].role != 'system' %}{{ raise_exception('need a system message') }}{% endif %}";
    let err = apply_chat_template(template, &[ChatMessage::new("user", "x")], true, "", "")
        .expect_err("raises");
    assert!(
        matches!(
            err,
            combs::ModelError::InvalidArgument {
                name: "messages",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("need a system message"));
}

/// Hostile templates end with an error in bounded time and memory: a loop
/// that never stops writing runs out of fuel, one that writes past the
/// output cap is cut there, and unbounded recursion stops at the depth limit.
#[test]
fn hostile_templates_are_bounded() {
    let msgs = [ChatMessage::new("user", "hi")];
    let run = |t: &str| {
        let start = std::time::Instant::now();
        let r = apply_chat_template(t, &msgs, true, "<s>", "</s>");
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "{t}: took {:?}",
            start.elapsed()
        );
        r
    };
    // ~10^15 iterations of writing nothing: stopped by fuel.
    let spin = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}";
    let e = run(spin).expect_err("fuel runs out");
    assert!(e.to_string().contains("fuel"), "{e}");
    // 100000 writes of 1 MB each: cut at the output cap.
    let flood = "{% for a in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}";
    let e = run(flood).expect_err("output cap");
    assert!(e.to_string().contains("exceeds"), "{e}");
    // A macro calling itself forever.
    let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    assert!(run(deep).is_err());
    // A real conversation of 2000 turns still renders under the bounds.
    let long: Vec<ChatMessage> = (0..2000)
        .map(|i| ChatMessage::new(["user", "assistant"][i % 2], format!("message {i}")))
        .collect();
    let out = apply_chat_template(CHATML_TEMPLATE, &long, true, "<s>", "</s>")
        .expect("a long conversation renders");
    assert!(out.contains("message 1999"));
}
