//! The speech-to-text contract, separate from [`super::GenerativeModel`]:
//! an encoder that runs once per 30-second window of log-mel features, and a
//! decoder stepped over token prefixes against that window's fixed states
//! (the cross-attention K/V are computed once per window and kept in the
//! [`AudioStates`]). Decoding strategies (greedy, beam search, timestamp
//! rules, temperature fallback) live above this contract and drive any
//! model that implements it: the GPU [`WhisperModel`](super::whisper) and
//! the CPU reference alike.

use std::any::Any;

use crate::error::Result;

/// Samples per second of the audio Whisper models take.
pub const SAMPLE_RATE: u32 = 16_000;
/// Samples between two mel frames.
pub const HOP_LENGTH: usize = 160;
/// Window length of the short-time Fourier transform.
pub const N_FFT: usize = 400;
/// Seconds of audio in one encoder window.
pub const CHUNK_SECONDS: usize = 30;
/// Mel frames in one encoder window (30 s at 100 frames per second).
pub const N_FRAMES: usize = CHUNK_SECONDS * SAMPLE_RATE as usize / HOP_LENGTH;

/// A Whisper model's dimensions, as whisper.cpp's file header holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhisperHparams {
    /// Vocabulary size (51864 English-only, 51865+ multilingual).
    pub n_vocab: usize,
    /// Encoder positions (1500: 3000 mel frames after the stride-2 stem).
    pub n_audio_ctx: usize,
    /// Encoder width.
    pub n_audio_state: usize,
    /// Encoder attention heads.
    pub n_audio_head: usize,
    /// Encoder blocks.
    pub n_audio_layer: usize,
    /// Decoder positions (448).
    pub n_text_ctx: usize,
    /// Decoder width.
    pub n_text_state: usize,
    /// Decoder attention heads.
    pub n_text_head: usize,
    /// Decoder blocks.
    pub n_text_layer: usize,
    /// Mel bins of the input features (80, or 128 for large-v3).
    pub n_mels: usize,
}

impl WhisperHparams {
    /// Whether the vocabulary has language and task tokens.
    pub fn is_multilingual(&self) -> bool {
        self.n_vocab >= 51865
    }
}

/// Log-mel features of one or more windows: `n_mels` rows of `n_frames`
/// values each (row-major, the layout Whisper's encoder reads).
#[derive(Clone, Debug, PartialEq)]
pub struct LogMel {
    /// Mel bins.
    pub n_mels: usize,
    /// Frames (100 per second).
    pub n_frames: usize,
    /// `n_mels * n_frames` values.
    pub data: Vec<f32>,
}

/// One window's encoder output and the decoder's cross-attention K/V derived
/// from it, kept for every decoder step over that window. What it holds is
/// the model's own business (device buffers, host arrays).
pub struct AudioStates {
    /// The model's representation.
    pub inner: Box<dyn Any + Send + Sync>,
}

/// A decoder over one window's [`AudioStates`], holding `n_seqs` token
/// sequences (beams) and their self-attention caches.
pub trait SpeechDecoder: Send {
    /// Sequences this decoder holds.
    fn n_seqs(&self) -> usize;

    /// Tokens already fed to each sequence (all sequences advance together).
    fn n_past(&self) -> usize;

    /// Appends `tokens[i]` to sequence `i` (every slice the same length, at
    /// least one token) and returns the logits of each sequence's last new
    /// position: `n_seqs` rows of `n_vocab` values.
    ///
    /// # Errors
    /// Ragged or empty slices, token ids out of range, more positions than
    /// `n_text_ctx`, device errors.
    fn step(&mut self, tokens: &[&[u32]]) -> Result<Vec<f32>>;

    /// Rearranges the sequences: sequence `i` becomes a copy of what
    /// sequence `source[i]` was (beam search); the number of sequences may
    /// change.
    ///
    /// # Errors
    /// An index out of range, device errors.
    fn reorder(&mut self, source: &[usize]) -> Result<()>;

    /// Forgets every token of every sequence, keeping the window.
    fn reset(&mut self);
}

/// A speech-to-text model resident on a device.
pub trait SpeechToTextModel: Send + Sync {
    /// The model's dimensions.
    fn hparams(&self) -> &WhisperHparams;

    /// The mel filterbank stored with the model: `n_mels` rows of
    /// `N_FFT / 2 + 1` weights.
    fn mel_filters(&self) -> &[f32];

    /// The vocabulary: each token id's bytes.
    fn vocab(&self) -> &crate::tokenizer::whisper::WhisperVocab;

    /// Runs the encoder over one window of exactly `N_FRAMES` frames.
    ///
    /// # Errors
    /// Features of the wrong shape, non-finite values, device errors.
    fn encode(&self, mel: &LogMel) -> Result<AudioStates>;

    /// [`encode`](Self::encode) with the device time of each kind of step
    /// in nanoseconds, largest first (empty where the model cannot time
    /// its steps: the default).
    ///
    /// # Errors
    /// As [`encode`](Self::encode).
    fn encode_profiled(&self, mel: &LogMel) -> Result<(AudioStates, Vec<(String, f64)>)> {
        Ok((self.encode(mel)?, Vec::new()))
    }

    /// A decoder of `n_seqs` empty sequences over `audio`.
    ///
    /// # Errors
    /// `audio` from another model, out of device memory.
    fn decoder(&self, audio: &AudioStates, n_seqs: usize) -> Result<Box<dyn SpeechDecoder + '_>>;

    /// Bytes of weights on the device.
    fn device_bytes(&self) -> u64;

    /// The encoder output a window's states hold: `n_audio_ctx` rows of
    /// `n_audio_state` values (what tests compare across models).
    ///
    /// # Errors
    /// States of another model, device errors, or a model that does not
    /// keep it (the default).
    fn encoder_output(&self, audio: &AudioStates) -> Result<Vec<f32>> {
        let _ = audio;
        Err(crate::error::ModelError::invalid(
            "encoder output",
            "this model does not keep it",
        ))
    }
}
