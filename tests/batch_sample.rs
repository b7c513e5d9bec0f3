//! Batched decode steps that sample on the device (`Model::decode_batch_sample`
//! / `BatchRunner::decode_sample`) against the same steps reading whole rows
//! of logits and sampling them on the host: the same tokens, step after
//! step, for greedy, top-k/top-p/min-p chains with temperatures and
//! repetition penalties, on tiny random-weight models with a vocabulary of
//! several top-k chunks, with the Vulkan kernels and with the host's.

mod common;

use std::sync::Arc;

use combs::formats::gguf::GgufFile;
use combs::gpu::DeviceClass;
use combs::kv::CacheKind;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry};
use combs::ops::plan::Backend;
use combs::quant::QuantType;
use combs::runtime::{BatchRunner, Sampler, SamplerOptions, Session, SessionOptions};
use common::{Rng, gpu};

fn model(seed: u64, backend: Backend) -> Arc<dyn GenerativeModel> {
    let mut cfg = SynthConfig::preset("tiny", QuantType::Q8_0).expect("preset");
    cfg.seed = seed;
    cfg.n_layer = 2;
    // Three chunks of the top-k's first pass, and a partial one.
    cfg.n_vocab = 9000;
    let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
    let opts = LoadOptions {
        backend: Some(backend),
        ..Default::default()
    };
    ModelRegistry::new().load(&gpu(), &g, &opts).expect("load")
}

/// The kernels to check on this device: the host's run on CPU devices only.
fn backends() -> Vec<Backend> {
    if gpu().caps().class() == DeviceClass::Cpu {
        vec![Backend::Vulkan, Backend::Host]
    } else {
        vec![Backend::Vulkan]
    }
}

fn sessions(model: &Arc<dyn GenerativeModel>, n: usize) -> Vec<Session> {
    let opts = SessionOptions {
        n_ctx: 64,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        pool_pages: 2 * n * 4 + 2,
        n_batch: 16,
        ..Default::default()
    };
    (0..n)
        .map(|_| Session::new(model.clone(), &opts).expect("session"))
        .collect()
}

/// Every sampler in `chains` over its own session: `steps` steps sampled
/// on the device against the same steps sampled from whole rows.
fn check(backend: Backend, chains: &[SamplerOptions], expect_device: bool, steps: usize) {
    let mut rng = Rng::fresh("batch_sample");
    let m = model(rng.next_u64(), backend);
    let n_vocab = m.spec().n_vocab;
    let n = chains.len();
    let prompts: Vec<Vec<u32>> = (0..n)
        .map(|i| (0..3 + i).map(|_| rng.below(n_vocab) as u32).collect())
        .collect();
    let mut runs = Vec::new();
    for device in [false, true] {
        let mut ss = sessions(&m, n);
        let mut samplers: Vec<Sampler> = chains
            .iter()
            .map(|o| Sampler::new(o.clone()).expect("sampler"))
            .collect();
        let mut runner = BatchRunner::new(m.clone());
        {
            let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
            let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            runner.prefill(&mut refs, &views).expect("prefill");
        }
        for (s, p) in samplers.iter_mut().zip(&prompts) {
            p.iter().for_each(|&t| s.accept(t));
        }
        let mut next: Vec<u32> = ss
            .iter()
            .zip(samplers.iter_mut())
            .map(|(s, sm)| sm.sample(s.logits()))
            .collect();
        let mut drawn = vec![next.clone()];
        for _ in 0..steps {
            let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
            let mut srefs: Vec<&mut Sampler> = samplers.iter_mut().collect();
            next = if device {
                let t = runner
                    .decode_sample(&mut refs, &next, &mut srefs)
                    .expect("decode and sample");
                for s in &ss {
                    assert_eq!(
                        s.logits().is_empty(),
                        expect_device,
                        "{backend:?}: logits read back or not"
                    );
                }
                t
            } else {
                runner.decode(&mut refs, &next).expect("decode");
                ss.iter()
                    .zip(srefs.iter_mut())
                    .map(|(s, sm)| sm.sample(s.logits()))
                    .collect()
            };
            drawn.push(next.clone());
        }
        runs.push(drawn);
    }
    for (step, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert_eq!(a, b, "{backend:?}, step {step}: host and device draws");
    }
}

fn chains() -> Vec<SamplerOptions> {
    vec![
        SamplerOptions::greedy(),
        SamplerOptions::default(),
        SamplerOptions {
            temperature: 1.5,
            top_k: 5,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..Default::default()
        },
        SamplerOptions {
            repeat_penalty: 1.3,
            repeat_last_n: 16,
            seed: 8,
            ..Default::default()
        },
        SamplerOptions {
            temperature: 0.0,
            repeat_penalty: 2.0,
            repeat_last_n: -1,
            ..Default::default()
        },
        SamplerOptions {
            temperature: 2.0,
            top_k: 200,
            top_p: 0.99,
            min_p: 0.0,
            seed: 9,
            ..Default::default()
        },
    ]
}

#[test]
fn device_sampling_draws_as_the_host() {
    for backend in backends() {
        check(backend, &chains(), true, 12);
    }
}

/// A chain that needs the whole row (no top-k) sends the batch the host's
/// way: logits read back, the same draws.
#[test]
fn whole_row_chains_read_the_logits() {
    let mut c = chains();
    c.push(SamplerOptions {
        top_k: 0,
        seed: 10,
        ..Default::default()
    });
    check(Backend::Vulkan, &c, false, 4);
}

/// One session's own step (`Session::decode_sample`, a contiguous cache)
/// draws what `decode` and `Sampler::sample` on the row draw.
#[test]
fn session_sampling_draws_as_the_host() {
    let mut rng = Rng::fresh("session_sample");
    for backend in backends() {
        let m = model(rng.next_u64(), backend);
        let n_vocab = m.spec().n_vocab;
        let prompt: Vec<u32> = (0..5).map(|_| rng.below(n_vocab) as u32).collect();
        for chain in chains() {
            let mut runs = Vec::new();
            for device in [false, true] {
                let opts = SessionOptions {
                    n_ctx: 64,
                    ..Default::default()
                };
                let mut s = Session::new(m.clone(), &opts).expect("session");
                let mut sm = Sampler::new(chain.clone()).expect("sampler");
                s.prefill(&prompt).expect("prefill");
                let mut t = sm.sample(s.logits());
                let mut drawn = vec![t];
                for _ in 0..10 {
                    t = if device {
                        let t = s.decode_sample(t, &mut sm).expect("decode and sample");
                        assert!(s.logits().is_empty(), "{backend:?}: logits read back");
                        t
                    } else {
                        s.decode(t).expect("decode");
                        sm.sample(s.logits())
                    };
                    drawn.push(t);
                }
                runs.push(drawn);
            }
            assert_eq!(runs[0], runs[1], "{backend:?} {chain:?}");
        }
    }
}

/// After a step that drew on the device, `Session::sample` draws again
/// from the candidates it kept (what `generate` continues from after a
/// stop), the same token a read row gives; a sampler needing more of the
/// row than was kept is refused.
#[test]
fn session_sample_after_a_device_step() {
    let mut rng = Rng::fresh("session_sample_again");
    let m = model(rng.next_u64(), Backend::Vulkan);
    let n_vocab = m.spec().n_vocab;
    let prompt: Vec<u32> = (0..4).map(|_| rng.below(n_vocab) as u32).collect();
    let opts = SessionOptions {
        n_ctx: 32,
        ..Default::default()
    };
    let chain = SamplerOptions {
        seed: rng.next_u64(),
        ..Default::default()
    };
    let (mut a, mut b) = (
        Session::new(m.clone(), &opts).expect("session"),
        Session::new(m.clone(), &opts).expect("session"),
    );
    let (mut sa, mut sb) = (
        Sampler::new(chain.clone()).expect("sampler"),
        Sampler::new(chain.clone()).expect("sampler"),
    );
    a.prefill(&prompt).expect("prefill");
    b.prefill(&prompt).expect("prefill");
    let t = a.sample(&mut sa).expect("sample from logits");
    assert_eq!(t, sb.sample(b.logits()));
    // a draws with its step; b reads the row.
    let ta = a.decode_sample(t, &mut sa).expect("decode and sample");
    b.decode(t).expect("decode");
    assert_eq!(ta, sb.sample(b.logits()));
    assert!(a.logits().is_empty());
    // Again from the same step: a from its kept candidates.
    assert_eq!(
        a.sample(&mut sa).expect("sample again"),
        sb.sample(b.logits())
    );
    let mut wider = Sampler::new(SamplerOptions {
        top_k: 200,
        ..chain
    })
    .expect("sampler");
    assert!(a.sample(&mut wider).is_err());
}
