//! `combs_transcribe`: PCM samples to timed text segments through a C
//! callback (`runtime::transcribe`), with its options struct.

use std::ffi::{CString, c_char, c_void};

use super::args::{array, c_enum, c_str, handle, invalid, utf8};
use super::combs_token;
use super::guard::{FfiResult, guard, guard_const};
use super::speech::combs_speech_model;
use super::status::combs_status;
use crate::runtime::transcribe::options::temperature_schedule;
use crate::runtime::transcribe::{Segment, SegmentSink, Task, TranscribeOptions, transcribe};

/// Speech to text in its own language, or to English.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_task {
    /// Transcribe in the spoken language.
    COMBS_TASK_TRANSCRIBE = 0,
    /// Translate to English (multilingual models).
    COMBS_TASK_TRANSLATE = 1,
}

/// Options of `combs_transcribe()`; start from
/// `combs_transcribe_default_options()` (openai-whisper's defaults). Fields
/// may be appended, never reordered. A threshold set to NAN is off.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_transcribe_options {
    /// Spoken language by code (`"de"`) or English name; NULL or `"auto"`:
    /// detected on the first 30 s (multilingual models), English otherwise.
    pub language: *const c_char,
    /// Transcribe or translate.
    pub task: combs_task,
    /// Beams of beam search at temperature 0; 1: greedy.
    pub beam_size: i32,
    /// Samples drawn per window at temperatures above 0 (the likeliest kept).
    pub best_of: i32,
    /// First temperature (0: greedy or beam search).
    pub temperature: f32,
    /// Step up to 1.0 when a window fails the thresholds; 0: no fallback.
    pub temperature_increment: f32,
    /// Fall back when the text's zlib compression ratio exceeds this (2.4).
    pub compression_ratio_threshold: f32,
    /// Fall back when the average token log-probability is below this (-1).
    pub logprob_threshold: f32,
    /// Skip a window as silence when its no-speech probability exceeds this
    /// (0.6) and its average log-probability is below `logprob_threshold`.
    pub no_speech_threshold: f32,
    /// Feed the previous text to the next window as a prompt.
    pub condition_on_previous_text: bool,
    /// Timestamp tokens and timed segments (false: one segment per window).
    pub timestamps: bool,
    /// Text before the first window (NULL: none): names, spelling, style.
    pub initial_prompt: *const c_char,
    /// Tokens per window at most (0: half the text context, 224).
    pub max_tokens_per_window: i32,
    /// Seed of the draws at temperatures above 0.
    pub seed: u64,
}

/// The struct as read from C memory: `bool` bytes and the enum read as
/// integers so that no bit pattern a C caller can store is undefined on the
/// Rust side.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawTranscribeOptions {
    language: *const c_char,
    task: i32,
    beam_size: i32,
    best_of: i32,
    temperature: f32,
    temperature_increment: f32,
    compression_ratio_threshold: f32,
    logprob_threshold: f32,
    no_speech_threshold: f32,
    condition_on_previous_text: u8,
    timestamps: u8,
    initial_prompt: *const c_char,
    max_tokens_per_window: i32,
    seed: u64,
}
const _: () = assert!(size_of::<RawTranscribeOptions>() == size_of::<combs_transcribe_options>());
const _: () = assert!(size_of::<combs_task>() == size_of::<i32>());

/// One final segment, passed to a `combs_segment_callback`. Every pointer
/// in it is valid only during the callback.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_segment {
    /// The text, UTF-8, NUL-terminated (usually with a leading space).
    pub text: *const c_char,
    /// Bytes of `text` (NUL not counted).
    pub text_len: usize,
    /// Start in seconds from the start of the audio.
    pub t0: f64,
    /// End in seconds.
    pub t1: f64,
    /// The segment's tokens, timestamp tokens included.
    pub tokens: *const combs_token,
    /// Number of `tokens`.
    pub n_tokens: usize,
    /// Average log-probability of its window's tokens.
    pub avg_logprob: f32,
    /// Probability that its window holds no speech.
    pub no_speech_prob: f32,
    /// Temperature its window was decoded at.
    pub temperature: f32,
    /// zlib compression ratio of its window's text.
    pub compression_ratio: f32,
    /// The language, by code (`"en"`), NUL-terminated.
    pub language: *const c_char,
}

/// Receives each segment as it becomes final; return 0 to go on, anything
/// else to stop transcribing (`combs_transcribe()` then returns `COMBS_OK`).
/// The callback must not unwind (no C++ exception, no longjmp) through combs.
pub type combs_segment_callback =
    Option<unsafe extern "C" fn(seg: *const combs_segment, user_data: *mut c_void) -> i32>;

/// openai-whisper's `transcribe()` defaults: greedy at temperature 0 with
/// fallback by 0.2 up to 1.0, one sample per fallback, thresholds 2.4 / -1 / 0.6, previous text as
/// prompt, timestamps on, language detected.
#[unsafe(no_mangle)]
pub extern "C" fn combs_transcribe_default_options() -> combs_transcribe_options {
    let d = TranscribeOptions::default();
    let o = combs_transcribe_options {
        language: std::ptr::null(),
        task: combs_task::COMBS_TASK_TRANSCRIBE,
        beam_size: d.beam_size as i32,
        best_of: d.best_of as i32,
        temperature: 0.0,
        temperature_increment: 0.2,
        compression_ratio_threshold: d.compression_ratio_threshold.unwrap_or(f32::NAN),
        logprob_threshold: d.logprob_threshold.unwrap_or(f32::NAN),
        no_speech_threshold: d.no_speech_threshold.unwrap_or(f32::NAN),
        condition_on_previous_text: d.condition_on_previous_text,
        timestamps: d.timestamps,
        initial_prompt: std::ptr::null(),
        max_tokens_per_window: 0,
        seed: 0,
    };
    guard_const("combs_transcribe_default_options", o)
}

/// A C threshold: NAN is off.
fn threshold(v: f32) -> Option<f32> {
    (!v.is_nan()).then_some(v)
}

/// A positive count field.
fn count(v: i32, name: &'static str) -> FfiResult<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(name, format!("{v} is not a positive count")))
}

/// The Rust options of a C options struct.
///
/// # Safety
/// The strings in `o` are NULL or NUL-terminated.
unsafe fn convert(o: &RawTranscribeOptions) -> FfiResult<TranscribeOptions> {
    let text = |p: *const c_char, name: &'static str| -> FfiResult<Option<String>> {
        if p.is_null() {
            return Ok(None);
        }
        // SAFETY: non-NULL and NUL-terminated per the caller's contract.
        let s = unsafe { c_str(p, name) }?;
        Ok(Some(utf8(s.to_bytes(), name)?.to_string()))
    };
    let language = text(o.language, "language")?.filter(|l| !l.eq_ignore_ascii_case("auto"));
    let task = c_enum(
        o.task,
        &[Task::Transcribe, Task::Translate],
        "task",
        "combs_task (0: transcribe, 1: translate)",
    )?;
    if !(o.temperature.is_finite() && o.temperature >= 0.0) {
        return Err(invalid(
            "temperature",
            format!("{} is negative or not finite", o.temperature),
        ));
    }
    if !(o.temperature_increment.is_finite() && o.temperature_increment >= 0.0) {
        return Err(invalid(
            "temperature_increment",
            format!("{} is negative or not finite", o.temperature_increment),
        ));
    }
    let max_tokens = match o.max_tokens_per_window {
        0 => None,
        n => Some(count(n, "max_tokens_per_window")?),
    };
    let opts = TranscribeOptions {
        language,
        task,
        beam_size: count(o.beam_size, "beam_size")?,
        best_of: count(o.best_of, "best_of")?,
        temperatures: temperature_schedule(o.temperature, o.temperature_increment),
        compression_ratio_threshold: threshold(o.compression_ratio_threshold),
        logprob_threshold: threshold(o.logprob_threshold),
        no_speech_threshold: threshold(o.no_speech_threshold),
        condition_on_previous_text: o.condition_on_previous_text != 0,
        timestamps: o.timestamps != 0,
        initial_prompt: text(o.initial_prompt, "initial_prompt")?,
        max_tokens_per_window: max_tokens,
        seed: o.seed,
        ..TranscribeOptions::default()
    };
    opts.validate()?;
    Ok(opts)
}

/// The C defaults as the raw struct.
fn raw_defaults(d: &combs_transcribe_options) -> RawTranscribeOptions {
    RawTranscribeOptions {
        language: d.language,
        task: d.task as i32,
        beam_size: d.beam_size,
        best_of: d.best_of,
        temperature: d.temperature,
        temperature_increment: d.temperature_increment,
        compression_ratio_threshold: d.compression_ratio_threshold,
        logprob_threshold: d.logprob_threshold,
        no_speech_threshold: d.no_speech_threshold,
        condition_on_previous_text: u8::from(d.condition_on_previous_text),
        timestamps: u8::from(d.timestamps),
        initial_prompt: d.initial_prompt,
        max_tokens_per_window: d.max_tokens_per_window,
        seed: d.seed,
    }
}

/// Hands segments to the C callback.
struct CallbackSink {
    cb: combs_segment_callback,
    user_data: *mut c_void,
    language: CString,
}

impl SegmentSink for CallbackSink {
    fn language(&mut self, code: &str, _prob: Option<f32>) {
        self.language = CString::new(code).unwrap_or_default();
    }

    fn segment(&mut self, s: &Segment) -> bool {
        let Some(f) = self.cb else {
            return true;
        };
        // Interior NULs cannot come from UTF-8 token text but are dropped
        // rather than trusted.
        let text = CString::new(s.text.replace('\0', "")).unwrap_or_default();
        let tokens: Vec<combs_token> = s.tokens.iter().map(|&t| t as combs_token).collect();
        let seg = combs_segment {
            text: text.as_ptr(),
            text_len: text.as_bytes().len(),
            t0: s.t0,
            t1: s.t1,
            tokens: tokens.as_ptr(),
            n_tokens: tokens.len(),
            avg_logprob: s.avg_logprob,
            no_speech_prob: s.no_speech_prob,
            temperature: s.temperature,
            compression_ratio: s.compression_ratio,
            language: self.language.as_ptr(),
        };
        // SAFETY: f is a valid callback per combs_transcribe's contract; seg
        // and what it points to outlive the call.
        unsafe { f(&seg, self.user_data) == 0 }
    }
}

/// Transcribes `n_samples` mono samples at `sample_rate` Hz (resampled to
/// 16 kHz inside; values nominally in [-1, 1]) with `m`, passing each
/// segment to `cb` (NULL: none) as soon as it is final. `opts` may be NULL
/// for the defaults. A non-zero return from `cb` stops transcription and
/// the call returns `COMBS_OK`.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `m`, NULL `pcm` with samples, no
/// samples, a NaN or infinite sample, `sample_rate` 0 or above 384 kHz,
/// options out of range (beam size or best-of below 1, a negative
/// temperature, a language the model does not know, translation with an
/// English-only model); `COMBS_ERR_OUT_OF_MEMORY`, `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `m` is NULL or a live speech model; `pcm` is NULL or valid for
/// `n_samples` reads; `opts` is NULL or points to a
/// `combs_transcribe_options` whose strings are NULL or NUL-terminated;
/// `cb` is NULL or a function as `combs_segment_callback` describes;
/// `user_data` is passed through untouched.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_transcribe(
    m: *const combs_speech_model,
    pcm: *const f32,
    n_samples: usize,
    sample_rate: u32,
    opts: *const combs_transcribe_options,
    cb: combs_segment_callback,
    user_data: *mut c_void,
) -> combs_status {
    guard("combs_transcribe", || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        // SAFETY: per this function's contract.
        let pcm = unsafe { array(pcm, n_samples, "pcm") }?;
        // SAFETY: opts is NULL or a combs_transcribe_options, whose layout
        // RawTranscribeOptions mirrors.
        let raw = unsafe { opts.cast::<RawTranscribeOptions>().as_ref() }
            .copied()
            .unwrap_or_else(|| raw_defaults(&combs_transcribe_default_options()));
        // SAFETY: the strings in raw are NULL or NUL-terminated per the contract.
        let opts = unsafe { convert(&raw) }?;
        let samples = crate::audio::prepare(pcm, 1, sample_rate)?;
        let mut sink = CallbackSink {
            cb,
            user_data,
            language: CString::default(),
        };
        transcribe(m.model.as_ref(), &samples, &opts, &mut sink)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;
    use std::sync::Arc;

    use super::*;
    use crate::ffi::guard::last_error_ptr;
    use crate::runtime::transcribe::mock::{MockModel, favour, word};

    const TB: u32 = 50363;

    /// Says " hello" from 0 to 1 s in every window, then ends.
    fn model() -> combs_speech_model {
        let m = MockModel::new(
            51864,
            Box::new(|_, seq| {
                let at = seq
                    .iter()
                    .rposition(|&t| (50257..TB).contains(&t))
                    .map_or(0, |i| i + 1);
                let tok = match seq.len() - at {
                    0 => TB,
                    1 => word(0),
                    2 => TB + 50,
                    _ => 50256,
                };
                favour(51864, &[(tok, 10.0)])
            }),
        );
        combs_speech_model { model: Arc::new(m) }
    }

    fn last_error() -> String {
        // SAFETY: this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[derive(Default)]
    struct Seen {
        texts: Vec<String>,
        spans: Vec<(f64, f64)>,
        tokens: Vec<Vec<i32>>,
        language: String,
        stop_after: usize,
    }

    unsafe extern "C" fn collect(seg: *const combs_segment, user: *mut c_void) -> i32 {
        // SAFETY: combs passes a valid segment and our Seen.
        let (seg, seen) = unsafe { (&*seg, &mut *user.cast::<Seen>()) };
        // SAFETY: valid during the callback, per the contract under test.
        let text = unsafe { CStr::from_ptr(seg.text) }
            .to_string_lossy()
            .into_owned();
        assert_eq!(text.len(), seg.text_len);
        // SAFETY: as above.
        let tokens = unsafe { std::slice::from_raw_parts(seg.tokens, seg.n_tokens) }.to_vec();
        // SAFETY: as above.
        seen.language = unsafe { CStr::from_ptr(seg.language) }
            .to_string_lossy()
            .into_owned();
        seen.texts.push(text);
        seen.spans.push((seg.t0, seg.t1));
        seen.tokens.push(tokens);
        i32::from(seen.texts.len() >= seen.stop_after)
    }

    fn run(
        m: *const combs_speech_model,
        pcm: &[f32],
        rate: u32,
        opts: Option<&combs_transcribe_options>,
        seen: &mut Seen,
    ) -> combs_status {
        let o = opts.map_or(std::ptr::null(), std::ptr::from_ref);
        // SAFETY: valid pointers, lengths and callback.
        unsafe {
            combs_transcribe(
                m,
                pcm.as_ptr(),
                pcm.len(),
                rate,
                o,
                Some(collect),
                std::ptr::from_mut(seen).cast(),
            )
        }
    }

    fn noise(n: usize) -> Vec<f32> {
        let mut rng = crate::runtime::rng::Rng::new(n as u64);
        (0..n)
            .map(|_| (rng.next_f64() as f32 - 0.5) * 0.2)
            .collect()
    }

    #[test]
    fn transcribe_delivers_segments_and_stops_on_nonzero() {
        let m = model();
        // 45 s at 8 kHz: two windows, each " hello" at its start.
        let pcm = noise(8000 * 45);
        let mut seen = Seen {
            stop_after: usize::MAX,
            ..Default::default()
        };
        assert_eq!(
            run(&m, &pcm, 8000, None, &mut seen),
            combs_status::COMBS_OK,
            "{}",
            last_error()
        );
        assert_eq!(seen.texts, vec![" hello", " hello"]);
        assert_eq!(seen.spans, vec![(0.0, 1.0), (30.0, 31.0)]);
        assert_eq!(
            seen.tokens[0],
            vec![TB as i32, word(0) as i32, (TB + 50) as i32]
        );
        assert_eq!(seen.language, "en");
        let mut seen = Seen {
            stop_after: 1,
            ..Default::default()
        };
        assert_eq!(run(&m, &pcm, 8000, None, &mut seen), combs_status::COMBS_OK);
        assert_eq!(seen.texts.len(), 1);
    }

    #[test]
    fn transcribe_bad_input_is_invalid_argument() {
        use combs_status::COMBS_ERR_INVALID_ARGUMENT as INVALID;
        let m = model();
        let pcm = noise(16000);
        let mut seen = Seen::default();
        let check = |got: combs_status, text: &str| {
            let msg = last_error();
            assert_eq!(got, INVALID, "{msg}");
            assert!(
                msg.starts_with("combs_transcribe: ") && msg.contains(text),
                "`{msg}` lacks `{text}`"
            );
        };
        check(run(std::ptr::null(), &pcm, 16000, None, &mut seen), "`m`");
        check(run(&m, &[], 16000, None, &mut seen), "empty");
        check(
            run(&m, &[0.0, f32::NAN, 0.0], 16000, None, &mut seen),
            "NaN",
        );
        check(
            run(&m, &[0.0, f32::INFINITY], 16000, None, &mut seen),
            "inf",
        );
        check(run(&m, &pcm, 0, None, &mut seen), "sample_rate");
        check(run(&m, &pcm, 100_000_000, None, &mut seen), "sample_rate");
        // SAFETY: NULL pcm with samples promised must be refused, not read.
        let s = unsafe {
            combs_transcribe(
                &m,
                std::ptr::null(),
                10,
                16000,
                std::ptr::null(),
                None,
                std::ptr::null_mut(),
            )
        };
        check(s, "pcm");
        let d = combs_transcribe_default_options();
        let lang = c"klingon";
        let bad = [
            (combs_transcribe_options { beam_size: 0, ..d }, "beam_size"),
            (combs_transcribe_options { best_of: -3, ..d }, "best_of"),
            (
                combs_transcribe_options {
                    temperature: -0.5,
                    ..d
                },
                "temperature",
            ),
            (
                combs_transcribe_options {
                    temperature: f32::NAN,
                    ..d
                },
                "temperature",
            ),
            (
                combs_transcribe_options {
                    max_tokens_per_window: -1,
                    ..d
                },
                "max_tokens_per_window",
            ),
            (
                combs_transcribe_options {
                    language: lang.as_ptr(),
                    ..d
                },
                "klingon",
            ),
            (
                combs_transcribe_options {
                    task: combs_task::COMBS_TASK_TRANSLATE,
                    ..d
                },
                "translate",
            ),
        ];
        for (o, text) in bad {
            check(run(&m, &pcm, 16000, Some(&o), &mut seen), text);
        }
        // A task value outside the enum, as C may store it.
        let mut raw = raw_defaults(&d);
        raw.task = 7;
        let o: *const combs_transcribe_options = std::ptr::from_ref(&raw).cast();
        // SAFETY: the raw struct has the options' layout.
        let s = unsafe {
            combs_transcribe(
                &m,
                pcm.as_ptr(),
                pcm.len(),
                16000,
                o,
                None,
                std::ptr::null_mut(),
            )
        };
        check(s, "combs_task");
        assert!(seen.texts.is_empty());
    }

    #[test]
    fn default_options_match_rust_defaults() {
        let d = combs_transcribe_default_options();
        // SAFETY: default strings are NULL.
        let o = unsafe { convert(&raw_defaults(&d)) }.expect("defaults convert");
        let r = TranscribeOptions::default();
        assert_eq!(o.temperatures, r.temperatures);
        assert_eq!(o.logprob_threshold, r.logprob_threshold);
        assert_eq!(o.beam_size, 1);
        assert!(o.language.is_none() && o.timestamps && o.condition_on_previous_text);
    }
}
