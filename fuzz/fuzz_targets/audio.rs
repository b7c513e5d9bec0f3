//! Audio decoding (WAV, FLAC, MP3, Ogg Vorbis through symphonia) on
//! arbitrary bytes, then what a transcription does with the samples: mix
//! to mono, resample to 16 kHz, and the log-mel features of the first window.
#![no_main]

use combs::audio::{decode_bytes, log_mel, mix_to_mono, resample};
use combs::formats::whisper_bin::mel_filters;

/// libFuzzer's panic hook aborts on every panic, even one the code under
/// test catches. `decode_bytes` contains panics inside the decoder crates
/// (symphonia-format-riff 0.6.1 overflows a shift on a crafted WAV chunk,
/// which this build's overflow checks turn into a panic: the regression
/// input is tests/fixtures/fuzz/audio-riff-shift-overflow.wav), so those
/// are let through to its `catch_unwind`; any other panic still aborts.
fn contain_decoder_panics() {
    let fuzzer_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_decoder = info
            .location()
            .is_some_and(|l| l.file().contains("/symphonia-"));
        if !in_decoder {
            fuzzer_hook(info);
        }
    }));
}

libfuzzer_sys::fuzz_target!(init: contain_decoder_panics(), |data: &[u8]| {
    let Ok(audio) = decode_bytes(data) else {
        return;
    };
    let Ok(mono) = mix_to_mono(&audio.samples, audio.channels) else {
        return;
    };
    // Thirty seconds at most: the features of one window are what is fuzzed.
    let head = &mono[..mono.len().min(audio.sample_rate as usize * 30)];
    let Ok(pcm) = resample(head, audio.sample_rate, 16_000) else {
        return;
    };
    let n_mels = 80;
    if let Ok(mel) = log_mel(&pcm, &mel_filters(n_mels), n_mels, 0) {
        assert_eq!(mel.data.len(), mel.n_mels * mel.n_frames);
        assert!(mel.data.iter().all(|v| v.is_finite()), "finite features");
    }
});
