//! `combs`, the command-line front end: one clap subcommand per job (see
//! DESIGN.md, "The command line"). Each subcommand lives in its own module
//! under `src/bin/combs/`; this file only parses arguments, dispatches, and
//! turns errors into `error: <message>` on stderr and exit code 1.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use combs::ModelError;

#[path = "combs/bench.rs"]
mod bench;
#[path = "combs/bench_batch.rs"]
mod bench_batch;
#[path = "combs/common.rs"]
mod common;
#[path = "combs/convert.rs"]
mod convert;
#[path = "combs/info.rs"]
mod info;
#[path = "combs/kernel_bench.rs"]
mod kernel_bench;
#[path = "combs/perplexity.rs"]
mod perplexity;
#[path = "combs/quantize.rs"]
mod quantize;
#[path = "combs/run.rs"]
mod run;
#[path = "combs/synth.rs"]
mod synth;
#[path = "combs/transcribe.rs"]
mod transcribe;

/// LLM inference on Vulkan compute.
#[derive(Parser)]
#[command(name = "combs", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The subcommands; each variant's arguments are defined beside its code.
#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams tokens, reports tokens/s).
    Run(run::RunArgs),
    /// Describe a GGUF model (metadata, tensors) or list the Vulkan devices.
    Info(info::InfoArgs),
    /// Perplexity of a model on a text file (llama.cpp's method).
    Perplexity(perplexity::PerplexityArgs),
    /// Prefill and decode speed (llama-bench style).
    Bench(bench::BenchArgs),
    /// Write a GGUF of a real model shape with random weights.
    Synth(synth::SynthArgs),
    /// Requantize a GGUF file to another type, as llama-quantize does.
    Quantize(quantize::QuantizeArgs),
    /// Write a whisper.cpp model file from a CTranslate2 Whisper directory or another whisper.cpp file.
    Convert(convert::ConvertArgs),
    /// GPU time of single kernels at a model's matrix shapes (tuning).
    KernelBench(kernel_bench::KernelBenchArgs),
    /// Speech to text with a whisper.cpp model (segments, srt/vtt/json/txt).
    Transcribe(transcribe::TranscribeArgs),
}

/// Why a subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// An error from the library that names its own context.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An error about a file the user named.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong with it.
        source: ModelError,
    },
    /// Writing to stdout failed.
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    /// An error while reading the file at `path`: I/O errors already name
    /// the file, any other gets its path in front.
    pub fn in_file(path: &std::path::Path, e: ModelError) -> Self {
        match e {
            ModelError::Io { .. } => CliError::Model(e),
            source => CliError::File {
                path: path.to_path_buf(),
                source,
            },
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = match &cli.command {
        Command::Run(args) => run::run(args, &mut out),
        Command::Info(args) => info::run(args, &mut out),
        Command::Perplexity(args) => perplexity::run(args, &mut out),
        Command::Bench(args) => bench::run(args, &mut out),
        Command::Synth(args) => synth::run(args, &mut out),
        Command::Quantize(args) => quantize::run(args, &mut out),
        Command::Convert(args) => convert::run(args, &mut out),
        Command::KernelBench(args) => kernel_bench::run(args, &mut out),
        Command::Transcribe(args) => transcribe::run(args, &mut out),
    };
    let result = result.and_then(|()| out.flush().map_err(CliError::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`combs info -m x | head`): not an error worth a message.
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            // Ignore a failure to write the message itself: there is nowhere else to report it.
            let _ = writeln!(std::io::stderr(), "error: {e}");
            ExitCode::FAILURE
        }
    }
}
