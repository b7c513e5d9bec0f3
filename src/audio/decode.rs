//! Audio files to interleaved f32 samples: WAV (PCM 8/16/24/32-bit integer
//! and 32-bit float) through hound; anything else, and the WAV variants
//! hound refuses (64-bit float), through symphonia (FLAC, MP3, Ogg Vorbis,
//! WAV). Integer samples scale by `1 / 2^(bits-1)`, as ffmpeg converts
//! them, so a 16-bit file gives exactly the floats faster-whisper reads.

use std::io::Cursor;
use std::path::Path;

use symphonia::core::codecs::audio::well_known::{
    CODEC_ID_AC3, CODEC_ID_DCA, CODEC_ID_EAC3, CODEC_ID_OPUS, CODEC_ID_SPEEX, CODEC_ID_WMA,
};
use symphonia::core::codecs::audio::{AudioCodecId, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::packet::Packet;

use crate::error::{ModelError, Result};

/// Decoded audio at its own rate and channel count.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedAudio {
    /// Frames per second.
    pub sample_rate: u32,
    /// Channels per frame.
    pub channels: usize,
    /// `channels` samples per frame, interleaved, nominally in `[-1, 1]`.
    pub samples: Vec<f32>,
}

/// Reads and decodes an audio file (format told by its content, not its
/// name).
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be read; what [`decode_bytes`]
/// refuses.
pub fn decode_file(path: &Path) -> Result<DecodedAudio> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_bytes(&bytes)
}

/// Decodes an audio file held in memory.
///
/// # Errors
/// [`ModelError::Format`] for a malformed or unsupported file, or one
/// without an audio track, sample rate or channels.
pub fn decode_bytes(bytes: &[u8]) -> Result<DecodedAudio> {
    // The decoders are other crates' parsers doing arithmetic on header
    // fields; one that panics (found by `fuzz/run.sh audio`: a WAV chunk's
    // shift overflowing in symphonia-format-riff 0.6.1 under overflow
    // checks) fails this file, not the caller.
    std::panic::catch_unwind(|| decode_any(bytes)).unwrap_or_else(|_| {
        Err(media_error(
            "the audio decoder failed on this file (a malformed header)",
        ))
    })
}

fn decode_any(bytes: &[u8]) -> Result<DecodedAudio> {
    if is_riff_wave(bytes) {
        match decode_wav(bytes) {
            Ok(audio) => return Ok(audio),
            // hound reads the common PCM layouts; symphonia gets a chance
            // at the rest (64-bit float, other codecs in a WAV).
            Err(wav_err) => return decode_other(bytes).map_err(|_| wav_err),
        }
    }
    decode_other(bytes)
}

/// Averages the channels of each frame (ffmpeg's default downmix for
/// stereo, and the plain mean for any other layout).
///
/// # Errors
/// [`ModelError::InvalidArgument`] for 0 channels or a length that is not
/// a whole number of frames.
pub fn mix_to_mono(interleaved: &[f32], channels: usize) -> Result<Vec<f32>> {
    if channels == 0 {
        return Err(ModelError::invalid("channels", "0 channels"));
    }
    if !interleaved.len().is_multiple_of(channels) {
        return Err(ModelError::invalid(
            "samples",
            format!(
                "{} samples is not a whole number of {channels}-channel frames",
                interleaved.len()
            ),
        ));
    }
    if channels == 1 {
        return Ok(interleaved.to_vec());
    }
    let scale = 1.0 / channels as f32;
    Ok(interleaved
        .chunks_exact(channels)
        .map(|frame| frame.iter().sum::<f32>() * scale)
        .collect())
}

fn is_riff_wave(bytes: &[u8]) -> bool {
    bytes.len() >= 12
        && matches!(&bytes[..4], b"RIFF" | b"RIFX" | b"RF64")
        && &bytes[8..12] == b"WAVE"
}

fn wav_error(reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "WAV",
        offset: 0,
        reason: reason.into(),
    }
}

fn decode_wav(bytes: &[u8]) -> Result<DecodedAudio> {
    let mut reader =
        hound::WavReader::new(Cursor::new(bytes)).map_err(|e| wav_error(e.to_string()))?;
    let spec = reader.spec();
    if spec.channels == 0 {
        return Err(wav_error("0 channels"));
    }
    let samples: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => reader
            .samples::<f32>()
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| wav_error(e.to_string()))?,
        hound::SampleFormat::Int => {
            if !(1..=32).contains(&spec.bits_per_sample) {
                return Err(wav_error(format!(
                    "{} bits per sample",
                    spec.bits_per_sample
                )));
            }
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f64;
            reader
                .samples::<i32>()
                .map(|s| s.map(|v| (f64::from(v) * scale) as f32))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| wav_error(e.to_string()))?
        }
    };
    let channels = usize::from(spec.channels);
    // A truncated data chunk may end mid-frame; the partial frame is dropped.
    let whole = samples.len() - samples.len() % channels;
    let mut samples = samples;
    samples.truncate(whole);
    Ok(DecodedAudio {
        sample_rate: spec.sample_rate,
        channels,
        samples,
    })
}

fn media_error(reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "audio",
        offset: 0,
        reason: reason.into(),
    }
}

fn decode_other(bytes: &[u8]) -> Result<DecodedAudio> {
    let source = Box::new(Cursor::new(bytes.to_vec()));
    let stream = MediaSourceStream::new(source, Default::default());
    let mut format = symphonia::default::get_probe()
        .probe(
            &Hint::new(),
            stream,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| media_error(format!("not a supported audio file: {e}")))?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| media_error("no audio track"))?;
    let track_id = track.id;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| media_error("the audio track has no codec parameters"))?;
    if params.codec == CODEC_ID_OPUS {
        let head = params.extra_data.clone();
        return super::opus::decode_track(head.as_deref(), || {
            next_packet_of(format.as_mut(), track_id)
        });
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| unsupported_codec(params.codec, e))?;

    let mut samples = Vec::new();
    let mut packet_samples: Vec<f32> = Vec::new();
    let mut spec: Option<(u32, usize)> = None;
    while let Some(packet) = next_packet_of(format.as_mut(), track_id)? {
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            // A corrupt packet is skipped, as ffmpeg does.
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(media_error(format!("decoding: {e}"))),
        };
        let this = (buf.spec().rate(), buf.spec().channels().count());
        match spec {
            None => spec = Some(this),
            Some(s) if s != this => {
                return Err(media_error(format!(
                    "the stream changes from {} Hz x {} to {} Hz x {} channels",
                    s.0, s.1, this.0, this.1
                )));
            }
            Some(_) => {}
        }
        buf.copy_to_vec_interleaved(&mut packet_samples);
        samples.extend_from_slice(&packet_samples);
    }
    let (sample_rate, channels) = spec.ok_or_else(|| media_error("no audio decoded"))?;
    if channels == 0 {
        return Err(media_error("0 channels"));
    }
    Ok(DecodedAudio {
        sample_rate,
        channels,
        samples,
    })
}

/// The next packet of track `track_id` (`None` at the end; a file cut short
/// ends there too, as FFmpeg reads what it can).
fn next_packet_of(format: &mut dyn FormatReader, track_id: u32) -> Result<Option<Packet>> {
    loop {
        match format.next_packet() {
            Ok(Some(p)) if p.track_id == track_id => return Ok(Some(p)),
            Ok(Some(_)) => {}
            Ok(None) => return Ok(None),
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(None);
            }
            Err(e) => return Err(media_error(format!("reading a packet: {e}"))),
        }
    }
}

/// A track whose codec this build cannot decode, named where it is a
/// well-known one.
fn unsupported_codec(codec: AudioCodecId, e: SymphoniaError) -> ModelError {
    let name = match codec {
        CODEC_ID_AC3 => Some("AC-3"),
        CODEC_ID_EAC3 => Some("E-AC-3"),
        CODEC_ID_DCA => Some("DTS"),
        CODEC_ID_WMA => Some("WMA"),
        CODEC_ID_SPEEX => Some("Speex"),
        _ => None,
    };
    let supported =
        "PCM, A-law, mu-law, FLAC, ALAC, MP3, MP2, AAC-LC, Vorbis, Opus and IMA/MS ADPCM are";
    match name {
        Some(name) => media_error(format!("{name} audio is not supported ({supported})")),
        None => media_error(format!(
            "an audio codec this build does not decode ({e}; {supported})"
        )),
    }
}
