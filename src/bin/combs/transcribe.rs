//! `combs transcribe`: speech to text with a whisper.cpp model file. Prints
//! each segment as it becomes final (`[MM:SS.mmm --> MM:SS.mmm] text`, as
//! openai-whisper's verbose mode), writes srt / vtt / json / txt with `-o`,
//! and reports the timings and the real-time factor on stderr.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use combs::ModelError;
use combs::gpu::GpuContext;
use combs::models::LoadOptions;
use combs::runtime::transcribe::options::temperature_schedule;
use combs::runtime::transcribe::writers::{self, Format, format_timestamp};
use combs::runtime::transcribe::{Segment, SegmentSink, Task, TranscribeOptions, transcribe};

use super::common::{KernelsArg, parse_device};
use crate::CliError;

/// Arguments of `combs transcribe`.
#[derive(Args, Debug)]
pub struct TranscribeArgs {
    /// whisper.cpp model file (`ggml-*.bin`, or written by `combs convert`).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model: PathBuf,
    /// Audio file: WAV, FLAC, MP3, M4A/MP4 (AAC, ALAC), Ogg (Vorbis, Opus),
    /// WebM/Matroska, AIFF, CAF.
    #[arg(value_name = "AUDIO")]
    audio: PathBuf,
    /// Spoken language by code or name; `auto`: detected (multilingual models).
    #[arg(short = 'l', long, default_value = "auto")]
    language: String,
    /// Translate to English instead of transcribing.
    #[arg(long)]
    translate: bool,
    /// Beams of beam search (1: greedy).
    #[arg(long = "beam", default_value_t = 5)]
    beam: usize,
    /// Samples per window when falling back to a temperature above 0.
    #[arg(long = "best-of", default_value_t = 5)]
    best_of: usize,
    /// First decoding temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Temperature step on fallback up to 1.0 (0: no fallback).
    #[arg(long = "temperature-increment", default_value_t = 0.2)]
    temperature_increment: f32,
    /// No timestamp tokens: one segment per 30-s window.
    #[arg(long = "no-timestamps")]
    no_timestamps: bool,
    /// Do not feed the previous text to the next window.
    #[arg(long = "no-condition")]
    no_condition: bool,
    /// Text before the first window (names, spelling, style).
    #[arg(long = "prompt", value_name = "TEXT")]
    prompt: Option<String>,
    /// Seed of the draws at temperatures above 0.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the transcript to this file; its extension picks the format
    /// (`.srt`, `.vtt`, `.json`, `.txt`).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Vulkan device index, or `cpu` for the native kernels on the CPU.
    #[arg(long, value_name = "N|cpu", value_parser = parse_device)]
    device: Option<usize>,
    /// Kernels: `auto`, `vulkan` or `host`.
    #[arg(long, value_enum, default_value = "auto")]
    kernels: KernelsArg,
    /// After transcribing, encode the first window once more with device
    /// timestamps and print the time of each kind of step.
    #[arg(long)]
    profile: bool,
}

/// Prints segments as they come and drives the progress bar.
struct Printer<'o> {
    out: &'o mut dyn Write,
    bar: Option<indicatif::ProgressBar>,
    error: Option<std::io::Error>,
}

impl SegmentSink for Printer<'_> {
    fn segment(&mut self, s: &Segment) -> bool {
        let line = format!(
            "[{} --> {}] {}",
            format_timestamp(s.t0, false, '.'),
            format_timestamp(s.t1, false, '.'),
            s.text.trim()
        );
        let r = match &self.bar {
            Some(bar) => {
                bar.suspend(|| writeln!(self.out, "{line}").and_then(|()| self.out.flush()))
            }
            None => writeln!(self.out, "{line}").and_then(|()| self.out.flush()),
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                self.error = Some(e);
                false
            }
        }
    }

    fn language(&mut self, code: &str, prob: Option<f32>) {
        if let Some(p) = prob {
            eprintln!("detected language: {code} (p = {p:.2})");
        }
    }

    fn progress(&mut self, done: f64, total: f64) {
        if let Some(bar) = &self.bar {
            bar.set_length((total * 1000.0) as u64);
            bar.set_position((done * 1000.0) as u64);
        }
    }
}

impl TranscribeArgs {
    fn options(&self) -> TranscribeOptions {
        let temperatures = temperature_schedule(self.temperature, self.temperature_increment);
        TranscribeOptions {
            language: (!self.language.eq_ignore_ascii_case("auto")).then(|| self.language.clone()),
            task: if self.translate {
                Task::Translate
            } else {
                Task::Transcribe
            },
            beam_size: self.beam,
            best_of: self.best_of,
            temperatures,
            condition_on_previous_text: !self.no_condition,
            timestamps: !self.no_timestamps,
            initial_prompt: self.prompt.clone(),
            seed: self.seed,
            ..TranscribeOptions::default()
        }
    }
}

/// Runs `combs transcribe`.
pub fn run(args: &TranscribeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let opts = args.options();
    opts.validate()?;
    let format = match &args.output {
        Some(p) => Some(Format::from_path(p).ok_or_else(|| {
            CliError::Model(ModelError::invalid(
                "output",
                format!(
                    "{}: unknown extension (use .srt, .vtt, .json or .txt)",
                    p.display()
                ),
            ))
        })?),
        None => None,
    };
    let file_err = |path: &PathBuf| {
        let path = path.clone();
        move |e: ModelError| CliError::in_file(&path, e)
    };
    let t_start = Instant::now();
    let samples = combs::audio::load_audio(&args.audio).map_err(file_err(&args.audio))?;
    let t_audio = t_start.elapsed();
    let t = Instant::now();
    let ctx = GpuContext::new(args.device)?;
    let model = combs::models::load_speech_model(
        &ctx,
        &args.model,
        &LoadOptions {
            show_progress: true,
            backend: args.kernels.backend(),
            ..LoadOptions::default()
        },
    )
    .map_err(file_err(&args.model))?;
    let t_load = t.elapsed();
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(1);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {percent:>3}% {elapsed} / ~{eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut printer = Printer {
        out,
        bar,
        error: None,
    };
    let t = Instant::now();
    let result = transcribe(model.as_ref(), &samples, &opts, &mut printer);
    let t_transcribe = t.elapsed();
    if let Some(bar) = &printer.bar {
        bar.finish_and_clear();
    }
    if let Some(e) = printer.error.take() {
        return Err(e.into());
    }
    let transcript = result?;
    if let (Some(path), Some(format)) = (&args.output, format) {
        let file = std::fs::File::create(path).map_err(|source| {
            CliError::Model(ModelError::Io {
                path: path.clone(),
                source,
            })
        })?;
        let mut w = std::io::BufWriter::new(file);
        writers::write(&transcript, format, &mut w)
            .and_then(|()| w.flush())
            .map_err(|source| {
                CliError::Model(ModelError::Io {
                    path: path.clone(),
                    source,
                })
            })?;
    }
    let s = &transcript.stats;
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let per = |d: std::time::Duration, n: usize| ms(d) / n.max(1) as f64;
    let total = t_transcribe.as_secs_f64();
    eprintln!(
        "\naudio {:.2} s (read {:.0} ms); load {:.0} ms; mel {:.0} ms; encode {} windows {:.0} ms ({:.1} ms/window); decode {} steps {:.0} ms ({:.2} ms/token, {} fallbacks)",
        s.audio_seconds,
        ms(t_audio),
        ms(t_load),
        ms(s.mel),
        s.n_encodes,
        ms(s.encode),
        per(s.encode, s.n_encodes),
        s.n_steps,
        ms(s.decode),
        per(s.decode, s.n_steps),
        s.n_fallbacks,
    );
    eprintln!(
        "transcribe {:.2} s: real-time factor {:.3} ({:.1}x real time); language {}",
        total,
        total / s.audio_seconds.max(1e-9),
        s.audio_seconds / total.max(1e-9),
        transcript.language
    );
    if args.profile {
        print_encoder_profile(model.as_ref(), &samples)?;
    }
    Ok(())
}

/// Encodes the audio's first window with timestamps and prints each kind
/// of step's device time, largest first.
fn print_encoder_profile(
    model: &dyn combs::models::speech::SpeechToTextModel,
    samples: &[f32],
) -> Result<(), CliError> {
    let hp = model.hparams();
    let mel = combs::audio::log_mel(samples, model.mel_filters(), hp.n_mels, 0)?;
    let first = combs::audio::window(&mel, 0)?;
    let (_, times) = model.encode_profiled(&first)?;
    // Wall time of encodes once the window's buffers are recorded.
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        model.encode(&first)?;
    }
    let wall = t.elapsed().as_secs_f64() * 1e3 / f64::from(reps);
    let total: f64 = times.iter().map(|(_, ns)| ns).sum();
    eprintln!(
        "encoder profile (one window): device {:.3} ms; wall {wall:.3} ms per replayed window",
        total / 1e6
    );
    for (label, ns) in &times {
        eprintln!(
            "  {:>9.3} ms {:>5.1}%  {label}",
            ns / 1e6,
            100.0 * ns / total.max(1.0)
        );
    }
    Ok(())
}
