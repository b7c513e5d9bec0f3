//! The transcription loop on a scripted model: each test's logits make the
//! expected behaviour of openai-whisper's `transcribe()` unambiguous
//! (timestamps and seek, prompts, fallback, no-speech, beam search,
//! language detection, stopping, bad input).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::mock::{MockModel, favour, word};
use super::*;

const EN: usize = 51864;
const ML: usize = 51865;

/// The tokens after the start-of-transcript sequence (after the last id in
/// `sot..timestamp_begin`), given the vocabulary size.
fn sampled(seq: &[u32], n_vocab: usize) -> &[u32] {
    let (sot, tb) = if n_vocab > EN {
        (50258, 50364)
    } else {
        (50257, 50363)
    };
    let at = seq
        .iter()
        .rposition(|&t| (sot..tb).contains(&t))
        .map_or(0, |i| i + 1);
    &seq[at..]
}

fn run(model: &MockModel, content: usize, opts: &TranscribeOptions) -> Result<Transcript> {
    let mel = MockModel::mel(content);
    transcribe_mel(model, &mel, content, opts, &mut |_: &Segment| true)
}

const TB: u32 = 50363;
const EOT: u32 = 50256;

#[test]
fn greedy_one_window_timestamps_and_text() {
    let model = MockModel::new(
        EN,
        Box::new(|_, seq| match sampled(seq, EN).len() {
            0 => favour(EN, &[(TB, 10.0)]),
            // " (" is a non-speech token: suppressed although most likely.
            1 => favour(EN, &[(word(5), 12.0), (word(0), 10.0)]),
            2 => favour(EN, &[(word(1), 10.0)]),
            3 => favour(EN, &[(TB + 100, 10.0)]),
            _ => favour(EN, &[(EOT, 10.0)]),
        }),
    );
    let t = run(&model, 1000, &TranscribeOptions::default()).expect("transcribe");
    assert_eq!(t.segments.len(), 1);
    let s = &t.segments[0];
    assert_eq!(s.text, " hello world");
    assert_eq!(s.tokens, vec![TB, word(0), word(1), TB + 100]);
    assert!((s.t0 - 0.0).abs() < 1e-9 && (s.t1 - 2.0).abs() < 1e-9);
    assert!(
        s.avg_logprob > -0.01 && s.avg_logprob <= 0.0,
        "{}",
        s.avg_logprob
    );
    assert!(s.no_speech_prob < 1e-3);
    assert_eq!(s.temperature, 0.0);
    assert_eq!(t.text, " hello world");
    assert_eq!(t.language, "en");
    assert_eq!(*model.encoded.lock().expect("lock"), vec![0.0]);
}

/// Two windows: the first ends inside an unfinished segment, so the second
/// starts at the last timestamp (10 s) and gets the first's tokens as prompt.
fn two_window_model() -> MockModel {
    MockModel::new(
        EN,
        Box::new(|key, seq| {
            let s = sampled(seq, EN);
            let script: &[u32] = if key == 0.0 {
                &[
                    TB,
                    word(0),
                    TB + 250,
                    TB + 250,
                    word(1),
                    TB + 500,
                    TB + 500,
                    word(2),
                ]
            } else {
                &[TB, word(6), TB + 150]
            };
            favour(EN, &[(script.get(s.len()).copied().unwrap_or(EOT), 10.0)])
        }),
    )
}

#[test]
fn long_audio_seeks_to_last_timestamp_with_prompt() {
    let model = two_window_model();
    let t = run(&model, 4000, &TranscribeOptions::default()).expect("transcribe");
    let spans: Vec<(f64, f64, &str)> = t
        .segments
        .iter()
        .map(|s| (s.t0, s.t1, s.text.as_str()))
        .collect();
    let want = [
        (0.0, 5.0, " hello"),
        (5.0, 10.0, " world"),
        (10.0, 13.0, " again"),
    ];
    assert_eq!(spans.len(), want.len(), "{spans:?}");
    for (g, w) in spans.iter().zip(want) {
        assert!(
            (g.0 - w.0).abs() < 1e-9 && (g.1 - w.1).abs() < 1e-9 && g.2 == w.2,
            "{spans:?}"
        );
    }
    assert_eq!(*model.encoded.lock().expect("lock"), vec![0.0, 1000.0]);
    // The second window's prompt: <|startofprev|>, the first window's
    // segment tokens (timestamps included), then <|startoftranscript|>.
    let firsts = model.first_inputs.lock().expect("lock").clone();
    let want_prompt = [
        vec![50360],
        vec![TB, word(0), TB + 250, TB + 250, word(1), TB + 500],
        vec![50257],
    ]
    .concat();
    assert_eq!(firsts[1], want_prompt);
    assert_eq!(t.text, " hello world again");
}

#[test]
fn no_condition_on_previous_text_means_no_prompt() {
    let model = two_window_model();
    let opts = TranscribeOptions {
        condition_on_previous_text: false,
        ..Default::default()
    };
    let t = run(&model, 4000, &opts).expect("transcribe");
    assert_eq!(t.segments.len(), 3);
    let firsts = model.first_inputs.lock().expect("lock").clone();
    assert_eq!(firsts[1], vec![50257]);
}

#[test]
fn initial_prompt_is_encoded_after_startofprev() {
    let model = two_window_model();
    let opts = TranscribeOptions {
        initial_prompt: Some("  hello world ".into()),
        ..Default::default()
    };
    let t = run(&model, 4000, &opts).expect("transcribe");
    let firsts = model.first_inputs.lock().expect("lock").clone();
    assert_eq!(firsts[0], vec![50360, word(0), word(1), 50257]);
    // The prompt is not part of the text.
    assert_eq!(t.text, " hello world again");
}

#[test]
fn segment_callback_false_stops() {
    let model = two_window_model();
    let mel = MockModel::mel(4000);
    let mut seen = 0;
    let t = transcribe_mel(
        &model,
        &mel,
        4000,
        &TranscribeOptions::default(),
        &mut |_: &Segment| {
            seen += 1;
            false
        },
    )
    .expect("transcribe");
    assert!(t.stopped);
    assert_eq!(seen, 1);
    assert_eq!(t.segments.len(), 1);
    assert_eq!(model.encoded.lock().expect("lock").len(), 1);
}

#[test]
fn temperature_fallback_on_repetitive_text() {
    // Attempts 0 and 1 repeat " the" (compression ratio far above 2.4);
    // attempt 2 (temperature 0.4) says " hello".
    let attempt = Arc::new(AtomicUsize::new(0));
    let a = attempt.clone();
    let model = MockModel::new(
        EN,
        Box::new(move |_, seq| {
            let s = sampled(seq, EN);
            if seq.last() == Some(&50257) {
                a.fetch_add(1, Ordering::Relaxed);
            }
            let n = a.load(Ordering::Relaxed);
            let tok = if n <= 2 {
                if s.len() < 60 { word(2) } else { EOT }
            } else if s.is_empty() {
                word(0)
            } else {
                EOT
            };
            favour(EN, &[(tok, 10.0)])
        }),
    );
    let opts = TranscribeOptions {
        timestamps: false,
        ..Default::default()
    };
    let t = run(&model, 1000, &opts).expect("transcribe");
    assert_eq!(attempt.load(Ordering::Relaxed), 3);
    assert_eq!(t.stats.n_fallbacks, 2);
    assert_eq!(t.segments.len(), 1);
    assert_eq!(t.segments[0].text, " hello");
    assert!((t.segments[0].temperature - 0.4).abs() < 1e-6);
    // Without timestamps a segment spans its window's audio.
    assert!((t.segments[0].t1 - 10.0).abs() < 1e-9);
    // All temperatures failing: the last result is kept.
    let model = MockModel::new(
        EN,
        Box::new(|_, seq| {
            let n = sampled(seq, EN).len();
            favour(EN, &[(if n < 60 { word(2) } else { EOT }, 10.0)])
        }),
    );
    let t = run(&model, 1000, &opts).expect("transcribe");
    assert_eq!(t.stats.n_fallbacks, 5);
    assert!((t.segments[0].temperature - 1.0).abs() < 1e-6);
    assert!(t.segments[0].compression_ratio > 2.4);
}

/// A model whose start-of-transcript position says "no speech" with
/// probability ~1, then text with logit `text_logit` over a flat rest.
fn no_speech_model(text_logit: f32) -> MockModel {
    MockModel::new(
        EN,
        Box::new(move |_, seq| {
            if seq.last() == Some(&50257) {
                return favour(EN, &[(50361, 30.0)]);
            }
            let n = sampled(seq, EN).len();
            let mut l = vec![0.0f32; EN];
            l[if n < 3 { word(0) } else { EOT } as usize] = text_logit;
            l
        }),
    )
}

#[test]
fn no_speech_window_skipped_unless_confident_text() {
    let opts = TranscribeOptions {
        timestamps: false,
        ..Default::default()
    };
    // Unlikely text (avg log-prob far below -1): silence, skipped, no fallback.
    let model = no_speech_model(1.0);
    let t = run(&model, 1000, &opts).expect("transcribe");
    assert!(t.segments.is_empty());
    assert_eq!(t.stats.n_fallbacks, 0);
    // Confident text: kept despite the no-speech probability.
    let model = no_speech_model(30.0);
    let t = run(&model, 1000, &opts).expect("transcribe");
    assert_eq!(t.segments.len(), 1);
    assert!(t.segments[0].no_speech_prob > 0.99);
}

/// " hello" (p 0.6) then three equally likely words, or " world" (p 0.4)
/// then " again" for sure: greedy takes the first, beam search the second.
fn beam_model() -> MockModel {
    MockModel::new(
        EN,
        Box::new(|_, seq| {
            let s = sampled(seq, EN);
            match s {
                [] => favour(EN, &[(word(0), 2.0), (word(1), 1.6)]),
                [h] if *h == word(0) => {
                    favour(EN, &[(word(2), 0.0), (word(6), 0.0), (word(7), 0.0)])
                }
                [w] if *w == word(1) => favour(EN, &[(word(6), 10.0)]),
                _ => favour(EN, &[(EOT, 10.0)]),
            }
        }),
    )
}

#[test]
fn beam_search_finds_likelier_sequence_than_greedy() {
    let greedy = TranscribeOptions {
        timestamps: false,
        ..Default::default()
    };
    let t = run(&beam_model(), 1000, &greedy).expect("greedy");
    assert_eq!(t.segments[0].text, " hello the");
    let beam = TranscribeOptions {
        beam_size: 5,
        ..greedy
    };
    let t = run(&beam_model(), 1000, &beam).expect("beam");
    assert_eq!(t.segments[0].text, " world again");
    // Sum of log-probabilities over tokens + 1 (end-of-text), from the
    // script's logits: " again" and end-of-text are near certain.
    let z = 2.0f32.exp() + 1.6f32.exp() + (EN as f32 - 2.0) * (-10.0f32).exp();
    let want = (1.6 - z.ln()) / 3.0;
    let got = t.segments[0].avg_logprob;
    assert!((got - want).abs() < 2e-3, "{got} vs {want}");
}

#[test]
fn multilingual_detects_language_and_uses_its_token() {
    let de = 50259 + 2;
    let model = MockModel::new(
        ML,
        Box::new(move |_, seq| {
            if seq == [50258] {
                return favour(ML, &[(de, 10.0), (50259, 8.0)]);
            }
            let s = sampled(seq, ML);
            let tok = match s.len() {
                0 => 50364,
                1 if seq.contains(&de) => word(0),
                1 => word(7),
                2 => 50364 + 50,
                _ => 50257,
            };
            favour(ML, &[(tok, 10.0)])
        }),
    );
    let t = run(&model, 1000, &TranscribeOptions::default()).expect("transcribe");
    assert_eq!(t.language, "de");
    assert!(
        t.language_prob
            .is_some_and(|p| (p - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-3)
    );
    assert_eq!(t.segments[0].text, " hello");
    // Detection reads the first window's states, which decoding reuses.
    assert_eq!(model.encoded.lock().expect("lock").len(), 1);
    // A given language skips detection.
    let opts = TranscribeOptions {
        language: Some("german".into()),
        ..Default::default()
    };
    let t = run(&model, 1000, &opts).expect("transcribe");
    assert_eq!(t.language, "de");
    assert_eq!(t.segments[0].text, " hello");
}

#[test]
fn bad_input_is_an_error() {
    let model = two_window_model();
    let d = TranscribeOptions::default();
    // No content.
    assert!(run(&model, 0, &d).is_err());
    // Features of another mel size.
    let mut mel = MockModel::mel(100);
    mel.n_mels = 3;
    let e = transcribe_mel(&model, &mel, 100, &d, &mut |_: &Segment| true).expect_err("shape");
    assert!(matches!(e, ModelError::Shape { .. }), "{e}");
    // English-only model: another language, translation.
    let e = run(
        &model,
        100,
        &TranscribeOptions {
            language: Some("de".into()),
            ..d.clone()
        },
    )
    .expect_err("language");
    assert!(
        matches!(
            e,
            ModelError::InvalidArgument {
                name: "language",
                ..
            }
        ),
        "{e}"
    );
    let e = run(
        &model,
        100,
        &TranscribeOptions {
            task: Task::Translate,
            ..d.clone()
        },
    )
    .expect_err("translate");
    assert!(
        matches!(e, ModelError::InvalidArgument { name: "task", .. }),
        "{e}"
    );
    // Options out of range.
    let e = run(
        &model,
        100,
        &TranscribeOptions {
            beam_size: 0,
            ..d.clone()
        },
    )
    .expect_err("beam");
    assert!(
        matches!(
            e,
            ModelError::InvalidArgument {
                name: "beam_size",
                ..
            }
        ),
        "{e}"
    );
    // Samples.
    assert!(check_samples(&[]).is_err());
    assert!(check_samples(&[0.0, f32::NAN]).is_err());
    assert!(check_samples(&[0.0, f32::INFINITY]).is_err());
    assert!(check_samples(&[0.0, 0.5]).is_ok());
    // Shorter than one frame.
    let e = transcribe(&model, &[0.1; 100], &d, &mut |_: &Segment| true).expect_err("short");
    assert!(
        matches!(e, ModelError::InvalidArgument { name: "pcm", .. }),
        "{e}"
    );
}
