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
use combs::gpu::{DeviceClass, Fault, GpuContext};
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry};
use combs::ops::act_round::Numerics;
use combs::ops::plan::IntDot;
use combs::quant::QuantType;
use combs::runtime::{Session, SessionOptions};
use common::steps::{logit_rows, recorded_decode_step};
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
            let (ra, rb) = (recorded_decode_step(&a), recorded_decode_step(&b));
            let (da, ba, ha) = (ra.n_dispatches(), ra.n_barriers(), ra.n_handoffs());
            let (db, bb, hb) = (rb.n_dispatches(), rb.n_barriers(), rb.n_handoffs());
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
                let x = logit_rows(a.clone(), &prompt, &more, batch);
                let y = logit_rows(b.clone(), &prompt, &more, batch);
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
/// `HandoffTimeout` instead of hanging or returning what it computed;
/// recordings made after it use barriers, and the call repeated in a new
/// session gives the logits a context that never handed off gives.
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
        matches!(
            e.root(),
            ModelError::HandoffTimeout { counted: 0, of: 0 }
        ),
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
