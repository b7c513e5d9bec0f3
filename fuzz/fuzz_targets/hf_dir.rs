//! Hugging Face model directories on arbitrary bytes: `config.json`,
//! `tokenizer.json` and `model.safetensors` (one input carries the three,
//! split at 0xFF 0x00 0xFF 0x00), read, converted to the GGUF combs loads,
//! and resolved to a spec and a tokenizer.
#![no_main]

#[path = "common.rs"]
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use combs::formats::hf::HfDir;
use combs::models::ModelRegistry;
use combs::tokenizer::Tokenizer;

fn scratch_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("combs-fuzz-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let parts = common::split_parts(data, 3);
    let dir = scratch_dir();
    for (name, bytes) in ["config.json", "tokenizer.json", "model.safetensors"]
        .iter()
        .zip(&parts)
    {
        std::fs::write(dir.join(name), bytes).expect("the scratch directory is writable");
    }
    let Ok(hf) = HfDir::open(dir) else {
        return;
    };
    let registry = ModelRegistry::new();
    let Ok(family) = registry.resolve_hf(&hf) else {
        return;
    };
    let Ok(g) = combs::models::hf::to_gguf(&hf, family) else {
        return;
    };
    let _ = registry.resolve(&g);
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        if let Ok(ids) = tok.encode("Hello wörld 😀", true, false) {
            let _ = tok.decode(&ids);
        }
    }
});
