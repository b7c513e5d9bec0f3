//! `combs synth`: writes a GGUF of a real model shape with random weights
//! (see `combs::models::synth`), for speed runs of combs and llama.cpp on the
//! same file.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::models::synth::{SynthConfig, exact_gguf, synth_gguf};
use combs::quant::QuantType;

use crate::CliError;

/// Arguments of `combs synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Shape: tiny, smollm2-135m, llama-1b or llama-8b; or `exact`, a tiny
    /// model whose logits every engine computes exactly (f16 or f32; --seed
    /// 0 is the base, another seed a variant close to it).
    #[arg(long)]
    preset: String,
    /// Weight type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k … q6_k.
    #[arg(long = "type", value_name = "QTYPE")]
    qtype: String,
    /// Output file.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: PathBuf,
    /// Random seed of the weights (of the `exact` preset: its variant).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs `combs synth`.
pub fn run(args: &SynthArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let t = QuantType::from_name(&args.qtype).ok_or_else(|| {
        ModelError::invalid("type", format!("unknown weight type `{}`", args.qtype))
    })?;
    let t0 = Instant::now();
    let w = if args.preset == "exact" {
        exact_gguf(t, args.seed)?
    } else {
        let mut cfg = SynthConfig::preset(&args.preset, t)?;
        cfg.seed = args.seed;
        synth_gguf(&cfg)?
    };
    w.write_file(&args.output)?;
    let bytes = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    writeln!(
        out,
        "wrote {} ({} {}, {:.1} MiB) in {:.1} s",
        args.output.display(),
        args.preset,
        t,
        bytes as f64 / (1 << 20) as f64,
        t0.elapsed().as_secs_f64()
    )?;
    Ok(())
}
