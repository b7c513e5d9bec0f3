//! SmolLM2-135M-Instruct against llama.cpp on the same GGUF files
//! (`tests/fixtures/llama/`, written by `scripts/make-llama-fixtures.py`):
//!
//! 1. perplexity on GPL-3 (llama.cpp's method, chunks of 512) within 1% of
//!    `llama-perplexity`'s;
//! 2. teacher-forced next-token argmax agreement with llama.cpp, with the max
//!    |logit difference| over llama.cpp's top-8 printed;
//! 3. greedy generation compared with llama.cpp's tokens.
//!
//! On 2 and 3 the bar is not "≥ 99% / 32 tokens equal to llama.cpp": its CPU
//! backend rounds activations to 8 bits before each quantized product, which
//! moves SmolLM2's logits by up to about one unit, and its own two attention
//! paths (flash attention on and off) agree on the argmax at only ~91% of the
//! positions of GPL-3. So combs is held to an exact f64 forward of the same
//! weights (argmax ≥ 99%, first 32 greedy tokens equal), and to llama.cpp at
//! least as closely as that exact forward is (2 points of slack on the
//! argmax, greedy tokens equal as far as the exact forward's are).
//!
//! By default only Q4_1 runs, on a subset small enough for lavapipe (first
//! 128 positions of one window, 32 tokens from 2 prompts, 2 perplexity
//! chunks). Everything — the five quant types, both 512-token windows, five
//! prompts × 64 tokens, all 14 chunks — is slow (hours on lavapipe), so it
//! runs only when asked: either the `#[ignore]`d tests `full::<type>::*`, or
//! all of them in one test when `COMBS_SLOW_TESTS=1` is set:
//!
//! ```text
//! cargo test --release --test parity_smollm2 -- --ignored --nocapture --test-threads=1
//! cargo test --release --test parity_smollm2 -- --ignored --nocapture full::q8_0
//! COMBS_SLOW_TESTS=1 cargo test --release --test parity_smollm2 -- --nocapture full_set
//! ```
//!
//! Every test prints its measurements (`--nocapture` shows them); lines
//! starting `RESULT` sum up each check. Beside llama.cpp's numbers the
//! fixtures carry two baselines that the tests print: llama.cpp with flash
//! attention off, and an exact f64 forward of the same weights (see
//! `scripts/make-llama-fixtures.py` for why), and combs must agree with the
//! latter's argmax at ≥ 99% of positions too.

mod common;
#[path = "common/parity.rs"]
mod parity;

use std::sync::OnceLock;

use parity::{Case, check_greedy, check_perplexity, check_teacher, first};
use serde_json::Value as Json;

/// The shared inputs (texts, windows, prompts, llama.cpp's tokens).
fn inputs() -> &'static Json {
    static INPUTS: OnceLock<Json> = OnceLock::new();
    INPUTS.get_or_init(|| parity::read_fixture("inputs.json"))
}

/// One quant type's model, loaded, and its fixture.
fn case(ty: &'static str) -> Case {
    Case::load(
        &common::gpu(),
        inputs(),
        &format!("smollm2-{ty}.json"),
        ty,
        &format!("smollm2-{ty}"),
        combs::ops::act_round::Numerics::Exact,
    )
}

// ---------------------------------------------------------------- default subset (Q4_1)

#[test]
fn q4_1_teacher_forcing_first_128_positions_argmax_agrees() {
    check_teacher(&case("Q4_1"), &[("gpl3", &first(128))]);
}

#[test]
fn q4_1_greedy_32_tokens_from_two_prompts_match() {
    check_greedy(&case("Q4_1"), &["capital", "chat"], 32, 32);
}

#[test]
fn q4_1_perplexity_first_2_chunks_within_1_percent() {
    check_perplexity(&case("Q4_1"), Some(2));
}

// ---------------------------------------------------------------- full set (slow)

const TYPES: [&str; 5] = ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q4_K_M"];

/// The whole full set in one test, run when `COMBS_SLOW_TESTS=1`; every
/// check of every type runs even after one fails, and the failures are
/// listed at the end.
#[test]
fn full_set_with_combs_slow_tests() {
    if std::env::var("COMBS_SLOW_TESTS").as_deref() != Ok("1") {
        eprintln!(
            "full parity set NOT run (hours on lavapipe): set COMBS_SLOW_TESTS=1, \
             or run the ignored tests full::<type>::* with --ignored"
        );
        return;
    }
    let mut failed = Vec::new();
    for ty in TYPES {
        let c = case(ty);
        let checks: [(&str, &dyn Fn()); 3] = [
            ("teacher forcing", &|| {
                check_teacher(&c, &[("gpl3", &first(512)), ("apache2", &first(512))])
            }),
            ("greedy", &|| check_greedy(&c, &[], 64, 32)),
            ("perplexity", &|| check_perplexity(&c, None)),
        ];
        for (what, check) in checks {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)).is_err() {
                failed.push(format!("{ty} {what}"));
            }
        }
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
}

macro_rules! full_set {
    ($($module:ident => $ty:literal),* $(,)?) => {
        mod full {
            $(
                mod $module {
                    #[test]
                    #[ignore = "slow (~1 h per type on lavapipe): run with --ignored"]
                    fn teacher_forcing_both_windows_argmax_agrees() {
                        super::super::check_teacher(
                            &super::super::case($ty),
                            &[
                                ("gpl3", &super::super::first(512)),
                                ("apache2", &super::super::first(512)),
                            ],
                        );
                    }

                    #[test]
                    #[ignore = "slow (~1 h per type on lavapipe): run with --ignored"]
                    fn greedy_64_tokens_first_32_match() {
                        super::super::check_greedy(&super::super::case($ty), &[], 64, 32);
                    }

                    #[test]
                    #[ignore = "slow (~1 h per type on lavapipe): run with --ignored"]
                    fn perplexity_all_chunks_within_1_percent() {
                        super::super::check_perplexity(&super::super::case($ty), None);
                    }
                }
            )*
        }
    };
}

full_set! {
    q4_1 => "Q4_1",
    q8_0 => "Q8_0",
    q4_0 => "Q4_0",
    q5_0 => "Q5_0",
    q4_k_m => "Q4_K_M",
}
