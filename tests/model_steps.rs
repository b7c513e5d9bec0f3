//! `GenerativeModel`'s MLC-style steps (`embed`, `prefill`, `decode` over a
//! cache from `create_kv_cache`) on tiny random-weight models written by
//! the project's GGUF writer, against a `Session` on the same model: the
//! same kernels on the same rows, so the same logits. Also their error
//! paths: bad rows, tokens out of range, a full context (nothing evaluated).

mod common;

use std::sync::Arc;

use combs::formats::gguf::GgufFile;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::quant::QuantType;
use combs::runtime::{Session, SessionOptions};
use combs::{CacheConfig, GenerativeModel, LoadOptions, ModelError, ModelRegistry};
use common::{Rng, gpu, max_rel};

fn load(arch: &str, t: QuantType, seed: u64, window: usize) -> Arc<dyn GenerativeModel> {
    let mut cfg = SynthConfig::preset("tiny", t).expect("preset");
    cfg.arch = arch.to_string();
    cfg.seed = seed;
    cfg.sliding_window = window;
    let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
    ModelRegistry::new()
        .load(&gpu(), &g, &LoadOptions::default())
        .expect("load")
}

/// Prefills a prompt and decodes a few tokens both ways, in calls of at
/// most `n_batch` rows, and compares every logits vector.
fn check_steps_match_session(arch: &str, t: QuantType, window: usize, n_batch: usize) {
    let mut rng = Rng::fresh(&format!("steps_{arch}"));
    let model = load(arch, t, rng.next_u64(), window);
    let n_vocab = model.spec().n_vocab;
    let prompt: Vec<u32> = (0..23).map(|_| rng.below(n_vocab) as u32).collect();
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch,
        ..Default::default()
    };
    let mut session = Session::new(model.clone(), &opts).expect("session");
    let cfg = CacheConfig {
        max_batch: n_batch,
        ..CacheConfig::contiguous(64)
    };
    let mut cache = model.create_kv_cache(&cfg).expect("cache");

    session.prefill(&prompt).expect("session prefill");
    let x = model.embed(&prompt).expect("embed");
    let logits = model.prefill(&x, cache.as_mut()).expect("prefill");
    let e = max_rel(&logits, session.logits());
    assert!(e <= 1e-6, "{arch}: prompt logits differ by {e}");
    assert_eq!(cache.len(), prompt.len());

    for step in 0..4 {
        let t = rng.below(n_vocab) as u32;
        session.decode(t).expect("session decode");
        let x = model.embed(&[t]).expect("embed");
        let logits = model.decode(&x, cache.as_mut()).expect("decode");
        let e = max_rel(&logits, session.logits());
        assert!(
            e <= 1e-6,
            "{arch}: decode step {step}: logits differ by {e}"
        );
    }
    assert_eq!(cache.len(), prompt.len() + 4);
}

#[test]
fn steps_llama_match_session() {
    check_steps_match_session("llama", QuantType::F32, 0, 512);
}

#[test]
fn steps_qwen2_q8_0_match_session() {
    check_steps_match_session("qwen2", QuantType::Q8_0, 0, 512);
}

/// Gemma 3: the embedding scale (applied by `embed`, not again by
/// `prefill`), zero-centred norms, local and global layers.
#[test]
fn steps_gemma3_match_session() {
    check_steps_match_session("gemma3", QuantType::F32, 0, 512);
}

/// A prompt longer than one call: a sliding-window cache whose ring holds
/// 5 new rows per call, filled in 5 calls.
#[test]
fn steps_mistral_window_in_small_calls_match_session() {
    check_steps_match_session("mistral", QuantType::F32, 8, 5);
}

#[test]
fn embed_of_gemma3_is_the_scaled_table_row() {
    let model = load("gemma3", QuantType::F32, 7, 0);
    let d = model.spec().n_embd;
    let both = model.embed(&[3, 9]).expect("embed");
    let one = model.embed(&[9]).expect("embed");
    assert_eq!(&both[d..], &one[..]);
    // The scale is √n_embd: the rows are far from unit size.
    assert!(one.iter().map(|v| v * v).sum::<f32>() > 1.0);
}

#[test]
fn embed_rejects_bad_tokens() {
    let model = load("llama", QuantType::F32, 1, 0);
    let n_vocab = model.spec().n_vocab as u32;
    assert!(matches!(
        model.embed(&[1, n_vocab]),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        model.embed(&[]),
        Err(ModelError::InvalidArgument { .. })
    ));
}

#[test]
fn prefill_rejects_partial_and_non_finite_rows() {
    let model = load("llama", QuantType::F32, 1, 0);
    let d = model.spec().n_embd;
    let mut cache = model
        .create_kv_cache(&CacheConfig::contiguous(16))
        .expect("cache");
    for bad in [vec![0.5; d + 1], vec![], vec![f32::NAN; d]] {
        let r = model.prefill(&bad, cache.as_mut());
        assert!(
            matches!(r, Err(ModelError::InvalidArgument { .. })),
            "{r:?}"
        );
    }
    let r = model.decode(&vec![0.5; 2 * d], cache.as_mut());
    assert!(
        matches!(r, Err(ModelError::InvalidArgument { .. })),
        "{r:?}"
    );
    assert_eq!(cache.len(), 0);
}

#[test]
fn prefill_past_ctx_is_context_full() {
    let model = load("llama", QuantType::F32, 1, 0);
    let mut cache = model
        .create_kv_cache(&CacheConfig::contiguous(8))
        .expect("cache");
    let x = model.embed(&[1; 6]).expect("embed");
    model.prefill(&x, cache.as_mut()).expect("prefill");
    let r = model.prefill(&x, cache.as_mut());
    assert!(
        matches!(r, Err(ModelError::ContextFull { n_ctx: 8, .. })),
        "{r:?}"
    );
    assert_eq!(cache.len(), 6, "a refused prefill evaluates nothing");
}
