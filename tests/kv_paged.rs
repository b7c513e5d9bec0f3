//! The paged KV cache and batched forward passes on tiny random-weight
//! models (the project's GGUF writer): fast enough to cover page sizes,
//! page boundaries, forks, pool exhaustion and batches of mixed lengths in
//! detail. Each test loads its own model, so its page pools start empty.
//! The real-model checks (SmolLM2) are in tests/kv_paged_smollm2.rs.

mod common;

use std::sync::Arc;

use combs::ModelError;
use combs::formats::gguf::GgufFile;
use combs::kv::{CacheKind, PageStats};
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry};
use combs::quant::QuantType;
use combs::runtime::{BatchRunner, Session, SessionOptions};
use common::{Rng, gpu};

fn tiny_model(seed: u64) -> Arc<dyn GenerativeModel> {
    tiny_windowed_of("llama", seed, 0, 2)
}

/// A tiny model of `arch` with `n_layer` layers and a sliding window of
/// `window` positions (0: none; Mistral: every layer; Gemma 3: every sixth
/// layer global).
fn tiny_windowed_of(
    arch: &str,
    seed: u64,
    window: usize,
    n_layer: usize,
) -> Arc<dyn GenerativeModel> {
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.arch = arch.into();
    cfg.seed = seed;
    cfg.sliding_window = window;
    cfg.n_layer = n_layer;
    let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
    ModelRegistry::new()
        .load(&gpu(), &g, &LoadOptions::default())
        .expect("load")
}

fn contiguous(model: &Arc<dyn GenerativeModel>, n_ctx: usize) -> Session {
    Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx,
            n_batch: 64,
            ..Default::default()
        },
    )
    .expect("contiguous session")
}

fn paged(
    model: &Arc<dyn GenerativeModel>,
    n_ctx: usize,
    page_size: usize,
    pool_pages: usize,
) -> Session {
    Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx,
            kv_kind: CacheKind::Paged,
            page_size,
            pool_pages,
            n_batch: 64,
            ..Default::default()
        },
    )
    .expect("paged session")
}

fn tokens(rng: &mut Rng, n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|_| rng.below(n_vocab) as u32).collect()
}

/// One batched prefill of `prompts[i]` into `sessions[i]`.
#[track_caller]
fn prefill_all(runner: &mut BatchRunner, sessions: &mut [Session], prompts: &[Vec<u32>]) {
    let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
    let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    runner.prefill(&mut refs, &views).expect("batched prefill");
}

/// One batched decode step of every session, `tokens[i]` into `sessions[i]`.
#[track_caller]
fn decode_all(runner: &mut BatchRunner, sessions: &mut [Session], tokens: &[u32]) {
    let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
    runner.decode(&mut refs, tokens).expect("batched decode");
}

/// Largest |a - b| over the row, relative to the row's largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Bound on [`rel_diff`] between sessions that evaluated the same tokens in
/// differently shaped calls (a prompt at once vs in chunks, then a re-
/// evaluation): on GPUs the calls take different kernels (f16 matrix units
/// for prompts), on lavapipe they agree bit for bit. A cache that reads a
/// wrong row is off by ~0.1–1.
const ACROSS_SHAPES: f32 = 5e-3;

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn paged_matches_contiguous_across_page_sizes() {
    let mut rng = Rng::fresh("paged_vs_contiguous");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    for prompt_len in [5, 23, 64] {
        let prompt = tokens(&mut rng, prompt_len, n_vocab);
        let mut want = contiguous(&model, 128);
        want.prefill(&prompt).expect("prefill");
        let mut steps = vec![want.logits().to_vec()];
        for _ in 0..12 {
            let t = argmax(want.logits());
            want.decode(t).expect("decode");
            steps.push(want.logits().to_vec());
        }
        for page_size in [1, 3, 16, 64] {
            let mut s = paged(&model, 128, page_size, 0);
            s.prefill(&prompt).expect("paged prefill");
            for (i, w) in steps.iter().enumerate() {
                let d = rel_diff(s.logits(), w);
                assert!(
                    d <= 1e-6,
                    "prompt {prompt_len}, page size {page_size}, step {i}: differs by {d}"
                );
                if i + 1 < steps.len() {
                    s.decode(argmax(w)).expect("paged decode");
                }
            }
            let st = s.page_stats().expect("paged stats");
            assert_eq!(st.pages_used, s.len().div_ceil(page_size));
            assert_eq!(st.tokens, s.len());
        }
    }
}

#[test]
fn batched_decode_matches_sessions_alone() {
    let mut rng = Rng::fresh("batched_decode");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    let lens = [1usize, 7, 16, 17, 31, 40, 3, 25];
    let prompts: Vec<Vec<u32>> = lens.iter().map(|&n| tokens(&mut rng, n, n_vocab)).collect();
    let steps = 6;

    // Each alone, greedy.
    let mut alone = Vec::new();
    for p in &prompts {
        let mut s = contiguous(&model, 64);
        s.prefill(p).expect("prefill");
        let mut rows = vec![s.logits().to_vec()];
        for _ in 0..steps {
            s.decode(argmax(s.logits())).expect("decode");
            rows.push(s.logits().to_vec());
        }
        alone.push(rows);
    }

    // Together: the prompts in one batched prefill, then batched decode steps.
    let mut sessions: Vec<Session> = prompts.iter().map(|_| paged(&model, 64, 16, 0)).collect();
    let mut runner = BatchRunner::new(model.clone());
    prefill_all(&mut runner, &mut sessions, &prompts);
    for step in 0..=steps {
        let mut next = Vec::new();
        for (s, rows) in sessions.iter().zip(&alone) {
            let i = next.len();
            // Alone, short prompts run the f32 matvec; together, the
            // prompts' pass runs f16 matrix units on GPUs that have them.
            let d = rel_diff(s.logits(), &rows[step]);
            assert!(
                d <= ACROSS_SHAPES,
                "session {i} step {step}: differs by {d}"
            );
            let t = argmax(&rows[step]);
            let scale = rows[step].iter().fold(1.0f32, |m, v| m.max(v.abs()));
            if top_margin(&rows[step]) > 2.0 * ACROSS_SHAPES * scale {
                assert_eq!(
                    argmax(s.logits()),
                    t,
                    "session {i} step {step}: greedy token"
                );
            }
            // Both continue with the token the session alone took.
            next.push(t);
        }
        if step < steps {
            decode_all(&mut runner, &mut sessions, &next);
        }
    }
    for (s, &n) in sessions.iter().zip(&lens) {
        assert_eq!(s.len(), n + steps);
    }
    // A smaller batch after a larger one (its own recorded step).
    let mut refs: Vec<&mut Session> = sessions.iter_mut().take(3).collect();
    runner.decode(&mut refs, &[1, 2, 3]).expect("batch of 3");
}

/// Gap between the two largest logits of a row.
fn top_margin(l: &[f32]) -> f32 {
    let best = argmax(l) as usize;
    let second = l
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .fold(f32::NEG_INFINITY, |m, (_, &v)| m.max(v));
    l[best] - second
}

/// Batches of 4 to 128 sequences: on GPUs with cooperative matrices they
/// run the skinny products (one or two 16-token blocks per workgroup) on f16
/// activations, which the norms and gates write directly. Each sequence's
/// logits stay within [`ACROSS_SHAPES`] of it decoding alone, and its
/// greedy token is the same wherever the top two logits are further apart
/// than that.
#[test]
fn batches_past_the_matvec_match_sessions_alone() {
    let mut rng = Rng::fresh("batched_decode_many");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    for count in [4usize, 8, 12, 16, 24, 40, 64, 100, 128] {
        let lens: Vec<usize> = (0..count).map(|_| 1 + rng.below(30)).collect();
        let prompts: Vec<Vec<u32>> = lens.iter().map(|&n| tokens(&mut rng, n, n_vocab)).collect();
        let mut alone: Vec<Session> = prompts
            .iter()
            .map(|p| {
                let mut s = contiguous(&model, 64);
                s.prefill(p).expect("prefill");
                s
            })
            .collect();
        let mut sessions: Vec<Session> = prompts.iter().map(|_| paged(&model, 64, 16, 0)).collect();
        let mut runner = BatchRunner::new(model.clone());
        prefill_all(&mut runner, &mut sessions, &prompts);
        for step in 0..4 {
            let next: Vec<u32> = alone.iter().map(|s| argmax(s.logits())).collect();
            for (s, &t) in alone.iter_mut().zip(&next) {
                s.decode(t).expect("decode");
            }
            decode_all(&mut runner, &mut sessions, &next);
            for (i, (b, a)) in sessions.iter().zip(&alone).enumerate() {
                let d = rel_diff(b.logits(), a.logits());
                assert!(
                    d <= ACROSS_SHAPES,
                    "{count} sequences, session {i} step {step}: differs by {d}"
                );
                let scale = a.logits().iter().fold(1.0f32, |m, v| m.max(v.abs()));
                if top_margin(a.logits()) > 2.0 * ACROSS_SHAPES * scale {
                    assert_eq!(
                        argmax(b.logits()),
                        argmax(a.logits()),
                        "{count} sequences, session {i} step {step}: greedy token"
                    );
                }
            }
        }
    }
}

/// Decode steps leave their logits in readback buffers the sessions read
/// in place, alternating between buffers while sessions hold them. A
/// session that sits out steps keeps its logits; when every buffer is
/// held, the step copies logits into the sessions instead. Each stepped
/// session matches the same tokens evaluated alone.
#[test]
fn lent_logits_survive_steps_of_other_sessions() {
    let mut rng = Rng::fresh("lent_logits");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    let prompts: Vec<Vec<u32>> = (0..4).map(|_| tokens(&mut rng, 5, n_vocab)).collect();
    let mut batched: Vec<Session> = prompts.iter().map(|_| paged(&model, 64, 16, 0)).collect();
    let mut alone: Vec<Session> = prompts.iter().map(|_| contiguous(&model, 64)).collect();
    for ((b, a), p) in batched.iter_mut().zip(&mut alone).zip(&prompts) {
        b.prefill(p).expect("prefill");
        a.prefill(p).expect("prefill");
    }
    let mut runner = BatchRunner::new(model.clone());
    // Which sessions step together: the fourth step finds all three
    // buffers held (by 0, by 3, by 1 and 2) and copies.
    for (step, group) in [
        vec![0, 1],
        vec![2, 3],
        vec![1, 2],
        vec![1, 3],
        vec![0, 1, 2, 3],
    ]
    .iter()
    .enumerate()
    {
        let before: Vec<Vec<f32>> = batched.iter().map(|s| s.logits().to_vec()).collect();
        let next: Vec<u32> = group.iter().map(|&i| argmax(alone[i].logits())).collect();
        for (&i, &t) in group.iter().zip(&next) {
            alone[i].decode(t).expect("decode alone");
        }
        let mut refs: Vec<&mut Session> = batched
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| group.contains(i))
            .map(|(_, s)| s)
            .collect();
        runner.decode(&mut refs, &next).expect("batched decode");
        for (i, s) in batched.iter().enumerate() {
            if group.contains(&i) {
                // (steps of four sessions run the skinny f16 products on
                // GPUs with cooperative matrices, the others the matvec)
                let d = rel_diff(s.logits(), alone[i].logits());
                assert!(
                    d <= ACROSS_SHAPES,
                    "step {step} session {i}: differs by {d}"
                );
            } else {
                assert_eq!(
                    s.logits(),
                    &before[i][..],
                    "step {step}: session {i} sat out and its logits changed"
                );
            }
        }
    }
    // A fork reads the same logits, and keeps them when its parent steps.
    let fork = batched[0].fork().expect("fork");
    let kept = fork.logits().to_vec();
    assert_eq!(kept, batched[0].logits());
    let t = argmax(batched[0].logits());
    let mut refs: Vec<&mut Session> = batched.iter_mut().take(2).collect();
    runner.decode(&mut refs, &[t, t]).expect("step after fork");
    assert_eq!(fork.logits(), &kept[..]);
}

#[test]
fn forks_share_the_prompt_and_continue_on_their_own() {
    let mut rng = Rng::fresh("forks");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    let page = 16;
    let prompt = tokens(&mut rng, 45, n_vocab); // 2 full pages and a partial one
    let mut parent = paged(&model, 128, page, 0);
    let start = {
        let st = parent.page_stats().expect("stats");
        PageStats {
            sequences: st.sequences - 1,
            ..st
        }
    };
    parent.prefill(&prompt).expect("prefill");
    let mut forks: Vec<Session> = (0..8).map(|_| parent.fork().expect("fork")).collect();
    let st = parent.page_stats().expect("stats");
    assert_eq!(st.pages_used, 3, "forks share the prompt's pages: {st:?}");
    assert_eq!(st.sequences, 9);
    assert_eq!(st.tokens, 9 * 45);

    // Each fork continues with its own token, then greedily, crossing into a fourth page.
    let firsts: Vec<u32> = (0..8).map(|_| rng.below(n_vocab) as u32).collect();
    let mut runner = BatchRunner::new(model.clone());
    {
        decode_all(&mut runner, &mut forks, &firsts);
    }
    for _ in 0..5 {
        let next: Vec<u32> = forks.iter().map(|s| argmax(s.logits())).collect();
        decode_all(&mut runner, &mut forks, &next);
    }
    // Positions 45..50: each fork copied the shared partial page (45..47)
    // once and took a fourth page for 48..50; the two full pages stay shared.
    let st = parent.page_stats().expect("stats");
    assert_eq!(st.pages_used, 3 + 8 * 2, "{st:?}");

    // Each fork equals a session that evaluated the same tokens itself.
    for (f, &first) in forks.iter().zip(&firsts) {
        let mut want = contiguous(&model, 128);
        want.prefill(&prompt).expect("prefill");
        want.prefill(&f.tokens()[45..]).expect("continuation");
        assert_eq!(f.tokens()[45], first);
        let d = rel_diff(f.logits(), want.logits());
        assert!(d <= 1e-3, "fork differs by {d}");
    }
    // The parent was not disturbed by its forks' writes.
    let mut want = contiguous(&model, 128);
    want.prefill(&prompt).expect("prefill");
    parent.decode(7).expect("parent decode");
    want.decode(7).expect("decode");
    assert!(rel_diff(parent.logits(), want.logits()) <= 1e-6);

    drop(forks);
    drop(parent);
    let probe = paged(&model, 128, page, 0);
    let end = probe.page_stats().expect("stats");
    assert_eq!(
        PageStats {
            sequences: end.sequences - 1,
            ..end
        },
        start
    );
}

#[test]
fn rewind_returns_pages_and_fork_of_fork_works() {
    let mut rng = Rng::fresh("rewind_pages");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    let mut s = paged(&model, 128, 8, 0);
    s.prefill(&tokens(&mut rng, 40, n_vocab)).expect("prefill");
    assert_eq!(s.page_stats().expect("stats").pages_used, 5);
    s.rewind(9).expect("rewind");
    assert_eq!(s.page_stats().expect("stats").pages_used, 2);
    // A fork of a rewound session, and a fork of that fork, write into the shared page.
    let mut a = s.fork().expect("fork");
    let mut b = a.fork().expect("fork of fork");
    a.decode(3).expect("a");
    b.decode(4).expect("b");
    s.decode(5).expect("s");
    assert_eq!(s.page_stats().expect("stats").pages_used, 1 + 3);
    let mut want = contiguous(&model, 128);
    want.prefill(&s.tokens()[..9]).expect("prefix");
    want.decode(4).expect("b's token");
    assert!(rel_diff(b.logits(), want.logits()) <= ACROSS_SHAPES);
}

#[test]
fn exhausted_pool_is_a_clean_error_and_pages_come_back() {
    let mut rng = Rng::fresh("exhaust");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    // 6 pages of 8 rows for the whole model.
    let mut a = paged(&model, 64, 8, 6);
    let start = a.page_stats().expect("stats");
    assert_eq!(start.pages_total, 6);
    assert_eq!(start.pages_free, 6);
    a.prefill(&tokens(&mut rng, 30, n_vocab)).expect("4 pages");
    let mut b = paged(&model, 64, 8, 0);
    let before = b.page_stats().expect("stats");
    let err = b
        .prefill(&tokens(&mut rng, 20, n_vocab))
        .expect_err("3 pages needed, 2 free");
    assert!(
        matches!(err.root(), ModelError::PoolExhausted { .. }),
        "{err}"
    );
    assert_eq!(b.len(), 0);
    assert_eq!(
        b.page_stats().expect("stats"),
        before,
        "failure took no page"
    );
    // Both sessions still work.
    b.prefill(&tokens(&mut rng, 9, n_vocab))
        .expect("2 pages fit");
    a.decode(1).expect("a continues in its partial page");
    a.decode(2).expect("a fills its page");
    assert_eq!(a.len(), 32);

    // A batched step needing a page for each of a and b: none left.
    b.rewind(8).expect("b at a page boundary");
    let mut c = paged(&model, 64, 8, 0);
    c.prefill(&tokens(&mut rng, 8, n_vocab))
        .expect("the last page");
    assert_eq!(c.page_stats().expect("stats").pages_free, 0);
    let lens = (a.len(), b.len(), c.len());
    let snapshot = c.page_stats().expect("stats");
    let mut runner = BatchRunner::new(model.clone());
    let err = runner
        .decode(&mut [&mut a, &mut b, &mut c], &[1, 2, 3])
        .expect_err("no free page");
    assert!(
        matches!(err.root(), ModelError::PoolExhausted { .. }),
        "{err}"
    );
    assert_eq!((a.len(), b.len(), c.len()), lens, "no session changed");
    assert_eq!(c.page_stats().expect("stats"), snapshot);

    // Free everything, fill again, free again.
    drop((a, b, c));
    for _ in 0..2 {
        let mut ss: Vec<Session> = (0..3).map(|_| paged(&model, 64, 8, 0)).collect();
        for s in &mut ss {
            s.prefill(&tokens(&mut rng, 16, n_vocab))
                .expect("2 pages each");
        }
        assert_eq!(ss[0].page_stats().expect("stats").pages_free, 0);
        drop(ss);
        let probe = paged(&model, 64, 8, 0);
        let st = probe.page_stats().expect("stats");
        assert_eq!(st.pages_free, 6);
        assert_eq!(st.tokens, 0);
        assert_eq!(st.sequences, 1);
    }
}

#[test]
fn batches_need_paged_sessions_of_one_pool_and_model() {
    let mut rng = Rng::fresh("batch_errors");
    let model = tiny_model(rng.next_u64());
    let other = tiny_model(rng.next_u64());
    let mut runner = BatchRunner::new(model.clone());
    let mut p = paged(&model, 32, 16, 0);
    let mut c = contiguous(&model, 32);
    let err = runner
        .decode(&mut [&mut p, &mut c], &[1, 2])
        .expect_err("contiguous");
    assert!(err.to_string().contains("contiguous"), "{err}");
    let mut q = paged(&model, 32, 8, 0);
    let err = runner
        .decode(&mut [&mut p, &mut q], &[1, 2])
        .expect_err("two pools");
    assert!(err.to_string().contains("page pool"), "{err}");
    let mut o = paged(&other, 32, 16, 0);
    let err = runner
        .decode(&mut [&mut p, &mut o], &[1, 2])
        .expect_err("other model");
    assert!(err.to_string().contains("another model"), "{err}");
    let n_vocab = model.spec().n_vocab as u32;
    let err = runner
        .decode(&mut [&mut p], &[n_vocab])
        .expect_err("token range");
    assert!(
        matches!(err.root(), ModelError::TokenOutOfRange { .. }),
        "{err}"
    );
    let err = runner.decode(&mut [&mut p], &[1, 2]).expect_err("count");
    assert!(matches!(err, ModelError::InvalidArgument { .. }), "{err}");
    assert_eq!(p.len(), 0);
    runner.decode(&mut [&mut p], &[1]).expect("a batch of one");
    assert_eq!(p.len(), 1);
}

#[test]
fn rewinding_a_sliding_window_ring_past_what_it_holds_reevaluates() {
    let mut rng = Rng::fresh("ring_rewind");
    let model = tiny_windowed_of("mistral", rng.next_u64(), 8, 2);
    let n_vocab = model.spec().n_vocab;
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch: 4,
        ..Default::default()
    };
    // Rings of window + batch = 12 rows instead of 64.
    let mut s = Session::new(model.clone(), &opts).expect("session");
    assert!(
        s.cache_bytes()
            < Session::new(
                model.clone(),
                &SessionOptions {
                    n_ctx: 64,
                    n_batch: 64,
                    ..opts.clone()
                }
            )
            .expect("session")
            .cache_bytes()
    );
    let toks = tokens(&mut rng, 40, n_vocab);
    s.prefill(&toks).expect("prefill");
    for n_keep in [38, 37, 20, 5, 0] {
        s.rewind(n_keep).expect("rewind");
        assert_eq!(s.tokens(), &toks[..n_keep]);
        let t = rng.below(n_vocab) as u32;
        s.decode(t).expect("decode");
        // A fresh session that evaluated the same tokens: a window of 8 on a
        // cache large enough never to wrap.
        let mut want = Session::new(
            model.clone(),
            &SessionOptions {
                n_ctx: 64,
                n_batch: 64,
                ..Default::default()
            },
        )
        .expect("session");
        if n_keep > 0 {
            want.prefill(&toks[..n_keep]).expect("prefill");
        }
        want.decode(t).expect("decode");
        let d = rel_diff(s.logits(), want.logits());
        assert!(d <= ACROSS_SHAPES, "rewind to {n_keep}: differs by {d}");
        // Back to the full prompt for the next case.
        s.rewind(n_keep).expect("rewind");
        s.prefill(&toks[n_keep..]).expect("refill");
    }
}

#[test]
fn paged_sliding_window_layers_keep_only_a_ring() {
    let mut rng = Rng::fresh("paged_rings");
    for (arch, n_layer) in [("mistral", 2), ("gemma3", 6)] {
        let model = tiny_windowed_of(arch, rng.next_u64(), 8, n_layer);
        let n_vocab = model.spec().n_vocab;
        let n_ctx = 1100;
        // Past the ring (8 + 512 rows): positions wrap around it.
        let toks = tokens(&mut rng, 600, n_vocab);
        // Reference: a contiguous cache holding every row.
        let mut want = Session::new(
            model.clone(),
            &SessionOptions {
                n_ctx,
                n_batch: 64,
                ..Default::default()
            },
        )
        .expect("session");
        want.prefill(&toks).expect("prefill");
        let mut s = paged(&model, n_ctx, 4, 0);
        s.prefill(&toks).expect("paged prefill");
        assert!(
            rel_diff(s.logits(), want.logits()) <= 1e-6,
            "{arch}: prefill"
        );
        let st = s.page_stats().expect("stats");
        // Rings of window + 512 rows in pages of 4; full layers keep every position.
        assert_eq!(st.window_pages_used, 520 / 4, "{arch}: {st:?}");
        assert_eq!(st.pages_used, 600 / 4, "{arch}: {st:?}");
        assert!(st.bytes_used > 0);
        for _ in 0..6 {
            let t = argmax(want.logits());
            want.decode(t).expect("decode");
            s.decode(t).expect("paged decode");
            assert!(
                rel_diff(s.logits(), want.logits()) <= 1e-6,
                "{arch}: decode"
            );
        }
        // A fork shares the rings; its writes copy only the ring page it writes.
        let mut f = s.fork().expect("fork");
        let before = s.page_stats().expect("stats").window_pages_used;
        f.decode(3).expect("fork decode");
        assert_eq!(s.page_stats().expect("stats").window_pages_used, before + 1);
        let mut w2 = Session::new(
            model.clone(),
            &SessionOptions {
                n_ctx,
                n_batch: 64,
                ..Default::default()
            },
        )
        .expect("session");
        w2.prefill(want.tokens()).expect("prefill");
        w2.decode(3).expect("decode");
        assert!(
            rel_diff(f.logits(), w2.logits()) <= ACROSS_SHAPES,
            "{arch}: fork"
        );
        // Rewinding within what the ring holds, then further than it holds.
        for n_keep in [598, 10] {
            s.rewind(n_keep).expect("rewind");
            s.decode(5).expect("decode");
            let mut w3 = Session::new(
                model.clone(),
                &SessionOptions {
                    n_ctx,
                    n_batch: 64,
                    ..Default::default()
                },
            )
            .expect("session");
            w3.prefill(&s.tokens()[..n_keep]).expect("prefill");
            w3.decode(5).expect("decode");
            assert!(
                rel_diff(s.logits(), w3.logits()) <= ACROSS_SHAPES,
                "{arch}: rewind {n_keep}"
            );
        }
    }
}

#[test]
fn batches_of_windowed_sequences_read_their_own_rings() {
    let mut rng = Rng::fresh("batched_rings");
    let model = tiny_windowed_of("gemma3", rng.next_u64(), 8, 6);
    let n_vocab = model.spec().n_vocab;
    let prompts: Vec<Vec<u32>> = [30, 530, 5, 700]
        .iter()
        .map(|&n| tokens(&mut rng, n, n_vocab))
        .collect();
    let mut ss: Vec<Session> = prompts.iter().map(|_| paged(&model, 1024, 16, 0)).collect();
    let mut runner = BatchRunner::new(model.clone());
    prefill_all(&mut runner, &mut ss, &prompts);
    for _ in 0..3 {
        let next: Vec<u32> = ss.iter().map(|s| argmax(s.logits())).collect();
        decode_all(&mut runner, &mut ss, &next);
    }
    for (i, s) in ss.iter().enumerate() {
        let mut want = contiguous(&model, 1024);
        want.prefill(s.tokens()).expect("alone");
        let d = rel_diff(s.logits(), want.logits());
        assert!(d <= 1e-3, "sequence {i}: differs by {d}");
    }
}

/// A prompt longer than a batch that runs out of pages part way is not
/// evaluated at all, and the logits stay those of the last evaluation
/// wherever that left them: a decode step's row, a batched step's lent
/// row, or a prompt's own vector.
#[test]
fn failed_long_prompt_keeps_the_last_logits_where_they_were() {
    let mut rng = Rng::fresh("failed_long_prompt");
    let model = tiny_model(rng.next_u64());
    let n_vocab = model.spec().n_vocab;
    let opts = SessionOptions {
        n_ctx: 64,
        kv_kind: CacheKind::Paged,
        page_size: 8,
        pool_pages: 3,
        n_batch: 8,
        ..Default::default()
    };
    let mut s = Session::new(model.clone(), &opts).expect("session");
    s.prefill(&tokens(&mut rng, 7, n_vocab)).expect("prompt");
    let mut runner = BatchRunner::new(model.clone());
    // Each kind of evaluation, then a prompt of 24-25 tokens (3-4 batches)
    // where two pages are left: its first batch takes a page, and the
    // second or third finds none.
    for kind in ["decode", "batched decode", "prompt"] {
        match kind {
            "decode" => s.decode(3).expect("decode"),
            "batched decode" => runner.decode(&mut [&mut s], &[4]).expect("batched"),
            _ => s.prefill(&[5]).expect("one-token prompt"),
        }
        let len = s.len();
        let want = s.logits().to_vec();
        assert_eq!(want.len(), n_vocab, "{kind}");
        let pages = s.page_stats().expect("stats").pages_used;
        let err = s
            .prefill(&tokens(&mut rng, 24 - len % 8 + 1, n_vocab))
            .expect_err("more pages than the pool has");
        assert!(
            matches!(err.root(), ModelError::PoolExhausted { .. }),
            "{kind}: {err}"
        );
        assert_eq!(s.len(), len, "{kind}: the prompt was not kept");
        // The batches that fit took pages, given back with the prompt.
        assert_eq!(
            s.page_stats().expect("stats").pages_used,
            pages,
            "{kind}: pages kept"
        );
        assert_eq!(s.logits(), &want[..], "{kind}: logits changed");
        // A failed prompt after a decode step leaves the step rows in turn.
        s.decode(6).expect("decode after the failure");
        assert_eq!(s.logits().len(), n_vocab);
        s.rewind(len).expect("back");
    }
}
