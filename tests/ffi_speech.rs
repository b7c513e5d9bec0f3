//! The speech C API as C calls it: `combs_speech_model_load` on bad files
//! (missing, a GGUF text model, truncated, empty) gives its status and a
//! `combs_last_error()` naming the file, never a crash; a small random
//! model written as a whisper.cpp file loads and transcribes fresh random
//! audio end to end, its segments well formed (times within the audio and
//! ordered, tokens in range). With `COMBS_WHISPER_MODEL` naming tiny.en and
//! `COMBS_WHISPER_AUDIO` a clip, the real model transcribes it too.

mod common;
mod ffi_support;

use std::ffi::{CStr, CString, c_void};
use std::path::{Path, PathBuf};
use std::ptr;

use combs::ffi::*;
use combs::models::speech::WhisperHparams;
use combs::models::whisper::HostWhisper;
use combs::quant::QuantType;
use common::Rng;
use ffi_support::last_error;

use combs_status::*;

#[track_caller]
fn expect(got: combs_status, want: combs_status, texts: &[&str]) {
    let msg = last_error();
    assert_eq!(got, want, "last error: {msg}");
    for t in texts {
        assert!(msg.contains(t), "`{msg}` lacks `{t}`");
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("combs-speech-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn c_path(p: &Path) -> CString {
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

struct Runtime(*mut combs_runtime);

impl Runtime {
    fn new() -> Self {
        let mut rt = ptr::null_mut();
        // SAFETY: NULL options, valid out-pointer.
        let s = unsafe { combs_runtime_create(ptr::null(), &mut rt) };
        assert_eq!(
            s,
            COMBS_OK,
            "no Vulkan device ({}): install Mesa's lavapipe (mesa-vulkan-drivers)",
            last_error()
        );
        Runtime(rt)
    }

    fn load(&self, path: &Path) -> (combs_status, *mut combs_speech_model) {
        let p = c_path(path);
        let mut m = ptr::NonNull::dangling().as_ptr();
        // SAFETY: live runtime, NUL-terminated path, valid out-pointer.
        let s = unsafe { combs_speech_model_load(self.0, p.as_ptr(), ptr::null(), &mut m) };
        (s, m)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // SAFETY: from combs_runtime_create, freed once.
        unsafe { combs_runtime_free(self.0) };
    }
}

fn small() -> WhisperHparams {
    WhisperHparams {
        n_vocab: 51864,
        n_audio_ctx: 1500,
        n_audio_state: 64,
        n_audio_head: 2,
        n_audio_layer: 1,
        n_text_ctx: 448,
        n_text_state: 64,
        n_text_head: 2,
        n_text_layer: 1,
        n_mels: 80,
    }
}

/// A small random model as whisper.cpp file bytes.
fn random_model_bytes(seed: u64) -> Vec<u8> {
    let m = HostWhisper::random(small(), QuantType::Q8_0, seed).expect("random model");
    let w = m.to_whisper_bin(QuantType::Q8_0).expect("writer");
    w.to_bytes()
}

#[test]
fn speech_model_load_bad_arguments_and_files() {
    let rt = Runtime::new();
    let dir = temp_dir("load");
    let mut m = ptr::null_mut();
    let path = c_path(&dir.join("x.bin"));
    // SAFETY: each call passes one NULL where the contract allows it to be refused.
    unsafe {
        expect(
            combs_speech_model_load(ptr::null_mut(), path.as_ptr(), ptr::null(), &mut m),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_speech_model_load", "`rt`"],
        );
        expect(
            combs_speech_model_load(rt.0, ptr::null(), ptr::null(), &mut m),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`path`"],
        );
        expect(
            combs_speech_model_load(rt.0, path.as_ptr(), ptr::null(), ptr::null_mut()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`out`"],
        );
    }
    assert!(m.is_null());
    // Missing file.
    let (s, m) = rt.load(&dir.join("missing.bin"));
    expect(s, COMBS_ERR_IO, &["missing.bin"]);
    assert!(m.is_null());
    // A GGUF (text model) header: not a speech model.
    let gguf = dir.join("text.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 64]);
    std::fs::write(&gguf, &bytes).expect("write");
    let (s, m) = rt.load(&gguf);
    expect(s, COMBS_ERR_UNSUPPORTED, &["text.gguf", "GGUF"]);
    assert!(m.is_null());
    // Truncated at random points, and random bytes flipped: an error, never a crash.
    let mut rng = Rng::fresh("speech_model_load_bad_arguments_and_files");
    let good = random_model_bytes(rng.next_u64());
    let cut = dir.join("cut.bin");
    for _ in 0..4 {
        // Past the magic: a whisper.cpp file, cut short.
        let at = 4 + rng.below(good.len() - 4);
        std::fs::write(&cut, &good[..at]).expect("write");
        let (s, m) = rt.load(&cut);
        expect(s, COMBS_ERR_FORMAT, &["cut.bin"]);
        assert!(m.is_null());
    }
    // The empty file: no magic, so not a model combs knows.
    std::fs::write(&cut, b"").expect("write");
    let (s, _) = rt.load(&cut);
    expect(s, COMBS_ERR_UNSUPPORTED, &["cut.bin", "magic"]);
    // SAFETY: NULL is a no-op.
    unsafe { combs_speech_model_free(ptr::null_mut()) };
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Default)]
struct Seen {
    spans: Vec<(f64, f64)>,
    tokens: Vec<Vec<i32>>,
    texts: Vec<String>,
}

unsafe extern "C" fn collect(seg: *const combs_segment, user: *mut c_void) -> i32 {
    // SAFETY: combs passes a valid segment and our Seen.
    let (seg, seen) = unsafe { (&*seg, &mut *user.cast::<Seen>()) };
    // SAFETY: valid during the callback.
    let text = unsafe { CStr::from_ptr(seg.text) };
    seen.texts
        .push(text.to_str().expect("UTF-8 text").to_string());
    seen.spans.push((seg.t0, seg.t1));
    // SAFETY: as above.
    seen.tokens
        .push(unsafe { std::slice::from_raw_parts(seg.tokens, seg.n_tokens) }.to_vec());
    0
}

fn transcribe(
    m: *const combs_speech_model,
    pcm: &[f32],
    rate: u32,
    o: &combs_transcribe_options,
) -> Seen {
    let mut seen = Seen::default();
    // SAFETY: live model, valid slices, callback and user data.
    let s = unsafe {
        combs_transcribe(
            m,
            pcm.as_ptr(),
            pcm.len(),
            rate,
            o,
            Some(collect),
            ptr::from_mut(&mut seen).cast(),
        )
    };
    expect(s, COMBS_OK, &[]);
    seen
}

#[test]
fn speech_random_model_transcribes_well_formed_segments() {
    let rt = Runtime::new();
    let dir = temp_dir("random");
    let mut rng = Rng::fresh("speech_random_model_transcribes_well_formed_segments");
    let path = dir.join("random.bin");
    std::fs::write(&path, random_model_bytes(rng.next_u64())).expect("write");
    let (s, m) = rt.load(&path);
    expect(s, COMBS_OK, &[]);
    // 12 s of noise at 22.05 kHz: resampled on the way in.
    let rate = 22050;
    let seconds = 12.0;
    let pcm: Vec<f32> = (0..(rate as f64 * seconds) as usize)
        .map(|_| rng.range(-0.3, 0.3))
        .collect();
    let mut o = combs_transcribe_default_options();
    // One temperature and few tokens: a random model's text is long and unlikely.
    o.temperature_increment = 0.0;
    o.max_tokens_per_window = 16;
    let seen = transcribe(m, &pcm, rate, &o);
    let mut last = 0.0;
    for ((t0, t1), toks) in seen.spans.iter().zip(&seen.tokens) {
        assert!(
            *t0 >= last - 1e-9 && t1 > t0 && *t1 <= seconds + 30.0,
            "{:?}",
            seen.spans
        );
        assert!(toks.iter().all(|&t| (0..51864).contains(&t)));
        last = *t0;
    }
    // Beam search and no timestamps run too.
    o.beam_size = 3;
    o.timestamps = false;
    o.max_tokens_per_window = 6;
    let seen = transcribe(m, &pcm, rate, &o);
    for (t0, t1) in &seen.spans {
        assert!((t1 - t0) <= 30.0 + 1e-9 && t1 > t0);
    }
    // SAFETY: from combs_speech_model_load, freed once.
    unsafe { combs_speech_model_free(m) };
    let _ = std::fs::remove_dir_all(&dir);
}

/// tiny.en on a real clip, where the files are given:
/// `COMBS_WHISPER_MODEL=~/.cache/combs/models/ggml-tiny.en.bin
/// COMBS_WHISPER_AUDIO=~/.cache/combs/audio/hello_world.wav`, and the text
/// the clip's `.txt` beside it holds (case and punctuation aside).
#[test]
fn speech_tiny_en_transcribes_clip_when_given() {
    let (Some(model), Some(audio)) = (
        std::env::var_os("COMBS_WHISPER_MODEL"),
        std::env::var_os("COMBS_WHISPER_AUDIO"),
    ) else {
        eprintln!("COMBS_WHISPER_MODEL / COMBS_WHISPER_AUDIO not set: nothing to compare");
        return;
    };
    let rt = Runtime::new();
    let (s, m) = rt.load(Path::new(&model));
    expect(s, COMBS_OK, &[]);
    let samples = combs::audio::load_audio(Path::new(&audio)).expect("audio");
    let o = combs_transcribe_default_options();
    let seen = transcribe(m, &samples, 16000, &o);
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_alphanumeric() || c.is_whitespace())
            .collect::<String>()
            .to_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let got = norm(&seen.texts.concat());
    let want_path = Path::new(&audio).with_extension("txt");
    if let Ok(want) = std::fs::read_to_string(&want_path) {
        assert_eq!(got, norm(&want));
    }
    assert!(!got.is_empty());
    // SAFETY: from combs_speech_model_load, freed once.
    unsafe { combs_speech_model_free(m) };
}
