//! Transcripts of the real models against the references' committed in
//! `tests/fixtures/whisper/transcripts.json` (made by
//! `scripts/make-whisper-fixtures.py`: faster-whisper 1.2.1 greedy and
//! beam 5, openai-whisper greedy; language en, temperature 0 only,
//! `condition_on_previous_text=False`, timestamps on): greedy transcripts
//! token for token equal to faster-whisper's wherever the two references
//! agree, segment times within 0.02 s of openai-whisper's, beam-5
//! transcripts equal on at least 90% of the clips. Each clip is read as
//! the references read it: the 16 kHz s16 array in the audio cache's
//! `ref16k/`.
//!
//! They need the converted models (`scripts/fetch-models.sh --whisper`)
//! and the clips (`scripts/fetch-test-audio.sh`), and take minutes on a
//! CPU, so they are ignored by default:
//! `cargo test --release --test whisper_transcribe -- --ignored`.

use std::path::{Path, PathBuf};

use combs::gpu::GpuContext;
use combs::models::{LoadOptions, load_speech_model};
use combs::runtime::transcribe::{Segment, TranscribeOptions, Transcript, transcribe};

fn cache() -> PathBuf {
    std::env::var_os("COMBS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/combs")
        })
}

fn models_dir() -> PathBuf {
    std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache().join("models"))
}

fn fixtures() -> serde_json::Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper/transcripts.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("transcripts.json")
}

/// The 16 kHz array the references transcribed.
fn clip(name: &str) -> Vec<f32> {
    let path = cache().join("audio/ref16k").join(format!("{name}.s16"));
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-test-audio.sh)", path.display()));
    bytes
        .chunks_exact(2)
        .map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0)
        .collect()
}

fn options(beam: usize) -> TranscribeOptions {
    TranscribeOptions {
        language: Some("en".into()),
        beam_size: beam,
        temperatures: vec![0.0],
        condition_on_previous_text: false,
        ..TranscribeOptions::default()
    }
}

struct Clip {
    name: String,
    ours: Transcript,
}

fn run_model(file: &str, beam: usize) -> (serde_json::Value, Vec<Clip>) {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "{} missing: run scripts/fetch-models.sh --whisper",
        path.display()
    );
    let ctx = GpuContext::new(None).expect("a device (lavapipe on machines without a GPU)");
    let model = load_speech_model(&ctx, &path, &LoadOptions::default()).expect("load");
    let fx = fixtures();
    let key = if file.contains("tiny.en") {
        "tiny.en"
    } else {
        "base"
    };
    let clips = fx["models"][key].clone();
    let mut out = Vec::new();
    for (name, _) in clips.as_object().expect("clips") {
        let samples = clip(name);
        let t = transcribe(
            model.as_ref(),
            &samples,
            &options(beam),
            &mut |_: &Segment| true,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        eprintln!("{key} {name}: {}", t.text.trim());
        out.push(Clip {
            name: name.clone(),
            ours: t,
        });
    }
    (clips, out)
}

fn tokens_of(v: &serde_json::Value) -> Vec<Vec<u64>> {
    v["segments"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|s| {
            s["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("token"))
                .collect()
        })
        .collect()
}

fn ours_tokens(t: &Transcript) -> Vec<Vec<u64>> {
    t.segments
        .iter()
        .map(|s| s.tokens.iter().map(|&x| u64::from(x)).collect())
        .collect()
}

fn greedy_matches(file: &str) {
    let (refs, clips) = run_model(file, 1);
    let mut compared = 0;
    for c in &clips {
        let r = &refs[&c.name];
        if r["references_agree"].as_bool() != Some(true) {
            continue;
        }
        compared += 1;
        assert_eq!(
            ours_tokens(&c.ours),
            tokens_of(&r["fw_greedy"]),
            "{}: tokens",
            c.name
        );
        let oa = r["oa_greedy"]["segments"].as_array().expect("segments");
        assert_eq!(oa.len(), c.ours.segments.len(), "{}", c.name);
        for (s, o) in c.ours.segments.iter().zip(oa) {
            let (t0, t1) = (
                o["start"].as_f64().expect("start"),
                o["end"].as_f64().expect("end"),
            );
            assert!(
                (s.t0 - t0).abs() <= 0.02 && (s.t1 - t1).abs() <= 0.02,
                "{}: [{}, {}] vs openai-whisper [{t0}, {t1}]",
                c.name,
                s.t0,
                s.t1
            );
            let lp = o["avg_logprob"].as_f64().expect("avg_logprob");
            assert!(
                (f64::from(s.avg_logprob) - lp).abs() < 0.02,
                "{}: avg log-prob {} vs {lp}",
                c.name,
                s.avg_logprob
            );
        }
    }
    assert!(compared > 0, "no clip where the references agree");
}

fn beam_matches(file: &str) {
    let (refs, clips) = run_model(file, 5);
    let same = clips
        .iter()
        .filter(|c| ours_tokens(&c.ours) == tokens_of(&refs[&c.name]["fw_beam5"]))
        .count();
    eprintln!(
        "beam 5: {same} of {} identical to faster-whisper",
        clips.len()
    );
    assert!(same * 10 >= clips.len() * 9, "{same} of {}", clips.len());
}

#[test]
#[ignore = "needs ggml-tiny.en.bin and the clips; minutes on a CPU"]
fn tiny_en_greedy_matches_references() {
    greedy_matches("ggml-tiny.en.bin");
}

#[test]
#[ignore = "needs ggml-base.bin and the clips; minutes on a CPU"]
fn base_greedy_matches_references() {
    greedy_matches("ggml-base.bin");
}

#[test]
#[ignore = "needs ggml-tiny.en.bin and the clips; minutes on a CPU"]
fn tiny_en_beam5_matches_faster_whisper() {
    beam_matches("ggml-tiny.en.bin");
}

#[test]
#[ignore = "needs ggml-base.bin and the clips; minutes on a CPU"]
fn base_beam5_matches_faster_whisper() {
    beam_matches("ggml-base.bin");
}

/// Word error rate of `got` against `want` (words split on whitespace,
/// lower case, punctuation dropped).
fn wer(got: &str, want: &str) -> f64 {
    let words = |t: &str| -> Vec<String> {
        t.split_whitespace()
            .map(|w| {
                w.chars()
                    .filter(|c| c.is_alphanumeric())
                    .collect::<String>()
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    let (a, b) = (words(got), words(want));
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, wa) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, wb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(wa != wb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()] as f64 / b.len().max(1) as f64
}

/// whisper.cpp (pywhispercpp, `scripts/whispercpp_check.py`) read the files
/// `combs convert` wrote and transcribed the committed espeak-ng clips; combs
/// reads the same files and transcribes the same clips. Exact equality does
/// not hold on these short synthetic clips: whisper.cpp's own front end and
/// decoding loop differ from openai-whisper's, and faster-whisper and
/// openai-whisper both give combs' text here ("The quick roundfire stump over
/// the lazy dog.", where whisper.cpp hears "brown fox jump"). What this holds:
/// a file both engines read gives the same words but for those few (word
/// error rate ≤ 0.35 between the two engines; a misconverted tensor gives
/// garbage), and the exact texts are printed.
#[test]
fn converted_files_transcribe_as_in_whisper_cpp() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper");
    let text = std::fs::read_to_string(dir.join("whispercpp_transcripts.json"))
        .expect("whispercpp_transcripts.json");
    let fx: serde_json::Value = serde_json::from_str(&text).expect("json");
    let ctx = GpuContext::new(None).expect("a device (lavapipe on machines without a GPU)");
    let mut compared = 0;
    for r in fx["results"].as_array().expect("results") {
        let file = r["model"].as_str().expect("model");
        let path = models_dir().join(file);
        if !path.exists() {
            eprintln!(
                "{} missing (scripts/fetch-models.sh --whisper): skipped",
                path.display()
            );
            continue;
        }
        let model = load_speech_model(&ctx, &path, &LoadOptions::default()).expect("load");
        let clip = dir.join(r["clip"].as_str().expect("clip"));
        let samples = combs::audio::load_audio(&clip).expect("clip");
        let t = transcribe(model.as_ref(), &samples, &options(1), &mut |_: &Segment| {
            true
        })
        .expect("transcribe");
        let want = r["text"].as_str().expect("text").trim();
        let w = wer(t.text.trim(), want);
        eprintln!(
            "{file} {}: combs {:?}, whisper.cpp {want:?}, WER {w:.2}",
            clip.display(),
            t.text.trim()
        );
        assert!(w <= 0.35, "{file} on {}: WER {w:.2}", clip.display());
        compared += 1;
    }
    eprintln!("{compared} transcripts compared with whisper.cpp's");
}

/// Word error rate of greedy tiny.en on `sample.wav` against its reference
/// transcript (`sample.stm`, joined in time order in `clips.json`), with
/// the normalization of `wer.json` (lower case; punctuation but apostrophes,
/// and hyphens, to spaces). The references reach 0.160 there (0.198 in the
/// issue's normalization); the issue asks for at most 0.21.
#[test]
#[ignore = "needs ggml-tiny.en.bin and the clips; a minute on a CPU"]
fn tiny_en_greedy_wer_on_sample() {
    let path = models_dir().join("ggml-tiny.en.bin");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper");
    let clips: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("clips.json")).expect("clips.json"))
            .expect("json");
    let reference = clips["sample"]["reference_text"]
        .as_str()
        .expect("reference");
    let ctx = GpuContext::new(None).expect("a device");
    let model = load_speech_model(&ctx, &path, &LoadOptions::default()).expect("load");
    let t = transcribe(
        model.as_ref(),
        &clip("sample"),
        &options(1),
        &mut |_: &Segment| true,
    )
    .expect("transcribe");
    let norm = |s: &str| -> String {
        s.to_lowercase()
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c == '\'' || c.is_whitespace() {
                    c
                } else {
                    ' '
                }
            })
            .collect()
    };
    let w = wer(&norm(&t.text), &norm(reference));
    eprintln!(
        "tiny.en greedy on sample.wav: WER {w:.3}\n  {}",
        t.text.trim()
    );
    assert!(w <= 0.21, "WER {w:.3}");
}
