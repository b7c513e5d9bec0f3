//! Writes the generated part of the fuzzers' seed corpora (`fuzz/run.sh`
//! calls it): small complete models of every text architecture and weight
//! type, small whisper.cpp files, WAV files of several sample formats, PNG
//! and JPEG images of several colour types, and requantizer inputs. The
//! seeds cut from real model headers come from `fuzz/make-header-seeds.py`.
//!
//! Usage: `cargo run --release --example fuzz_seeds -- fuzz/corpus`

use std::path::{Path, PathBuf};

use combs::formats::ggml_type::QuantType;
use combs::models::speech::WhisperHparams;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::whisper::HostWhisper;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(name), bytes)
}

/// Tiny models: one layer, 64 wide, a 64-token vocabulary.
fn text_models(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let archs = [
        ("llama", 0),
        ("qwen2", 0),
        ("qwen3", 0),
        ("gemma3", 16),
        ("mistral", 8),
    ];
    let types = [
        QuantType::F32,
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
    ];
    for (i, (arch, window)) in archs.iter().enumerate() {
        for (j, &qtype) in types.iter().enumerate() {
            // Every architecture once with each type would be 30 seeds of
            // the same shape; two types per architecture cover the loaders.
            if (i + j) % 3 != 0 {
                continue;
            }
            let block = qtype.block_size();
            let width = 64usize.next_multiple_of(block);
            let cfg = SynthConfig {
                arch: (*arch).to_string(),
                n_vocab: 64,
                n_embd: width,
                n_layer: 1,
                n_head: 2,
                n_head_kv: 1,
                head_dim: width / 2,
                n_ff: width * 2,
                n_ctx: 64,
                tied: i % 2 == 0,
                qtype,
                seed: (i * 10 + j) as u64,
                sliding_window: *window,
            };
            let bytes = synth_gguf(&cfg)?.to_bytes();
            let name = format!("{arch}-{qtype}.gguf");
            write(&root.join("gen-gguf_load"), &name, &bytes)?;
            write(&root.join("gen-gguf_parse"), &name, &bytes)?;
        }
    }
    Ok(())
}

/// The smallest whisper.cpp files the reader takes (Whisper's vocabulary
/// size is fixed, so these are a few MB: generated, not committed).
fn whisper_models(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    for (n_vocab, qtype) in [(51864, QuantType::Q8_0), (51865, QuantType::F16)] {
        let hp = WhisperHparams {
            n_vocab,
            n_audio_ctx: 64,
            n_audio_state: 32,
            n_audio_head: 2,
            n_audio_layer: 1,
            n_text_ctx: 16,
            n_text_state: 32,
            n_text_head: 2,
            n_text_layer: 1,
            n_mels: 80,
        };
        let bytes = HostWhisper::random(hp, qtype, n_vocab as u64)?
            .to_whisper_bin(qtype)?
            .to_bytes();
        write(
            &root.join("gen-whisper_load"),
            &format!("whisper-{n_vocab}-{qtype}.bin"),
            &bytes,
        )?;
    }
    Ok(())
}

/// A tenth of a second of a chord, in the sample formats WAV files carry.
fn wavs(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use hound::{SampleFormat, WavSpec, WavWriter};
    let dir = root.join("seed-audio");
    std::fs::create_dir_all(&dir)?;
    let cases: [(u32, u16, u16, SampleFormat); 5] = [
        (16_000, 1, 16, SampleFormat::Int),
        (44_100, 2, 16, SampleFormat::Int),
        (8_000, 1, 8, SampleFormat::Int),
        (48_000, 2, 24, SampleFormat::Int),
        (22_050, 1, 32, SampleFormat::Float),
    ];
    for (rate, channels, bits, format) in cases {
        let spec = WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: format,
        };
        let path = dir.join(format!("{rate}hz-{channels}ch-{bits}bit.wav"));
        let mut w = WavWriter::create(&path, spec)?;
        let n = rate as usize / 10;
        for i in 0..n * usize::from(channels) {
            let t = (i / usize::from(channels)) as f32 / rate as f32;
            let v = 0.3 * (2.0 * std::f32::consts::PI * 440.0 * t).sin()
                + 0.2 * (2.0 * std::f32::consts::PI * 660.0 * t).sin();
            match (format, bits) {
                (SampleFormat::Float, _) => w.write_sample(v)?,
                (_, 8) => w.write_sample((v * 127.0) as i8)?,
                (_, 16) => w.write_sample((v * 32767.0) as i16)?,
                _ => w.write_sample((v * 8_388_607.0) as i32)?,
            }
        }
        w.finalize()?;
    }
    Ok(())
}

/// The first 16 KiB of each codec variant `scripts/fetch-test-audio.sh`
/// wrote (AAC, ALAC, ADPCM, Opus, ...), where the cache holds them.
fn audio_variants(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cache =
        std::env::var_os("COMBS_CACHE").map_or_else(|| home.join(".cache/combs"), PathBuf::from);
    let Ok(entries) = std::fs::read_dir(cache.join("audio/variants")) else {
        return Ok(());
    };
    let dir = root.join("gen-audio");
    std::fs::create_dir_all(&dir)?;
    for entry in entries {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.ends_with(".f32") || name.ends_with(".json") {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        write(
            &dir,
            &format!("variant-{name}"),
            &bytes[..bytes.len().min(16 << 10)],
        )?;
    }
    Ok(())
}

/// Small images of several colour types and shapes: PNG, and the RGB and
/// grey ones in every other format `decode_image` takes.
fn images(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use image::{DynamicImage, ImageFormat, RgbImage};
    let dir = root.join("seed-image");
    std::fs::create_dir_all(&dir)?;
    let rgb = RgbImage::from_fn(24, 17, |x, y| {
        image::Rgb([(x * 10) as u8, (y * 15) as u8, 128])
    });
    let base = DynamicImage::ImageRgb8(rgb);
    let variants = [
        ("rgb", base.clone()),
        ("gray", DynamicImage::ImageLuma8(base.to_luma8())),
        ("rgba", DynamicImage::ImageRgba8(base.to_rgba8())),
        (
            "gray-alpha",
            DynamicImage::ImageLumaA8(base.to_luma_alpha8()),
        ),
        ("rgb16", DynamicImage::ImageRgb16(base.to_rgb16())),
    ];
    for (name, img) in &variants {
        img.save_with_format(dir.join(format!("{name}.png")), ImageFormat::Png)?;
    }
    for (name, img) in &variants[..2] {
        img.save_with_format(dir.join(format!("{name}.jpg")), ImageFormat::Jpeg)?;
        for (ext, format) in [
            ("webp", ImageFormat::WebP),
            ("gif", ImageFormat::Gif),
            ("bmp", ImageFormat::Bmp),
            ("tiff", ImageFormat::Tiff),
            ("pnm", ImageFormat::Pnm),
        ] {
            // The GIF encoder takes only RGB(A) pixels (it builds a palette).
            let img = if format == ImageFormat::Gif {
                DynamicImage::ImageRgba8(img.to_rgba8())
            } else {
                img.clone()
            };
            img.save_with_format(dir.join(format!("{name}.{ext}")), format)?;
        }
    }
    let tall = DynamicImage::ImageRgb8(RgbImage::from_fn(3, 40, |x, y| {
        image::Rgb([x as u8 * 80, y as u8 * 6, 7])
    }));
    tall.save_with_format(dir.join("tall.png"), ImageFormat::Png)?;
    Ok(())
}

/// Requantizer inputs: a source-type byte, a target byte, then weights.
fn requantize_inputs(root: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let dir = root.join("seed-requantize");
    std::fs::create_dir_all(&dir)?;
    for (src, target) in [(0u8, 0u8), (0, 4), (1, 6), (3, 1), (4, 7), (5, 3)] {
        let mut bytes = vec![src, target];
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(src * 8 + target);
        for _ in 0..1024 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small finite f32 / f16 bit patterns, so that conversion succeeds.
            let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1;
            if src == 1 {
                bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes());
            } else {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
        write(&dir, &format!("src{src}-to{target}.bin"), &bytes)?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args_os()
        .nth(1)
        .map_or_else(|| PathBuf::from("fuzz/corpus"), PathBuf::from);
    text_models(&root)?;
    whisper_models(&root)?;
    wavs(&root)?;
    audio_variants(&root)?;
    images(&root)?;
    requantize_inputs(&root)?;
    println!("seeds written under {}", root.display());
    Ok(())
}
