//! The whole load path on arbitrary bytes: a GGUF file resolved to an
//! architecture, its tensors checked against the spec and uploaded (on
//! lavapipe here), the tokenizer, and for what loads, a session that takes
//! a short prompt and one decoded token. Seeds are tiny complete models.
#![no_main]

#[path = "common.rs"]
mod common;

use combs::formats::GgufFile;
use combs::models::{LoadOptions, ModelRegistry};
use combs::runtime::session::{Session, SessionOptions};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let Ok(model) = ModelRegistry::new().load(common::context(), &g, &LoadOptions::default())
    else {
        return;
    };
    let n_vocab = model.spec().n_vocab as u32;
    let opts = SessionOptions {
        n_ctx: 32,
        ..SessionOptions::default()
    };
    let Ok(mut s) = Session::new(model, &opts) else {
        return;
    };
    let prompt: Vec<u32> = data
        .iter()
        .take(5)
        .map(|&b| u32::from(b) % n_vocab.max(1))
        .collect();
    if s.prefill(&prompt).is_ok() {
        let _ = s.decode(prompt.first().copied().unwrap_or(0));
    }
});
