//! Several devices in one process, on one machine: lavapipe opened two or
//! three times as separate `GpuContext`s stands for as many GPUs. The
//! one-device run is the reference. A model split by layers gives the
//! same logits bit for bit (the residual stream and the sums of squares
//! the next block's norm folds cross devices as they are), for prompts in
//! several calls, replayed decode steps, all-logits calls, forks and
//! rewinds. Replicas: sessions spread over the devices give what the same
//! sessions give alone on one device, and a batched call over them runs
//! each device's share.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use combs::formats::gguf::GgufFile;
use combs::gpu::{DeviceClass, GpuContext};
use combs::kv::CacheKind;
use combs::models::split::layer_ranges;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry, Placement, SplitMode};
use combs::ops::plan::Backend;
use combs::quant::QuantType;
use combs::runtime::{Model, Session, SessionOptions};
use common::{Rng, gpu, max_rel};

/// A second (and third) logical device: lavapipe opened once more.
fn another_gpu() -> Arc<GpuContext> {
    GpuContext::new(Some(gpu().index())).expect("a second context on the same device")
}

fn config(arch: &str, rng: &mut Rng, window: usize) -> SynthConfig {
    let mut cfg = SynthConfig::preset("tiny", QuantType::Q8_0).expect("preset");
    cfg.arch = arch.to_string();
    cfg.n_layer = 5;
    cfg.seed = rng.next_u64();
    cfg.sliding_window = window;
    cfg
}

fn gguf(cfg: &SynthConfig) -> GgufFile {
    GgufFile::from_bytes(synth_gguf(cfg).expect("synth").to_bytes()).expect("parse")
}

/// Prefills `prompt` in calls of `n_batch`, decodes `more`, then rewinds
/// and decodes again; returns every logits vector, and those of a fork.
fn run(model: Arc<dyn GenerativeModel>, prompt: &[u32], more: &[u32]) -> Vec<Vec<f32>> {
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch: 8,
        n_logit_rows: 4,
        ..Default::default()
    };
    let mut s = Session::new(model, &opts).expect("session");
    let mut out = Vec::new();
    s.prefill(prompt).expect("prefill");
    out.push(s.logits().to_vec());
    for &t in more {
        s.decode(t).expect("decode");
        out.push(s.logits().to_vec());
    }
    let mut f = s.fork().expect("fork");
    f.decode(more[0]).expect("decode fork");
    out.push(f.logits().to_vec());
    s.rewind(prompt.len() - 3).expect("rewind");
    s.decode(more[1]).expect("decode after rewind");
    out.push(s.logits().to_vec());
    let all = s.prefill_all_logits(&more[..5]).expect("all logits");
    out.extend(all.chunks(s.model().spec().n_vocab).map(<[f32]>::to_vec));
    out
}

fn check_split(arch: &str, window: usize) {
    let mut rng = Rng::fresh(&format!("multi_device_{arch}_{window}"));
    let cfg = config(arch, &mut rng, window);
    let g = gguf(&cfg);
    let prompt: Vec<u32> = (0..21).map(|_| rng.below(cfg.n_vocab) as u32).collect();
    let more: Vec<u32> = (0..6).map(|_| rng.below(cfg.n_vocab) as u32).collect();
    let reg = ModelRegistry::new();
    let ctxs = [gpu(), another_gpu(), another_gpu()];
    // Host kernels (lavapipe's default), and Vulkan planned as for a GPU
    // (norms folded into products from the sums of squares).
    let kernels = [
        (None, None),
        (Some(Backend::Vulkan), Some(DeviceClass::Gpu)),
    ];
    for (backend, plan_as) in kernels {
        let base = LoadOptions {
            backend,
            plan_as,
            ..LoadOptions::default()
        };
        let one = reg.load(&ctxs[0], &g, &base).expect("load on one device");
        let want = run(one, &prompt, &more);
        for (n_dev, split) in [(2, vec![1.0, 1.0]), (3, vec![1.0, 2.0, 2.0]), (2, vec![])] {
            let opts = LoadOptions {
                split_mode: SplitMode::Layer,
                tensor_split: split.clone(),
                ..base.clone()
            };
            let models = reg.load_on(&ctxs[..n_dev], &g, &opts).expect("load split");
            assert_eq!(models.len(), 1);
            let stages = models[0].stages().expect("a split model");
            assert_eq!(stages.len(), n_dev);
            // By free memory (empty), the ranges depend on what the
            // contexts hold; they still cover the blocks in order.
            let ranges = if split.is_empty() {
                let v: Vec<_> = stages.iter().map(|st| st.layers()).collect();
                assert!(
                    v.windows(2)
                        .all(|w| w[0].end == w[1].start && !w[0].is_empty())
                );
                v
            } else {
                layer_ranges(cfg.n_layer, &split).expect("ranges")
            };
            for ((st, ctx), r) in stages.iter().zip(&ctxs).zip(ranges) {
                assert!(Arc::ptr_eq(st.context(), ctx), "stage on its own device");
                assert_eq!(st.layers(), r);
            }
            let got = run(models[0].clone(), &prompt, &more);
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{arch} (window {window}, {backend:?}) split {split:?} over {n_dev}: \
                     logits {i} differ from one device (max rel {})",
                    max_rel(a, b)
                );
            }
        }
    }
}

#[test]
fn split_llama_matches_one_device_bit_for_bit() {
    check_split("llama", 0);
}

#[test]
fn split_gemma3_with_post_norms_and_window_matches_one_device_bit_for_bit() {
    check_split("gemma3", 4);
}

#[test]
fn split_qwen3_with_qk_norm_matches_one_device_bit_for_bit() {
    check_split("qwen3", 0);
}

#[test]
fn layer_ranges_follow_shares_and_give_every_device_a_block() {
    assert_eq!(layer_ranges(5, &[1.0, 1.0]).unwrap(), vec![0..3, 3..5]);
    assert_eq!(
        layer_ranges(5, &[1.0, 2.0, 2.0]).unwrap(),
        vec![0..1, 1..3, 3..5]
    );
    assert_eq!(layer_ranges(4, &[1.0, 0.0]).unwrap(), vec![0..3, 3..4]);
    assert_eq!(layer_ranges(32, &[0.25, 0.75]).unwrap(), vec![0..8, 8..32]);
    assert!(layer_ranges(2, &[1.0, 1.0, 1.0]).is_err());
    assert!(layer_ranges(4, &[0.0, 0.0]).is_err());
    assert!(layer_ranges(4, &[f32::NAN, 1.0]).is_err());
    assert!(layer_ranges(4, &[]).is_err());
}

#[test]
fn split_with_wrong_number_of_shares_is_invalid_argument() {
    let mut rng = Rng::fresh("multi_device_shares");
    let g = gguf(&config("llama", &mut rng, 0));
    let opts = LoadOptions {
        tensor_split: vec![1.0, 1.0, 1.0],
        ..LoadOptions::default()
    };
    let err = ModelRegistry::new()
        .load_on(&[gpu(), another_gpu()], &g, &opts)
        .err()
        .expect("three shares for two devices");
    assert!(
        matches!(err, combs::ModelError::InvalidArgument { .. }),
        "{err}"
    );
}

/// The synthetic model written to a file of its own (a `Model` loads a path).
fn model_file(cfg: &SynthConfig, label: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "combs-multi-device-{label}-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, synth_gguf(cfg).expect("synth").to_bytes()).expect("write model");
    path
}

fn greedy(logits: &[f32]) -> u32 {
    (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap_or(0) as u32
}

/// Mutable references to two different sessions of `v` (`g[0] < g[1]`).
fn two_mut(v: &mut [Session], g: [usize; 2]) -> (&mut Session, &mut Session) {
    let (lo, hi) = v.split_at_mut(g[1]);
    (&mut lo[g[0]], &mut hi[0])
}

#[test]
fn replica_sessions_equal_sessions_batched_on_one_device() {
    let mut rng = Rng::fresh("multi_device_replicas");
    let cfg = config("llama", &mut rng, 0);
    let path = model_file(&cfg, "replicas");
    let ctxs = [gpu(), another_gpu()];
    let opts = LoadOptions {
        split_mode: SplitMode::Replica,
        ..LoadOptions::default()
    };
    let replicated = Model::load_on(&ctxs, &path, &opts).expect("load replicas");
    let alone = Model::load(&ctxs[0], &path, &LoadOptions::default()).expect("load one");
    let _ = std::fs::remove_file(&path);
    assert_eq!(replicated.replicas().len(), 2);

    let sopts = SessionOptions {
        n_ctx: 64,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            (0..5 + 3 * i)
                .map(|_| rng.below(cfg.n_vocab) as u32)
                .collect()
        })
        .collect();
    let mut sessions: Vec<Session> = (0..4)
        .map(|_| replicated.new_session(&sopts).expect("session"))
        .collect();
    // Round-robin: the sessions alternate between the devices.
    for (i, s) in sessions.iter().enumerate() {
        let r = &replicated.replicas()[i % 2];
        assert!(
            Arc::ptr_eq(s.model(), r),
            "session {i} on replica {}",
            i % 2
        );
    }
    let mut lone: Vec<Session> = (0..4)
        .map(|_| alone.new_session(&sopts).expect("session"))
        .collect();

    // Each replica batches the sessions round-robin gave it (0 and 2, 1
    // and 3): the same two sessions batched on one device are the reference,
    // bit for bit (batched kernels add in another order than one sequence's,
    // by up to ~1e-3 with the f16 tiles of a GPU, so lone sessions are not).
    let groups = [[0usize, 2], [1, 3]];
    let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    {
        let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
        replicated
            .prefill_batch(&mut refs, &views)
            .expect("batched prefill over replicas");
    }
    for g in groups {
        let (a, b) = two_mut(&mut lone, g);
        alone
            .prefill_batch(&mut [a, b], &[views[g[0]], views[g[1]]])
            .expect("batched prefill on one device");
    }
    for step in 0..4 {
        let tokens: Vec<u32> = lone.iter().map(|s| greedy(s.logits())).collect();
        for (i, (a, b)) in sessions.iter().zip(&lone).enumerate() {
            let same = a
                .logits()
                .iter()
                .zip(b.logits())
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same,
                "step {step}, session {i}: differs by {}",
                max_rel(a.logits(), b.logits())
            );
            assert_eq!(greedy(a.logits()), tokens[i], "step {step}, session {i}");
        }
        let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
        replicated
            .decode_batch(&mut refs, &tokens)
            .expect("batched decode over replicas");
        for g in groups {
            let (a, b) = two_mut(&mut lone, g);
            alone
                .decode_batch(&mut [a, b], &[tokens[g[0]], tokens[g[1]]])
                .expect("batched decode on one device");
        }
    }
    // One sequence on a replica is one sequence on one device, bit for bit.
    let mut a = replicated.new_session(&sopts).expect("session");
    let mut b = alone.new_session(&sopts).expect("session");
    for s in [&mut a, &mut b] {
        s.prefill(&prompts[3]).expect("prefill");
        s.decode(7).expect("decode");
    }
    assert!(
        a.logits()
            .iter()
            .zip(b.logits())
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );
}

#[test]
fn replicas_place_sessions_by_free_memory() {
    let mut rng = Rng::fresh("multi_device_placement");
    let cfg = config("llama", &mut rng, 0);
    let path = model_file(&cfg, "placement");
    // Contexts of this test alone: it sets their budgets.
    let ctxs = [another_gpu(), another_gpu()];
    let opts = LoadOptions {
        split_mode: SplitMode::Replica,
        placement: Placement::MostFreeMemory,
        ..LoadOptions::default()
    };
    let model = Model::load_on(&ctxs, &path, &opts).expect("load replicas");
    let _ = std::fs::remove_file(&path);
    // The second device has room for more than the first.
    ctxs[0].set_memory_budget(ctxs[0].memory_in_use() + (64 << 20));
    ctxs[1].set_memory_budget(ctxs[1].memory_in_use() + (256 << 20));
    let s = model
        .new_session(&SessionOptions {
            n_ctx: 64,
            ..Default::default()
        })
        .expect("session");
    assert!(Arc::ptr_eq(s.model(), &model.replicas()[1]));
}

#[test]
fn batch_calls_on_a_split_model_equal_lone_sessions() {
    let mut rng = Rng::fresh("multi_device_split_batch");
    let cfg = config("llama", &mut rng, 0);
    let path = model_file(&cfg, "split-batch");
    let opts = LoadOptions {
        tensor_split: vec![2.0, 3.0],
        ..LoadOptions::default()
    };
    let split = Model::load_on(&[gpu(), another_gpu()], &path, &opts).expect("load split");
    let alone = Model::load(&gpu(), &path, &LoadOptions::default()).expect("load one");
    let _ = std::fs::remove_file(&path);
    let sopts = SessionOptions {
        n_ctx: 64,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        ..Default::default()
    };
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..4 + i).map(|_| rng.below(cfg.n_vocab) as u32).collect())
        .collect();
    let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut got: Vec<Session> = (0..3).map(|_| split.new_session(&sopts).unwrap()).collect();
    let mut want: Vec<Session> = (0..3).map(|_| alone.new_session(&sopts).unwrap()).collect();
    let tokens = [3u32, 5, 7];
    // A split model's sessions step one after another: each as alone.
    let mut refs: Vec<&mut Session> = got.iter_mut().collect();
    split
        .prefill_batch(&mut refs, &views)
        .expect("prefill batch");
    split
        .decode_batch(&mut refs, &tokens)
        .expect("decode batch");
    for ((s, p), &t) in want.iter_mut().zip(&prompts).zip(&tokens) {
        s.prefill(p).expect("prefill");
        s.decode(t).expect("decode");
    }
    for (a, b) in got.iter().zip(&want) {
        assert_eq!(a.tokens(), b.tokens());
        let same = a
            .logits()
            .iter()
            .zip(b.logits())
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "max rel {}", max_rel(a.logits(), b.logits()));
    }
}

#[test]
fn split_loads_a_model_too_big_for_one_device() {
    let mut rng = Rng::fresh("multi_device_too_big");
    let mut cfg = config("llama", &mut rng, 0);
    (cfg.n_vocab, cfg.n_embd, cfg.n_ff, cfg.n_layer) = (2048, 256, 1024, 6);
    (cfg.n_head, cfg.n_head_kv, cfg.head_dim) = (4, 2, 64);
    let g = gguf(&cfg);
    let reg = ModelRegistry::new();
    let sopts = SessionOptions {
        n_ctx: 64,
        n_batch: 8,
        ..Default::default()
    };
    // What the whole model and one session take on one device.
    let probe = another_gpu();
    let base = probe.memory_in_use();
    let one = reg
        .load(&probe, &g, &LoadOptions::default())
        .expect("load unbudgeted");
    let weights = probe.memory_in_use() - base;
    let mut want = Session::new(one, &sopts).expect("session");
    let session = probe.memory_in_use() - base - weights;
    assert!(
        session * 4 < weights,
        "the weights dominate ({weights} against {session})"
    );
    // Devices with room for 70% of the weights and a session each.
    let budgeted = || {
        let c = another_gpu();
        c.set_memory_budget(c.memory_in_use() + weights * 7 / 10 + 2 * session);
        c
    };
    let ctxs = [budgeted(), budgeted()];
    let err = reg
        .load(&ctxs[0], &g, &LoadOptions::default())
        .err()
        .expect("the model does not fit one device");
    assert!(
        matches!(err.root(), combs::ModelError::MemoryBudget { .. }),
        "{err}"
    );
    let split = reg
        .load_on(&ctxs, &g, &LoadOptions::default())
        .expect("split over two devices");
    let mut got = Session::new(split[0].clone(), &sopts).expect("session on the split");
    let prompt: Vec<u32> = (0..11).map(|_| rng.below(cfg.n_vocab) as u32).collect();
    for s in [&mut got, &mut want] {
        s.prefill(&prompt).expect("prefill");
        s.decode(9).expect("decode");
    }
    let same = got
        .logits()
        .iter()
        .zip(want.logits())
        .all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "max rel {}", max_rel(got.logits(), want.logits()));
}
