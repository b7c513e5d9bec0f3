//! Dispatches chained by hand-off (`glsl/common/handoff.glsl`: each waits
//! for the one before through memory instead of a pipeline barrier) give
//! the same logits, bit for bit, as the same recording with barriers: the
//! same kernels do the same arithmetic in the same order, so any
//! difference is a dispatch that read something too early or a slot the
//! recording bound wrongly. Tiny models planned as for a GPU (the decode
//! matvecs, split-key attention and embedding lookup have twins), a prompt
//! in chunks, decode steps and small batches, exact and integer numerics,
//! each on two contexts of the test device: one handing off, one not.
//!
//! lavapipe runs a command buffer's dispatches one after another, so here
//! the test checks the recording (twins, slots, the barriers around a
//! chain) and that a waiter finds its predecessor done; the overlap itself
//! runs only on GPUs (`combs kernel-bench --handoff` checks a chain's
//! output there).

mod common;

use std::sync::Arc;

use combs::ModelError;
use combs::formats::gguf::GgufFile;
use combs::gpu::{DeviceClass, Fault, GpuContext, Recording};
use combs::kv::CacheKind;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry};
use combs::ops::act_round::Numerics;
use combs::ops::plan::IntDot;
use combs::quant::QuantType;
use combs::runtime::{BatchRunner, Session, SessionOptions};
use common::{Rng, gpu};

fn load(ctx: &Arc<GpuContext>, g: &GgufFile, numerics: Numerics) -> Arc<dyn GenerativeModel> {
    let opts = LoadOptions {
        plan_as: Some(DeviceClass::Gpu),
        numerics,
        int_dot: IntDot::On,
        ..LoadOptions::default()
    };
    ModelRegistry::new().load(ctx, g, &opts).expect("load")
}

/// Every logit row for `prompt` in chunks of 5, then decode steps of
/// `more`, then one batched step of `batch` forks.
fn run(
    model: Arc<dyn GenerativeModel>,
    prompt: &[u32],
    more: &[u32],
    batch: usize,
) -> Vec<Vec<f32>> {
    let opts = SessionOptions {
        n_ctx: 96,
        n_batch: 5,
        n_logit_rows: 5,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        ..Default::default()
    };
    let mut s = Session::new(model.clone(), &opts).expect("session");
    let n_vocab = model.spec().n_vocab;
    let all = s.prefill_all_logits(prompt).expect("prefill");
    let mut rows: Vec<Vec<f32>> = all.chunks(n_vocab).map(<[f32]>::to_vec).collect();
    for &t in more {
        s.decode(t).expect("decode");
        rows.push(s.logits().to_vec());
    }
    let mut forks: Vec<Session> = (0..batch).map(|_| s.fork().expect("fork")).collect();
    let tokens: Vec<u32> = (0..batch).map(|i| more[i % more.len()]).collect();
    let mut refs: Vec<&mut Session> = forks.iter_mut().collect();
    BatchRunner::new(model)
        .decode(&mut refs, &tokens)
        .expect("batched decode");
    rows.extend(forks.iter().map(|f| f.logits().to_vec()));
    rows
}

/// (dispatches, barriers, hand-offs) of one recorded decode step.
fn decode_step(model: &Arc<dyn GenerativeModel>) -> (usize, usize, usize) {
    let cache = model
        .create_kv_cache(&combs::kv::CacheConfig::contiguous(8))
        .expect("cache");
    let scratch = model.create_scratch(1, 1).expect("scratch");
    scratch.ids().write_slice(0, &[1i32]).expect("ids");
    scratch
        .positions()
        .write_slice(0, &[0i32])
        .expect("positions");
    let mut rec = Recording::new(model.context(), false).expect("recording");
    model.record_embed(&mut rec, &scratch, 1).expect("embed");
    model
        .record_blocks(&mut rec, &scratch, cache.as_ref(), 1)
        .expect("blocks");
    model
        .record_logits(&mut rec, &scratch, 0, 1, 0)
        .expect("logits");
    (rec.n_dispatches(), rec.n_barriers(), rec.n_handoffs())
}

#[test]
fn handed_off_dispatches_match_barriers_bit_for_bit() {
    let on = GpuContext::new(None).expect("a second context on the test device");
    on.set_handoff(true);
    let off = gpu();
    assert!(
        !off.handoff(),
        "COMBS_HANDOFF=1 would leave nothing to compare"
    );
    let mut rng = Rng::fresh("handoff");
    let types = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
    ];
    for arch in ["llama", "qwen3"] {
        let t = types[rng.below(types.len())];
        let mut cfg = SynthConfig::preset("tiny", t).expect("preset");
        cfg.arch = arch.to_string();
        cfg.seed = rng.next_u64();
        let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
        let prompt: Vec<u32> = (0..13).map(|_| rng.below(cfg.n_vocab) as u32).collect();
        let more: Vec<u32> = (0..4).map(|_| rng.below(cfg.n_vocab) as u32).collect();
        for numerics in [Numerics::Exact, Numerics::LlamaCppCpu] {
            let (a, b) = (load(&on, &g, numerics), load(&off, &g, numerics));
            let (da, ba, ha) = decode_step(&a);
            let (db, bb, hb) = decode_step(&b);
            eprintln!(
                "{arch} {t:?} {numerics:?}: a decode step of {da} dispatches has {ba} barriers \
                 and {ha} hand-offs handing off, {bb} barriers without"
            );
            assert_eq!(da, db, "the same dispatches either way");
            assert_eq!(hb, 0, "no hand-off where it is off");
            // Kernels without a twin (a Q/K norm, the head's top-k) end
            // a chain with a barrier; the rest hand off.
            assert!(
                ha > 0 && ba < bb,
                "{arch} {t:?} {numerics:?}: {ha} of {da} dispatches handed off, \
                 {ba} barriers against {bb}"
            );
            for batch in [2, 6, 12, 40] {
                let x = run(a.clone(), &prompt, &more, batch);
                let y = run(b.clone(), &prompt, &more, batch);
                assert_eq!(x.len(), y.len());
                for (i, (r, s)) in x.iter().zip(&y).enumerate() {
                    let same = r.iter().zip(s).all(|(p, q)| p.to_bits() == q.to_bits());
                    assert!(
                        same,
                        "{arch} {t:?} {numerics:?} batch {batch}: row {i} differs with hand-offs"
                    );
                }
            }
        }
    }
}

/// A waiter whose predecessor never finishes (an injected stall: the wait
/// slot no dispatch completes) gives up, and the call fails with
/// `HandoffTimeout` instead of hanging or returning what it computed; the
/// device then orders dispatches with barriers, and the repeated call
/// gives the logits a context that never handed off gives.
#[test]
fn a_stalled_handoff_fails_the_call_and_barriers_take_over() {
    let ctx = GpuContext::new(None).expect("a second context on the test device");
    ctx.set_handoff(true);
    let mut rng = Rng::fresh("handoff_stall");
    let mut cfg = SynthConfig::preset("tiny", QuantType::Q8_0).expect("preset");
    cfg.seed = rng.next_u64();
    let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
    let token = rng.below(cfg.n_vocab) as u32;
    let opts = SessionOptions {
        n_ctx: 32,
        ..Default::default()
    };
    let want = {
        let m = load(&gpu(), &g, Numerics::Exact);
        let mut s = Session::new(m, &opts).expect("session");
        s.decode(token).expect("decode");
        s.logits().to_vec()
    };
    let m = load(&ctx, &g, Numerics::Exact);
    let mut s = Session::new(m, &opts).expect("session");
    ctx.inject_fault(Fault::HandoffStall);
    let e = s.decode(token).expect_err("a stalled chain fails the call");
    assert!(
        matches!(e.root(), ModelError::HandoffTimeout),
        "not a hand-off timeout: {e}"
    );
    assert!(!ctx.handoff(), "hand-offs still on after a timeout");
    let mut s = Session::new(s.model().clone(), &opts).expect("session");
    s.decode(token).expect("decode with barriers");
    let same = s
        .logits()
        .iter()
        .zip(&want)
        .all(|(p, q)| p.to_bits() == q.to_bits());
    assert!(same, "the repeated call's logits differ");
}
