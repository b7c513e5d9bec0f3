//! `Recording::survey`: a forward call recorded as a survey collects the
//! pipelines it uses, `create_surveyed_pipelines` creates them (in
//! parallel), and the real recording of the same call then creates none.
//! Sessions on GPUs do this before their first call of each size; on
//! lavapipe (a CPU device) it is driven here by hand.

mod common;

use combs::formats::gguf::GgufFile;
use combs::gpu::{GpuContext, Recording};
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::ops::plan::Backend;
use combs::quant::QuantType;
use combs::{CacheConfig, LoadOptions, ModelRegistry};
use common::Rng;

#[test]
fn surveyed_pipelines_are_all_a_call_needs() {
    // A context of its own: other tests' pipelines must not count.
    let ctx = GpuContext::new(None).expect("device");
    let mut rng = Rng::fresh("pipeline_survey");
    for (arch, t) in [("llama", QuantType::Q4_0), ("gemma3", QuantType::Q8_0)] {
        let mut cfg = SynthConfig::preset("tiny", t).expect("preset");
        cfg.arch = arch.to_string();
        cfg.seed = rng.next_u64();
        let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
        let opts = LoadOptions {
            backend: Some(Backend::Vulkan),
            ..Default::default()
        };
        let model = ModelRegistry::new().load(&ctx, &g, &opts).expect("load");
        let n = 3 + rng.below(20);
        let scratch = model.create_scratch(n, 1).expect("scratch");
        let mut cache = model
            .create_kv_cache(&CacheConfig {
                max_batch: n,
                ..CacheConfig::contiguous(64)
            })
            .expect("cache");
        cache.reserve(n).expect("reserve");
        let ids: Vec<i32> = (0..n).map(|_| rng.below(cfg.n_vocab) as i32).collect();
        let pos: Vec<i32> = (0..n as i32).collect();
        scratch.ids().write_slice(0, &ids).expect("ids");
        scratch.positions().write_slice(0, &pos).expect("positions");
        let record = |rec: &mut Recording| {
            model.record_embed(rec, &scratch, n).expect("embed");
            model
                .record_blocks(rec, &scratch, cache.as_ref(), n)
                .expect("blocks");
            model
                .record_logits(rec, &scratch, n - 1, 1, 0)
                .expect("logits");
        };
        let before = ctx.pipelines_created();
        let mut survey = Recording::survey(&ctx).expect("survey");
        record(&mut survey);
        let collected = survey.create_surveyed_pipelines().expect("create");
        let surveyed = ctx.pipelines_created();
        assert!(collected > 0, "{arch}: the survey saw no dispatch");
        assert!(
            surveyed > before || before > 0,
            "{arch}: nothing was created"
        );
        let mut rec = Recording::new(&ctx, false).expect("recording");
        record(&mut rec);
        rec.finish().expect("finish");
        rec.submit_and_wait().expect("run");
        assert_eq!(
            ctx.pipelines_created(),
            surveyed,
            "{arch}: the real recording created pipelines the survey missed"
        );
        let mut logits = vec![0.0f32; cfg.n_vocab];
        scratch.logits.read_slice(0, &mut logits).expect("read");
        assert!(logits.iter().all(|v| v.is_finite()) && logits.iter().any(|&v| v != 0.0));
    }
}
