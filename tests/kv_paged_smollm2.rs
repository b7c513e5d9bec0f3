//! The paged KV cache and batched decoding on the real SmolLM2-135M-Instruct
//! (Q4_1, from the model cache):
//!
//! 1. greedy generation with the paged cache equals the contiguous cache's,
//!    token for token and logit for logit, for page sizes 16, 64 and 256 and
//!    prompts whose prefill or generation crosses page boundaries;
//! 2. 8 sessions with prompts of different lengths, prefilled in one batched
//!    call and decoded together, give each the greedy tokens it gives alone
//!    (logits within 1e-3 of the row's largest magnitude, 5e-3 on GPUs whose
//!    batches of 4+ run the cooperative-matrix products on f16 activations);
//! 3. 8 forks of one 300-token prompt hold the prompt's pages once plus one
//!    page each (the copied partial page), and each continues exactly like a
//!    contiguous session that evaluated the same tokens.
//!
//! Prompts are the opening of GPL-3 tokenized by the model. Lavapipe runs
//! SmolLM2 at ~10 prompt tokens/s, so the default set is sized to a few
//! minutes; `COMBS_SLOW_TESTS=1` adds every page size on every prompt.

mod common;

use combs::kv::CacheKind;
use combs::runtime::{Model, Session, SessionOptions};

fn model() -> Model {
    let path = combs::runtime::model::default_model_path();
    assert!(
        path.exists(),
        "{} missing: scripts/fetch-models.sh fetches it",
        path.display()
    );
    Model::load(&common::gpu(), &path, &Default::default()).expect("load SmolLM2")
}

fn slow() -> bool {
    std::env::var("COMBS_SLOW_TESTS").is_ok_and(|v| v == "1")
}

/// The first `n` tokens of GPL-3 (with BOS where the model adds one).
fn text_tokens(model: &Model, n: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("/usr/share/common-licenses/GPL-3 (package base-files)");
    let ids = model
        .tokenizer()
        .encode(&text, true, false)
        .expect("tokenize");
    assert!(ids.len() >= n);
    ids[..n].to_vec()
}

fn session(model: &Model, kind: CacheKind, page_size: usize) -> Session {
    model
        .new_session(&SessionOptions {
            n_ctx: 512,
            kv_kind: kind,
            page_size,
            n_batch: 128,
            ..Default::default()
        })
        .expect("session")
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// Largest |a - b| over the row, relative to the row's largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Greedy tokens after `prompt` and the logits of every step.
fn greedy(s: &mut Session, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    s.prefill(prompt).expect("prefill");
    let mut toks = Vec::new();
    let mut rows = Vec::new();
    for _ in 0..n {
        rows.push(s.logits().to_vec());
        let t = argmax(s.logits());
        toks.push(t);
        s.decode(t).expect("decode");
    }
    (toks, rows)
}

#[test]
fn paged_greedy_equals_contiguous() {
    let m = model();
    let n_gen = 12;
    // (prompt length, page sizes it is checked with): 20 crosses 16 in the
    // prompt and 32 while generating; 58 crosses 64; 250 crosses 256.
    let cases: Vec<(usize, Vec<usize>)> = if slow() {
        vec![
            (20, vec![16, 64, 256]),
            (58, vec![16, 64, 256]),
            (250, vec![16, 64, 256]),
        ]
    } else {
        vec![(20, vec![16]), (58, vec![16, 64]), (250, vec![256])]
    };
    for (len, pages) in cases {
        let prompt = text_tokens(&m, len);
        let (want, want_rows) =
            greedy(&mut session(&m, CacheKind::Contiguous, 256), &prompt, n_gen);
        for ps in pages {
            let mut s = session(&m, CacheKind::Paged, ps);
            let (got, rows) = greedy(&mut s, &prompt, n_gen);
            let worst = rows
                .iter()
                .zip(&want_rows)
                .map(|(a, b)| rel_diff(a, b))
                .fold(0.0f32, f32::max);
            println!(
                "RESULT prompt {len}, page size {ps}: tokens equal {}, max logit diff {worst:.2e}",
                got == want
            );
            assert_eq!(got, want, "prompt {len}, page size {ps}");
            assert!(
                worst <= 1e-6,
                "prompt {len}, page size {ps}: logits differ by {worst}"
            );
            let st = s.page_stats().expect("stats");
            assert_eq!(st.pages_used, (len + n_gen).div_ceil(ps));
        }
    }
}

#[test]
fn batch_of_eight_equals_each_alone() {
    let m = model();
    let base = text_tokens(&m, 64);
    let lens = [3usize, 9, 14, 17, 22, 31, 40, 47];
    // Different prompts: windows of GPL-3 starting at different tokens.
    let prompts: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| base[i..i + n].to_vec())
        .collect();
    let steps = 8;
    let alone: Vec<(Vec<u32>, Vec<Vec<f32>>)> = prompts
        .iter()
        .map(|p| greedy(&mut session(&m, CacheKind::Contiguous, 256), p, steps))
        .collect();

    let mut ss: Vec<Session> = prompts
        .iter()
        .map(|_| session(&m, CacheKind::Paged, 16))
        .collect();
    {
        let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
        let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        m.prefill_batch(&mut refs, &views).expect("batched prefill");
    }
    let mut worst = 0.0f32;
    let tol = if combs::ops::plan::f16_activations(&common::gpu(), prompts.len()) {
        5e-3
    } else {
        1e-3
    };
    for step in 0..steps {
        let mut next = Vec::new();
        for (i, s) in ss.iter().enumerate() {
            let d = rel_diff(s.logits(), &alone[i].1[step]);
            worst = worst.max(d);
            assert!(d <= tol, "session {i}, step {step}: logits differ by {d}");
            let t = argmax(s.logits());
            assert_eq!(t, alone[i].0[step], "session {i}, step {step}");
            next.push(t);
        }
        let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
        m.decode_batch(&mut refs, &next).expect("batched decode");
    }
    println!(
        "RESULT batch of 8: greedy tokens equal for {steps} steps, max logit diff {worst:.2e}"
    );
}

#[test]
fn forks_of_a_long_prompt_share_its_pages() {
    let m = model();
    let prompt = text_tokens(&m, 300);
    let page = 16;
    let mut parent = session(&m, CacheKind::Paged, page);
    parent.prefill(&prompt).expect("prefill");
    let mut forks: Vec<Session> = (0..8).map(|_| parent.fork().expect("fork")).collect();
    let prompt_pages = 300usize.div_ceil(page);
    let st = parent.page_stats().expect("stats");
    assert_eq!(st.pages_used, prompt_pages, "{st:?}");

    // Fork i continues with token firsts[i], then greedily: 4 positions, all
    // in the prompt's partial last page, which each fork copies once.
    let firsts: Vec<u32> = (0..8).map(|i| prompt[10 + i]).collect();
    {
        let mut refs: Vec<&mut Session> = forks.iter_mut().collect();
        m.decode_batch(&mut refs, &firsts).expect("first tokens");
    }
    for _ in 0..3 {
        let next: Vec<u32> = forks.iter().map(|s| argmax(s.logits())).collect();
        let mut refs: Vec<&mut Session> = forks.iter_mut().collect();
        m.decode_batch(&mut refs, &next).expect("continue");
    }
    let st = parent.page_stats().expect("stats");
    println!(
        "RESULT 8 forks of 300 tokens + 4 each: {} pages used (prompt alone {prompt_pages}), {} tokens",
        st.pages_used, st.tokens
    );
    assert_eq!(st.pages_used, prompt_pages + 8, "{st:?}");
    assert_eq!(st.tokens, 300 + 8 * 304);

    // Reference: one contiguous session, rewound to the prompt for each fork.
    let mut want = session(&m, CacheKind::Contiguous, 256);
    want.prefill(&prompt).expect("prefill");
    for (i, f) in forks.iter().enumerate() {
        want.rewind(300).expect("rewind");
        let cont = &f.tokens()[300..];
        assert_eq!(cont[0], firsts[i]);
        for (j, &t) in cont.iter().enumerate() {
            want.decode(t).expect("decode");
            if let Some(&next) = cont.get(j + 1) {
                assert_eq!(
                    argmax(want.logits()),
                    next,
                    "fork {i}, step {j}: greedy token"
                );
            }
        }
        let d = rel_diff(f.logits(), want.logits());
        assert!(d <= 1e-3, "fork {i}: logits differ by {d}");
        // The greedy choices of the fork were the reference's too.
        assert_eq!(argmax(f.logits()), argmax(want.logits()), "fork {i}");
    }
}
