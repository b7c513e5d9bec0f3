//! `combs run`: generate text from a prompt, streaming tokens as they come,
//! then report prefill and decode speed on stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};
use combs::error::ModelError;
use combs::kv::CacheKind;
use combs::runtime::{EncodedImage, Model, VisionModel};
use combs::runtime::{Sampler, SamplerOptions, SessionOptions, generate};
use combs::tokenizer::{ChatMessage, IMAGE_MARKER};

use super::common::ModelArgs;
use crate::CliError;

/// KV cache implementation on the command line.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvArg {
    /// One contiguous block per layer.
    Contiguous,
    /// Pages from a pool through a page table.
    Paged,
}

/// Arguments of `combs run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt", default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    temp: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 40)]
    top_k: i32,
    /// Nucleus sampling threshold (1: off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens below min-p × the most likely one's probability (0: off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    min_p: f32,
    /// Repetition penalty (1: off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    repeat_last_n: i32,
    /// Random seed (default: from the clock, printed on stderr).
    #[arg(long)]
    seed: Option<u64>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Context size (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    ctx_size: usize,
    /// KV cache implementation.
    #[arg(long = "kv", value_enum, default_value_t = KvArg::Contiguous)]
    kv: KvArg,
    /// Vision projector (llama.cpp's `mmproj-*.gguf` of a SmolVLM model).
    #[arg(long = "mmproj", value_name = "FILE")]
    mmproj: Option<PathBuf>,
    /// An image (PNG, JPEG, WebP, GIF, BMP, TIFF or PNM) for the prompt; repeat for several. Each
    /// `<image>` in the prompt stands for the next one; without any, the
    /// images go before the prompt text.
    #[arg(long = "image", value_name = "FILE")]
    images: Vec<PathBuf>,
    /// Also encode each image's first submission of tiles with GPU
    /// timestamps and print each kind of step's device time.
    #[arg(long)]
    profile: bool,
}

/// Runs `combs run`.
pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if !args.images.is_empty() && args.mmproj.is_none() {
        return Err(CliError::Model(ModelError::invalid(
            "--image",
            "an image needs a vision projector: pass --mmproj FILE",
        )));
    }
    let (ctx, model) = args.model.load()?;
    let vision = args
        .mmproj
        .as_ref()
        .map(|path| load_vision(&model, path, &args.model.load_options()))
        .transpose()?;
    let images = match &vision {
        Some(v) => encode_images(v, &args.images, args.profile)?,
        None => Vec::new(),
    };
    let tok = model.tokenizer();
    let mut user = args.prompt.clone();
    if !images.is_empty() && !user.contains(IMAGE_MARKER) {
        user = IMAGE_MARKER.repeat(images.len()) + &user;
    }
    let text = if args.chat {
        tok.apply_chat_template(&[ChatMessage::new("user", &user)], true)?
    } else {
        user
    };
    let prompt = match &vision {
        Some(v) => v.tokenize(&text, &images, true)?,
        None => tok.encode(&text, true, args.chat)?,
    };
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let mut sampler = Sampler::new(SamplerOptions {
        temperature: args.temp,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        repeat_last_n: args.repeat_last_n,
        seed,
    })?;
    let n_ctx_train = model.spec().n_ctx_train;
    let n_ctx = match args.ctx_size {
        0 => n_ctx_train,
        n => n,
    };
    let mut session = model.new_session(&SessionOptions {
        n_ctx,
        kv_kind: match args.kv {
            KvArg::Contiguous => CacheKind::Contiguous,
            KvArg::Paged => CacheKind::Paged,
        },
        ..Default::default()
    })?;
    for &t in &prompt {
        sampler.accept(t);
    }
    if !args.chat {
        write!(out, "{}", args.prompt)?;
        out.flush()?;
    }
    let t0 = Instant::now();
    match &vision {
        Some(v) => v.prefill(&mut session, &prompt, &images)?,
        None => session.prefill(&prompt)?,
    }
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut io_err = None;
    let stats = generate(
        &mut session,
        tok,
        &mut sampler,
        args.n_predict,
        |_, piece| match write!(out, "{piece}").and_then(|()| out.flush()) {
            Ok(()) => true,
            Err(e) => {
                io_err = Some(e);
                false
            }
        },
    )?;
    if let Some(e) = io_err {
        return Err(e.into());
    }
    writeln!(out)?;
    out.flush()?;
    eprintln!(
        "\nseed {seed}; prompt {} tokens in {:.1} ms ({:.1} tok/s); generated {} tokens in {:.1} ms ({:.1} tok/s); stop: {:?}",
        prompt.len(),
        prefill_s * 1e3,
        prompt.len() as f64 / prefill_s.max(1e-9),
        stats.n_tokens,
        stats.elapsed.as_secs_f64() * 1e3,
        stats.tokens_per_second(),
        stats.stop
    );
    if ctx.memory_budget() != 0 {
        let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
        eprintln!(
            "memory: {:.1} MiB in use, {:.1} MiB peak, budget {:.1} MiB",
            mib(ctx.memory_in_use()),
            mib(ctx.memory_peak()),
            mib(ctx.memory_budget())
        );
    }
    Ok(())
}

/// Loads the projector at `path` beside `model`.
fn load_vision(
    model: &Model,
    path: &Path,
    opts: &combs::models::LoadOptions,
) -> Result<VisionModel, CliError> {
    model
        .load_vision(path, opts)
        .map_err(|e| CliError::in_file(path, e))
}

/// Decodes and encodes each image, printing its tiles and times.
fn encode_images(
    vision: &VisionModel,
    paths: &[PathBuf],
    profile: bool,
) -> Result<Vec<EncodedImage>, CliError> {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    paths
        .iter()
        .map(|path| {
            let t = Instant::now();
            let file_err = |e: ModelError| CliError::in_file(path, e);
            let rgb = combs::vision::load_image(path).map_err(file_err)?;
            let decode = t.elapsed();
            let image = vision.encode(&rgb).map_err(file_err)?;
            let grid = if image.rows == 0 {
                "global view only".to_string()
            } else {
                format!("{}x{} + global", image.rows, image.cols)
            };
            eprintln!(
                "image: {} tiles ({grid}), decode {:.1} ms, preprocess {:.1} ms, encode {:.1} ms ({:.2} ms/tile), {} embeddings",
                image.n_tiles(),
                ms(decode),
                ms(image.preprocess_time),
                ms(image.encode_time),
                ms(image.encode_time) / image.n_tiles().max(1) as f64,
                image.n_embeddings()
            );
            if profile {
                let (times, k) = vision.profile_encode(&rgb).map_err(file_err)?;
                print_profile(&times, k);
            }
            Ok(image)
        })
        .collect()
}

/// Prints an encoder profile: each kind of step's device time, largest first.
fn print_profile(times: &[(String, f64)], tiles: usize) {
    let total: f64 = times.iter().map(|(_, ns)| ns).sum();
    eprintln!(
        "encoder profile ({tiles} tiles in one submission): device {:.3} ms ({:.3} ms/tile)",
        total / 1e6,
        total / 1e6 / tiles.max(1) as f64
    );
    for (label, ns) in times {
        eprintln!(
            "  {:>9.3} ms {:>5.1}%  {label}",
            ns / 1e6,
            100.0 * ns / total.max(1.0)
        );
    }
}
