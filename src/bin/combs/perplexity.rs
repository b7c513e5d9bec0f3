//! `combs perplexity`: llama.cpp's perplexity method on a text file (chunks of
//! `--ctx` tokens, BOS first where the model adds one, second half of each
//! chunk scored). Prints running values per chunk and `PPL = ...` last.
//!
//! With `--kl-divergence-base FILE` it also writes the scored rows in the
//! base-file format of `llama-perplexity --kl-divergence-base`; with
//! `--kl-divergence` as well it reads such a file instead (written by
//! llama.cpp or by combs), evaluates the file's own tokens and prints the
//! statistics `llama-perplexity --kl-divergence` prints, with its labels.
//! `--reference` evaluates with the CPU f64 reference forward instead of
//! the device (the exact baseline of README's parity table).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::formats::gguf::GgufFile;
use combs::models::reference::ReferenceModel;
use combs::runtime::kld::KldStats;
use combs::runtime::kld_file::{KldHeader, KldReader, KldWriter, rows_per_chunk};
use combs::runtime::perplexity::{ChunkLogits, for_each_chunk, perplexity_chunks};
use combs::runtime::{Model, SessionOptions};

use super::common::ModelArgs;
use crate::CliError;

/// Arguments of `combs perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to score (not needed with --kl-divergence: the base file holds the tokens).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: Option<PathBuf>,
    /// Tokens per chunk (default 512; with --kl-divergence, the base file's).
    #[arg(short = 'c', long = "ctx")]
    ctx: Option<usize>,
    /// Score at most this many chunks (0: all).
    #[arg(long = "chunks", default_value_t = 0)]
    chunks: usize,
    /// Write the scored positions' log-probabilities to FILE in llama.cpp's
    /// base-file format (as `llama-perplexity --kl-divergence-base FILE`);
    /// with --kl-divergence, read them from FILE instead (given several
    /// times: compare with each, in one pass).
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    kl_divergence_base: Vec<PathBuf>,
    /// Compare with the base file of --kl-divergence-base: KL divergence,
    /// same top token, Δp and both perplexities, as `llama-perplexity
    /// --kl-divergence` prints them.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    kl_divergence: bool,
    /// With --kl-divergence: also write this run's own log-probabilities of
    /// the same tokens as a base file (to compare other runs with it later).
    #[arg(
        long = "kl-divergence-save",
        value_name = "FILE",
        requires = "kl_divergence"
    )]
    kl_divergence_save: Option<PathBuf>,
    /// Evaluate with the CPU reference forward pass (f64 sums over the
    /// dequantized weights, f32 K/V) instead of the device: slow, exact.
    #[arg(long)]
    reference: bool,
}

/// Runs `combs perplexity`.
pub fn run(args: &PerplexityArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (_ctx, model) = args.model.load()?;
    let tok = model.tokenizer();
    let bos = if tok.add_bos() { tok.bos() } else { None };
    if args.kl_divergence {
        if args.file.is_some() {
            eprintln!("note: --kl-divergence scores the base file's tokens; -f is not read");
        }
        return kl_divergence(args, &model, bos, out);
    }
    if args.kl_divergence_base.len() > 1 {
        return Err(ModelError::invalid(
            "kl-divergence-base",
            "one file is written; several are only read (with --kl-divergence)",
        )
        .into());
    }
    let Some(file) = &args.file else {
        return Err(ModelError::invalid("file", "a text file to score is needed (-f FILE)").into());
    };
    let text = std::fs::read(file).map_err(|source| ModelError::Io {
        path: file.clone(),
        source,
    })?;
    let text = String::from_utf8_lossy(&text);
    let n_ctx = args.ctx.unwrap_or(512);
    let mut tokens = tok.encode(&text, true, false)?;
    // as llama.cpp: at least two chunks of text, then --chunks picks the first ones
    if tokens.len() < 2 * n_ctx {
        return Err(ModelError::invalid(
            "file",
            format!(
                "{} tokenizes to {} tokens; perplexity needs at least 2 × n_ctx = {}",
                file.display(),
                tokens.len(),
                2 * n_ctx
            ),
        )
        .into());
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if args.chunks > 0 {
        n_chunk = n_chunk.min(args.chunks);
    }
    tokens.truncate(n_chunk * n_ctx);
    let mut src = source(args, &model, n_ctx)?;
    writeln!(out, "{} tokens, {n_chunk} chunks of {n_ctx}", tokens.len())?;
    let mut writer = match args.kl_divergence_base.first() {
        Some(path) => Some(KldWriter::create(
            path,
            KldHeader {
                n_ctx,
                n_vocab: src.n_vocab(),
                n_chunk,
                tokens: tokens.clone(),
            },
        )?),
        None => None,
    };
    let t0 = Instant::now();
    let report = perplexity_chunks(
        src.as_mut(),
        &tokens,
        n_ctx,
        n_chunk,
        bos,
        |i, ppl| eprint!("[{}]{:.4},", i + 1, ppl),
        |_, rows, _| match &mut writer {
            Some(w) => w.write_chunk(rows).map(|_| ()),
            None => Ok(()),
        },
    )?;
    eprintln!();
    writeln!(
        out,
        "{} chunks, {} tokens scored in {:.1} s",
        report.n_chunks,
        report.n_scored,
        t0.elapsed().as_secs_f64()
    )?;
    if let (Some(w), Some(path)) = (writer, args.kl_divergence_base.first()) {
        w.finish()?;
        writeln!(
            out,
            "KL-divergence base written to {} ({n_chunk} chunks of {n_ctx}, n_vocab {})",
            path.display(),
            src.n_vocab()
        )?;
    }
    writeln!(out, "PPL = {:.4} +/- {:.5}", report.ppl, report.ppl_err)?;
    Ok(())
}

/// What evaluates the chunks: a session on the device, or the CPU reference.
fn source(
    args: &PerplexityArgs,
    model: &Model,
    n_ctx: usize,
) -> Result<Box<dyn ChunkLogits>, CliError> {
    if args.reference {
        let path = model.path();
        let g = GgufFile::open(path).map_err(|source| CliError::File {
            path: path.to_path_buf(),
            source,
        })?;
        let r = ReferenceModel::load_with(&g, model.spec().clone(), args.model.numerics)?
            .with_n_ctx(n_ctx)
            .with_f32_kv();
        return Ok(Box::new(r));
    }
    Ok(Box::new(model.new_session(&SessionOptions {
        n_ctx,
        n_batch: n_ctx,
        n_logit_rows: n_ctx,
        ..Default::default()
    })?))
}

/// `--kl-divergence`: the base files' tokens through the model, compared
/// row by row with each file's log-probabilities.
fn kl_divergence(
    args: &PerplexityArgs,
    model: &Model,
    bos: Option<u32>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let n_vocab = model.spec().n_vocab;
    let mut bases = Vec::new();
    for path in &args.kl_divergence_base {
        let reader = KldReader::open(path).map_err(|source| CliError::File {
            path: path.clone(),
            source,
        })?;
        let h = reader.header();
        let mismatch = |reason: String| CliError::File {
            path: path.clone(),
            source: ModelError::invalid("kl-divergence-base", reason),
        };
        if h.n_vocab != n_vocab {
            return Err(mismatch(format!(
                "written for a vocabulary of {} tokens, the model has {n_vocab}",
                h.n_vocab
            )));
        }
        if let Some(c) = args.ctx.filter(|&c| c != h.n_ctx) {
            return Err(mismatch(format!(
                "computed with n_ctx {}, --ctx is {c} (leave --ctx out to use the file's)",
                h.n_ctx
            )));
        }
        if let Some(first) = bases.first().map(|(r, _): &(KldReader, _)| r.header()) {
            let n = first.tokens.len().min(h.tokens.len());
            if h.n_ctx != first.n_ctx || h.tokens[..n] != first.tokens[..n] {
                return Err(mismatch(format!(
                    "holds other chunks than {} (n_ctx {} vs {}, or other tokens)",
                    args.kl_divergence_base[0].display(),
                    h.n_ctx,
                    first.n_ctx
                )));
            }
        }
        bases.push((reader, (KldStats::new(), Vec::new())));
    }
    let h = bases[0].0.header().clone();
    let mut n_chunk = bases
        .iter()
        .map(|(r, _)| r.header().n_chunk)
        .min()
        .unwrap_or(0);
    if args.chunks > 0 {
        n_chunk = n_chunk.min(args.chunks);
    }
    let tokens = &h.tokens[..n_chunk * h.n_ctx];
    let mut save = match &args.kl_divergence_save {
        Some(path) => Some(KldWriter::create(
            path,
            KldHeader {
                n_ctx: h.n_ctx,
                n_vocab,
                n_chunk,
                tokens: tokens.to_vec(),
            },
        )?),
        None => None,
    };
    let mut src = source(args, model, h.n_ctx)?;
    eprintln!(
        "kl_divergence: computing over {n_chunk} chunks, n_ctx={}, against {}",
        h.n_ctx,
        args.kl_divergence_base
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // one base prints as llama.cpp does, streaming its chunk lines; several
    // print one block each at the end
    let single = bases.len() == 1;
    if single {
        writeln!(out)?;
        writeln!(out, "{}", KldStats::chunk_heading())?;
    }
    let mut rows = Vec::new();
    let t0 = Instant::now();
    let stdout_err = |source| ModelError::Io {
        path: PathBuf::from("<stdout>"),
        source,
    };
    for_each_chunk(
        src.as_mut(),
        tokens,
        h.n_ctx,
        n_chunk,
        bos,
        |c, logits, targets| {
            for (reader, (stats, lines)) in &mut bases {
                reader.read_chunk(&mut rows)?;
                stats.add_chunk(logits, &rows, targets);
                let line = stats.chunk_line(c + 1);
                if single {
                    writeln!(out, "{line}").map_err(stdout_err)?;
                    out.flush().map_err(stdout_err)?;
                } else {
                    eprintln!("{line}");
                    lines.push(line);
                }
            }
            if let Some(w) = &mut save {
                w.write_chunk(logits)?;
            }
            Ok(())
        },
    )?;
    eprintln!(
        "{n_chunk} chunks, {} positions compared in {:.1} s",
        n_chunk * rows_per_chunk(h.n_ctx),
        t0.elapsed().as_secs_f64()
    );
    if let (Some(w), Some(path)) = (save, &args.kl_divergence_save) {
        w.finish()?;
        eprintln!("this run's log-probabilities written to {}", path.display());
    }
    for ((_, (stats, lines)), path) in bases.iter().zip(&args.kl_divergence_base) {
        if !single {
            writeln!(out, "###### against {} ######", path.display())?;
            writeln!(out, "{}", KldStats::chunk_heading())?;
            for l in lines {
                writeln!(out, "{l}")?;
            }
        }
        writeln!(out)?;
        match stats.report() {
            Some(report) => write!(out, "{report}")?,
            None => writeln!(
                out,
                "{} positions: too few for the final statistics (llama.cpp prints them from 100 on)",
                stats.count()
            )?,
        }
        if !single {
            writeln!(out)?;
        }
    }
    Ok(())
}
