//! What a transcription may be asked to do, with openai-whisper's
//! `transcribe()` defaults (greedy at temperature 0 with fallback up to 1.0,
//! thresholds 2.4 / −1.0 / 0.6, conditioning on previous text, timestamps).

use crate::error::{ModelError, Result};

/// Speech to text in its own language, or to English.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Task {
    /// X → X (`<|transcribe|>`).
    #[default]
    Transcribe,
    /// X → English (`<|translate|>`).
    Translate,
}

/// Options of one transcription.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscribeOptions {
    /// Spoken language by code or English name (`"de"`, `"german"`);
    /// `None`: detected on the first window by multilingual models, English
    /// for English-only ones.
    pub language: Option<String>,
    /// Transcribe or translate (multilingual models only).
    pub task: Task,
    /// Beams of beam search at temperature 0; 1 is greedy decoding.
    pub beam_size: usize,
    /// Patience of beam search: finished candidates to collect, as a
    /// multiple of `beam_size` (openai-whisper's default 1).
    pub patience: f32,
    /// Independent samples per window at temperatures above 0 (the one
    /// with the best average log-probability is kept).
    pub best_of: usize,
    /// Temperatures tried in order until a window's result passes the
    /// thresholds (the first is usually 0, greedy or beam search).
    pub temperatures: Vec<f32>,
    /// A window whose text's zlib compression ratio exceeds this is decoded
    /// again at the next temperature (too repetitive); `None`: no check.
    pub compression_ratio_threshold: Option<f32>,
    /// A window whose average token log-probability is below this is decoded
    /// again at the next temperature; `None`: no check.
    pub logprob_threshold: Option<f32>,
    /// A window whose no-speech probability exceeds this and whose average
    /// log-probability is below `logprob_threshold` is silence: skipped.
    pub no_speech_threshold: Option<f32>,
    /// Feed the previous windows' text as a prompt (`<|startofprev|>`).
    pub condition_on_previous_text: bool,
    /// Predict timestamp tokens and split windows into timed segments;
    /// without, each window is one segment spanning it.
    pub timestamps: bool,
    /// Text before the first window's prompt (names, spelling, style).
    pub initial_prompt: Option<String>,
    /// Latest first timestamp of a window, in seconds (`None`: any).
    pub max_initial_timestamp: Option<f32>,
    /// Tokens sampled per window at most (`None`: half the text context, 224).
    pub max_tokens_per_window: Option<usize>,
    /// Suppress the blank token and end-of-text as a window's first token.
    pub suppress_blank: bool,
    /// Suppress openai-whisper's non-speech symbols (its `"-1"` setting).
    pub suppress_non_speech: bool,
    /// More token ids never to sample.
    pub suppress_tokens: Vec<u32>,
    /// Seed of the draws at temperatures above 0.
    pub seed: u64,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        TranscribeOptions {
            language: None,
            task: Task::Transcribe,
            beam_size: 1,
            patience: 1.0,
            best_of: 1,
            temperatures: vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
            compression_ratio_threshold: Some(2.4),
            logprob_threshold: Some(-1.0),
            no_speech_threshold: Some(0.6),
            condition_on_previous_text: true,
            timestamps: true,
            initial_prompt: None,
            max_initial_timestamp: Some(1.0),
            max_tokens_per_window: None,
            suppress_blank: true,
            suppress_non_speech: true,
            suppress_tokens: Vec::new(),
            seed: 0,
        }
    }
}

impl TranscribeOptions {
    /// Checks every field's range.
    ///
    /// # Errors
    /// `beam_size` or `best_of` 0 or above 64, patience not positive, no
    /// temperature, a negative or non-finite temperature, a non-finite
    /// threshold or initial timestamp, `max_tokens_per_window` 0.
    pub fn validate(&self) -> Result<()> {
        if !(1..=64).contains(&self.beam_size) {
            return Err(ModelError::invalid(
                "beam_size",
                format!("{} is outside 1..=64 (1: greedy)", self.beam_size),
            ));
        }
        if !(1..=64).contains(&self.best_of) {
            return Err(ModelError::invalid(
                "best_of",
                format!("{} is outside 1..=64", self.best_of),
            ));
        }
        if !(self.patience.is_finite() && self.patience > 0.0)
            || (self.beam_size as f32 * self.patience).round() < 1.0
        {
            return Err(ModelError::invalid(
                "patience",
                format!(
                    "{} leaves no candidate for beam size {}",
                    self.patience, self.beam_size
                ),
            ));
        }
        if self.temperatures.is_empty() {
            return Err(ModelError::invalid("temperatures", "is empty"));
        }
        if let Some(t) = self
            .temperatures
            .iter()
            .find(|t| !(t.is_finite() && **t >= 0.0))
        {
            return Err(ModelError::invalid(
                "temperature",
                format!("{t} is negative or not finite"),
            ));
        }
        let thresholds = [
            (
                "compression_ratio_threshold",
                self.compression_ratio_threshold,
            ),
            ("logprob_threshold", self.logprob_threshold),
            ("no_speech_threshold", self.no_speech_threshold),
            ("max_initial_timestamp", self.max_initial_timestamp),
        ];
        for (name, v) in thresholds {
            if let Some(v) = v
                && !v.is_finite()
            {
                return Err(ModelError::invalid(name, format!("{v} is not finite")));
            }
        }
        if let Some(t) = self.max_initial_timestamp
            && t < 0.0
        {
            return Err(ModelError::invalid(
                "max_initial_timestamp",
                format!("{t} is negative"),
            ));
        }
        if self.max_tokens_per_window == Some(0) {
            return Err(ModelError::invalid("max_tokens_per_window", "is 0"));
        }
        Ok(())
    }
}

/// The temperatures openai-whisper's command line tries:
/// `numpy.arange(t, 1.0 + 1e-6, inc)`, or `t` alone when `inc` is 0.
pub fn temperature_schedule(t: f32, inc: f32) -> Vec<f32> {
    if !(inc > 0.0 && inc.is_finite() && t.is_finite()) {
        return vec![t];
    }
    let (t, inc) = (f64::from(t), f64::from(inc));
    let n = ((1.0 + 1e-6 - t) / inc).ceil().clamp(1.0, 1000.0) as usize;
    (0..n).map(|i| (t + i as f64 * inc) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_schedule_as_numpy_arange() {
        assert_eq!(
            temperature_schedule(0.0, 0.2),
            vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
        );
        assert_eq!(temperature_schedule(0.5, 0.0), vec![0.5]);
        assert_eq!(temperature_schedule(0.3, 0.5), vec![0.3, 0.8]);
        assert_eq!(temperature_schedule(1.5, 0.2), vec![1.5]);
    }

    #[test]
    fn transcribe_options_defaults_valid_and_ranges_checked() {
        let d = TranscribeOptions::default();
        d.validate().expect("defaults are valid");
        let bad = [
            TranscribeOptions {
                beam_size: 0,
                ..d.clone()
            },
            TranscribeOptions {
                best_of: 0,
                ..d.clone()
            },
            TranscribeOptions {
                temperatures: vec![0.0, -0.2],
                ..d.clone()
            },
            TranscribeOptions {
                temperatures: vec![f32::NAN],
                ..d.clone()
            },
            TranscribeOptions {
                temperatures: vec![],
                ..d.clone()
            },
            TranscribeOptions {
                patience: 0.0,
                ..d.clone()
            },
            TranscribeOptions {
                logprob_threshold: Some(f32::INFINITY),
                ..d.clone()
            },
            TranscribeOptions {
                max_tokens_per_window: Some(0),
                ..d.clone()
            },
        ];
        for o in bad {
            let e = o.validate().expect_err("out of range");
            assert!(matches!(e, ModelError::InvalidArgument { .. }), "{e}");
        }
    }
}
