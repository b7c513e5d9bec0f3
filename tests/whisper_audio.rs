//! The audio front end: WAV decoding of every PCM layout (files written by
//! hound from fresh random samples), FLAC, Ogg Vorbis and MP3 through
//! symphonia against their source WAV, stereo mixdown, resampling (a random
//! sine keeps its frequency, amplitude and phase; nothing folds back), input
//! validation, and the log-mel features of every test clip against
//! faster-whisper 1.2.1's `FeatureExtractor` and openai-whisper's first
//! window (fixtures made by `scripts/make-whisper-fixtures.py`).
//!
//! The clip tests need `scripts/fetch-test-audio.sh` (pip, espeak-ng, sox;
//! ~1 MB in `~/.cache/combs/audio`; `scripts/test.sh` runs it). When the
//! audio cache is absent they print what to run and pass without checking;
//! everything else always runs.

mod common;

use std::io::Cursor;
use std::path::{Path, PathBuf};

use combs::ModelError;
use combs::audio::{self, DecodedAudio, decode_bytes, log_mel, mix_to_mono, resample};
use combs::models::speech::{HOP_LENGTH, N_FRAMES};
use common::Rng;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper")
}

fn audio_cache() -> PathBuf {
    let base = std::env::var_os("COMBS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/combs")
        });
    base.join("audio")
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn mel_filters_80() -> Vec<f32> {
    read_f32(&fixtures().join("mel_filters_80.f32"))
}

fn json(name: &str) -> serde_json::Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256_f32(samples: &[f32]) -> String {
    let mut h = Sha256::new();
    for s in samples {
        h.update(s.to_le_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// What ffmpeg's conversion to s16 (faster-whisper's `decode_audio`) makes
/// of float samples (lrintf: ties to even), as integers divided by 32768
/// (so no -0.0, which would change the hash).
fn as_s16(samples: &[f32]) -> Vec<f32> {
    samples
        .iter()
        .map(|&s| ((s * 32768.0).round_ties_even().clamp(-32768.0, 32767.0) + 0.0) / 32768.0)
        .collect()
}

// ---------------------------------------------------------------- decoding

fn wav_bytes(
    spec: hound::WavSpec,
    write: impl FnOnce(&mut hound::WavWriter<&mut Cursor<Vec<u8>>>),
) -> Vec<u8> {
    let mut cursor = Cursor::new(Vec::new());
    {
        let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
        write(&mut w);
        w.finalize().unwrap();
    }
    cursor.into_inner()
}

#[test]
fn wav_integer_formats_decode_exactly() {
    let mut rng = Rng::fresh("wav_integer_formats");
    for bits in [8u16, 16, 24, 32] {
        for channels in [1u16, 2, 3] {
            let spec = hound::WavSpec {
                channels,
                sample_rate: 8000 + rng.below(40_000) as u32,
                bits_per_sample: bits,
                sample_format: hound::SampleFormat::Int,
            };
            let n = (1 + rng.below(500)) * usize::from(channels);
            let lim = 1i64 << (bits - 1);
            let ints: Vec<i32> = (0..n)
                .map(|_| (rng.next_u64() % (2 * lim as u64)) as i64 - lim)
                .map(|v| v as i32)
                .collect();
            let bytes = wav_bytes(spec, |w| {
                for &v in &ints {
                    if bits == 8 {
                        w.write_sample(v as i8).unwrap();
                    } else {
                        w.write_sample(v).unwrap();
                    }
                }
            });
            let got = decode_bytes(&bytes).unwrap();
            assert_eq!(got.sample_rate, spec.sample_rate);
            assert_eq!(got.channels, usize::from(channels));
            let want: Vec<f32> = ints
                .iter()
                .map(|&v| (f64::from(v) / lim as f64) as f32)
                .collect();
            assert_eq!(got.samples, want, "{bits}-bit x {channels}");
            assert!(got.samples.iter().all(|s| (-1.0..1.0).contains(s)));
        }
    }
}

#[test]
fn wav_float32_decodes_exactly() {
    let mut rng = Rng::fresh("wav_float32");
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 22_050,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let samples = rng.normals(2 * 777, 0.3);
    let bytes = wav_bytes(spec, |w| {
        samples.iter().for_each(|&s| w.write_sample(s).unwrap())
    });
    let got = decode_bytes(&bytes).unwrap();
    assert_eq!((got.sample_rate, got.channels), (22_050, 2));
    assert_eq!(got.samples, samples);
}

/// A WAVE_FORMAT_IEEE_FLOAT file with 64-bit samples, which hound refuses
/// and symphonia reads.
fn wav_f64(samples: &[f64], channels: u16, rate: u32) -> Vec<u8> {
    let data_len = (samples.len() * 8) as u32;
    let mut b = Vec::new();
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&(36 + data_len).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&3u16.to_le_bytes());
    b.extend_from_slice(&channels.to_le_bytes());
    b.extend_from_slice(&rate.to_le_bytes());
    b.extend_from_slice(&(rate * 8 * u32::from(channels)).to_le_bytes());
    b.extend_from_slice(&(8 * channels).to_le_bytes());
    b.extend_from_slice(&64u16.to_le_bytes());
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        b.extend_from_slice(&s.to_le_bytes());
    }
    b
}

#[test]
fn wav_float64_decodes() {
    let mut rng = Rng::fresh("wav_float64");
    let samples: Vec<f64> = (0..2 * 1500)
        .map(|_| f64::from(rng.range(-1.0, 1.0)))
        .collect();
    let got = decode_bytes(&wav_f64(&samples, 2, 48_000)).unwrap();
    assert_eq!((got.sample_rate, got.channels), (48_000, 2));
    let want: Vec<f32> = samples.iter().map(|&s| s as f32).collect();
    assert_eq!(got.samples, want);
}

#[test]
fn stereo_mixes_down_to_the_mean() {
    let mut rng = Rng::fresh("stereo_mixdown");
    let frames = 1000 + rng.below(1000);
    let left = rng.normals(frames, 0.2);
    let right = rng.normals(frames, 0.2);
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 16_000,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let bytes = wav_bytes(spec, |w| {
        for (l, r) in left.iter().zip(&right) {
            w.write_sample(*l).unwrap();
            w.write_sample(*r).unwrap();
        }
    });
    let DecodedAudio {
        samples, channels, ..
    } = decode_bytes(&bytes).unwrap();
    let mono = mix_to_mono(&samples, channels).unwrap();
    assert_eq!(mono.len(), frames);
    for ((m, l), r) in mono.iter().zip(&left).zip(&right) {
        assert!((m - (l + r) / 2.0).abs() <= 1e-7, "{m} vs ({l} + {r}) / 2");
    }
    // At 16 kHz the whole path is the mixdown alone.
    assert_eq!(audio::prepare(&samples, 2, 16_000).unwrap(), mono);
}

// -------------------------------------------------------------- resampling

/// Amplitude and phase of frequency `f` in `x` (sampled at `rate`), by
/// correlation with a cosine and a sine over a whole number of periods.
fn tone(x: &[f32], rate: f64, f: f64) -> (f64, f64) {
    let period = rate / f;
    let n = ((x.len() as f64 / period).floor() * period) as usize;
    let (mut c, mut s) = (0.0, 0.0);
    for (i, &v) in x[..n].iter().enumerate() {
        let a = std::f64::consts::TAU * f * i as f64 / rate;
        c += f64::from(v) * a.cos();
        s += f64::from(v) * a.sin();
    }
    let amp = 2.0 * (c * c + s * s).sqrt() / n as f64;
    (amp, s.atan2(c))
}

#[test]
fn resampling_keeps_a_sine() {
    let mut rng = Rng::fresh("resample_sine");
    for from in [
        8_000u32, 22_050, 44_100, 48_000, 11_025, 96_000, 32_000, 12_345, 16_001,
    ] {
        let f = f64::from(rng.range(100.0, 3_500.0));
        let amp = f64::from(rng.range(0.1, 0.9));
        let phase = f64::from(rng.range(0.0, 6.0));
        let secs = 1.5;
        let n = (secs * f64::from(from)) as usize;
        let x: Vec<f32> = (0..n)
            .map(|i| {
                (amp * (std::f64::consts::TAU * f * i as f64 / f64::from(from) + phase).cos())
                    as f32
            })
            .collect();
        let y = resample(&x, from, 16_000).unwrap();
        let want_len = (n as f64 * 16_000.0 / f64::from(from)).ceil() as usize;
        assert!(
            y.len().abs_diff(want_len) <= 1,
            "{from} Hz: {} samples, expected {want_len}",
            y.len()
        );
        // Away from the ends (where the filter sees the signal start and
        // stop), the output is the same sine sampled at 16 kHz.
        let skip = 1600;
        let mid = &y[skip..y.len() - skip];
        let mut err = 0.0f64;
        for (i, &v) in mid.iter().enumerate() {
            let t = (i + skip) as f64 / 16_000.0;
            let want = amp * (std::f64::consts::TAU * f * t + phase).cos();
            err = err.max((f64::from(v) - want).abs());
        }
        let (got_amp, _) = tone(mid, 16_000.0, f);
        eprintln!("{from} Hz, {f:.1} Hz: amp {got_amp:.4} vs {amp:.4}, max err {err:.2e}");
        assert!(
            (got_amp - amp).abs() < 1e-3 * amp,
            "{from} Hz, {f:.1} Hz tone: amplitude {got_amp} vs {amp}"
        );
        assert!(
            err < 1e-3,
            "{from} Hz, {f:.1} Hz tone: max error {err} against the ideal 16 kHz sine"
        );
    }
}

#[test]
fn resampling_removes_what_16khz_cannot_hold() {
    // A 7 kHz tone survives 44.1 -> 16 kHz; an 11 kHz one (above the new
    // Nyquist) must not fold back to 5 kHz.
    let x: Vec<f32> = (0..44_100)
        .map(|i| {
            let t = i as f64 / 44_100.0;
            (0.4 * (std::f64::consts::TAU * 7_000.0 * t).sin()
                + 0.4 * (std::f64::consts::TAU * 11_000.0 * t).sin()) as f32
        })
        .collect();
    let y = resample(&x, 44_100, 16_000).unwrap();
    let mid = &y[1600..y.len() - 1600];
    let (kept, _) = tone(mid, 16_000.0, 7_000.0);
    let (alias, _) = tone(mid, 16_000.0, 5_000.0);
    assert!(kept > 0.35, "7 kHz amplitude {kept}");
    assert!(
        alias < 0.004,
        "11 kHz folded to 5 kHz with amplitude {alias}"
    );
}

// ------------------------------------------------------------------ errors

fn is_invalid(r: Result<impl std::fmt::Debug, ModelError>, name: &str) {
    match r {
        Err(ModelError::InvalidArgument { name: got, .. }) => assert_eq!(got, name),
        other => panic!("expected InvalidArgument({name}), got {other:?}"),
    }
}

#[test]
fn bad_input_is_an_error() {
    let filters = mel_filters_80();
    is_invalid(log_mel(&[], &filters, 80, 160), "samples");
    let mut x = vec![0.1f32; 4000];
    x[1234] = f32::NAN;
    is_invalid(log_mel(&x, &filters, 80, 160), "samples");
    x[1234] = f32::INFINITY;
    is_invalid(log_mel(&x, &filters, 80, 160), "samples");
    is_invalid(audio::prepare(&x, 1, 16_000), "samples");
    is_invalid(audio::prepare(&[], 1, 16_000), "samples");
    let ok = vec![0.1f32; 4000];
    is_invalid(
        log_mel(&ok, &filters[..filters.len() - 1], 80, 160),
        "filters",
    );
    is_invalid(log_mel(&ok, &filters, 0, 160), "n_mels");
    is_invalid(log_mel(&ok[..100], &filters, 80, 0), "samples");
    is_invalid(audio::prepare(&ok, 1, 0), "sample_rate");
    is_invalid(audio::prepare(&ok, 1, 5_000_000), "sample_rate");
    is_invalid(resample(&ok, 44_100, 0), "sample_rate");
    is_invalid(audio::prepare(&ok, 0, 16_000), "channels");
    is_invalid(audio::prepare(&ok[..3999], 2, 16_000), "samples");
    let mel = log_mel(&ok, &filters, 80, 160).unwrap();
    is_invalid(audio::window(&mel, mel.n_frames + 1), "start_frame");

    // Files: garbage, a WAV cut inside its header, one cut inside its data.
    let mut rng = Rng::fresh("bad_files");
    let mut junk = vec![0u8; 1000];
    rng.fill(&mut junk);
    assert!(matches!(
        decode_bytes(&junk),
        Err(ModelError::Format { .. })
    ));
    assert!(matches!(decode_bytes(&[]), Err(ModelError::Format { .. })));
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let wav = wav_bytes(spec, |w| {
        (0..1000).for_each(|i| w.write_sample(i as i16).unwrap())
    });
    assert!(matches!(
        decode_bytes(&wav[..30]),
        Err(ModelError::Format { .. })
    ));
    let cut = wav.len() - 501;
    match decode_bytes(&wav[..cut]) {
        Ok(a) => assert!(
            a.samples.len() <= 750,
            "{} samples from a cut file",
            a.samples.len()
        ),
        Err(e) => assert!(matches!(e, ModelError::Format { .. }), "{e}"),
    }
    let missing = Path::new("/nonexistent/combs-test.wav");
    assert!(matches!(
        audio::load_audio(missing),
        Err(ModelError::Io { .. })
    ));
}

// ----------------------------------------------------------------- log-mel

#[test]
fn log_mel_shape_and_padding() {
    let mut rng = Rng::fresh("log_mel_shape");
    let filters = mel_filters_80();
    let n = 16_000 + rng.below(16_000);
    let x = rng.normals(n, 0.1);
    let fw = log_mel(&x, &filters, 80, audio::mel::FASTER_WHISPER_PAD).unwrap();
    assert_eq!(fw.n_frames, (n + 160) / HOP_LENGTH);
    let oa = log_mel(&x, &filters, 80, audio::N_SAMPLES).unwrap();
    assert_eq!(oa.n_frames, n / HOP_LENGTH + N_FRAMES);
    assert_eq!(audio::content_frames(n), n / HOP_LENGTH);
    // Frames over audio only are the same whatever silence follows, up to
    // the floor (max - 8), which both place at the same maximum here.
    let content = audio::content_frames(n);
    let mut diff = 0.0f32;
    for m in 0..80 {
        for t in 0..content {
            diff = diff.max((fw.data[m * fw.n_frames + t] - oa.data[m * oa.n_frames + t]).abs());
        }
    }
    assert!(diff < 1e-6, "content frames differ by {diff}");
    let w = audio::window_content(&oa, 0, content).unwrap();
    assert_eq!((w.n_mels, w.n_frames), (80, N_FRAMES));
    assert!(w.data[content..N_FRAMES].iter().all(|&v| v == 0.0));
    assert!(w.data.iter().all(|v| v.is_finite()));
    assert!(
        w.data.iter().all(|&v| v <= 1.0 + 3.0),
        "log-mel above the possible range"
    );
}

#[test]
fn log_mel_of_30s_is_fast() {
    let mut rng = Rng::fresh("log_mel_speed");
    let filters = mel_filters_80();
    let x = rng.normals(30 * 16_000, 0.1);
    let _ = log_mel(&x, &filters, 80, 160).unwrap();
    let t = std::time::Instant::now();
    let runs = 5;
    for _ in 0..runs {
        let _ = log_mel(&x, &filters, 80, audio::N_SAMPLES).unwrap();
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
    eprintln!("log-mel of 30 s + 30 s padding: {ms:.1} ms");
    // Generous for a loaded 2-core CI machine; it is a few ms when idle.
    assert!(ms < 200.0, "log-mel of 30 s took {ms:.1} ms");
}

/// The mel of `samples` against faster-whisper's kept frames; returns the
/// max abs difference.
fn mel_vs_fixture(samples: &[f32], clip: &str, meta: &serde_json::Value, filters: &[f32]) -> f32 {
    let n_mels = meta["n_mels"].as_u64().unwrap() as usize;
    let n_frames = meta["n_frames"].as_u64().unwrap() as usize;
    let step = meta["frame_step"].as_u64().unwrap() as usize;
    let pad = meta["pad_samples"].as_u64().unwrap() as usize;
    let kept = read_f32(&fixtures().join(format!("features/{clip}.f32")));
    let mel = log_mel(samples, filters, n_mels, pad).unwrap();
    assert_eq!(
        (mel.n_mels, mel.n_frames),
        (n_mels, n_frames),
        "{clip}: shape"
    );
    assert_eq!(
        kept.len(),
        n_frames.div_ceil(step) * n_mels,
        "{clip}: fixture size"
    );
    let mut diff = 0.0f32;
    for (k, frame) in kept.chunks_exact(n_mels).enumerate() {
        for (m, &want) in frame.iter().enumerate() {
            diff = diff.max((mel.data[m * n_frames + k * step] - want).abs());
        }
    }
    let mean = mel.data.iter().map(|&v| f64::from(v)).sum::<f64>() / mel.data.len() as f64;
    let want_mean = meta["mean"].as_f64().unwrap();
    assert!(
        (mean - want_mean).abs() < 1e-4,
        "{clip}: mean {mean} vs {want_mean}"
    );
    let max = mel.data.iter().copied().fold(f32::MIN, f32::max);
    assert!(
        (f64::from(max) - meta["max"].as_f64().unwrap()).abs() < 1e-4,
        "{clip}: max {max}"
    );
    diff
}

/// Mean and max abs difference between the mel of `samples` and
/// faster-whisper's kept frames, for audio that is not bit-identical to
/// what faster-whisper read.
fn mel_diff_own(
    samples: &[f32],
    clip: &str,
    meta: &serde_json::Value,
    filters: &[f32],
) -> (f64, f32) {
    let n_mels = meta["n_mels"].as_u64().unwrap() as usize;
    let step = meta["frame_step"].as_u64().unwrap() as usize;
    let pad = meta["pad_samples"].as_u64().unwrap() as usize;
    let kept = read_f32(&fixtures().join(format!("features/{clip}.f32")));
    let mel = log_mel(samples, filters, n_mels, pad).unwrap();
    let (mut sum, mut max, mut n) = (0.0f64, 0.0f32, 0usize);
    for (k, frame) in kept.chunks_exact(n_mels).enumerate() {
        if k * step >= mel.n_frames {
            break;
        }
        for (m, &want) in frame.iter().enumerate() {
            let d = (mel.data[m * mel.n_frames + k * step] - want).abs();
            sum += f64::from(d);
            max = max.max(d);
            n += 1;
        }
    }
    (sum / n.max(1) as f64, max)
}

#[test]
fn log_mel_matches_faster_whisper_on_every_clip() {
    let cache = audio_cache();
    if !cache.join("sample.wav").exists() {
        eprintln!(
            "SKIPPED: no test audio in {} (run scripts/fetch-test-audio.sh)",
            cache.display()
        );
        return;
    }
    let clips = json("clips.json");
    let features = json("features.json");
    let filters = mel_filters_80();
    let mut checked = 0;
    for (clip, info) in clips.as_object().unwrap() {
        let file = cache.join(info["file"].as_str().unwrap());
        let want_sha = info["sha256_16k"].as_str().unwrap();
        let meta = &features["clips"][clip];
        let ours = audio::load_audio(&file).unwrap_or_else(|e| panic!("{clip}: {e}"));
        assert_eq!(
            ours.len(),
            info["n_samples_16k"].as_u64().unwrap() as usize,
            "{clip}: 16 kHz length"
        );
        // What faster-whisper read: our decoding exactly for 16 kHz integer
        // files, our floats rounded to s16 for float files, and its own
        // (ffmpeg-resampled) array, cached by the fixture script, otherwise.
        let (samples, how) = if sha256_f32(&ours) == want_sha {
            (ours.clone(), "decoded by combs")
        } else if sha256_f32(&as_s16(&ours)) == want_sha {
            (
                as_s16(&ours),
                "decoded by combs, rounded to s16 as ffmpeg does",
            )
        } else {
            // Resampled by combs (rubato), not ffmpeg: close, not identical.
            let (mean_diff, max_diff) = mel_diff_own(&ours, clip, meta, &filters);
            eprintln!(
                "{clip}: mel of combs' own resampled audio vs faster-whisper's: \
                 {mean_diff:.2e} mean, {max_diff:.2e} max abs difference"
            );
            assert!(
                mean_diff < 0.03,
                "{clip}: mel of the resampled audio off by {mean_diff} on average"
            );
            let path = cache.join(format!("ref16k/{clip}.s16"));
            let Ok(bytes) = std::fs::read(&path) else {
                eprintln!(
                    "{clip}: no {} (scripts/make-whisper-fixtures.py writes it) to compare on faster-whisper's own array",
                    path.display()
                );
                continue;
            };
            let theirs: Vec<f32> = bytes
                .chunks_exact(2)
                .map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0)
                .collect();
            assert_eq!(
                sha256_f32(&theirs),
                want_sha,
                "{}: not the array of the fixtures",
                path.display()
            );
            // Our resampler against ffmpeg's on the same file.
            let (mut e, mut s) = (0.0f64, 0.0f64);
            for (a, b) in ours.iter().zip(&theirs) {
                e += f64::from(a - b).powi(2);
                s += f64::from(*b).powi(2);
            }
            let snr = 10.0 * (s / e.max(1e-30)).log10();
            eprintln!("{clip}: combs' resampling vs ffmpeg's: SNR {snr:.1} dB");
            assert!(
                snr > 30.0,
                "{clip}: resampled audio differs from ffmpeg's (SNR {snr:.1} dB)"
            );
            (theirs, "faster-whisper's array from the cache")
        };
        let diff = mel_vs_fixture(&samples, clip, meta, &filters);
        eprintln!("{clip}: max |mel - faster-whisper| = {diff:.2e} ({how})");
        assert!(
            diff <= 1e-3,
            "{clip}: log-mel differs from faster-whisper's by {diff}"
        );
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} clips compared exactly");
}

#[test]
fn flac_decodes_to_the_same_samples_as_its_wav() {
    let cache = audio_cache();
    let (flac, wav) = (
        cache.join("espeak_flac.flac"),
        cache.join("espeak_numbers.wav"),
    );
    if !flac.exists() || !wav.exists() {
        eprintln!(
            "SKIPPED: no test audio in {} (run scripts/fetch-test-audio.sh)",
            cache.display()
        );
        return;
    }
    let a = audio::decode_file(&flac).unwrap();
    let b = audio::decode_file(&wav).unwrap();
    assert_eq!((a.sample_rate, a.channels), (b.sample_rate, b.channels));
    assert_eq!(a.samples, b.samples);
}

#[test]
fn ogg_vorbis_decodes_close_to_its_wav() {
    let cache = audio_cache();
    let (ogg, wav) = (
        cache.join("espeak_vorbis.ogg"),
        cache.join("espeak_numbers.wav"),
    );
    if !ogg.exists() || !wav.exists() {
        eprintln!(
            "SKIPPED: no test audio in {} (run scripts/fetch-test-audio.sh)",
            cache.display()
        );
        return;
    }
    let a = audio::decode_file(&ogg).unwrap();
    let b = audio::decode_file(&wav).unwrap();
    assert_eq!((a.sample_rate, a.channels), (b.sample_rate, b.channels));
    // Gapless: the encoder's priming and padding are trimmed.
    assert_eq!(a.samples.len(), b.samples.len());
    let (mut e, mut s) = (0.0f64, 0.0f64);
    for (x, y) in a.samples.iter().zip(&b.samples) {
        e += f64::from(x - y).powi(2);
        s += f64::from(*y).powi(2);
    }
    let snr = 10.0 * (s / e.max(1e-30)).log10();
    eprintln!("Ogg Vorbis vs its source: SNR {snr:.1} dB");
    assert!(snr > 15.0, "Vorbis decoding SNR {snr:.1} dB");
}

#[test]
fn first_window_matches_openai_whisper() {
    // openai-whisper's way: 30 s of silence appended before the transform,
    // the window cut at the content's end and zero-padded to 3000 frames.
    let wav = audio_cache().join("sample.wav");
    if !wav.exists() {
        eprintln!("SKIPPED: no test audio (run scripts/fetch-test-audio.sh)");
        return;
    }
    let refs = json("encoder_ref.json");
    let filters = mel_filters_80();
    let x = audio::load_audio(&wav).unwrap();
    let mel = log_mel(&x, &filters, 80, audio::N_SAMPLES).unwrap();
    for model in ["tiny.en", "base"] {
        let want = &refs[model]["mel"];
        let content = audio::content_frames(x.len());
        assert_eq!(content as u64, want["content_frames"].as_u64().unwrap());
        let w = audio::window_content(&mel, 0, content).unwrap();
        let step = want["subsample_step"].as_u64().unwrap() as usize;
        let sub = want["subsample"].as_array().unwrap();
        assert_eq!(w.data.len().div_ceil(step), sub.len());
        let mut diff = 0.0f64;
        for (got, want) in w.data.iter().step_by(step).zip(sub) {
            diff = diff.max((f64::from(*got) - want.as_f64().unwrap()).abs());
        }
        let mean = w.data.iter().map(|&v| f64::from(v)).sum::<f64>() / w.data.len() as f64;
        let want_mean = want["mean"].as_f64().unwrap();
        eprintln!(
            "{model}: max |window - openai-whisper's| = {diff:.2e}, mean {mean:.6} vs {want_mean:.6}"
        );
        assert!(
            diff <= 1e-3,
            "first window differs from openai-whisper's by {diff}"
        );
        assert!((mean - want_mean).abs() < 1e-4);
    }
}

#[test]
fn mp3_decodes_close_to_its_wav() {
    let cache = audio_cache();
    let (mp3, wav) = (
        cache.join("espeak_mp3.mp3"),
        cache.join("espeak_numbers.wav"),
    );
    if !mp3.exists() || !wav.exists() {
        eprintln!(
            "SKIPPED: no test audio in {} (run scripts/fetch-test-audio.sh)",
            cache.display()
        );
        return;
    }
    let a = audio::decode_file(&mp3).unwrap();
    let b = audio::decode_file(&wav).unwrap();
    assert_eq!((a.sample_rate, a.channels), (b.sample_rate, b.channels));
    // The best alignment within two MP3 frames (encoder delay, if the file
    // carries no gapless info).
    let mut best = (f64::MIN, 0isize);
    for lag in -2304isize..=2304 {
        let (mut e, mut s) = (0.0f64, 0.0f64);
        for (i, y) in b.samples.iter().enumerate() {
            let j = i as isize + lag;
            let x = if j >= 0 {
                a.samples.get(j as usize).copied().unwrap_or(0.0)
            } else {
                0.0
            };
            e += f64::from(x - y).powi(2);
            s += f64::from(*y).powi(2);
        }
        let snr = 10.0 * (s / e.max(1e-30)).log10();
        if snr > best.0 {
            best = (snr, lag);
        }
    }
    eprintln!(
        "MP3 vs its source: SNR {:.1} dB at lag {} ({} vs {} samples)",
        best.0,
        best.1,
        a.samples.len(),
        b.samples.len()
    );
    assert!(best.0 > 15.0, "MP3 decoding SNR {:.1} dB", best.0);
}

/// Found by `fuzz/run.sh audio`: a float WAV holding NaN (or samples so
/// large that the FFT's sums overflow) made rubato panic inside the
/// resampler. Such audio is refused with an error naming the sample.
#[test]
fn resampling_refuses_nan_and_huge_samples() {
    for bad in [f32::NAN, f32::INFINITY, -3.0e30] {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 44_100,
            bits_per_sample: 32,
            sample_format: hound::SampleFormat::Float,
        };
        let mut bytes = std::io::Cursor::new(Vec::new());
        {
            let mut w = hound::WavWriter::new(&mut bytes, spec).expect("wav writer");
            for i in 0..9000 {
                let v = if i == 4321 {
                    bad
                } else {
                    (i as f32 * 0.01).sin() * 0.5
                };
                w.write_sample(v).expect("sample");
            }
            w.finalize().expect("finalize");
        }
        let audio = combs::audio::decode_bytes(bytes.get_ref()).expect("the WAV decodes");
        let err =
            combs::audio::resample(&audio.samples, audio.sample_rate, 16_000).expect_err("refused");
        assert!(err.to_string().contains("sample 4321"), "{err}");
    }
    // Loud but sane audio still resamples.
    let loud: Vec<f32> = (0..9000)
        .map(|i| (i as f32 * 0.01).sin() * 1000.0)
        .collect();
    let out = combs::audio::resample(&loud, 44_100, 16_000).expect("loud audio resamples");
    assert!(out.iter().all(|v| v.is_finite()));
}

/// Files fuzzing found (`tests/fixtures/fuzz/`): each decodes or fails with
/// an error, never panics. `audio-riff-shift-overflow.wav` made
/// symphonia-format-riff 0.6.1 overflow a shift, a panic under the fuzz
/// build's overflow checks (a silent wrap in release); `decode_bytes` turns
/// a decoder's panic into an error either way.
#[test]
fn fuzz_found_audio_files_are_errors_not_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/fuzz")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with("audio-"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no audio inputs in {}", dir.display());
    for name in names {
        let bytes = std::fs::read(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let r = std::panic::catch_unwind(|| decode_bytes(&bytes).map(|a| a.samples.len()));
        assert!(r.is_ok(), "{name}: the decoder's panic escaped");
    }
}

/// Every codec and container beyond WAV/FLAC/MP3/Vorbis — AAC (MP4 and
/// ADTS, mono and 44.1 kHz stereo), ALAC, AIFF, CAF, IMA and MS ADPCM,
/// 8 kHz A-law and mu-law WAV, MP2, Opus (Ogg and WebM, mono, stereo, 5.1 through mapping family 1) —
/// against FFmpeg's decoding of the same file (`scripts/audio_variants.py`
/// through PyAV, what faster-whisper reads): same rate and channels, same
/// length, and the samples within each codec's bound (multichannel files
/// compared as their mono mixes: FFmpeg reorders 5.1 channels from the
/// Vorbis order Opus carries).
#[test]
fn other_codecs_decode_as_ffmpeg_does() {
    let dir = audio_cache().join("variants");
    let Ok(index) = std::fs::read_to_string(dir.join("index.json")) else {
        eprintln!(
            "SKIPPED: no audio variants in {} (run scripts/fetch-test-audio.sh)",
            dir.display()
        );
        return;
    };
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let index = index.as_object().unwrap();
    assert!(index.len() >= 16, "{} variants", index.len());
    for (name, meta) in index {
        if meta["unsupported"].as_bool() == Some(true) {
            // A codec no decoder here handles is refused by name.
            let err = audio::decode_file(&dir.join(name)).expect_err(name);
            assert!(err.to_string().contains("AC-3"), "{name}: {err}");
            continue;
        }
        let got = audio::decode_file(&dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let raw = std::fs::read(dir.join(format!("{name}.f32"))).unwrap();
        let want: Vec<f32> = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (rate, channels) = (
            meta["rate"].as_u64().unwrap(),
            meta["channels"].as_u64().unwrap(),
        );
        assert_eq!(
            (u64::from(got.sample_rate), got.channels as u64),
            (rate, channels),
            "{name}"
        );
        let ch = got.channels;
        let mono = |s: &[f32]| audio::mix_to_mono(s, ch).unwrap();
        let (a, b) = (mono(&got.samples), mono(&want));
        // WebM's last block carries its padding in a DiscardPadding element
        // that symphonia's Matroska reader skips: at most one packet more.
        if name.ends_with(".webm") {
            assert!(
                a.len() >= b.len() && a.len() - b.len() <= 5760,
                "{name}: {} frames, FFmpeg {}",
                a.len(),
                b.len()
            );
        } else {
            assert_eq!(a.len(), b.len(), "{name}: frames");
        }
        let (mut e, mut s) = (0.0f64, 0.0f64);
        for (x, y) in a.iter().zip(&b) {
            e += f64::from(x - y).powi(2);
            s += f64::from(*y).powi(2);
        }
        let snr = 10.0 * (s / e.max(1e-30)).log10();
        // Lossless codecs decode to the same integers; lossy ones to the
        // same signal up to their decoders' arithmetic (IMA ADPCM: symphonia
        // rounds each step's difference as the IMA reference does, FFmpeg
        // with one multiply: 1-2 LSB that accumulate within a block).
        let bound = match meta["codec"].as_str().unwrap() {
            "alac" | "pcm_s16be" | "pcm_s16le" | "adpcm_ms" | "pcm_alaw" | "pcm_mulaw" => 200.0,
            "adpcm_ima_wav" => 35.0,
            "opus" => 60.0,
            _ => 70.0,
        };
        if ch == 6 {
            // Opus carries 5.1 in the Vorbis order (FL FC FR BL BR LFE),
            // FFmpeg gives its own (FL FR FC LFE BL BR): channel by channel.
            for (c, ff) in [0usize, 2, 1, 4, 5, 3].into_iter().enumerate() {
                let (mut e, mut s) = (0.0f64, 0.0f64);
                let frames = got.samples.len() / 6;
                for f in 0..frames {
                    let (x, y) = (got.samples[f * 6 + c], want[f * 6 + ff]);
                    e += f64::from(x - y).powi(2);
                    s += f64::from(y).powi(2);
                }
                let snr = 10.0 * (s / e.max(1e-30)).log10();
                assert!(
                    snr >= 60.0,
                    "{name}: channel {c} vs FFmpeg's {ff}: {snr:.1} dB"
                );
            }
        }
        eprintln!(
            "{name}: {} Hz x {ch}, {} frames, SNR vs FFmpeg {snr:.1} dB",
            got.sample_rate,
            a.len()
        );
        assert!(snr >= bound, "{name}: SNR vs FFmpeg {snr:.1} dB < {bound}");
    }
}

/// Mixing down as the file decodes gives the very samples of mixing the
/// decoded file after, for every container and codec (and a WAV cut
/// mid-frame); decoding from memory gives what decoding the file gives.
#[test]
fn mono_decoding_equals_mixing_after() {
    let cache = audio_cache();
    let mut files: Vec<PathBuf> = [
        "espeak_stereo44k.wav",
        "espeak_mp3.mp3",
        "espeak_vorbis.ogg",
    ]
    .iter()
    .map(|f| cache.join(f))
    .collect();
    if let Ok(dir) = std::fs::read_dir(cache.join("variants")) {
        for e in dir.flatten() {
            let p = e.path();
            let ext = p.extension().and_then(|x| x.to_str()).unwrap_or_default();
            if !matches!(ext, "f32" | "json" | "mka") {
                files.push(p);
            }
        }
    }
    files.retain(|p| p.exists());
    if files.len() < 3 {
        eprintln!("SKIPPED: no test audio (run scripts/fetch-test-audio.sh)");
        return;
    }
    // 24-bit stereo cut inside a frame.
    let stereo = std::fs::read(cache.join("espeak_stereo44k.wav")).unwrap();
    let cut = std::env::temp_dir().join(format!("combs-cut-{}.wav", std::process::id()));
    std::fs::write(&cut, &stereo[..stereo.len() - 4]).unwrap();
    files.push(cut.clone());
    for path in &files {
        let whole = audio::decode_file(path).unwrap();
        let mono = audio::decode_file_mono(path).unwrap();
        let mixed = audio::mix_to_mono(&whole.samples, whole.channels).unwrap();
        assert_eq!(
            (mono.sample_rate, mono.channels),
            (whole.sample_rate, 1),
            "{}",
            path.display()
        );
        assert!(
            mono.samples == mixed,
            "{}: mono decoding differs",
            path.display()
        );
        let from_memory = audio::decode_bytes(&std::fs::read(path).unwrap()).unwrap();
        assert!(
            from_memory == whole,
            "{}: decoding from memory differs",
            path.display()
        );
    }
    let _ = std::fs::remove_file(&cut);
    eprintln!("{} files", files.len());
}
