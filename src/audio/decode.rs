//! Audio files to interleaved f32 samples: WAV (PCM 8/16/24/32-bit integer
//! and 32-bit float) through hound; anything else, and the WAV variants
//! hound refuses (64-bit float), through symphonia (FLAC, MP3, Ogg Vorbis,
//! WAV). Integer samples scale by `1 / 2^(bits-1)`, as ffmpeg converts
//! them, so a 16-bit file gives exactly the floats faster-whisper reads.

use std::io::{BufReader, Cursor, Read, SeekFrom};
use std::path::Path;

use symphonia::core::codecs::audio::well_known::{
    CODEC_ID_AC3, CODEC_ID_DCA, CODEC_ID_EAC3, CODEC_ID_OPUS, CODEC_ID_SPEEX, CODEC_ID_WMA,
};
use symphonia::core::codecs::audio::{AudioCodecId, AudioDecoderOptions};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
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
/// name). The file is read as it decodes, not first into memory.
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be opened; what [`decode_bytes`]
/// refuses.
pub fn decode_file(path: &Path) -> Result<DecodedAudio> {
    decode_path(path, false)
}

/// [`decode_file`] mixed down to one channel as it decodes (each packet as
/// [`mix_to_mono`] mixes it, so the samples are the same as mixing the
/// whole file after): an hour of 48 kHz stereo holds 0.7 GB of samples at
/// its peak rather than 1.4 GB interleaved and the mix besides.
///
/// # Errors
/// As [`decode_file`].
pub fn decode_file_mono(path: &Path) -> Result<DecodedAudio> {
    decode_path(path, true)
}

fn decode_path(path: &Path, mono: bool) -> Result<DecodedAudio> {
    let open = || {
        std::fs::File::open(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    // Opened once here so that a missing file is an I/O error, not a
    // decoder's.
    open()?;
    guarded(|| decode_any(open, mono))
}

/// Decodes an audio file held in memory.
///
/// # Errors
/// [`ModelError::Format`] for a malformed or unsupported file, or one
/// without an audio track, sample rate or channels.
pub fn decode_bytes(bytes: &[u8]) -> Result<DecodedAudio> {
    guarded(|| decode_any(|| Ok(Cursor::new(bytes.to_vec())), false))
}

/// Runs a decode, its panics turned into errors.
fn guarded(decode: impl FnOnce() -> Result<DecodedAudio>) -> Result<DecodedAudio> {
    // The decoders are other crates' parsers doing arithmetic on header
    // fields; one that panics (found by `fuzz/run.sh audio`: a WAV chunk's
    // shift overflowing in symphonia-format-riff 0.6.1 under overflow
    // checks) fails this file, not the caller.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|_| {
        Err(media_error(
            "the audio decoder failed on this file (a malformed header)",
        ))
    })
}

/// A source to decode from the start: each call opens it anew.
fn decode_any<S: MediaSource + 'static>(
    open: impl Fn() -> Result<S>,
    mono: bool,
) -> Result<DecodedAudio> {
    let mut src = open()?;
    let mut head = [0u8; 12];
    let n = read_up_to(&mut src, &mut head)?;
    if is_riff_wave(&head[..n]) {
        src.seek(SeekFrom::Start(0)).map_err(read_error)?;
        match decode_wav(BufReader::new(src), mono) {
            Ok(audio) => return Ok(audio),
            // hound reads the common PCM layouts; symphonia gets a chance
            // at the rest (64-bit float, other codecs in a WAV).
            Err(wav_err) => return decode_other(open()?, mono).map_err(|_| wav_err),
        }
    }
    decode_other(open()?, mono)
}

/// Reads until `buf` is full or the source ends; the bytes read.
fn read_up_to(src: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
    Ok(n)
}

fn read_error(e: std::io::Error) -> ModelError {
    media_error(format!("reading the file: {e}"))
}

/// Decoded samples as they arrive, interleaved or mixed down.
pub(crate) struct Collect {
    mono: bool,
    /// The stream's channels, once known.
    channels: usize,
    samples: Vec<f32>,
}

/// Most frames a header may make [`Collect`] reserve (a header can lie).
const MAX_RESERVE_FRAMES: u64 = 1 << 24;

impl Collect {
    pub(crate) fn new(mono: bool, channels: usize, frames_hint: Option<u64>) -> Self {
        let width = if mono { 1 } else { channels.max(1) };
        let frames = frames_hint.unwrap_or(0).min(MAX_RESERVE_FRAMES) as usize;
        Collect {
            mono,
            channels,
            samples: Vec::with_capacity(frames * width),
        }
    }

    /// Appends whole frames of `channels` samples (the caller keeps them
    /// whole).
    pub(crate) fn push(&mut self, interleaved: &[f32]) {
        if !self.mono || self.channels <= 1 {
            self.samples.extend_from_slice(interleaved);
            return;
        }
        self.samples
            .extend(mixed_frames(interleaved, self.channels));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    pub(crate) fn finish(self, sample_rate: u32) -> DecodedAudio {
        DecodedAudio {
            sample_rate,
            channels: if self.mono { 1 } else { self.channels },
            samples: self.samples,
        }
    }
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
    Ok(mixed_frames(interleaved, channels).collect())
}

/// The mean of each frame's `channels` samples: the one mixdown both
/// [`mix_to_mono`] and the decoders' per-packet mixing use, so the two
/// give the same floats.
fn mixed_frames(interleaved: &[f32], channels: usize) -> impl Iterator<Item = f32> + '_ {
    let scale = 1.0 / channels as f32;
    interleaved
        .chunks_exact(channels)
        .map(move |frame| frame.iter().sum::<f32>() * scale)
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

fn decode_wav(src: impl Read, mono: bool) -> Result<DecodedAudio> {
    let mut reader = hound::WavReader::new(src).map_err(|e| wav_error(e.to_string()))?;
    let spec = reader.spec();
    if spec.channels == 0 {
        return Err(wav_error("0 channels"));
    }
    let channels = usize::from(spec.channels);
    let mut out = Collect::new(mono, channels, Some(u64::from(reader.duration())));
    // Whole frames a block; a truncated data chunk may end mid-frame, and
    // the partial frame is dropped.
    let block = 4096 * channels;
    let mut buf = Vec::with_capacity(block);
    let mut flush = |buf: &mut Vec<f32>, last: bool| {
        let whole = buf.len() - buf.len() % channels;
        if whole == buf.len() || last {
            out.push(&buf[..whole]);
            buf.clear();
        }
    };
    match spec.sample_format {
        hound::SampleFormat::Float => {
            for s in reader.samples::<f32>() {
                buf.push(s.map_err(|e| wav_error(e.to_string()))?);
                if buf.len() == block {
                    flush(&mut buf, false);
                }
            }
        }
        hound::SampleFormat::Int => {
            if !(1..=32).contains(&spec.bits_per_sample) {
                return Err(wav_error(format!(
                    "{} bits per sample",
                    spec.bits_per_sample
                )));
            }
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f64;
            for s in reader.samples::<i32>() {
                let v = s.map_err(|e| wav_error(e.to_string()))?;
                buf.push((f64::from(v) * scale) as f32);
                if buf.len() == block {
                    flush(&mut buf, false);
                }
            }
        }
    }
    flush(&mut buf, true);
    Ok(out.finish(spec.sample_rate))
}

fn media_error(reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "audio",
        offset: 0,
        reason: reason.into(),
    }
}

fn decode_other(source: impl MediaSource + 'static, mono: bool) -> Result<DecodedAudio> {
    let stream = MediaSourceStream::new(Box::new(source), Default::default());
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
    let frames_hint = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| media_error("the audio track has no codec parameters"))?;
    if params.codec == CODEC_ID_OPUS {
        let head = params.extra_data.clone();
        return super::opus::decode_track(head.as_deref(), mono, || {
            next_packet_of(format.as_mut(), track_id)
        });
    }
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| unsupported_codec(params.codec, e))?;

    let mut out: Option<Collect> = None;
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
        if this.1 == 0 {
            return Err(media_error("0 channels"));
        }
        buf.copy_to_vec_interleaved(&mut packet_samples);
        out.get_or_insert_with(|| Collect::new(mono, this.1, frames_hint))
            .push(&packet_samples);
    }
    match (spec, out) {
        (Some((rate, _)), Some(out)) => Ok(out.finish(rate)),
        _ => Err(media_error("no audio decoded")),
    }
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
