//! Rough prefill/decode timing of a GGUF on the default device (development aid).
use combs::formats::gguf::GgufFile;
use combs::models::{LoadOptions, ModelRegistry};
use combs::runtime::{Session, SessionOptions};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: timing MODEL.gguf [n_prompt] [n_gen]")?;
    let n_prompt: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(128);
    let n_gen: usize = std::env::args()
        .nth(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(16);
    let ctx = combs::gpu::GpuContext::new(None)?;
    println!("device: {}", ctx.caps().name);
    let t0 = Instant::now();
    let g = if let Some(spec) = path.strip_prefix("synth:") {
        // synth:PRESET:TYPE builds a random-weight model in memory.
        let (preset, t) = spec.split_once(':').ok_or("synth:PRESET:TYPE")?;
        let t = combs::quant::QuantType::from_name(t).ok_or("unknown type")?;
        let cfg = combs::models::synth::SynthConfig::preset(preset, t)?;
        GgufFile::from_bytes(combs::models::synth::synth_gguf(&cfg)?.to_bytes())?
    } else {
        GgufFile::open(std::path::Path::new(&path))?
    };
    let model = ModelRegistry::new().load(&ctx, &g, &LoadOptions::default())?;
    println!("load: {:.2}s", t0.elapsed().as_secs_f64());
    let mut s = Session::new(
        model.clone(),
        &SessionOptions {
            n_ctx: 2048,
            ..Default::default()
        },
    )?;
    let prompt: Vec<u32> = (0..n_prompt as u32)
        .map(|i| (i * 7919) % 1000 + 100)
        .collect();
    for _ in 0..2 {
        s.clear();
        let t0 = Instant::now();
        s.prefill(&prompt)?;
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "prefill {n_prompt}: {:.2}s = {:.1} tok/s",
            dt,
            n_prompt as f64 / dt
        );
    }
    s.decode(5)?;
    // Profile one prefill of the prompt by kernel.
    {
        use combs::gpu::Recording;
        let scratch = model.create_scratch(n_prompt, 1)?;
        let cache = model.create_kv_cache(&combs::kv::CacheConfig::contiguous(2048))?;
        let ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (0..n_prompt as i32).collect();
        scratch.ids().write_slice(0, &ids)?;
        scratch.positions().write_slice(0, &pos)?;
        for n in [n_prompt.min(512), 1] {
            let mut rec = Recording::new(&ctx, true)?;
            model.record_embed(&mut rec, &scratch, n)?;
            model.record_blocks(&mut rec, &scratch, cache.as_ref(), n)?;
            model.record_logits(&mut rec, &scratch, n - 1, 1, 0)?;
            rec.finish()?;
            rec.submit_and_wait()?;
            let t0 = Instant::now();
            rec.submit_and_wait()?;
            println!(
                "replay of {n} tokens: {:.3}s wall",
                t0.elapsed().as_secs_f64()
            );
            for (k, ns) in rec.profile()?.iter().take(12) {
                println!("  {k:28} {:9.3} ms", ns / 1e6);
            }
            if n == 1 {
                let mut plain = Recording::new(&ctx, false)?;
                model.record_embed(&mut plain, &scratch, n)?;
                model.record_blocks(&mut plain, &scratch, cache.as_ref(), n)?;
                model.record_logits(&mut plain, &scratch, 0, 1, 0)?;
                plain.finish()?;
                plain.submit_and_wait()?;
                let t0 = Instant::now();
                for _ in 0..50 {
                    plain.submit_and_wait()?;
                }
                println!(
                    "plain replay of 1 token: {:.3} ms",
                    t0.elapsed().as_secs_f64() * 1e3 / 50.0
                );
                let mut l = vec![0f32; model.spec().n_vocab];
                let t0 = Instant::now();
                for _ in 0..50 {
                    scratch.logits.read_slice(0, &mut l)?;
                }
                println!(
                    "logits read: {:.3} ms",
                    t0.elapsed().as_secs_f64() * 1e3 / 50.0
                );
                let t0 = Instant::now();
                for i in 0..50 {
                    scratch.ids().write_slice(0, &[i])?;
                    scratch.positions().write_slice(0, &[i])?;
                }
                println!(
                    "inputs write: {:.3} ms",
                    t0.elapsed().as_secs_f64() * 1e3 / 50.0
                );
                println!(
                    "dispatches {} barriers {}",
                    plain.n_dispatches(),
                    plain.n_barriers()
                );
            }
        }
    }
    let t0 = Instant::now();
    let mut tok = 100u32;
    let mut t_decode = 0.0;
    for _ in 0..n_gen {
        let t1 = Instant::now();
        s.decode(tok)?;
        t_decode += t1.elapsed().as_secs_f64();
        tok = combs::runtime::sampler::argmax(s.logits()) as u32;
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "  of which in Session::decode: {:.3} ms/token",
        t_decode * 1e3 / n_gen as f64
    );
    println!(
        "decode {n_gen}: {:.2}s = {:.1} tok/s",
        dt,
        n_gen as f64 / dt
    );
    Ok(())
}
