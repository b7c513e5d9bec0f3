//! `combs perplexity`: llama.cpp's perplexity method on a text file (chunks of
//! `--ctx` tokens, BOS first where the model adds one, second half of each
//! chunk scored). Prints running values per chunk and `PPL = ...` last.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::runtime::SessionOptions;
use combs::runtime::perplexity::perplexity;

use super::common::ModelArgs;
use crate::CliError;

/// Arguments of `combs perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks (0: all).
    #[arg(long = "chunks", default_value_t = 0)]
    chunks: usize,
}

/// Runs `combs perplexity`.
pub fn run(args: &PerplexityArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let text = std::fs::read(&args.file).map_err(|source| ModelError::Io {
        path: args.file.clone(),
        source,
    })?;
    let text = String::from_utf8_lossy(&text);
    let (_ctx, model) = args.model.load()?;
    let tok = model.tokenizer();
    let mut tokens = tok.encode(&text, true, false)?;
    if args.chunks > 0 {
        tokens.truncate(args.chunks * args.ctx);
    }
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let mut session = model.new_session(&SessionOptions {
        n_ctx: args.ctx,
        n_batch: args.ctx,
        n_logit_rows: args.ctx,
        ..Default::default()
    })?;
    writeln!(
        out,
        "{} tokens, {} chunks of {}",
        tokens.len(),
        tokens.len() / args.ctx.max(1),
        args.ctx
    )?;
    let t0 = Instant::now();
    let report = perplexity(&mut session, &tokens, args.ctx, bos, |i, ppl| {
        eprint!("[{}]{:.4},", i + 1, ppl);
    })?;
    eprintln!();
    writeln!(
        out,
        "{} chunks, {} tokens scored in {:.1} s",
        report.n_chunks,
        report.n_scored,
        t0.elapsed().as_secs_f64()
    )?;
    writeln!(out, "PPL = {:.4} +/- {:.5}", report.ppl, report.ppl_err)?;
    Ok(())
}
