//! `combs quantize IN OUT TYPE`: requantizes a GGUF file exactly as
//! `llama-quantize --allow-requantize IN OUT TYPE` does (see
//! `combs::quant::requantize`), printing one line per tensor and a summary in
//! the style of llama-quantize's log.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::formats::gguf::GgufFile;
use combs::quant::requantize::{FileType, RequantizeOptions, TensorDone, requantize_with_progress};
use combs::quant::types::ggml_type_name;

use crate::CliError;

/// Arguments of `combs quantize`.
#[derive(Args)]
pub struct QuantizeArgs {
    /// GGUF file to read.
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// GGUF file to write (replaced if it exists; may be IN itself).
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// Target as llama-quantize names it: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K
    /// Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K F16 BF16 F32
    /// (case-insensitive; Q3_K, Q4_K, Q5_K mean the _M mixes).
    #[arg(value_name = "TYPE", value_parser = parse_file_type)]
    ftype: FileType,
    /// Worker threads (default: one per core).
    #[arg(long, value_name = "N", default_value_t = 0)]
    threads: usize,
}

fn parse_file_type(s: &str) -> Result<FileType, String> {
    FileType::parse(s).map_err(|e| e.to_string())
}

const MIB: f64 = 1024.0 * 1024.0;

/// `[576, 192]` padded to four dimensions, as llama.cpp prints shapes.
fn shape(dims: &[u64]) -> String {
    let d: Vec<String> = (0..4)
        .map(|i| format!("{:6}", dims.get(i).copied().unwrap_or(1)))
        .collect();
    format!("[{}]", d.join(", "))
}

fn tensor_line(d: &TensorDone<'_>) -> String {
    let p = d.plan;
    let from = ggml_type_name(p.from).to_lowercase();
    let head = format!(
        "[{:4}/{:4}] {:<36} - {}, type = {from:>6}, ",
        d.position + 1,
        d.total,
        p.name,
        shape(&p.dims),
    );
    if p.converts() {
        let to = ggml_type_name(p.to).to_lowercase();
        let note = match p.fallback_from {
            Some(t) => format!(" (fallback from {})", t.name()),
            None => String::new(),
        };
        format!(
            "{head}converting to {to}{note} .. size = {:8.2} MiB -> {:8.2} MiB",
            d.old_bytes as f64 / MIB,
            d.new_bytes as f64 / MIB,
        )
    } else {
        format!("{head}size = {:8.3} MiB", d.old_bytes as f64 / MIB)
    }
}

/// Runs `combs quantize`, writing the log to `out`.
pub fn run(args: &QuantizeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let start = Instant::now();
    let file_err = |path: &PathBuf| {
        let path = path.clone();
        move |e: ModelError| CliError::in_file(&path, e)
    };
    let input = GgufFile::open(&args.input).map_err(file_err(&args.input))?;
    writeln!(
        out,
        "combs quantize: {} -> {} as {} (llama_ftype {})",
        args.input.display(),
        args.output.display(),
        args.ftype,
        args.ftype.id()
    )?;
    let opts = RequantizeOptions {
        threads: args.threads,
    };
    let (mut old_total, mut new_total, mut n_elements, mut n_fallback) = (0u64, 0u64, 0u64, 0);
    let mut io_result = Ok(());
    let writer = requantize_with_progress(&input, args.ftype, &opts, |d| {
        old_total += d.old_bytes;
        new_total += d.new_bytes;
        n_elements += d.plan.n_elements;
        n_fallback += usize::from(d.plan.fallback_from.is_some());
        if io_result.is_ok() {
            io_result = writeln!(out, "{}", tensor_line(d)).and_then(|()| out.flush());
        }
    })
    .map_err(file_err(&args.input))?;
    io_result?;
    let n_tensors = input.tensors().len();
    // Unmap the input before writing: OUT may be the same file.
    drop(input);
    writer.write_file(&args.output)?;

    let bpw = |bytes: u64| bytes as f64 * 8.0 / n_elements.max(1) as f64;
    writeln!(
        out,
        "model size  = {:8.2} MiB ({:.2} BPW)",
        old_total as f64 / MIB,
        bpw(old_total)
    )?;
    writeln!(
        out,
        "quant size  = {:8.2} MiB ({:.2} BPW)",
        new_total as f64 / MIB,
        bpw(new_total)
    )?;
    if n_fallback > 0 {
        writeln!(
            out,
            "warning: {n_fallback} of {n_tensors} tensor(s) required fallback quantization"
        )?;
    }
    writeln!(
        out,
        "quantize time = {:.2} s",
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}
