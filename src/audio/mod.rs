//! Audio in, Whisper features out: decoding files (WAV through hound; FLAC,
//! MP3, MP2, AAC, ALAC, Vorbis, ADPCM in their containers through
//! symphonia; Opus through `opus-decoder`), mixing down to mono, resampling
//! to 16 kHz, and the log-mel spectrogram the encoder reads. Nothing here
//! touches a device.

pub mod decode;
pub mod mel;
mod opus;
pub mod resample;

use std::path::Path;

use crate::error::Result;
use crate::models::speech::SAMPLE_RATE;

pub use decode::{DecodedAudio, decode_bytes, decode_file, decode_file_mono, mix_to_mono};
pub use mel::{N_SAMPLES, content_frames, log_mel, window, window_content};
pub use resample::{MAX_SAMPLE_RATE, resample};

/// Whisper's input from interleaved samples of any channel count and rate:
/// mixed down to mono, checked (non-empty, finite) and resampled to 16 kHz.
///
/// # Errors
/// [`crate::ModelError::InvalidArgument`] for no samples, a NaN or infinity,
/// 0 channels or a length that is not a whole number of frames, or a rate
/// of 0 or above [`MAX_SAMPLE_RATE`].
pub fn prepare(interleaved: &[f32], channels: usize, sample_rate: u32) -> Result<Vec<f32>> {
    resample::validate_rate(sample_rate)?;
    // One channel is its own mix: no copy of a long recording.
    let mixed;
    let mono = if channels == 1 {
        interleaved
    } else {
        mixed = mix_to_mono(interleaved, channels)?;
        &mixed
    };
    mel::validate_samples(mono)?;
    resample(mono, sample_rate, SAMPLE_RATE)
}

/// A file's audio as Whisper's input: decoded, mixed down to mono and
/// resampled to 16 kHz.
///
/// # Errors
/// [`crate::ModelError::Io`] when the file cannot be read,
/// [`crate::ModelError::Format`] when it is not audio this build decodes,
/// and what [`prepare`] refuses.
pub fn load_audio(path: &Path) -> Result<Vec<f32>> {
    let audio = decode_file_mono(path)?;
    prepare(&audio.samples, audio.channels, audio.sample_rate)
}
