//! What several targets share: one Vulkan context per fuzzing process
//! (creating one per input would make every run a device bring-up), and
//! the real vocabularies from the model cache.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use combs::formats::GgufFile;
use combs::gpu::GpuContext;
use combs::tokenizer::Tokenizer;

/// The process's device (lavapipe on machines without a GPU).
pub fn context() -> &'static Arc<GpuContext> {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| GpuContext::new(None).expect("a Vulkan device (lavapipe) for fuzzing"))
}

/// `$COMBS_MODELS`, else `~/.cache/combs/models` (where
/// `scripts/fetch-models.sh` puts the real models).
pub fn model_dir() -> PathBuf {
    std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(combs::runtime::model::model_cache_dir)
}

/// The tokenizer of a real model in the cache; the target cannot run without it.
pub fn tokenizer(file: &str) -> Tokenizer {
    let path = model_dir().join(file);
    let g = GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-models.sh)", path.display()));
    Tokenizer::from_gguf(&g).expect("the real model's vocabulary loads")
}

/// Splits `data` into `n` parts at the 0xFF 0x00 0xFF 0x00 separators
/// (missing parts are empty), so one input can carry several files.
pub fn split_parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    const SEP: &[u8] = &[0xff, 0x00, 0xff, 0x00];
    let mut parts = Vec::with_capacity(n);
    let mut rest = data;
    while parts.len() + 1 < n {
        match rest.windows(SEP.len()).position(|w| w == SEP) {
            Some(i) => {
                parts.push(&rest[..i]);
                rest = &rest[i + SEP.len()..];
            }
            None => break,
        }
    }
    parts.push(rest);
    parts.resize(n, &[][..]);
    parts
}
