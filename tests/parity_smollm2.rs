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

use combs::runtime::Model;
use combs::tokenizer::ChatMessage;
use parity::{field, floats, ids};
use serde_json::Value as Json;

/// The shared inputs (texts, windows, prompts, llama.cpp's tokens).
fn inputs() -> &'static Json {
    static INPUTS: OnceLock<Json> = OnceLock::new();
    INPUTS.get_or_init(|| parity::read_fixture("inputs.json"))
}

/// One quant type's model, loaded, and its fixture.
struct Case {
    ty: &'static str,
    model: Model,
    fixture: Json,
}

fn case(ty: &'static str) -> Case {
    let fixture = parity::read_fixture(&format!("smollm2-{ty}.json"));
    let file = field(&fixture, "model").as_str().expect("model file name");
    let path = parity::model_path(file);
    parity::check_same_file(
        &path,
        field(&fixture, "sha256").as_str().expect("sha256"),
        "re-make it with scripts/setup-llamacpp.sh, or re-run scripts/make-llama-fixtures.py",
    );
    let model = parity::load_model(
        &common::gpu(),
        &path,
        combs::ops::act_round::Numerics::Exact,
    );
    Case { ty, model, fixture }
}

impl Case {
    fn piece(&self, t: u32) -> String {
        self.model
            .tokenizer()
            .token_to_piece(t)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_else(|_| format!("<{t}>"))
    }

    fn text(&self, tokens: &[u32]) -> String {
        tokens.iter().map(|&t| self.piece(t)).collect()
    }
}

// ---------------------------------------------------------------- the three checks

/// Teacher forcing on the first `n` positions of each named window: combs'
/// argmax must equal llama.cpp's at ≥ 99% of positions in each window, and
/// (where the fixture has the f64 reference forward) the reference's too.
fn check_teacher(c: &Case, windows: &[&str], n: usize) {
    let mut session = parity::session_512(&c.model);
    let mut failed = Vec::new();
    let (mut agree, mut total, mut max_diff) = (0, 0, 0.0f64);
    for &w in windows {
        let tokens = ids(field(field(inputs(), "windows"), w));
        let want = parity::TopK::from_json(field(field(&c.fixture, "teacher"), w));
        let t0 = std::time::Instant::now();
        let dump = format!("smollm2-{}-{w}-{n}", c.ty);
        let r = parity::teacher_forcing(&mut session, &tokens, &want, n, &dump);
        let label = format!("{} teacher {w} {}", c.ty, r.n);
        parity::print_teacher(&label, &r, &tokens, |t| c.piece(t));
        eprintln!("[{label}] {:.0} s", t0.elapsed().as_secs_f64());
        agree += r.llama.agree;
        total += r.n;
        max_diff = max_diff.max(r.llama.max_abs_diff);
        // llama.cpp's CPU backend rounds activations to 8 bits before every
        // quantized product, and its two attention paths disagree with each
        // other at several percent of the positions of this text (the
        // fixture's flash-attn on/off baseline), so ≥ 99% with llama.cpp is
        // out of reach of any exact forward pass: combs must agree with
        // llama.cpp at least as well as the exact f64 forward does (2 points
        // of slack), and with that forward at ≥ 99% (below).
        let floor = r
            .ref_llama_agree
            .map_or(0.99 * r.n as f64, |a| a as f64 - 0.02 * r.n as f64);
        if !r.meets_99pct() && (r.llama.agree as f64) < floor {
            let base = |a: Option<usize>| {
                a.map_or("-".to_string(), |a| {
                    format!("{:.2}%", 100.0 * a as f64 / r.n as f64)
                })
            };
            failed.push(format!(
                "{w}: {:.2}% agreement with llama.cpp (baselines: the f64 reference agrees with \
                 llama.cpp at {}, llama.cpp flash-attn off with on at {})",
                r.agreement_pct(),
                base(r.ref_llama_agree),
                base(r.fa_off_agree)
            ));
        }
        if let Some(d) = r
            .reference
            .as_ref()
            .filter(|d| !parity::meets_99pct(d.agree, r.n))
        {
            failed.push(format!(
                "{w}: {}/{} agreement with the f64 reference",
                d.agree, r.n
            ));
        }
    }
    eprintln!(
        "RESULT {} teacher: {agree}/{total} = {:.2}% argmax agreement with llama.cpp, \
         max |logit diff| {max_diff:.4}",
        c.ty,
        100.0 * agree as f64 / total.max(1) as f64
    );
    assert!(failed.is_empty(), "{}: {failed:?}", c.ty);
}

/// Greedy generation of `n_gen` tokens from each named prompt (all when
/// `names` is empty); the first `n_exact` must equal llama.cpp's.
fn check_greedy(c: &Case, names: &[&str], n_gen: usize, n_exact: usize) {
    let mut session = parity::session_512(&c.model);
    let tok = c.model.tokenizer();
    let mut failed = Vec::new();
    let mut matched = Vec::new();
    for p in field(inputs(), "prompts").as_array().expect("prompts") {
        let name = field(p, "name").as_str().expect("name");
        if !names.is_empty() && !names.contains(&name) {
            continue;
        }
        let text = field(p, "text").as_str().expect("text");
        let prompt = ids(field(p, "tokens"));
        let chat = p.get("messages");
        // the prompt as a user would make it: template (for the chat one) and tokenizer
        if let Some(msgs) = chat {
            let msgs: Vec<ChatMessage> = msgs
                .as_array()
                .expect("messages")
                .iter()
                .map(|m| {
                    ChatMessage::new(
                        field(m, "role").as_str().expect("role"),
                        field(m, "content").as_str().expect("content"),
                    )
                })
                .collect();
            let rendered = tok.apply_chat_template(&msgs, true).expect("chat template");
            if rendered != text {
                failed.push(format!(
                    "{name}: chat template renders {rendered:?}, llama.cpp's input is {text:?}"
                ));
            }
        }
        let ours_prompt = tok.encode(text, true, chat.is_some()).expect("encode");
        if ours_prompt != prompt {
            failed.push(format!(
                "{name}: combs tokenizes the prompt as {ours_prompt:?}, llama.cpp as {prompt:?}"
            ));
        }
        let theirs = ids(field(field(&c.fixture, "greedy"), name));
        let t0 = std::time::Instant::now();
        let r = parity::greedy(&mut session, &prompt, n_gen, &theirs);
        let label = format!("{} greedy {name}", c.ty);
        eprintln!(
            "[{label}] {}/{} tokens equal before the first difference ({:.0} s)",
            r.n_match,
            r.ours.len(),
            t0.elapsed().as_secs_f64()
        );
        if r.n_match < r.ours.len() {
            let k = r.n_match;
            eprintln!(
                "[{label}]   at token {k}: combs {} {:?} (its top-2 margin {:.4}), llama.cpp {} {:?}",
                r.ours[k],
                c.piece(r.ours[k]),
                r.margins[k],
                r.theirs[k],
                c.piece(r.theirs[k])
            );
            eprintln!("[{label}]   combs:     {:?}", c.text(&r.ours));
            eprintln!("[{label}]   llama.cpp: {:?}", c.text(&r.theirs));
        } else {
            eprintln!("[{label}]   {:?}", c.text(&r.ours));
        }
        // baselines: the same greedy run by llama.cpp with flash attention
        // off and by the f64 reference forward
        let n = r.ours.len();
        for (key, what) in [
            ("greedy_fa_off", "llama.cpp flash-attn off"),
            ("greedy_ref", "the f64 reference"),
        ] {
            if let Some(other) = c.fixture.get(key).and_then(|g| g.get(name)) {
                let other = ids(other);
                eprintln!(
                    "[{label}]   baseline: {what} equals llama.cpp for {}/{n} tokens, combs for {}/{n}",
                    parity::common_prefix(&other[..n], &theirs[..n]),
                    parity::common_prefix(&other[..n], &r.ours),
                );
            }
        }
        matched.push(format!("{name} {}/{}", r.n_match, r.ours.len()));
        // Exact agreement with llama.cpp is required up to where the exact
        // f64 forward itself still agrees with llama.cpp; combs must equal
        // the f64 forward's greedy tokens for the first n_exact.
        let need = match c.fixture.get("greedy_ref").and_then(|g| g.get(name)) {
            Some(reference) => {
                let reference = ids(reference);
                let with_ref = parity::common_prefix(&reference[..n], &r.ours);
                if with_ref < n_exact.min(n) {
                    failed.push(format!(
                        "{name}: differs from the f64 reference forward at token {with_ref} \
                         (need {n_exact} equal)"
                    ));
                }
                parity::common_prefix(&reference[..n], &theirs[..n]).min(n_exact)
            }
            None => n_exact,
        };
        if r.n_match < need.min(n) {
            failed.push(format!(
                "{name}: first difference from llama.cpp at token {} (need {need} equal)",
                r.n_match
            ));
        }
    }
    eprintln!("RESULT {} greedy: {}", c.ty, matched.join(", "));
    assert!(failed.is_empty(), "{}: {failed:#?}", c.ty);
}

/// Perplexity on GPL-3 over the first `n_chunks` chunks (all when `None`)
/// within 1% of llama.cpp's running value after as many chunks.
fn check_perplexity(c: &Case, n_chunks: Option<usize>) {
    let src = field(field(inputs(), "texts"), "gpl3");
    let path = std::path::PathBuf::from(field(src, "path").as_str().expect("path"));
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (Debian package base-files)", path.display()));
    parity::check_same_file(
        &path,
        field(src, "sha256").as_str().expect("sha256"),
        "another version of the text",
    );
    // tokenized the way `combs perplexity` does it
    let tok = c.model.tokenizer();
    let tokens = tok
        .encode(&String::from_utf8_lossy(&text), true, false)
        .expect("encode");
    let theirs_tokens = ids(field(field(inputs(), "perplexity_tokens"), "tokens"));
    if tokens != theirs_tokens {
        let k = tokens
            .iter()
            .zip(&theirs_tokens)
            .take_while(|(a, b)| a == b)
            .count();
        panic!(
            "combs tokenizes {} differently from llama.cpp: {} vs {} tokens, first difference at {k}",
            path.display(),
            tokens.len(),
            theirs_tokens.len()
        );
    }
    let ppl = field(&c.fixture, "perplexity");
    let per_chunk = floats(field(ppl, "per_chunk"));
    let n = n_chunks.unwrap_or(tokens.len() / 512);
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut session = parity::session_512(&c.model);
    let label = format!("{} perplexity", c.ty);
    let r = parity::perplexity_chunks(&label, &mut session, &tokens, bos, n, &per_chunk);
    let theirs = if n == per_chunk.len() {
        field(ppl, "ppl").as_f64().expect("ppl")
    } else {
        per_chunk[n - 1]
    };
    let d = parity::rel_pct(r.ppl, theirs);
    if let Some(off) = ppl.get("fa_off") {
        let off_chunks = floats(field(off, "per_chunk"));
        let o = off_chunks[n - 1];
        eprintln!(
            "[{label}] baseline: llama.cpp flash-attn off {o:.4} ({:+.3}% from flash-attn on)",
            parity::rel_pct(o, theirs)
        );
    }
    eprintln!(
        "RESULT {} perplexity ({n} chunks): combs {:.4} +/- {:.5}, llama.cpp {theirs:.4}, {d:+.3}%",
        c.ty, r.ppl, r.ppl_err
    );
    assert!(
        d.abs() <= 1.0,
        "{}: PPL {:.4} is {d:+.3}% from llama.cpp's {theirs:.4}",
        c.ty,
        r.ppl
    );
}

// ---------------------------------------------------------------- default subset (Q4_1)

#[test]
fn q4_1_teacher_forcing_first_128_positions_argmax_agrees() {
    check_teacher(&case("Q4_1"), &["gpl3"], 128);
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
                check_teacher(&c, &["gpl3", "apache2"], 512)
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
                        super::super::check_teacher(&super::super::case($ty), &["gpl3", "apache2"], 512);
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
