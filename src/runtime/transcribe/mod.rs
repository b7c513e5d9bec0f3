//! Speech to text over any [`SpeechToTextModel`], as openai-whisper's
//! `transcribe()` (`transcribe.py`) and `decode()` (`decoding.py`) do it:
//! 30-second windows over the log-mel features, each encoded once and
//! decoded with the logit rules (suppress blank, suppressed tokens,
//! timestamp rules), greedily or by beam search, again at higher
//! temperatures while the text is too repetitive or too unlikely; silent
//! windows skipped by the no-speech probability; segments split at
//! timestamp pairs and the next window started at the last timestamp; the
//! previous text as the next window's prompt. Multilingual models detect the
//! language on the first window when none is given.
//!
//! Files: `options` ([`TranscribeOptions`]), `tokens` (start sequence,
//! suppressed ids, text, compression ratio), `filters` (logit rules),
//! `search` (greedy, sampling, beam search, ranking), `window` (one window
//! at one temperature, language detection), `segments` (timestamp pairs and
//! seek), `languages`, `writers` (srt, vtt, json, txt).

pub mod filters;
pub mod languages;
pub mod options;
pub mod search;
pub mod segments;
pub mod tokens;
pub mod window;
pub mod writers;

#[cfg(test)]
pub(crate) mod mock;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

pub use options::{Task, TranscribeOptions};

use crate::error::{ModelError, Result};
use crate::models::speech::{
    AudioStates, HOP_LENGTH, LogMel, N_FRAMES, SAMPLE_RATE, SpeechToTextModel,
};
use crate::runtime::rng::Rng;
use filters::{LogitFilters, TimestampRules};
use languages::{LANGUAGES, language_index};
use segments::Timing;
use tokens::{DecodeTokens, py_strip};
use window::{Strategy, WindowResult, WindowTask, detect_language};

/// A piece of the transcript with its time span, final when delivered.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// Its text as decoded (usually with a leading space; not stripped).
    pub text: String,
    /// Start in seconds from the start of the audio.
    pub t0: f64,
    /// End in seconds.
    pub t1: f64,
    /// Its tokens, timestamp tokens included.
    pub tokens: Vec<u32>,
    /// Average log-probability of its window's tokens.
    pub avg_logprob: f32,
    /// No-speech probability of its window.
    pub no_speech_prob: f32,
    /// Temperature its window was decoded at.
    pub temperature: f32,
    /// zlib compression ratio of its window's text.
    pub compression_ratio: f32,
    /// Mel frame where its window starts.
    pub seek: usize,
}

/// Where the time of a transcription went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TranscribeStats {
    /// Seconds of audio (content, without padding).
    pub audio_seconds: f64,
    /// Computing the log-mel features.
    pub mel: Duration,
    /// Encoder runs.
    pub encode: Duration,
    /// Windows encoded (language detection included).
    pub n_encodes: usize,
    /// Decoding (every temperature tried).
    pub decode: Duration,
    /// Decoder steps (one token for every sequence each).
    pub n_steps: usize,
    /// Windows decoded again at a higher temperature.
    pub n_fallbacks: usize,
}

/// A finished transcription.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transcript {
    /// The language, by code (`"en"`).
    pub language: String,
    /// Its probability when it was detected (`None`: given or English-only).
    pub language_prob: Option<f32>,
    /// Every segment delivered.
    pub segments: Vec<Segment>,
    /// The whole text (not stripped).
    pub text: String,
    /// Whether the segment callback stopped it early.
    pub stopped: bool,
    /// Timings.
    pub stats: TranscribeStats,
}

/// Receives segments as they become final, and progress.
pub trait SegmentSink {
    /// A final segment; return false to stop transcribing.
    fn segment(&mut self, s: &Segment) -> bool;

    /// The language (by code), once known and before any segment; its
    /// probability when it was detected.
    fn language(&mut self, code: &str, prob: Option<f32>) {
        let _ = (code, prob);
    }

    /// `done` of `total` seconds of audio transcribed.
    fn progress(&mut self, done: f64, total: f64) {
        let _ = (done, total);
    }
}

impl<F: FnMut(&Segment) -> bool> SegmentSink for F {
    fn segment(&mut self, s: &Segment) -> bool {
        self(s)
    }
}

/// Transcribes `samples` (16 kHz mono, any length) with `model`.
///
/// # Errors
/// Empty audio, non-finite samples, options out of range, a language the
/// model does not know, model and device errors.
pub fn transcribe(
    model: &dyn SpeechToTextModel,
    samples: &[f32],
    opts: &TranscribeOptions,
    sink: &mut dyn SegmentSink,
) -> Result<Transcript> {
    opts.validate()?;
    check_samples(samples)?;
    if crate::audio::content_frames(samples.len()) == 0 {
        return Err(ModelError::invalid(
            "pcm",
            format!(
                "{} samples at 16 kHz are shorter than one {HOP_LENGTH}-sample frame",
                samples.len()
            ),
        ));
    }
    let t = Instant::now();
    let hp = model.hparams();
    let pad = N_FRAMES * HOP_LENGTH;
    let mel = crate::audio::log_mel(samples, model.mel_filters(), hp.n_mels, pad)?;
    let mel_time = t.elapsed();
    let content_frames = crate::audio::content_frames(samples.len());
    let mut out = transcribe_mel(model, &mel, content_frames, opts, sink)?;
    out.stats.mel = mel_time;
    Ok(out)
}

/// Checks that `samples` hold audio: not empty, every value finite.
///
/// # Errors
/// Empty audio; the index of the first NaN or infinite sample.
pub fn check_samples(samples: &[f32]) -> Result<()> {
    if samples.is_empty() {
        return Err(ModelError::invalid("pcm", "the audio is empty (0 samples)"));
    }
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        return Err(ModelError::invalid(
            "pcm",
            format!("sample {i} is {} (samples must be finite)", samples[i]),
        ));
    }
    Ok(())
}

/// Transcribes log-mel features: `mel` holds the audio's `content_frames`
/// frames followed by at least 30 s of padding (openai-whisper computes the
/// features of the audio with 30 s of silence appended).
///
/// # Errors
/// Features of the wrong shape or without content, options out of range, a
/// language the model does not know, model and device errors.
pub fn transcribe_mel(
    model: &dyn SpeechToTextModel,
    mel: &LogMel,
    content_frames: usize,
    opts: &TranscribeOptions,
    sink: &mut dyn SegmentSink,
) -> Result<Transcript> {
    opts.validate()?;
    let hp = *model.hparams();
    if mel.n_mels != hp.n_mels || mel.data.len() != mel.n_mels * mel.n_frames {
        return Err(ModelError::Shape {
            tensor: "log-mel features".into(),
            expected: vec![hp.n_mels as u64, mel.n_frames as u64],
            got: vec![mel.n_mels as u64, mel.data.len() as u64],
        });
    }
    if content_frames == 0 || content_frames > mel.n_frames {
        return Err(ModelError::invalid(
            "mel",
            format!(
                "{content_frames} frames of content in {} frames of features",
                mel.n_frames
            ),
        ));
    }
    if hp.n_audio_ctx == 0 || !N_FRAMES.is_multiple_of(hp.n_audio_ctx) || hp.n_text_ctx < 8 {
        return Err(ModelError::Format {
            format: "Whisper model",
            offset: 0,
            reason: format!(
                "n_audio_ctx {} / n_text_ctx {} do not fit 30-second windows",
                hp.n_audio_ctx, hp.n_text_ctx
            ),
        });
    }
    let tokens = DecodeTokens::new(model.vocab())?;
    let mut run = Run {
        model,
        tokens: &tokens,
        opts,
        timing: Timing {
            input_stride: N_FRAMES / hp.n_audio_ctx,
            frame_seconds: HOP_LENGTH as f64 / f64::from(SAMPLE_RATE),
        },
        n_ctx: hp.n_text_ctx,
        stats: TranscribeStats {
            audio_seconds: content_frames as f64 * HOP_LENGTH as f64 / f64::from(SAMPLE_RATE),
            ..Default::default()
        },
        rng: Rng::new(opts.seed),
    };
    let (language, language_prob, first) = run.language(mel, content_frames)?;
    sink.language(language_code(language), language_prob);
    run.windows(mel, content_frames, (language, language_prob), first, sink)
}

/// The code of language `i` (`"en"`).
fn language_code(i: usize) -> &'static str {
    LANGUAGES.get(i).map_or("en", |(code, _)| code)
}

/// The state of one transcription.
struct Run<'a> {
    model: &'a dyn SpeechToTextModel,
    tokens: &'a DecodeTokens<'a>,
    opts: &'a TranscribeOptions,
    timing: Timing,
    n_ctx: usize,
    stats: TranscribeStats,
    rng: Rng,
}

/// Frames `[start, start + len)` of `mel`, zero-padded to a whole window
/// (openai-whisper's `pad_or_trim` of the slice).
fn window(mel: &LogMel, start: usize, len: usize) -> LogMel {
    let mut data = vec![0.0f32; mel.n_mels * N_FRAMES];
    let len = len.min(N_FRAMES).min(mel.n_frames.saturating_sub(start));
    if len == 0 {
        return LogMel {
            n_mels: mel.n_mels,
            n_frames: N_FRAMES,
            data,
        };
    }
    for m in 0..mel.n_mels {
        let src = &mel.data[m * mel.n_frames + start..m * mel.n_frames + start + len];
        data[m * N_FRAMES..m * N_FRAMES + len].copy_from_slice(src);
    }
    LogMel {
        n_mels: mel.n_mels,
        n_frames: N_FRAMES,
        data,
    }
}

impl Run<'_> {
    fn encode(&mut self, mel: &LogMel) -> Result<AudioStates> {
        let t = Instant::now();
        let a = self.model.encode(mel)?;
        self.stats.encode += t.elapsed();
        self.stats.n_encodes += 1;
        Ok(a)
    }

    /// The language index: given, English for English-only models, or
    /// detected on the first window, as faster-whisper does it (the
    /// window decoding reads, whose states are returned for reuse;
    /// openai-whisper encodes the first 30 s of the padded features apart,
    /// the same window for audio of 30 s or more).
    fn language(
        &mut self,
        mel: &LogMel,
        content_frames: usize,
    ) -> Result<(usize, Option<f32>, Option<AudioStates>)> {
        let n = self.tokens.n_languages();
        let given = |i| (i, None, None);
        match &self.opts.language {
            Some(l) if n > 0 => language_index(l, n).map(given).ok_or_else(|| {
                ModelError::invalid(
                    "language",
                    format!("`{l}` is not one of the model's {n} languages"),
                )
            }),
            Some(l) => match language_index(l, 1) {
                Some(_) => Ok(given(0)),
                None => Err(ModelError::invalid(
                    "language",
                    format!("`{l}`: this model is English-only"),
                )),
            },
            None if n == 0 => Ok(given(0)),
            None => {
                let first = window(mel, 0, content_frames.min(N_FRAMES));
                let audio = self.encode(&first)?;
                let t = Instant::now();
                let (i, probs) = detect_language(self.model, &audio, self.tokens)?;
                self.stats.decode += t.elapsed();
                Ok((i, probs.get(i).copied(), Some(audio)))
            }
        }
    }

    /// The seek loop over every window.
    fn windows(
        mut self,
        mel: &LogMel,
        content_frames: usize,
        (language, language_prob): (usize, Option<f32>),
        mut first: Option<AudioStates>,
        sink: &mut dyn SegmentSink,
    ) -> Result<Transcript> {
        let opts = self.opts;
        if self.tokens.n_languages() == 0 && opts.task == Task::Translate {
            return Err(ModelError::invalid(
                "task",
                "an English-only model cannot translate",
            ));
        }
        let specials = self.tokens.specials();
        let sot_sequence = self
            .tokens
            .sot_sequence(language, opts.task, opts.timestamps);
        let suppress = self
            .tokens
            .suppress_tokens(opts.suppress_non_speech, &opts.suppress_tokens);
        let mut blank = self.tokens.blank.clone();
        blank.push(specials.eot);
        let precision = self.timing.time_precision();
        let max_initial_timestamp_index = opts
            .max_initial_timestamp
            .filter(|&t| t > 0.0)
            .map(|t| (f64::from(t) / precision).round_ties_even() as usize);
        let mut all_tokens: Vec<u32> = Vec::new();
        if let Some(p) = &opts.initial_prompt {
            all_tokens = self.tokens.encode(&format!(" {}", py_strip(p)));
        }
        let n_initial = all_tokens.len();
        let mut prompt_reset_since = 0;
        let mut segments = Vec::new();
        let mut stopped = false;
        let total = self.stats.audio_seconds;
        let mut seek = 0;
        while seek < content_frames {
            let segment_size = N_FRAMES.min(content_frames - seek);
            let audio = match first.take() {
                Some(a) if seek == 0 => a,
                _ => self.encode(&window(mel, seek, segment_size))?,
            };
            let prompt = &all_tokens[prompt_reset_since..];
            let mut initial = Vec::new();
            if !prompt.is_empty() {
                let keep = self.n_ctx / 2 - 1;
                initial.push(specials.prev);
                initial.extend_from_slice(&prompt[prompt.len().saturating_sub(keep)..]);
            }
            let sot_index = initial.len();
            initial.extend_from_slice(&sot_sequence);
            let task = WindowTask {
                tokens: self.tokens,
                filters: LogitFilters {
                    sample_begin: initial.len(),
                    suppress_blank: opts.suppress_blank.then(|| blank.clone()),
                    suppress: suppress.clone(),
                    timestamps: opts.timestamps.then_some(TimestampRules {
                        specials,
                        max_initial_timestamp_index,
                    }),
                },
                initial,
                sot_index,
                sample_len: opts.max_tokens_per_window.unwrap_or(self.n_ctx / 2),
                n_ctx: self.n_ctx,
            };
            let result = self.decode_with_fallback(&task, &audio)?;
            if let Some(ns) = opts.no_speech_threshold {
                let mut skip = result.no_speech_prob > ns;
                if opts
                    .logprob_threshold
                    .is_some_and(|lp| result.avg_logprob > lp)
                {
                    skip = false;
                }
                if skip {
                    seek += segment_size;
                    sink.progress((seek as f64 * self.timing.frame_seconds).min(total), total);
                    continue;
                }
            }
            let split = segments::split(
                &result.tokens,
                specials.timestamp_begin,
                seek,
                segment_size,
                self.timing,
            );
            for raw in split.segments {
                let text_tokens: Vec<u32> = raw
                    .tokens
                    .iter()
                    .copied()
                    .filter(|&t| t < specials.eot)
                    .collect();
                let text = self.tokens.text(&text_tokens);
                // Instantaneous or empty segments carry nothing (openai-whisper
                // clears them; faster-whisper drops them).
                if raw.start == raw.end || py_strip(&text).is_empty() {
                    continue;
                }
                all_tokens.extend_from_slice(&raw.tokens);
                let s = Segment {
                    text,
                    t0: raw.start,
                    t1: raw.end,
                    tokens: raw.tokens,
                    avg_logprob: result.avg_logprob,
                    no_speech_prob: result.no_speech_prob,
                    temperature: result.temperature,
                    compression_ratio: result.compression_ratio,
                    seek,
                };
                let go_on = sink.segment(&s);
                segments.push(s);
                if !go_on {
                    stopped = true;
                    break;
                }
            }
            if stopped {
                break;
            }
            if !opts.condition_on_previous_text || result.temperature > 0.5 {
                prompt_reset_since = all_tokens.len();
            }
            // The timestamp rules make every pair advance; a window that did
            // not (a model outside them) still moves on rather than loop.
            seek = if split.seek > seek {
                split.seek
            } else {
                seek + segment_size
            };
            sink.progress((seek as f64 * self.timing.frame_seconds).min(total), total);
        }
        Ok(Transcript {
            language: language_code(language).to_string(),
            language_prob,
            text: self
                .tokens
                .text(&all_tokens[n_initial.min(all_tokens.len())..]),
            segments,
            stopped,
            stats: self.stats,
        })
    }

    /// openai-whisper's `decode_with_fallback`: each temperature in turn
    /// until the result is neither too repetitive nor too unlikely (or is
    /// silence); the last result otherwise.
    fn decode_with_fallback(
        &mut self,
        task: &WindowTask<'_>,
        audio: &AudioStates,
    ) -> Result<WindowResult> {
        let opts = self.opts;
        let mut last = None;
        for (i, &t) in opts.temperatures.iter().enumerate() {
            if i > 0 {
                self.stats.n_fallbacks += 1;
            }
            let strategy = if t > 0.0 {
                Strategy::Sample {
                    temperature: t,
                    n: opts.best_of,
                }
            } else if opts.beam_size > 1 {
                Strategy::Beam {
                    beam_size: opts.beam_size,
                    patience: opts.patience,
                }
            } else {
                Strategy::Sample {
                    temperature: 0.0,
                    n: 1,
                }
            };
            let start = Instant::now();
            let r = task.run(self.model, audio, strategy, &mut self.rng)?;
            self.stats.decode += start.elapsed();
            self.stats.n_steps += r.n_steps;
            let mut needs_fallback = opts
                .compression_ratio_threshold
                .is_some_and(|c| r.compression_ratio > c)
                || opts.logprob_threshold.is_some_and(|l| r.avg_logprob < l);
            if opts
                .no_speech_threshold
                .is_some_and(|n| r.no_speech_prob > n)
                && opts.logprob_threshold.is_some_and(|l| r.avg_logprob < l)
            {
                needs_fallback = false;
            }
            let done = !needs_fallback;
            last = Some(r);
            if done {
                break;
            }
        }
        last.ok_or_else(|| ModelError::invalid("temperatures", "is empty"))
    }
}
