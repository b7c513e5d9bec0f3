//! `combs kernel-bench`: GPU time of single kernels at the matrix shapes of a
//! model preset, for tuning the kernels' workgroup layouts on a device. Each
//! case records `-r` dispatches in one command buffer, with the barrier a
//! forward pass would put between them, over enough copies of the weight
//! that they do not fit the GPU's cache; timestamps around the run give
//! microseconds per dispatch, GB/s of weights (matvec) or TFLOP/s (matmul).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use combs::ModelError;
use combs::gpu::{Buffer, GpuContext, MemoryKind, Recording, Uploader, WaitMode};
use combs::models::synth::{SynthConfig, random_weight_bytes};
use combs::ops::attention::{
    AttentionCall, AttentionOptions, AttentionScratch, AttentionShape, AttentionVariant, KeySplit,
    MAX_KEY_SPLITS, NewKv, NewRows, key_splits, record_attention,
};
use combs::ops::kv_store::{CacheAddressing, KvStoreCall, LayerKv, record_kv_store};
use combs::ops::linear::matvec_q8::Q8Input;
use combs::ops::linear::{
    CoopInput, CoopTile, FoldedRope, Input, LinearCall, LinearVariant, MatvecShape, Output,
    SquareSums, matvec_q8, record_linear,
};
use combs::ops::quantize_q8_1::{Q8Rows, record_quantize_q8_1};
use combs::ops::rms_norm::{
    NormFlavor, NormOut, NormWeight, RmsNorm, RmsNormCall, record_rms_norm,
};
use combs::ops::rope::{Rope, RopeStyle};
use combs::ops::{AnyMat, Mat};
use combs::quant::{QuantType, QuantWeight};

use crate::CliError;

/// Arguments of `combs kernel-bench`.
#[derive(Args, Debug)]
pub struct KernelBenchArgs {
    /// Model shape whose matrices are timed: smollm2-135m, llama-1b, llama-8b.
    #[arg(long, default_value = "llama-1b")]
    preset: String,
    /// Weight types, comma-separated.
    #[arg(
        long = "type",
        value_name = "QTYPES",
        value_delimiter = ',',
        default_value = "q4_0"
    )]
    qtypes: Vec<String>,
    /// Matvec layouts TPRxNRxKS (invocations per row group, rows per group,
    /// column slices), comma-separated; `auto` is combs' own choice.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    shapes: Vec<String>,
    /// Token counts for the tiled linear kernels (0: none), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    tokens: Vec<usize>,
    /// Cooperative-matrix tiles WMxWNxWKxTMxTNxBK[s|n] for the token counts
    /// (`s`: the skinny kernel's independent subgroups; `n`: workgroup-scope
    /// matrices, `VK_NV_cooperative_matrix2`), comma-separated;
    /// `auto` is combs' own choice.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    coop_tiles: Vec<String>,
    /// Dispatches per timed run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 64)]
    reps: usize,
    /// Vulkan device index.
    #[arg(long, value_name = "N|cpu", value_parser = crate::common::parse_device)]
    device: Option<usize>,
    /// Also time the host's round trip of one submission, blocking and polling.
    #[arg(long)]
    sync: bool,
    /// Also time attention of the preset's heads: a prompt of this many
    /// tokens (prefill, causal), and one token after it (decode), with each
    /// variant; 0: none.
    #[arg(long, default_value_t = 0)]
    attention: usize,
    /// Key splits per head to also time the decode query with (the tiled
    /// kernel, each head's keys over this many workgroups; `auto`: combs'
    /// choice for the device), comma-separated; with --attention.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    splits: Vec<String>,
    /// Also time a decode step's matvecs as the model chains them (Q/K/V,
    /// output, gate/up, down for this many layers, each its own weight, a
    /// barrier between), against the same matvecs each chained with itself:
    /// the cost of switching kernels between dispatches; 0: none.
    #[arg(long, default_value_t = 0)]
    chain: usize,
    /// Give the cooperative-matrix tiles f16 activations, as batched decode
    /// and prompts on such GPUs do.
    #[arg(long)]
    x_f16: bool,
    /// With --x-f16: give the tiles the f32 activations' bits read as
    /// halves (some NaN or infinite) instead of the same values converted
    /// to f16, as the benchmark did before session 36.
    #[arg(long)]
    x_bits: bool,
    /// Also time the cooperative-matrix tiles with the outputs the model
    /// gives them: adding into the output (label suffix `a`, the output and
    /// down projections' residual) and, for even row counts, the gated
    /// activation written as f16 (`g`, gate/up), against the plain store.
    #[arg(long)]
    epilogues: bool,
    /// Also time each cooperative tile on f16 input right after the RMS
    /// norm that writes that input (as a prompt's Q/K/V and gate/up follow
    /// theirs), less the norm timed alone (label suffix `p`): what being
    /// second in a dependent pair costs the tile.
    #[arg(long)]
    after_norm: bool,
    /// Also time this many layers of a prompt chained as a prompt runs
    /// them (norm, Q/K/V, the K/V stores and causal attention, output adding
    /// into the residual, norm, gated gate/up, down adding), at the first
    /// --tokens count on f16 input, each layer its own weights, a timestamp
    /// after every dispatch:
    /// µs per product in the chain, to hold against the same tiles alone;
    /// once per --coop-tiles tile (every product on it; `auto`: combs'
    /// choice per product); 0: none.
    #[arg(long, default_value_t = 0)]
    prompt_chain: usize,
    /// Also time the skinny tiles with batched decode's RMS norm folded in:
    /// reading f32 activations normalized from sums of squares (label
    /// suffix `n`), and adding into the output while writing its sums of
    /// squares (`q`).
    #[arg(long)]
    fold_norm: bool,
    /// Also measure the device's copy bandwidth (a plain copy kernel over
    /// buffers of this many MiB; 0: none): the yardstick of the matvecs.
    #[arg(long, default_value_t = 0)]
    bandwidth: u64,
    /// Also time the integer decode path of Q4_0 / Q8_0 weights (what
    /// `--numerics llama.cpp` runs where the device has integer dot
    /// products): `q8 …` rows are quantize_q8_1 + the integer matvec per
    /// product (GB/s of weights over both), `q8mv …` the integer matvec
    /// alone, `q8x …` the integer matvec quantizing x in every workgroup
    /// (no quantizer dispatch), `q8quant` the quantizer alone; in each
    /// `--shapes` layout (staging flags ignored).
    #[arg(long)]
    q8: bool,
    /// Skip the matrices (with --sync: only the round trip).
    #[arg(long)]
    no_matrices: bool,
}

/// One matrix of a model: its name and `rows × cols`.
struct Matrix {
    name: &'static str,
    rows: usize,
    cols: usize,
}

/// The weights a decode step of `cfg` multiplies, as combs loads them (Q/K/V
/// stacked, gate/up interleaved).
fn matrices(cfg: &SynthConfig) -> Vec<Matrix> {
    let (e, q, kv, ff) = (
        cfg.n_embd,
        cfg.n_head * cfg.head_dim,
        cfg.n_head_kv * cfg.head_dim,
        cfg.n_ff,
    );
    vec![
        Matrix {
            name: "qkv",
            rows: q + 2 * kv,
            cols: e,
        },
        Matrix {
            name: "out",
            rows: e,
            cols: q,
        },
        Matrix {
            name: "gate_up",
            rows: 2 * ff,
            cols: e,
        },
        Matrix {
            name: "down",
            rows: e,
            cols: ff,
        },
        Matrix {
            name: "head",
            rows: cfg.n_vocab,
            cols: e,
        },
    ]
}

fn parse_shape(s: &str) -> Result<Option<MatvecShape>, CliError> {
    if s == "auto" {
        return Ok(None);
    }
    let bad = || {
        ModelError::invalid(
            "--shapes",
            format!("`{s}` is not TPRxNR[xKS[xUN[xWG]]][s][n]"),
        )
    };
    let (s, narrow) = match s.strip_suffix('n') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let (body, stage_x) = match s.strip_suffix('s') {
        Some(b) => (b, true),
        None => (s, false),
    };
    let v: Vec<u32> = body
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if !(2..=5).contains(&v.len()) {
        return Err(bad().into());
    }
    let mut m = MatvecShape::new(v[0], v[1]);
    m.ks = v.get(2).copied().unwrap_or(1);
    m.un = v.get(3).copied().unwrap_or(1);
    m.wg = v.get(4).copied().unwrap_or(m.wg);
    m.stage_x = stage_x;
    m.narrow = narrow;
    Ok(Some(m))
}

fn parse_tile(s: &str) -> Result<Option<CoopTile>, CliError> {
    if s == "auto" {
        return Ok(None);
    }
    let bad = || {
        ModelError::invalid(
            "--coop-tiles",
            format!("`{s}` is not WMxWNxWKxTMxTNxBK[s|n]"),
        )
    };
    // `s`: the skinny kernel; `n`: workgroup-scope matrices (matmul_cm2).
    let (dims, skinny, nv2) = if let Some(d) = s.strip_suffix('s') {
        (d, true, false)
    } else if let Some(d) = s.strip_suffix('n') {
        (d, false, true)
    } else {
        (s, false, false)
    };
    let v: Vec<u32> = dims
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    match v[..] {
        [wm, wn, wk, tm, tn, bk] => Ok(Some(CoopTile {
            wm,
            wn,
            wk,
            tm,
            tn,
            bk,
            skinny,
            nv2,
        })),
        _ => Err(bad().into()),
    }
}

/// A layout as `--shapes` spells it.
fn shape_label(s: &MatvecShape) -> String {
    format!(
        "{}x{}x{}x{}x{}{}{}",
        s.tpr,
        s.nr,
        s.ks,
        s.un,
        s.wg,
        if s.stage_x { "s" } else { "" },
        if s.narrow { "n" } else { "" }
    )
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

/// Copies of one weight, enough that together they exceed the GPU's cache.
fn weight_copies(
    ctx: &Arc<GpuContext>,
    t: QuantType,
    m: &Matrix,
) -> Result<Vec<QuantWeight>, CliError> {
    let mut up = Uploader::new(ctx)?;
    let one = combs::quant::device_bytes(t, m.rows * m.cols / t.block_size());
    // COMBS_BENCH_COPIES=1 leaves a weight that fits the cache resident
    // there: what the kernel would reach from L2.
    let n = match std::env::var("COMBS_BENCH_COPIES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(n) => n.clamp(1, 64),
        None => (256usize << 20).div_ceil(one.max(1)).clamp(2, 64),
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let bytes = random_weight_bytes(t, m.rows, m.cols, 7 + i as u64);
        out.push(QuantWeight::from_gguf_bytes(
            ctx, &mut up, m.name, t, m.rows, m.cols, &bytes,
        )?);
    }
    up.flush()?;
    Ok(out)
}

/// Microseconds per dispatch of `record` run `reps` times: the command
/// buffer is replayed for at least 250 ms first (pipelines, caches and the
/// GPU's clocks warm: after 20 ms, a fresh process on an H200 read its
/// first large rows 2–5× slower than later runs did), then the median of
/// five timed replays.
fn time(
    ctx: &Arc<GpuContext>,
    reps: usize,
    mut record: impl FnMut(&mut Recording, usize) -> combs::Result<()>,
) -> Result<f64, CliError> {
    let mut rec = Recording::timed(ctx)?;
    rec.timestamp("start");
    for i in 0..reps {
        record(&mut rec, i)?;
    }
    rec.timestamp("end");
    rec.finish()?;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(250) {
        rec.submit_and_wait()?;
    }
    let mut samples = Vec::new();
    for _ in 0..5 {
        rec.submit_and_wait()?;
        let t = rec.timestamps()?;
        samples.push(t.last().map_or(0.0, |(_, ns)| *ns));
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2] / 1e3 / reps.max(1) as f64)
}

/// Host round trip of a submission of one small dispatch, blocking and
/// polling for its fence: median wall microseconds per submit-and-wait.
fn sync_latency(ctx: &Arc<GpuContext>, out: &mut dyn Write) -> Result<(), CliError> {
    let t = QuantType::Q4_0;
    let m = Matrix {
        name: "sync",
        rows: 64,
        cols: 256,
    };
    let w = weight_copies(ctx, t, &m)?;
    let x = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&random_f32(m.cols, 5)), "x")?;
    let y = Buffer::new(ctx, (m.rows * 4) as u64, MemoryKind::Device, "y")?;
    let mut rec = Recording::timed(ctx)?;
    rec.timestamp("start");
    record_linear(&mut rec, &matvec(&w[0], &x, &y, None))?;
    rec.timestamp("end");
    rec.finish()?;
    for mode in [
        WaitMode::Block,
        WaitMode::Poll,
        WaitMode::Block,
        WaitMode::Poll,
    ] {
        let mut wall = Vec::new();
        let mut gpu = Vec::new();
        for _ in 0..300 {
            let t0 = Instant::now();
            rec.submit_and_wait_with(mode)?;
            wall.push(t0.elapsed().as_secs_f64() * 1e6);
            gpu.push(rec.timestamps()?.last().map_or(0.0, |(_, ns)| *ns) / 1e3);
        }
        wall.sort_by(f64::total_cmp);
        gpu.sort_by(f64::total_cmp);
        writeln!(
            out,
            "submit+wait ({mode:?}): wall {:.1} us median ({:.1} .. {:.1} p10..p90), GPU {:.1} us",
            wall[150], wall[30], wall[270], gpu[150]
        )?;
    }
    Ok(())
}

/// Attention of `cfg`'s heads over `n_ctx` cached positions: `n_ctx`
/// queries (a prompt) and one query at the end (decode), with each variant;
/// then the decode query with its keys split as each of `splits` says
/// (`None`: combs' choice).
fn attention_bench(
    ctx: &Arc<GpuContext>,
    cfg: &SynthConfig,
    n_ctx: usize,
    splits: &[Option<usize>],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let shape = AttentionShape {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
    };
    let width = shape.n_head_kv * shape.head_dim;
    let qw = shape.n_head * shape.head_dim;
    let kb = Buffer::new(ctx, (n_ctx * width * 2) as u64, MemoryKind::Device, "k")?;
    let vb = Buffer::new(ctx, (n_ctx * width * 2) as u64, MemoryKind::Device, "v")?;
    let src = combs::gpu::upload_new(
        ctx,
        bytemuck::cast_slice(&random_f32(n_ctx * width, 11)),
        "kv",
    )?;
    let q = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&random_f32(n_ctx * qw, 12)), "q")?;
    let o = Buffer::new(ctx, (n_ctx * qw * 4) as u64, MemoryKind::Device, "o")?;
    let host_i32 = |v: &[i32]| host_i32(ctx, v, "ints");
    let pos: Vec<i32> = (0..n_ctx as i32).collect();
    let all = host_i32(&pos)?;
    let last = host_i32(&[n_ctx as i32 - 1])?;
    // Every query sees every key: an encoder's attention.
    let full = host_i32(&vec![n_ctx as i32 - 1; n_ctx])?;
    let table = host_i32(&[0])?;
    let base = host_i32(&vec![0; n_ctx])?;
    let at = |positions| CacheAddressing {
        positions,
        page_table: &table,
        seq_base: &base,
        page_size: n_ctx,
        ring: 0,
    };
    combs::gpu::run_once(ctx, |rec| {
        let src = Mat::new(&src, n_ctx, width);
        for cache in [&kb, &vb] {
            let at = at(&all);
            record_kv_store(rec, &KvStoreCall { src, cache, at })?;
        }
        Ok(())
    })?;
    let opts = AttentionOptions {
        scale: 1.0 / (shape.head_dim as f32).sqrt(),
        softcap: 0.0,
        window: 0,
    };
    let coop = combs::ops::attention::coop_layout(ctx, shape.head_dim).is_some();
    for (n, positions, kind) in [
        (n_ctx, &all, "causal"),
        (n_ctx, &full, "full"),
        (1, &last, "causal"),
    ] {
        for variant in [
            AttentionVariant::Rows,
            AttentionVariant::Tiled,
            AttentionVariant::Blocks,
            AttentionVariant::Coop,
        ] {
            if variant == AttentionVariant::Coop && !coop {
                continue;
            }
            let us = time(ctx, 8, |rec, _| {
                let call = AttentionCall {
                    q: Mat::new(&q, n, qw),
                    out: AnyMat::F32(Mat::new(&o, n, qw)),
                    kv: LayerKv {
                        k: &kb,
                        v: &vb,
                        at: at(positions),
                    },
                    new: NewKv::Stored,
                    shape,
                    opts,
                    variant: Some(variant),
                    split: None,
                };
                record_attention(rec, &call)
            })?;
            writeln!(
                out,
                "attention {:?} heads {}/{} dim {}: {n} queries over {n_ctx} positions ({kind}): \
                 {us:.1} us ({:.2} TFLOP/s)",
                variant,
                shape.n_head,
                shape.n_head_kv,
                shape.head_dim,
                attention_flops(n, n_ctx, shape, kind == "causal") / us / 1e6
            )?;
        }
    }
    let scratch = AttentionScratch::new(ctx, shape.n_head * MAX_KEY_SPLITS, shape.head_dim)?;
    for &n in splits {
        let chosen = n.unwrap_or_else(|| key_splits(ctx, shape.n_head, shape.head_dim, None));
        let us = time(ctx, 8, |rec, _| {
            let call = AttentionCall {
                q: Mat::new(&q, 1, qw),
                out: AnyMat::F32(Mat::new(&o, 1, qw)),
                kv: LayerKv {
                    k: &kb,
                    v: &vb,
                    at: at(&last),
                },
                new: NewKv::Stored,
                shape,
                opts,
                variant: Some(AttentionVariant::Tiled),
                split: Some(KeySplit {
                    scratch: &scratch,
                    n: Some(chosen),
                    max_keys: None,
                    wg: None,
                }),
            };
            record_attention(rec, &call)
        })?;
        writeln!(
            out,
            "attention Tiled split {chosen}{} heads {}/{} dim {}: 1 query over {n_ctx} positions: {us:.1} us",
            if n.is_none() { " (auto)" } else { "" },
            shape.n_head,
            shape.n_head_kv,
            shape.head_dim
        )?;
    }
    Ok(())
}

/// Multiply-adds (×2) of the scores and the weighted values of `n` queries
/// over `n_ctx` keys, the last `n` of them when causal.
fn attention_flops(n: usize, n_ctx: usize, shape: AttentionShape, causal: bool) -> f64 {
    let pairs: f64 = if causal {
        (0..n).map(|i| (n_ctx - n + i + 1) as f64).sum()
    } else {
        (n * n_ctx) as f64
    };
    4.0 * pairs * (shape.n_head * shape.head_dim) as f64
}

/// A layer's matrices of `cfg` (the head left out) and `layers` random
/// copies of each, one per layer: `weights[matrix][layer]`.
fn layer_weights(
    ctx: &Arc<GpuContext>,
    cfg: &SynthConfig,
    layers: usize,
) -> Result<(Vec<Matrix>, Vec<Vec<QuantWeight>>), CliError> {
    let t = cfg.qtype;
    let mats: Vec<Matrix> = matrices(cfg)
        .into_iter()
        .filter(|m| m.name != "head")
        .collect();
    let mut up = Uploader::new(ctx)?;
    let mut weights: Vec<Vec<QuantWeight>> = Vec::new();
    for (i, m) in mats.iter().enumerate() {
        let mut v = Vec::new();
        for l in 0..layers {
            let bytes = random_weight_bytes(t, m.rows, m.cols, (100 * i + l) as u64);
            v.push(QuantWeight::from_gguf_bytes(
                ctx, &mut up, m.name, t, m.rows, m.cols, &bytes,
            )?);
        }
        weights.push(v);
    }
    up.flush()?;
    Ok((mats, weights))
}

/// `v` in a host-visible buffer (positions, page tables), as the workspace
/// holds such per-call integers.
fn host_i32(ctx: &Arc<GpuContext>, v: &[i32], name: &str) -> Result<Arc<Buffer>, CliError> {
    let b = Buffer::new(ctx, (4 * v.len().max(1)) as u64, MemoryKind::Upload, name)?;
    b.write_slice(0, v)?;
    Ok(b)
}

/// `v` rounded to f16, as a norm writes a tile's input.
fn to_halves(v: &[f32]) -> Vec<half::f16> {
    v.iter().map(|&x| half::f16::from_f32(x)).collect()
}

/// `layers` layers of a prompt of `n` tokens through `cfg`'s products and
/// attention, chained as the model chains them (one sequence at positions
/// 0..n, each layer storing its K/V into the same cache), timed dispatch by
/// dispatch over five replays after the warm-up of [`time`]; prints the
/// median µs of each dispatch of a layer.
fn prompt_chain_bench(
    ctx: &Arc<GpuContext>,
    cfg: &SynthConfig,
    n: usize,
    layers: usize,
    tile: Option<CoopTile>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let t = cfg.qtype;
    let (mats, weights) = layer_weights(ctx, cfg, layers)?;
    let (e, q_rows, ff) = (cfg.n_embd, mats[0].rows, cfg.n_ff);
    // The attention's output width and the rows the rope turns (q and k).
    let (n_q, n_kv) = (cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim);
    let halves = |len: usize, seed: u64| to_halves(&random_f32(len, seed));
    let x = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&random_f32(n * e, 11)), "x")?;
    let nw = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&random_f32(e, 12)), "norm")?;
    let xn = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&halves(n * e, 13)), "xn")?;
    let attn = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&halves(n * n_q, 14)), "attn")?;
    let hidden = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&halves(n * ff, 15)), "h")?;
    let q = Buffer::new(ctx, (n * q_rows * 4) as u64, MemoryKind::Device, "q")?;
    // One layer's K/V cache of the prompt, addressed as one sequence.
    let cache = |name| Buffer::new(ctx, (n * n_kv * 2) as u64, MemoryKind::Device, name);
    let (kc, vc) = (cache("k cache")?, cache("v cache")?);
    let host_i32 = |v: &[i32], name| host_i32(ctx, v, name);
    let page_table = host_i32(&[0], "page table")?;
    let seq_base = host_i32(&vec![0; n], "sequence bases")?;
    let shape = AttentionShape {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim: cfg.head_dim,
    };
    let y = Buffer::new(ctx, (n * e * 4) as u64, MemoryKind::Device, "y")?;
    // Positions as the workspace holds them (host-visible), the frequencies
    // of a 10000 base.
    let pos: Vec<i32> = (0..n as i32).collect();
    let positions = host_i32(&pos, "positions")?;
    let hd = cfg.head_dim;
    let freqs = combs::ops::rope::inv_freq(hd, 10000.0, &combs::ops::rope::RopeScaling::None);
    let inv_freq = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&freqs), "inv freq")?;
    let rope = Rope {
        style: RopeStyle::Normal,
        head_dim: hd,
        n_rot: hd,
        positions: &positions,
        inv_freq: &inv_freq,
        attn_factor: 1.0,
    };
    let (xm, xnm) = (Mat::new(&x, n, e), Mat::<half::f16>::new(&xn, n, e));
    let norm = RmsNormCall {
        x: xm,
        norm: RmsNorm {
            weight: Some(&nw),
            flavor: NormFlavor::Plain,
            eps: 1e-5,
        },
        out: NormOut::Store(AnyMat::F16(xnm)),
        head_dim: None,
    };
    let act = combs::ops::glu::Activation::Silu;
    let q_out = Mat::new(&q, n, q_rows);
    // `model`: the outputs a prompt gives each product (Q/K/V roped on its
    // query and key rows, output and down adding into the residual);
    // `plain`: every product storing (Q/K/V unrotated, output and down
    // into a scratch buffer), the gated gate/up as before.
    for model in [true, false] {
        // A stamp after every dispatch (and one before the first).
        let mut rec = Recording::new(ctx, true)?;
        let layer_weights = weights[0]
            .iter()
            .zip(&weights[1])
            .zip(&weights[2])
            .zip(&weights[3]);
        for (((wqkv, wout), wgu), wdown) in layer_weights {
            let product = |rec: &mut Recording, w: &QuantWeight, input, output| {
                let call = LinearCall::new(w, None, input, output)
                    .on(LinearVariant::Coop)
                    .with_tile(tile);
                record_linear(rec, &call)
            };
            let (qkv_out, residual) = if model {
                let folded = FoldedRope::adjacent(rope, n_q + n_kv)
                    .ok_or_else(|| ModelError::Internal("rope not foldable".into()))?;
                (
                    Output::Roped {
                        out: q_out,
                        rope: folded,
                    },
                    Output::Accumulate(xm),
                )
            } else {
                (Output::Store(q_out), Output::Store(Mat::new(&y, n, e)))
            };
            record_rms_norm(&mut rec, &norm)?;
            product(&mut rec, wqkv, Input::F16(xnm), qkv_out)?;
            // The K/V stores and the prompt's causal attention, writing the
            // output projection's f16 input.
            let all = Mat::new(&q, n, q_rows);
            let call = AttentionCall {
                q: all.cols_at(0, n_q),
                out: AnyMat::F16(Mat::new(&attn, n, n_q)),
                kv: LayerKv {
                    k: &kc,
                    v: &vc,
                    at: CacheAddressing {
                        positions: &positions,
                        page_table: &page_table,
                        seq_base: &seq_base,
                        page_size: n,
                        ring: 0,
                    },
                },
                new: NewKv::Store(NewRows {
                    k: all.cols_at(n_q, n_kv),
                    v: all.cols_at(n_q + n_kv, n_kv),
                }),
                shape,
                opts: AttentionOptions {
                    scale: 1.0 / (cfg.head_dim as f32).sqrt(),
                    softcap: 0.0,
                    window: 0,
                },
                variant: None,
                split: None,
            };
            record_attention(&mut rec, &call)?;
            product(
                &mut rec,
                wout,
                Input::F16(Mat::new(&attn, n, n_q)),
                residual,
            )?;
            record_rms_norm(&mut rec, &norm)?;
            let gated = Output::Gated {
                out: AnyMat::F16(Mat::new(&hidden, n, ff)),
                act,
            };
            product(&mut rec, wgu, Input::F16(xnm), gated)?;
            let h = Input::F16(Mat::new(&hidden, n, ff));
            product(&mut rec, wdown, h, residual)?;
        }
        rec.finish()?;
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(250) {
            rec.submit_and_wait()?;
        }
        // Each dispatch of a layer by its kernel's name, the products by
        // theirs, in the order recorded.
        let mut names: Vec<String> = Vec::new();
        let mut samples: Vec<Vec<f64>> = Vec::new();
        for _ in 0..5 {
            rec.submit_and_wait()?;
            let stamps = rec.timestamps()?;
            let per_layer = stamps.len().saturating_sub(1) / layers;
            if names.is_empty() {
                let mut products = ["qkv", "out", "gate_up", "down"].into_iter();
                names = stamps[1..=per_layer]
                    .iter()
                    .map(|(label, _)| match label.starts_with("matmul") {
                        true => products.next().unwrap_or("product").to_string(),
                        false => label.clone(),
                    })
                    .collect();
                samples = vec![Vec::new(); per_layer];
            }
            for (i, w) in stamps.windows(2).enumerate() {
                samples[i % per_layer.max(1)].push(w[1].1 - w[0].1);
            }
        }
        write!(
            out,
            "prompt chain {} {} n={n} ({layers} layers, {}, {}), median us:",
            cfg.arch,
            t.name(),
            if model { "model" } else { "plain" },
            tile.map_or("auto".to_string(), |c| format!(
                "{}x{}x{}x{}x{}x{}",
                c.wm, c.wn, c.wk, c.tm, c.tn, c.bk
            ))
        )?;
        for (name, v) in names.iter().zip(samples.iter_mut()) {
            v.sort_by(f64::total_cmp);
            let us = v.get(v.len() / 2).copied().unwrap_or(0.0) / 1e3;
            write!(out, " {name} {us:.1}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// The matvecs of `layers` layers of `cfg` chained as a decode step chains
/// them, and each matrix alone repeated as often: microseconds per layer.
fn chain_bench(
    ctx: &Arc<GpuContext>,
    cfg: &SynthConfig,
    layers: usize,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let t = cfg.qtype;
    let (mats, weights) = layer_weights(ctx, cfg, layers)?;
    let width = mats.iter().map(|m| m.rows.max(m.cols)).max().unwrap_or(1);
    let x = combs::gpu::upload_new(ctx, bytemuck::cast_slice(&random_f32(width, 9)), "x")?;
    let y = Buffer::new(ctx, (width * 4) as u64, MemoryKind::Device, "y")?;
    let mv = |rec: &mut Recording, w: &QuantWeight| record_linear(rec, &matvec(w, &x, &y, None));
    let n = mats.len();
    let chained = time(ctx, layers * n, |rec, i| mv(rec, &weights[i % n][i / n]))?;
    let mut alone = 0.0;
    for w in &weights {
        alone += time(ctx, layers, |rec, l| mv(rec, &w[l]))?;
    }
    writeln!(
        out,
        "chain {} {}: {layers} layers of {n} matvecs: {:.1} us per layer chained, {:.1} us as the sum of each chained with itself",
        cfg.arch,
        t.name(),
        chained * n as f64,
        alone
    )?;
    Ok(())
}

/// One row of the matrix table: µs per dispatch and GB/s or TFLOP/s.
fn print_row(
    out: &mut dyn Write,
    m: &Matrix,
    t: QuantType,
    label: &str,
    us: f64,
    rate: f64,
) -> Result<(), CliError> {
    writeln!(
        out,
        "{:8} {:6} {:>5}x{:<5} {label:>18} {us:9.2} {rate:9.1}",
        m.name,
        t.name(),
        m.rows,
        m.cols,
    )?;
    Ok(())
}

/// A one-token matvec of `w` from the start of `x` into `y` (layout `shape`
/// or the device's choice).
fn matvec<'a>(
    w: &'a QuantWeight,
    x: &'a Arc<Buffer>,
    y: &'a Arc<Buffer>,
    shape: Option<MatvecShape>,
) -> LinearCall<'a> {
    let input = Input::F32(Mat::new(x, 1, w.cols()));
    let output = Output::Store(Mat::new(y, 1, w.rows()));
    LinearCall::new(w, None, input, output)
        .on(LinearVariant::Matvec)
        .with_shape(shape)
}

/// The `--q8` rows of one matrix: quantize + integer matvec, the integer
/// matvec alone, the integer matvec quantizing x in every workgroup
/// (`q8x`), the quantizer alone.
#[allow(clippy::too_many_arguments)]
fn q8_rows(
    ctx: &Arc<GpuContext>,
    reps: usize,
    m: &Matrix,
    t: QuantType,
    copies: &[QuantWeight],
    x: &Arc<Buffer>,
    y: &Arc<Buffer>,
    shapes: &[Option<MatvecShape>],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if !matvec_q8::available(ctx) {
        writeln!(
            out,
            "{:8} q8: no integer dot products on this device",
            m.name
        )?;
        return Ok(());
    }
    let bytes = copies[0].device_bytes() as f64;
    let xq = Buffer::new(
        ctx,
        matvec_q8::scratch_bytes(1, m.cols),
        MemoryKind::Device,
        "x q8_1",
    )?;
    let x32 = Mat::new(x, 1, m.cols);
    let q8 = Q8Rows::new(&xq, 1, m.cols);
    combs::gpu::run_once(ctx, |rec| record_quantize_q8_1(rec, x32, None, q8))?;
    let us = time(ctx, reps, |rec, _| record_quantize_q8_1(rec, x32, None, q8))?;
    // bytes of x read and written
    let io = (4 * m.cols) as f64 + 4.0 * Q8Rows::row_words(m.cols) as f64;
    print_row(out, m, t, "q8quant", us, io / us / 1e3)?;
    for shape in shapes {
        let s = shape
            // `n`: Q4_K over 32-column units.
            .map(|s| MatvecShape {
                stage_x: false,
                ..s
            })
            .unwrap_or_else(|| matvec_q8::choose_shape(ctx, m.rows, m.cols));
        let call = |w| {
            let input = Input::F32(x32);
            let output = Output::Store(Mat::new(y, 1, m.rows));
            LinearCall::new(w, None, input, output).with_shape(Some(s))
        };
        let star = if shape.is_none() { "*" } else { "" };
        // Q4_K's q8_K blocks exist only inside the matvec: the q8x row alone.
        let separate = t != QuantType::Q4K;
        if separate {
            let us = time(ctx, reps, |rec, i| {
                matvec_q8::record_quantized(rec, &call(&copies[i % copies.len()]), &xq)
            })?;
            let label = format!("q8 {}{star}", shape_label(&s));
            print_row(out, m, t, &label, us, bytes / us / 1e3)?;
            let us = time(ctx, reps, |rec, i| {
                matvec_q8::record_matvec_q8(
                    rec,
                    &call(&copies[i % copies.len()]),
                    Q8Input::Quantized(q8),
                )
            })?;
            let label = format!("q8mv {}{star}", shape_label(&s));
            print_row(out, m, t, &label, us, bytes / us / 1e3)?;
        }
        let f32_input = Q8Input::F32 { x: x32, norm: None };
        match time(ctx, reps, |rec, i| {
            matvec_q8::record_matvec_q8(rec, &call(&copies[i % copies.len()]), f32_input)
        }) {
            Ok(us) => {
                let label = format!("q8x {}{star}", shape_label(&s));
                print_row(out, m, t, &label, us, bytes / us / 1e3)?;
            }
            // A row too long for the layout's shared memory.
            Err(e) => writeln!(out, "{:8} q8x {}: {e}", m.name, shape_label(&s))?,
        }
    }
    Ok(())
}

/// Runs `combs kernel-bench`.
pub fn run(args: &KernelBenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let ctx = GpuContext::new(args.device)?;
    if ctx.caps().timestamp_period_ns.is_none() {
        return Err(ModelError::MissingFeature {
            device: ctx.caps().name.clone(),
            feature: "timestamp queries".into(),
        }
        .into());
    }
    let shapes: Vec<Option<MatvecShape>> = args
        .shapes
        .iter()
        .map(|s| parse_shape(s))
        .collect::<Result<_, _>>()?;
    let tiles: Vec<Option<CoopTile>> = args
        .coop_tiles
        .iter()
        .map(|s| parse_tile(s))
        .collect::<Result<_, _>>()?;
    writeln!(
        out,
        "device: {} ({} bytes of shared memory per workgroup)",
        ctx.caps().name,
        ctx.caps().max_shared_memory
    )?;
    if args.sync {
        sync_latency(&ctx, out)?;
    }
    if args.bandwidth > 0 {
        let bps = combs::ops::bandwidth::copy_bandwidth(&ctx, args.bandwidth << 20)?;
        writeln!(
            out,
            "copy bandwidth ({} MiB buffers, read + write): {:.1} GB/s",
            args.bandwidth,
            bps / 1e9
        )?;
    }
    if args.attention > 0 {
        let cfg = SynthConfig::preset(&args.preset, QuantType::F16)?;
        let splits: Vec<Option<usize>> = args
            .splits
            .iter()
            .map(|s| match s.as_str() {
                "auto" => Ok(None),
                n => n.parse().map(Some).map_err(|_| {
                    ModelError::invalid("--splits", format!("`{n}` is neither a count nor auto"))
                }),
            })
            .collect::<Result<_, _>>()?;
        attention_bench(&ctx, &cfg, args.attention, &splits, out)?;
    }
    if args.chain > 0 {
        for qt in &args.qtypes {
            let t = QuantType::from_name(qt).ok_or_else(|| {
                ModelError::invalid("--type", format!("unknown weight type `{qt}`"))
            })?;
            chain_bench(
                &ctx,
                &SynthConfig::preset(&args.preset, t)?,
                args.chain,
                out,
            )?;
        }
    }
    if args.prompt_chain > 0 {
        let n = args.tokens.iter().copied().find(|&n| n > 0).unwrap_or(512);
        for qt in &args.qtypes {
            let t = QuantType::from_name(qt).ok_or_else(|| {
                ModelError::invalid("--type", format!("unknown weight type `{qt}`"))
            })?;
            let cfg = SynthConfig::preset(&args.preset, t)?;
            for tile in &tiles {
                if let Some(c) = tile.filter(|c| !c.fits(&ctx)) {
                    writeln!(out, "prompt chain {c:?}: beyond this device's limits")?;
                    continue;
                }
                prompt_chain_bench(&ctx, &cfg, n, args.prompt_chain, *tile, out)?;
            }
        }
    }
    if args.no_matrices {
        return Ok(());
    }
    writeln!(
        out,
        "{:8} {:6} {:>11} {:>18} {:>9} {:>9}",
        "matrix", "type", "rows x cols", "kernel", "us", "GB/s|TF/s"
    )?;
    for qt in &args.qtypes {
        let t = QuantType::from_name(qt)
            .ok_or_else(|| ModelError::invalid("--type", format!("unknown weight type `{qt}`")))?;
        let cfg = SynthConfig::preset(&args.preset, t)?;
        for m in matrices(&cfg) {
            let copies = weight_copies(&ctx, t, &m)?;
            let bytes = copies[0].device_bytes() as f64;
            let n_max = args.tokens.iter().copied().max().unwrap_or(0).max(1);
            let xv = random_f32(m.cols * n_max, 3);
            let x = combs::gpu::upload_new(&ctx, bytemuck::cast_slice(&xv), "x")?;
            // The same values as f16, what the tiles read from a norm.
            let halves = to_halves(&xv);
            let xh = combs::gpu::upload_new(&ctx, bytemuck::cast_slice(&halves), "x f16")?;
            let y = Buffer::new(&ctx, (m.rows * n_max * 4) as u64, MemoryKind::Device, "y")?;
            // Sums of squares of x (positive) and the norm's weight for --fold-norm.
            let groups = m.cols.div_ceil(16).max(m.rows.div_ceil(16));
            let sq: Vec<f32> = random_f32(groups * n_max, 5)
                .iter()
                .map(|v| v * v + 1.0)
                .collect();
            let sq = combs::gpu::upload_new(&ctx, bytemuck::cast_slice(&sq), "sums of squares")?;
            let nw = combs::gpu::upload_new(
                &ctx,
                bytemuck::cast_slice(&random_f32(m.cols, 7)),
                "norm weight",
            )?;
            for shape in &shapes {
                let us = time(&ctx, args.reps, |rec, i| {
                    record_linear(rec, &matvec(&copies[i % copies.len()], &x, &y, *shape))
                })?;
                let s = shape.unwrap_or_else(|| MatvecShape::choose(&ctx, t, m.rows, m.cols));
                let label = format!(
                    "mv {}{}",
                    shape_label(&s),
                    if shape.is_none() { "*" } else { "" }
                );
                print_row(out, &m, t, &label, us, bytes / us / 1e3)?;
            }
            if args.q8 && matvec_q8::supports(t) {
                q8_rows(&ctx, args.reps, &m, t, &copies, &x, &y, &shapes, out)?;
            }
            // Prompts need the head for their last token only.
            for &n in args
                .tokens
                .iter()
                .filter(|&&n| n > 0 && (n <= 64 || m.name != "head"))
            {
                let x32 = Mat::new(&x, n, m.cols);
                let y32 = Mat::new(&y, n, m.rows);
                let variant = LinearVariant::choose(&ctx, n, AnyMat::F32(x32));
                let tiles: &[Option<CoopTile>] = if variant == LinearVariant::Coop {
                    &tiles
                } else {
                    &[None]
                };
                for tile in tiles {
                    if let Some(c) = tile.filter(|c| !c.fits(&ctx)) {
                        writeln!(out, "{:8} {c:?}: beyond this device's limits", m.name)?;
                        continue;
                    }
                    let c = tile.unwrap_or_else(|| {
                        CoopTile::choose(&ctx, m.rows, m.cols, n).for_weights(
                            ctx.caps(),
                            t,
                            m.rows,
                            m.cols,
                        )
                    });
                    // f16 inputs: x's values in f16 (or, with --x-bits,
                    // x's bits read as halves: the same times within 2% on
                    // an H100, docs/perf-notes.md "Session 36").
                    let half = args.x_f16 && variant == LinearVariant::Coop;
                    let input = if half {
                        Input::F16(Mat::new(if args.x_bits { &x } else { &xh }, n, m.cols))
                    } else {
                        Input::F32(x32)
                    };
                    let us = time(&ctx, args.reps.min(16), |rec, i| {
                        let w = &copies[i % copies.len()];
                        let call = LinearCall::new(w, None, input, Output::Store(y32))
                            .on(variant)
                            .with_tile(*tile);
                        record_linear(rec, &call)
                    })?;
                    let flop = 2.0 * (m.rows * m.cols * n) as f64;
                    if args.fold_norm && variant == LinearVariant::Coop && c.skinny {
                        for (suffix, accumulate) in [("n", false), ("q", true)] {
                            let squares = SquareSums {
                                buf: &sq,
                                offset: 0,
                                groups: if accumulate {
                                    m.rows.div_ceil(16)
                                } else {
                                    m.cols.div_ceil(16)
                                },
                            };
                            let (input, output) = if accumulate {
                                (input, Output::AccumulateSquares { out: y32, squares })
                            } else {
                                // the norm reads the f32 residual
                                let norm = NormWeight {
                                    weight: &nw,
                                    flavor: NormFlavor::Plain,
                                    eps: 1e-5,
                                };
                                let x = x32;
                                let input = Input::NormedBySquares { x, norm, squares };
                                (input, Output::Store(y32))
                            };
                            // `auto`: the choice for this input
                            let c = tile.unwrap_or_else(|| {
                                CoopTile::choose_for(
                                    &ctx,
                                    m.rows,
                                    m.cols,
                                    n,
                                    if accumulate && half {
                                        CoopInput::F16
                                    } else if accumulate {
                                        CoopInput::F32
                                    } else {
                                        CoopInput::NormedBySquares
                                    },
                                    accumulate,
                                )
                            });
                            let us = time(&ctx, args.reps.min(16), |rec, i| {
                                let w = &copies[i % copies.len()];
                                let call = LinearCall::new(w, None, input, output)
                                    .on(LinearVariant::Coop)
                                    .with_tile(Some(c));
                                record_linear(rec, &call)
                            })?;
                            let label = format!(
                                "co{}x1x{}x{}x{}x{}s{suffix} n={n}",
                                c.wm, c.wk, c.tm, c.tn, c.bk
                            );
                            print_row(out, &m, t, &label, us, flop / us / 1e6)?;
                        }
                    }
                    let label = match (variant, tile) {
                        (LinearVariant::Coop, _) => format!(
                            "co{}x{}x{}x{}x{}x{}{}{}{} n={n}",
                            c.wm,
                            c.wn,
                            c.wk,
                            c.tm,
                            c.tn,
                            c.bk,
                            if c.skinny {
                                "s"
                            } else if c.nv2 {
                                "n"
                            } else {
                                ""
                            },
                            if half { "h" } else { "" },
                            if tile.is_none() { "*" } else { "" }
                        ),
                        _ => format!("{variant:?} n={n}"),
                    };
                    print_row(out, &m, t, &label, us, flop / us / 1e6)?;
                    if args.after_norm && half && !args.x_bits {
                        let call = RmsNormCall {
                            x: x32,
                            norm: RmsNorm {
                                weight: Some(&nw),
                                flavor: NormFlavor::Plain,
                                eps: 1e-5,
                            },
                            out: NormOut::Store(AnyMat::F16(Mat::new(&xh, n, m.cols))),
                            head_dim: None,
                        };
                        let norm = time(&ctx, args.reps.min(16), |rec, _| {
                            record_rms_norm(rec, &call)
                        })?;
                        let both = time(&ctx, args.reps.min(16), |rec, i| {
                            record_rms_norm(rec, &call)?;
                            let w = &copies[i % copies.len()];
                            let call = LinearCall::new(w, None, input, Output::Store(y32))
                                .on(variant)
                                .with_tile(Some(c));
                            record_linear(rec, &call)
                        })?;
                        let us = both - norm;
                        writeln!(
                            out,
                            "{:8} norm alone {norm:.2} us, with the tile {both:.2}",
                            m.name
                        )?;
                        print_row(out, &m, t, &format!("{label}p"), us, flop / us / 1e6)?;
                    }
                    if args.epilogues && variant == LinearVariant::Coop {
                        let mut kinds = vec![("a", Output::Accumulate(y32))];
                        if half && m.rows % 2 == 0 {
                            let act = combs::ops::glu::Activation::Silu;
                            let out = AnyMat::F16(Mat::new(&y, n, m.rows / 2));
                            kinds.push(("g", Output::Gated { out, act }));
                        }
                        for (suffix, output) in kinds {
                            let us = time(&ctx, args.reps.min(16), |rec, i| {
                                let w = &copies[i % copies.len()];
                                let call = LinearCall::new(w, None, input, output)
                                    .on(variant)
                                    .with_tile(Some(c));
                                record_linear(rec, &call)
                            })?;
                            let label = format!("{label}{suffix}");
                            print_row(out, &m, t, &label, us, flop / us / 1e6)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
