//! `WhisperModel` (the device forward through the planner) against
//! `WhisperReference` (plain loops on the host) on a small random model of
//! Whisper's real layout (1500 encoder positions, Whisper's vocabulary,
//! 64 wide), a fresh window of random features each run: the encoder
//! output and the logits of prompt, single-token and reordered beam steps,
//! on the native host kernels and on the Vulkan kernels. The real tiny.en
//! file runs the same comparison where `COMBS_WHISPER_MODEL` names it.

mod common;

use combs::gpu::{Buffer, DeviceClass, GpuContext, MemoryKind, Recording};
use combs::models::LoadOptions;
use combs::models::speech::{LogMel, N_FRAMES, SpeechToTextModel, WhisperHparams};
use combs::models::whisper::{HostWhisper, WhisperModel};
use combs::models::whisper_reference::WhisperReference;
use combs::ops::plan::Backend;
use combs::quant::QuantType;
use common::{Rng, gpu, host_kernels_run_here, max_rel};

fn small() -> WhisperHparams {
    WhisperHparams {
        n_vocab: 51864,
        n_audio_ctx: 1500,
        n_audio_state: 64,
        n_audio_head: 2,
        n_audio_layer: 2,
        n_text_ctx: 448,
        n_text_state: 64,
        n_text_head: 2,
        n_text_layer: 2,
        n_mels: 80,
    }
}

/// Log-mel-like features: smooth in time, in Whisper's range (about -1..1.5).
fn features(rng: &mut Rng, n_mels: usize) -> LogMel {
    let mut data = vec![0.0f32; n_mels * N_FRAMES];
    for m in 0..n_mels {
        let mut v = rng.range(-0.8, 1.2);
        for t in 0..N_FRAMES {
            v = (v + 0.1 * rng.normal()).clamp(-1.0, 1.5);
            data[m * N_FRAMES + t] = v;
        }
    }
    LogMel {
        n_mels,
        n_frames: N_FRAMES,
        data,
    }
}

fn compare(
    dev: &dyn SpeechToTextModel,
    re: &dyn SpeechToTextModel,
    mel: &LogMel,
    tol: f64,
    what: &str,
) {
    let (a_dev, a_ref) = (
        dev.encode(mel).expect("encode"),
        re.encode(mel).expect("encode"),
    );
    let (e_dev, e_ref) = (
        dev.encoder_output(&a_dev).expect("encoder output"),
        re.encoder_output(&a_ref).expect("encoder output"),
    );
    let err = max_rel(&e_dev, &e_ref);
    eprintln!("{what}: encoder output {err:.2e}");
    assert!(err < tol, "{what}: encoder output off by {err}");
    let (mut d_dev, mut d_ref) = (
        dev.decoder(&a_dev, 2).expect("decoder"),
        re.decoder(&a_ref, 2).expect("decoder"),
    );
    let sot = dev.vocab().specials.sot;
    let prompt: [&[u32]; 2] = [&[sot, 50362, 440], &[sot, 50362, 1770]];
    let steps: [Vec<Vec<u32>>; 3] = [
        prompt.iter().map(|p| p.to_vec()).collect(),
        vec![vec![13], vec![291]],
        vec![vec![7], vec![50256]],
    ];
    for (i, step) in steps.iter().enumerate() {
        if i == 2 {
            // Beam search: both sequences continue the second one.
            d_dev.reorder(&[1, 1]).expect("reorder");
            d_ref.reorder(&[1, 1]).expect("reorder");
        }
        let toks: Vec<&[u32]> = step.iter().map(|t| t.as_slice()).collect();
        let (l_dev, l_ref) = (
            d_dev.step(&toks).expect("step"),
            d_ref.step(&toks).expect("step"),
        );
        let err = max_rel(&l_dev, &l_ref);
        eprintln!("{what}: step {i} logits {err:.2e}");
        assert!(err < tol, "{what}: step {i} logits off by {err}");
    }
    assert_eq!(d_dev.n_past(), 5);
}

#[test]
fn small_random_model_matches_reference_on_host_kernels() {
    if !host_kernels_run_here() {
        eprintln!("the host's kernels need a CPU device: skipped");
        return;
    }
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper forward");
    let src = HostWhisper::random(small(), QuantType::F16, rng.next_u64()).expect("random model");
    let opts = LoadOptions {
        backend: Some(Backend::Host),
        ..LoadOptions::default()
    };
    let dev = WhisperModel::load(&ctx, &src, &opts).expect("load");
    let re = WhisperReference::load(&src).expect("reference");
    compare(&dev, &re, &features(&mut rng, 80), 1e-3, "host");
}

#[test]
fn small_random_q8_model_matches_reference_on_vulkan_kernels() {
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper forward vulkan");
    // One block each: lavapipe runs the 1500-position encoder slowly.
    let hp = WhisperHparams {
        n_audio_layer: 1,
        n_text_layer: 1,
        ..small()
    };
    let src = HostWhisper::random(hp, QuantType::Q8_0, rng.next_u64()).expect("random model");
    let opts = LoadOptions {
        backend: Some(Backend::Vulkan),
        ..LoadOptions::default()
    };
    let dev = WhisperModel::load(&ctx, &src, &opts).expect("load");
    let re = WhisperReference::load(&src).expect("reference");
    compare(&dev, &re, &features(&mut rng, 80), 1e-3, "vulkan");
}

/// Logits of a fixed two-step decode of one sequence over `audio`.
fn decode_two(
    model: &dyn SpeechToTextModel,
    audio: &combs::models::speech::AudioStates,
) -> Vec<f32> {
    let sot = model.vocab().specials.sot;
    let mut d = model.decoder(audio, 1).expect("decoder");
    let mut l = d.step(&[&[sot, 50362]]).expect("prompt");
    l.extend(d.step(&[&[440]]).expect("step"));
    l
}

/// The encoder reuses a window's buffers (and replays its recording) only
/// once no states or decoders of that window are alive; decoders reuse
/// their parts and recorded steps across windows. Results equal the
/// reference's however windows and decoders are interleaved.
#[test]
fn windows_and_decoders_reuse_buffers_safely() {
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper reuse");
    let hp = WhisperHparams {
        n_audio_layer: 1,
        n_text_layer: 1,
        ..small()
    };
    let src = HostWhisper::random(hp, QuantType::F16, rng.next_u64()).expect("random model");
    let opts = LoadOptions {
        backend: host_kernels_run_here().then_some(Backend::Host),
        ..LoadOptions::default()
    };
    let dev = WhisperModel::load(&ctx, &src, &opts).expect("load");
    let re = WhisperReference::load(&src).expect("reference");
    let mels: Vec<LogMel> = (0..3).map(|_| features(&mut rng, 80)).collect();
    let want: Vec<(Vec<f32>, Vec<f32>)> = mels
        .iter()
        .map(|m| {
            let a = re.encode(m).expect("encode");
            (re.encoder_output(&a).expect("output"), decode_two(&re, &a))
        })
        .collect();
    let check = |i: usize, a: &combs::models::speech::AudioStates, what: &str| {
        let e = max_rel(&dev.encoder_output(a).expect("output"), &want[i].0);
        let l = max_rel(&decode_two(&dev, a), &want[i].1);
        eprintln!("{what}: window {i} encoder {e:.2e} logits {l:.2e}");
        assert!(e < 1e-3 && l < 1e-3, "{what}: window {i} off: {e} {l}");
    };
    // Three windows alive at once: more than the encoder keeps slots for.
    let held: Vec<_> = mels
        .iter()
        .map(|m| dev.encode(m).expect("encode"))
        .collect();
    for (i, a) in held.iter().enumerate().rev() {
        check(i, a, "held");
    }
    drop(held);
    // One window at a time, as a transcription goes: replayed encoders and
    // pooled decoders.
    for round in 0..2 {
        for (i, m) in mels.iter().enumerate() {
            let a = dev.encode(m).expect("encode");
            check(i, &a, &format!("round {round}"));
        }
    }
    // A decoder outliving its states keeps the window's buffers.
    let a = dev.encode(&mels[0]).expect("encode");
    let mut d = dev.decoder(&a, 1).expect("decoder");
    drop(a);
    let b = dev.encode(&mels[1]).expect("encode");
    check(1, &b, "while a decoder of another window lives");
    let sot = dev.vocab().specials.sot;
    let mut l = d.step(&[&[sot, 50362]]).expect("prompt");
    l.extend(d.step(&[&[440]]).expect("step"));
    let err = max_rel(&l, &want[0].1);
    assert!(
        err < 1e-3,
        "decoder of a dropped window's states off by {err}"
    );
}

/// The plans a GPU gets (matvecs for the decode steps, the decode
/// attention storing K/V itself, the tiled and blocked kernels), run on
/// whatever device the tests have.
#[test]
fn small_random_model_matches_reference_on_gpu_plans() {
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper forward gpu plans");
    let hp = WhisperHparams {
        n_audio_layer: 1,
        n_text_layer: 1,
        ..small()
    };
    let src = HostWhisper::random(hp, QuantType::Q4_0, rng.next_u64()).expect("random model");
    let opts = LoadOptions {
        backend: Some(Backend::Vulkan),
        plan_as: Some(DeviceClass::Gpu),
        ..LoadOptions::default()
    };
    let dev = WhisperModel::load(&ctx, &src, &opts).expect("load");
    let re = WhisperReference::load(&src).expect("reference");
    // Device memory that held NaNs, freed: the decoder's caches (and the
    // spare set a reorder allocates) may be placed there, and attention
    // must not read what the sequences never wrote.
    poison_freed_memory(&ctx);
    compare(&dev, &re, &features(&mut rng, 80), 1e-3, "gpu plans");
}

/// Allocates device buffers, fills them with f16 NaNs and frees them.
fn poison_freed_memory(ctx: &std::sync::Arc<GpuContext>) {
    let size = 8 << 20;
    let bufs: Vec<_> = (0..8)
        .map(|i| {
            Buffer::new(ctx, size, MemoryKind::Device, &format!("poison {i}")).expect("buffer")
        })
        .collect();
    let mut rec = Recording::new(ctx, false).expect("recording");
    for b in &bufs {
        rec.fill(b, 0, size, 0x7e00_7e00).expect("fill");
    }
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
}

#[test]
fn bad_features_are_errors() {
    let ctx = gpu();
    let src = HostWhisper::random(small(), QuantType::F16, 7).expect("random model");
    let dev = WhisperModel::load(&ctx, &src, &LoadOptions::default()).expect("load");
    let mut mel = LogMel {
        n_mels: 80,
        n_frames: 100,
        data: vec![0.0; 8000],
    };
    assert!(dev.encode(&mel).is_err());
    mel = LogMel {
        n_mels: 80,
        n_frames: N_FRAMES,
        data: vec![0.0; 80 * N_FRAMES],
    };
    mel.data[17] = f32::NAN;
    assert!(dev.encode(&mel).is_err());
    mel.data[17] = 0.0;
    let audio = dev.encode(&mel).expect("encode");
    let mut d = dev.decoder(&audio, 1).expect("decoder");
    assert!(d.step(&[&[60000]]).is_err(), "token out of range");
    assert!(d.step(&[]).is_err(), "no sequences");
    assert!(d.reorder(&[3]).is_err(), "sequence out of range");
    let other = WhisperModel::load(&ctx, &src, &LoadOptions::default()).expect("load");
    assert!(other.decoder(&audio, 1).is_err(), "states of another model");
}

/// The random model as whisper.cpp's file, in its tensor order.
fn write_bin(src: &HostWhisper, weight_type: QuantType, path: &std::path::Path) {
    let w = src.to_whisper_bin(weight_type).expect("writer");
    w.write_file(path).expect("write");
}

#[test]
fn load_speech_model_reads_whisper_cpp_files_and_refuses_others() {
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper bin");
    let src = HostWhisper::random(small(), QuantType::Q8_0, rng.next_u64()).expect("random model");
    let dir = std::env::temp_dir().join(format!("combs-wforward-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("small.bin");
    write_bin(&src, QuantType::Q8_0, &path);
    let opts = LoadOptions::default();
    let dev = combs::models::load_speech_model(&ctx, &path, &opts).expect("load .bin");
    assert_eq!(*dev.hparams(), small());
    let file = combs::formats::whisper_bin::WhisperFile::open(&path).expect("open");
    let re = WhisperReference::load(&file).expect("reference");
    compare(dev.as_ref(), &re, &features(&mut rng, 80), 1e-3, "bin file");

    // A text model's GGUF is not a speech model, nor the reverse.
    let gguf = dir.join("text.gguf");
    std::fs::write(&gguf, b"GGUF\x03\x00\x00\x00").expect("write");
    let err = combs::models::load_speech_model(&ctx, &gguf, &opts)
        .err()
        .expect("gguf refused");
    assert!(err.to_string().contains("GGUF"), "{err}");
    let err = combs::runtime::Model::load(&ctx, &path, &opts)
        .err()
        .expect("bin refused");
    assert!(err.to_string().contains("speech"), "{err}");
    // A truncated file is an error, not a crash.
    let bytes = std::fs::read(&path).expect("read");
    let cut = dir.join("cut.bin");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    assert!(combs::models::load_speech_model(&ctx, &cut, &opts).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

/// The real tiny.en (`COMBS_WHISPER_MODEL=path/ggml-tiny.en.bin`): the device
/// model against the reference within 1e-3 on a 30-s window of speech
/// (`COMBS_WHISPER_AUDIO`, its first window) and on a window of fresh
/// random features, with the encoder's time.
#[test]
fn real_model_matches_reference() {
    let Ok(path) = std::env::var("COMBS_WHISPER_MODEL") else {
        eprintln!("COMBS_WHISPER_MODEL not set: skipped");
        return;
    };
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper real");
    let file =
        combs::formats::whisper_bin::WhisperFile::open(std::path::Path::new(&path)).expect("open");
    let dev = WhisperModel::load(&ctx, &file, &LoadOptions::default()).expect("load");
    let re = WhisperReference::load(&file).expect("reference");
    if let Ok(audio) = std::env::var("COMBS_WHISPER_AUDIO") {
        let samples = combs::audio::load_audio(std::path::Path::new(&audio)).expect("audio");
        let hp = file.hparams;
        let mel = combs::audio::log_mel(&samples, dev.mel_filters(), hp.n_mels, 0).expect("mel");
        let first = combs::audio::window(&mel, 0).expect("window");
        compare(&dev, &re, &first, 1e-3, "real speech");
    }
    let mel = features(&mut rng, file.hparams.n_mels);
    let t = std::time::Instant::now();
    dev.encode(&mel).expect("encode");
    eprintln!("encoder window: {:.3} s", t.elapsed().as_secs_f64());
    compare(&dev, &re, &mel, 1e-3, "real, random features");
}

/// Time of one encoder window of the real model by step
/// (`COMBS_WHISPER_MODEL=path`, `--ignored`).
#[test]
#[ignore]
fn real_model_encoder_profile() {
    let Ok(path) = std::env::var("COMBS_WHISPER_MODEL") else {
        return;
    };
    let ctx = gpu();
    let mut rng = Rng::fresh("whisper profile");
    let file =
        combs::formats::whisper_bin::WhisperFile::open(std::path::Path::new(&path)).expect("open");
    let dev = WhisperModel::load(&ctx, &file, &LoadOptions::default()).expect("load");
    let mel = features(&mut rng, file.hparams.n_mels);
    dev.encode(&mel).expect("warm-up");
    let t = std::time::Instant::now();
    let (audio, prof) = dev.encode_with(&mel, true).expect("encode");
    eprintln!("encoder window: {:.3} s", t.elapsed().as_secs_f64());
    for (label, ns) in prof.unwrap_or_default() {
        eprintln!("{label:>40} {:8.1} ms", ns / 1e6);
    }
    let sot = dev.vocab().specials.sot;
    for n_seqs in [1, 5] {
        let mut d = dev.decoder(&audio, n_seqs).expect("decoder");
        let prompt = vec![sot, 50362];
        d.step(&vec![prompt.as_slice(); n_seqs]).expect("prompt");
        let t = std::time::Instant::now();
        let steps = 20;
        for i in 0..steps {
            let tok = [(i * 37 % 50000) as u32];
            d.step(&vec![&tok[..]; n_seqs]).expect("step");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        eprintln!("decoder step of {n_seqs} sequence(s): {ms:.1} ms");
    }
}

/// Speed of a random model of tiny.en's shape (Q8_0 matrices) on the
/// default device: encoder window and decoder steps (`--ignored`; for GPU
/// machines, where no model file need travel).
#[test]
#[ignore]
fn tiny_shape_speed() {
    let ctx = gpu();
    let hp = WhisperHparams {
        n_vocab: 51864,
        n_audio_ctx: 1500,
        n_audio_state: 384,
        n_audio_head: 6,
        n_audio_layer: 4,
        n_text_ctx: 448,
        n_text_state: 384,
        n_text_head: 6,
        n_text_layer: 4,
        n_mels: 80,
    };
    let mut rng = Rng::fresh("tiny speed");
    let src = HostWhisper::random(hp, QuantType::Q8_0, rng.next_u64()).expect("random model");
    let dev = WhisperModel::load(&ctx, &src, &LoadOptions::default()).expect("load");
    eprintln!("device: {}", ctx.caps().name);
    let mel = features(&mut rng, 80);
    dev.encode(&mel).expect("warm-up");
    for _ in 0..3 {
        let t = std::time::Instant::now();
        dev.encode(&mel).expect("encode");
        eprintln!("encoder window: {:.2} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    let (audio, prof) = dev.encode_with(&mel, true).expect("encode");
    for (label, ns) in prof.unwrap_or_default().iter().take(12) {
        eprintln!("{label:>40} {:8.2} ms", ns / 1e6);
    }
    for n_seqs in [1, 5] {
        let mut d = dev.decoder(&audio, n_seqs).expect("decoder");
        let prompt = vec![dev.vocab().specials.sot, 50362];
        d.step(&vec![prompt.as_slice(); n_seqs]).expect("prompt");
        let t = std::time::Instant::now();
        let steps = 50;
        for i in 0..steps {
            let tok = [(i * 37 % 50000) as u32];
            d.step(&vec![&tok[..]; n_seqs]).expect("step");
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        eprintln!("decoder step of {n_seqs} sequence(s): {ms:.2} ms");
    }
}
