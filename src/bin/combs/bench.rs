//! `combs bench`: llama-bench style speed of a model — prefill of `-p`
//! tokens, then decode of `-n` tokens, each from an empty context and
//! repeated after its own warm-up (the two tests one after the other, as
//! llama-bench runs pp512 and tg128), reported as median tokens/s with the
//! spread; `--profile` adds GPU time per kernel family from timestamp
//! queries; `--batch 1,4,16` adds the aggregate decode speed of that many
//! sequences decoded together; `--json` prints one object.

use std::io::Write;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::gpu::{Recording, WaitMode, set_wait_mode};
use combs::kv::CacheConfig;
use combs::runtime::{Sampler, SessionOptions};

use super::common::ModelArgs;
use crate::CliError;

/// Arguments of `combs bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt tokens to prefill (0: skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Tokens to decode (0: skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also report GPU time per kernel family.
    #[arg(long)]
    profile: bool,
    /// Also decode this many sequences together (comma-separated batch
    /// sizes), reporting aggregate tokens/s for `-n` steps.
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// What each decode step ends with: `logits` (the row read back, tokens
    /// given), `greedy` or `default` (the next token drawn by a sampler of
    /// those options, as a chat or a server generates: on the device where
    /// the chain allows). With a sampler, `tg` also reports the same steps
    /// drawing on the host from the whole row (`tg_host`), and `--batch`
    /// steps draw every sequence's token.
    #[arg(long, default_value = "logits", value_parser = parse_sampler)]
    sampler: SamplerChoice,
    /// How the host waits for the GPU: `poll` or `block` (default: combs' choice).
    #[arg(long, value_parser = parse_wait)]
    wait: Option<WaitMode>,
}

/// How decode steps end (`--sampler`).
#[derive(Clone, Debug)]
pub struct SamplerChoice {
    /// The name given.
    pub name: &'static str,
    /// The sampler of each sequence, or none: logits read back.
    pub options: Option<combs::runtime::SamplerOptions>,
}

fn parse_sampler(s: &str) -> Result<SamplerChoice, String> {
    use combs::runtime::SamplerOptions;
    match s {
        "logits" => Ok(SamplerChoice {
            name: "logits",
            options: None,
        }),
        "greedy" => Ok(SamplerChoice {
            name: "greedy",
            options: Some(SamplerOptions::greedy()),
        }),
        "default" => Ok(SamplerChoice {
            name: "default",
            options: Some(SamplerOptions::default()),
        }),
        _ => Err(format!("`{s}`: expected logits, greedy or default")),
    }
}

fn parse_wait(s: &str) -> Result<WaitMode, String> {
    match s {
        "poll" => Ok(WaitMode::Poll),
        "block" => Ok(WaitMode::Block),
        _ => Err(format!("`{s}`: expected poll or block")),
    }
}

/// Median and sample standard deviation.
fn stats(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let median = if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    };
    let mean = s.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        s.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    (median, var.sqrt())
}

/// Deterministic pseudo-random token ids below `n_vocab`.
fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    tokens_seeded(n, n_vocab, 0)
}

/// [`tokens`] from another starting point.
fn tokens_seeded(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n_vocab as u64) as u32
        })
        .collect()
}

/// Runs `combs bench`.
pub fn run(args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if let Some(mode) = args.wait {
        set_wait_mode(mode);
    }
    // Load time: the file (warm in the page cache when repeated) to weights
    // resident on the device; first token: to the logits of the first
    // prefill of the prompt, pipelines and recordings made on the way.
    let t_start = Instant::now();
    let (ctx, model) = args.model.load()?;
    let load_ms = t_start.elapsed().as_secs_f64() * 1e3;
    let mut first_token_ms = None;
    let spec = model.spec().clone();
    let n_ctx = (args.n_prompt + args.n_gen + 1).max(16);
    let t_session = Instant::now();
    let mut session = model.new_session(&SessionOptions {
        n_ctx,
        n_batch: args.n_prompt.max(1),
        ..Default::default()
    })?;
    let session_ms = t_session.elapsed().as_secs_f64() * 1e3;
    let prompt = tokens(args.n_prompt, spec.n_vocab);
    let generated = tokens(args.n_gen, spec.n_vocab);
    let mut pp = Vec::new();
    let mut tg = Vec::new();
    let mut tg_host = Vec::new();
    // As llama-bench: the prompt test (a warm-up, then its repetitions),
    // then the decode test likewise, not the two interleaved. Interleaved,
    // the first timed prefill followed the first decode steps and ran
    // ~12% slow on the H200 (llama-1b Q4_0 pp512: 37.4-38.5k against
    // 41.6-43.6k tok/s for the later ones; docs/perf-notes.md, "Session 33").
    for rep in 0..=args.reps {
        if args.n_prompt > 0 {
            session.clear();
            let t0 = Instant::now();
            session.prefill(&prompt)?;
            let dt = t0.elapsed().as_secs_f64();
            if first_token_ms.is_none() {
                let ms = t_start.elapsed().as_secs_f64() * 1e3;
                first_token_ms = Some(ms);
                if combs::gpu::phases::enabled() {
                    eprintln!(
                        "load phases (COMBS_LOAD_PROFILE): load {load_ms:.1} ms, \
                         session {session_ms:.1} ms, first prefill {:.1} ms, \
                         first token at {ms:.1} ms\n{}",
                        dt * 1e3,
                        combs::gpu::phases::report()
                    );
                }
            }
            if rep > 0 {
                pp.push(args.n_prompt as f64 / dt);
                if rep == 1 && combs::gpu::phases::enabled() {
                    eprintln!(
                        "second prefill {:.1} ms; totals since load:\n{}",
                        dt * 1e3,
                        combs::gpu::phases::report()
                    );
                }
            }
        }
    }
    for rep in 0..=args.reps {
        if args.n_gen > 0 {
            let Some(opts) = &args.sampler.options else {
                session.clear();
                let t0 = Instant::now();
                for &t in &generated {
                    session.decode(t)?;
                }
                let dt = t0.elapsed().as_secs_f64();
                if rep > 0 {
                    tg.push(args.n_gen as f64 / dt);
                }
                continue;
            };
            // A chat's loop: each step's token drawn with it (on the
            // device where the chain allows), then the same on the host
            // from the whole row.
            for host in [false, true] {
                session.clear();
                let mut sampler = Sampler::new(opts.clone())?;
                let mut t = generated[0];
                let t0 = Instant::now();
                for _ in 0..args.n_gen {
                    t = if host {
                        session.decode(t)?;
                        sampler.sample(session.logits())
                    } else {
                        session.decode_sample(t, &mut sampler)?
                    };
                }
                let dt = t0.elapsed().as_secs_f64();
                if rep > 0 {
                    let v = if host { &mut tg_host } else { &mut tg };
                    v.push(args.n_gen as f64 / dt);
                }
            }
        }
    }
    let (pp_med, pp_sd) = stats(&pp);
    let (tg_med, tg_sd) = stats(&tg);
    let (tg_host_med, tg_host_sd) = stats(&tg_host);
    if args.batch.contains(&0) {
        return Err(ModelError::invalid("--batch", "sizes must be positive").into());
    }
    let batches = if args.batch.is_empty() || args.n_gen == 0 {
        Vec::new()
    } else {
        super::bench_batch::run(
            &model,
            &args.batch,
            args.n_gen,
            args.reps,
            args.profile,
            args.sampler.options.as_ref(),
            |n, seed| tokens_seeded(n, spec.n_vocab, seed + 1),
        )?
    };
    let profiles = if args.profile {
        profile(&ctx, &model, args.n_prompt.max(1))?
    } else {
        Vec::new()
    };
    let bytes = model.weights().device_bytes();
    // The decode floor: every weight a step reads, once, at the device's
    // copy bandwidth.
    let per_token = model.weights().decode_bytes_per_token();
    // Not on CPU devices: their decode runs the host's kernels, not the
    // Vulkan copy kernel's path, so the floor would say nothing.
    let copy_bps = if args.n_gen > 0 && ctx.caps().class() != combs::gpu::DeviceClass::Cpu {
        combs::ops::bandwidth::copy_bandwidth(&ctx, 512 << 20)?
    } else {
        0.0
    };
    let floor_tps = if per_token > 0 {
        copy_bps / per_token as f64
    } else {
        0.0
    };
    let devices = device_summary(&model);
    let name = model
        .path()
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    if args.json {
        let prof: Vec<String> = profiles
            .iter()
            .map(|(shape, _, rows, _)| {
                let r: Vec<String> = rows
                    .iter()
                    .map(|(k, ms)| format!("{{\"kernel\":\"{k}\",\"ms\":{ms:.4}}}"))
                    .collect();
                format!("{{\"tokens\":{shape},\"kernels\":[{}]}}", r.join(","))
            })
            .collect();
        let batch: Vec<String> = batches
            .iter()
            .map(|b| {
                let (med, sd) = stats(&b.samples);
                format!(
                    "{{\"batch\":{},\"n\":{},\"sampler\":\"{}\",\"tps\":{med:.2},\"sd\":{sd:.2},\"samples\":{:?}}}",
                    b.batch, args.n_gen, args.sampler.name, b.samples
                )
            })
            .collect();
        writeln!(
            out,
            "{{\"model\":\"{name}\",\"arch\":\"{}\",\"device\":\"{}\",\"weights_bytes\":{bytes},\
             \"decode_bytes_per_token\":{per_token},\"load_ms\":{load_ms:.1},\"first_token_ms\":{:.1},\"copy_gbps\":{:.1},\"floor_tps\":{floor_tps:.1},\
             \"pp\":{{\"n\":{},\"tps\":{pp_med:.2},\"sd\":{pp_sd:.2},\"samples\":{:?}}},\
             \"tg\":{{\"n\":{},\"sampler\":\"{}\",\"tps\":{tg_med:.2},\"sd\":{tg_sd:.2},\"samples\":{:?}}},\
             \"tg_host\":{{\"tps\":{tg_host_med:.2},\"sd\":{tg_host_sd:.2},\"samples\":{:?}}},\
             \"batch\":[{}],\"profile\":[{}],\"devices\":[{}]}}",
            spec.arch,
            ctx.caps().name,
            first_token_ms.unwrap_or(0.0),
            copy_bps / 1e9,
            args.n_prompt,
            pp,
            args.n_gen,
            args.sampler.name,
            tg,
            tg_host,
            batch.join(","),
            prof.join(","),
            devices
                .iter()
                .map(|d| format!("\"{d}\""))
                .collect::<Vec<_>>()
                .join(",")
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "model: {name} ({}, {:.1} MiB of weights on device)",
        spec.arch,
        bytes as f64 / (1 << 20) as f64
    )?;
    if devices.len() > 1 {
        writeln!(out, "devices: {}", devices.join("; "))?;
    } else {
        writeln!(out, "device: {}", ctx.caps().name)?;
    }
    writeln!(out, "| test   |          t/s |")?;
    writeln!(out, "| ------ | ------------ |")?;
    if args.n_prompt > 0 {
        writeln!(
            out,
            "| pp{:<4} | {pp_med:>8.1} ± {pp_sd:<4.1} |",
            args.n_prompt
        )?;
    }
    if args.n_gen > 0 {
        writeln!(
            out,
            "| tg{:<4} | {tg_med:>8.1} ± {tg_sd:<4.1} |",
            args.n_gen
        )?;
        if !tg_host.is_empty() {
            writeln!(
                out,
                "| tg{:<4} | {tg_host_med:>8.1} ± {tg_host_sd:<4.1} | ({} sampler on the host, whole rows; above: on the device)",
                args.n_gen, args.sampler.name
            )?;
        }
    }
    write!(out, "load: {load_ms:.0} ms (file to weights on the device)")?;
    if let Some(ms) = first_token_ms {
        write!(
            out,
            "; first token of a {}-token prompt: {ms:.0} ms from the start",
            args.n_prompt
        )?;
    }
    writeln!(out)?;
    if args.n_gen > 0 && floor_tps > 0.0 {
        writeln!(
            out,
            "decode floor: {:.1} MiB of weights per token at {:.1} GB/s (copy kernel) = {floor_tps:.0} t/s; \
             tg{} reaches {:.0}% of it",
            per_token as f64 / (1 << 20) as f64,
            copy_bps / 1e9,
            args.n_gen,
            100.0 * tg_med / floor_tps
        )?;
    }
    if !batches.is_empty() {
        writeln!(
            out,
            "\nbatched decode ({} prompt tokens each, then -n {} steps of all sequences):",
            super::bench_batch::BATCH_PROMPT,
            args.n_gen
        )?;
        writeln!(out, "| batch | aggregate t/s    | t/s per sequence |")?;
        writeln!(out, "| ----- | ---------------- | ---------------- |")?;
        for b in &batches {
            let (med, sd) = stats(&b.samples);
            writeln!(
                out,
                "| {:>5} | {med:>9.1} ± {sd:<5.1} | {:>16.1} |",
                b.batch,
                med / b.batch as f64
            )?;
        }
    }
    for b in batches.iter().filter(|b| !b.profile.is_empty()) {
        let (med, _) = stats(&b.samples);
        writeln!(
            out,
            "\nGPU time of one batched decode step of {} sequences (the step takes {:.3} ms), by kernel:",
            b.batch,
            1e3 * b.batch as f64 / med.max(1e-9)
        )?;
        write_kernel_times(out, &b.profile)?;
    }
    for (shape, (dispatches, barriers), rows, in_order) in &profiles {
        writeln!(
            out,
            "\nGPU time of one forward pass of {shape} token(s) ({dispatches} dispatches, \
             {barriers} barriers), by kernel:"
        )?;
        write_kernel_times(out, rows)?;
        // Host kernels (CPU devices) record no dispatches.
        if !in_order.is_empty() {
            writeln!(out, "  its first {} dispatches in order:", in_order.len())?;
            for (k, us) in in_order {
                writeln!(out, "    {k:30} {us:9.2} us")?;
            }
        }
    }
    Ok(())
}

/// What runs where: each stage of a split (`#index name blocks a..b`), each
/// replica (`#index name replica`), or the one device.
fn device_summary(model: &combs::runtime::Model) -> Vec<String> {
    let dev = |w: &dyn combs::GenerativeModel| {
        let c = w.context();
        format!("#{} {}", c.index(), c.caps().name)
    };
    if let Some(stages) = model.weights().stages() {
        return stages
            .iter()
            .map(|st| {
                let r = st.layers();
                format!("{} blocks {}..{}", dev(st.as_ref()), r.start, r.end)
            })
            .collect();
    }
    let replicas = model.replicas();
    if replicas.len() > 1 {
        return replicas
            .iter()
            .map(|r| format!("{} replica", dev(r.as_ref())))
            .collect();
    }
    vec![dev(model.weights().as_ref())]
}

/// One line per kernel (GPU ms, share of the total), then the total.
fn write_kernel_times(out: &mut dyn Write, rows: &[(String, f64)]) -> std::io::Result<()> {
    let total: f64 = rows.iter().map(|(_, ms)| ms).sum();
    for (k, ms) in rows {
        writeln!(
            out,
            "  {k:30} {ms:9.3} ms  {:5.1}%",
            100.0 * ms / total.max(1e-12)
        )?;
    }
    writeln!(out, "  {:30} {total:9.3} ms", "total")
}

/// Per forward pass: tokens, (dispatches, barriers), GPU ms per kernel,
/// then its first dispatches in order with their µs.
type Profile = Vec<(
    usize,
    (usize, usize),
    Vec<(String, f64)>,
    Vec<(String, f64)>,
)>;

/// Dispatches of a pass listed in order by `--profile`: the embedding and
/// the first two blocks of the models here, which shows what each product
/// costs between its neighbours (a kernel's total mixes them).
const PROFILE_IN_ORDER: usize = 12;

/// GPU time per kernel of one forward pass of `n_prompt` tokens and of one decode token.
fn profile(
    ctx: &std::sync::Arc<combs::gpu::GpuContext>,
    model: &combs::runtime::Model,
    n_prompt: usize,
) -> Result<Profile, CliError> {
    let w = model.weights();
    let scratch = w.create_scratch(n_prompt, 1)?;
    // The whole prompt is one call: the cache's per-call buffers hold it.
    let cache = w.create_kv_cache(&CacheConfig {
        max_batch: n_prompt,
        ..CacheConfig::contiguous(n_prompt + 1)
    })?;
    let ids: Vec<i32> = tokens(n_prompt, model.spec().n_vocab)
        .iter()
        .map(|&t| t as i32)
        .collect();
    let pos: Vec<i32> = (0..n_prompt as i32).collect();
    scratch.ids().write_slice(0, &ids)?;
    scratch.positions().write_slice(0, &pos)?;
    let mut out = Vec::new();
    for n in [n_prompt, 1] {
        let mut rec = Recording::new(ctx, true)?;
        w.record_embed(&mut rec, &scratch, n)?;
        w.record_blocks(&mut rec, &scratch, cache.as_ref(), n)?;
        w.record_logits(&mut rec, &scratch, n - 1, 1, 0)?;
        rec.finish()?;
        rec.submit_and_wait()?;
        rec.submit_and_wait()?;
        let rows = rec
            .profile()?
            .into_iter()
            .map(|(k, ns)| (k, ns / 1e6))
            .collect();
        let stamps = rec.timestamps()?;
        let in_order = stamps
            .windows(2)
            .take(PROFILE_IN_ORDER)
            .map(|w| (w[1].0.clone(), (w[1].1 - w[0].1) / 1e3))
            .collect();
        out.push((n, (rec.n_dispatches(), rec.n_barriers()), rows, in_order));
    }
    Ok(out)
}
