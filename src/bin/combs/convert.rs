//! `combs convert IN -o OUT [--type T]`: writes a whisper.cpp model file
//! (`ggml-*.bin`) from a CTranslate2 Whisper directory (faster-whisper's
//! format) or from another whisper.cpp file (requantizing it, as
//! whisper.cpp's `quantize` tool does), one line per tensor. GGUF files are
//! requantized by `combs quantize`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::formats::ctranslate2::{Ct2Directory, is_ct2_dir};
use combs::formats::whisper_bin::WhisperFile;
use combs::quant::QuantType;
use combs::quant::whisper_convert::{ConvertedTensor, WEIGHT_TYPES, from_ct2, requantize_bin};

use crate::CliError;

/// Arguments of `combs convert`.
#[derive(Args)]
pub struct ConvertArgs {
    /// A CTranslate2 Whisper model directory (model.bin, config.json,
    /// vocabulary.txt or tokenizer.json) or a whisper.cpp model file.
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// whisper.cpp model file to write (replaced if it exists; may be IN).
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// Weight type of the matrices: f32 f16 q8_0 q5_1 q5_0 q4_1 q4_0 (or
    /// q2_k..q6_k where rows are whole 256-blocks). Norms, biases and
    /// positional embeddings stay f32, the conv kernels f16, as whisper.cpp
    /// makes them.
    #[arg(long = "type", value_name = "TYPE", default_value = "f16", value_parser = parse_type)]
    weight_type: QuantType,
}

fn parse_type(s: &str) -> Result<QuantType, String> {
    QuantType::from_name(s)
        .filter(|t| WEIGHT_TYPES.contains(t))
        .ok_or_else(|| {
            let names: Vec<&str> = WEIGHT_TYPES.iter().map(|t| t.name()).collect();
            format!("unknown weight type `{s}` (one of {})", names.join(" "))
        })
}

const MIB: f64 = 1024.0 * 1024.0;

fn line(out: &mut dyn Write, i: usize, t: &ConvertedTensor) -> std::io::Result<()> {
    writeln!(
        out,
        "[{:4}] {:<44} {:>22} {:>6} -> {:<6} {:9.3} MiB",
        i + 1,
        t.name,
        format!("{:?}", t.ne),
        t.from,
        t.to.name(),
        t.bytes as f64 / MIB
    )
}

fn is_whisper_bin(path: &Path) -> bool {
    let mut head = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok()
        && WhisperFile::has_magic(&head)
}

/// Runs `combs convert`, writing the log to `out`.
pub fn run(args: &ConvertArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let start = Instant::now();
    let file_err = |path: &PathBuf| {
        let path = path.clone();
        move |e: ModelError| CliError::in_file(&path, e)
    };
    let mut n = 0usize;
    let mut io_result = Ok(());
    let mut progress = |t: &ConvertedTensor| {
        if io_result.is_ok() {
            io_result = line(out, n, t);
        }
        n += 1;
    };
    let (writer, what) = if is_ct2_dir(&args.input) {
        let dir = Ct2Directory::open(&args.input).map_err(file_err(&args.input))?;
        let w = from_ct2(&dir, args.weight_type, &mut progress).map_err(file_err(&args.input))?;
        (w, "CTranslate2 Whisper")
    } else if is_whisper_bin(&args.input) {
        let src = WhisperFile::open(&args.input).map_err(file_err(&args.input))?;
        let w =
            requantize_bin(&src, args.weight_type, &mut progress).map_err(file_err(&args.input))?;
        (w, "whisper.cpp")
    } else {
        return Err(CliError::File {
            path: args.input.clone(),
            source: ModelError::invalid(
                "IN",
                "neither a CTranslate2 model directory (with model.bin) nor a whisper.cpp \
                 model file (GGUF files: combs quantize)",
            ),
        });
    };
    io_result?;
    writer.write_file(&args.output)?;
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    writeln!(
        out,
        "combs convert: {} ({what}) -> {} as {}: {n} tensors, {:.2} MiB, {:.2} s",
        args.input.display(),
        args.output.display(),
        args.weight_type.name(),
        size as f64 / MIB,
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}
