//! Whisper's log-mel spectrogram, computed the way openai-whisper and
//! faster-whisper compute it, so the encoder sees the features it was
//! trained on: a centered STFT over reflect-padded audio (`N_FFT` 400,
//! `HOP_LENGTH` 160, periodic Hann window), the power spectrum with the
//! last frame dropped (`stft[..., :-1]`), the model's mel filterbank, log10
//! clamped at 1e-10, floored at the global maximum minus 8, then
//! `(x + 4) / 4`.
//!
//! The two references differ only in how much silence they append before
//! the transform: faster-whisper 1.2.1 appends 160 samples
//! (`FeatureExtractor.__call__(padding=160)`) and uses the first
//! `n_samples / 160` frames, openai-whisper appends a whole window
//! (`log_mel_spectrogram(audio, padding=N_SAMPLES)`). Both are
//! [`log_mel`]'s `pad_samples`.

use std::sync::Arc;

use rayon::prelude::*;
use realfft::RealFftPlanner;
use realfft::RealToComplex;

use crate::error::{ModelError, Result};
use crate::models::speech::{HOP_LENGTH, LogMel, N_FFT, N_FRAMES, SAMPLE_RATE};

/// Samples in one 30-second window (`CHUNK_SECONDS * SAMPLE_RATE`).
pub const N_SAMPLES: usize = N_FRAMES * HOP_LENGTH;

/// Frequency bins of one STFT frame (`N_FFT / 2 + 1`): the width of a mel
/// filterbank row.
pub const N_FREQS: usize = N_FFT / 2 + 1;

/// What faster-whisper 1.2.1 appends before its transform.
pub const FASTER_WHISPER_PAD: usize = HOP_LENGTH;

/// Frames that hold audio when `n_samples` samples are transformed: the
/// frames a decoder may seek over (openai-whisper's `content_frames`).
pub fn content_frames(n_samples: usize) -> usize {
    n_samples / HOP_LENGTH
}

/// Frames per rayon task: enough work to amortize a task and the FFT
/// scratch, small enough to spread 30 s (3000 frames) over a few cores.
const FRAMES_PER_TASK: usize = 128;

/// The log-mel spectrogram of `samples` (16 kHz mono) followed by
/// `pad_samples` zeros, with `n_mels` bins from `filters` (`n_mels` rows of
/// [`N_FREQS`] weights, the model file's filterbank).
///
/// The result has `(samples.len() + pad_samples) / HOP_LENGTH` frames; its
/// floor (maximum − 8) is taken over all of them, padding included, as the
/// references do.
///
/// # Errors
/// [`ModelError::InvalidArgument`] for empty or non-finite samples, a
/// filterbank of the wrong size or with non-finite weights, `n_mels` 0, or
/// audio too short to make one frame.
pub fn log_mel(
    samples: &[f32],
    filters: &[f32],
    n_mels: usize,
    pad_samples: usize,
) -> Result<LogMel> {
    validate_samples(samples)?;
    if n_mels == 0 {
        return Err(ModelError::invalid("n_mels", "must be at least 1"));
    }
    let filter_len = n_mels
        .checked_mul(N_FREQS)
        .ok_or_else(|| ModelError::invalid("n_mels", format!("{n_mels} is too large")))?;
    if filters.len() != filter_len {
        return Err(ModelError::invalid(
            "filters",
            format!(
                "{} weights for {n_mels} mel bins, expected {n_mels} x {N_FREQS} = {filter_len}",
                filters.len()
            ),
        ));
    }
    if filters.iter().any(|w| !w.is_finite()) {
        return Err(ModelError::invalid("filters", "holds a non-finite weight"));
    }
    let n_total = samples
        .len()
        .checked_add(pad_samples)
        .ok_or_else(|| ModelError::invalid("pad_samples", "audio plus padding overflows"))?;
    // The STFT has 1 + n_total / HOP frames; the last one is dropped.
    let n_frames = n_total / HOP_LENGTH;
    if n_frames == 0 {
        return Err(ModelError::invalid(
            "samples",
            format!(
                "{} samples with {pad_samples} of padding make no frame (at least {HOP_LENGTH} needed)",
                samples.len()
            ),
        ));
    }

    let bands = filter_bands(filters, n_mels);
    let fft = RealFftPlanner::<f32>::new().plan_fft_forward(N_FFT);
    let window = hann_window();

    // Frame-major log mel powers, filled in parallel blocks of frames.
    let mut power = vec![0.0f32; n_frames * n_mels];
    power
        .par_chunks_mut(FRAMES_PER_TASK * n_mels)
        .enumerate()
        .try_for_each(|(block, out)| {
            let first = block * FRAMES_PER_TASK;
            mel_power_block(samples, n_total, first, out, &fft, &window, &bands, filters)
        })?;

    // `power` holds log10 of the mel powers by now.
    let max_log = power
        .par_iter()
        .copied()
        .reduce(|| f32::NEG_INFINITY, f32::max);
    let floor = max_log - 8.0;

    // Mel-major, as the encoder reads it.
    let mut data = vec![0.0f32; n_mels * n_frames];
    data.par_chunks_mut(n_frames)
        .enumerate()
        .for_each(|(m, row)| {
            for (v, frame) in row.iter_mut().zip(power.chunks_exact(n_mels)) {
                *v = (frame[m].max(floor) + 4.0) / 4.0;
            }
        });
    Ok(LogMel {
        n_mels,
        n_frames,
        data,
    })
}

/// The `N_FRAMES`-frame window of `mel` that starts at `start_frame`,
/// zero-padded past the end (openai-whisper's `pad_or_trim`).
///
/// # Errors
/// [`ModelError::InvalidArgument`] when `start_frame` lies past the end.
pub fn window(mel: &LogMel, start_frame: usize) -> Result<LogMel> {
    window_content(mel, start_frame, N_FRAMES)
}

/// The decoders' window: at most `n_content` frames of `mel` from
/// `start_frame` (never past its end), zero-padded to `N_FRAMES`. The
/// references slice `mel[:, seek : seek + segment_size]` with
/// `segment_size = min(N_FRAMES, content_frames - seek)` and pad that, so
/// frames computed over the appended silence never reach the encoder.
///
/// # Errors
/// [`ModelError::InvalidArgument`] when `start_frame` lies past the end or
/// `mel` is malformed.
pub fn window_content(mel: &LogMel, start_frame: usize, n_content: usize) -> Result<LogMel> {
    if mel.data.len() != mel.n_mels * mel.n_frames {
        return Err(ModelError::invalid(
            "mel",
            format!(
                "{} values for {} x {} features",
                mel.data.len(),
                mel.n_mels,
                mel.n_frames
            ),
        ));
    }
    if start_frame > mel.n_frames {
        return Err(ModelError::invalid(
            "start_frame",
            format!("{start_frame} is past the last of {} frames", mel.n_frames),
        ));
    }
    let take = n_content.min(N_FRAMES).min(mel.n_frames - start_frame);
    let mut data = vec![0.0f32; mel.n_mels * N_FRAMES];
    for (m, row) in data.chunks_exact_mut(N_FRAMES).enumerate() {
        let src = m * mel.n_frames + start_frame;
        row[..take].copy_from_slice(&mel.data[src..src + take]);
    }
    Ok(LogMel {
        n_mels: mel.n_mels,
        n_frames: N_FRAMES,
        data,
    })
}

/// Refuses what the front end cannot transform: no samples, or a NaN or
/// infinity anywhere (it would spread through every FFT it touches).
///
/// # Errors
/// [`ModelError::InvalidArgument`] naming the first bad sample.
pub fn validate_samples(samples: &[f32]) -> Result<()> {
    if samples.is_empty() {
        return Err(ModelError::invalid("samples", "the audio is empty"));
    }
    if let Some(i) = samples.iter().position(|s| !s.is_finite()) {
        let secs = i as f64 / f64::from(SAMPLE_RATE);
        return Err(ModelError::invalid(
            "samples",
            format!("sample {i} (~{secs:.2} s at 16 kHz) is {}", samples[i]),
        ));
    }
    Ok(())
}

/// Each filter's nonzero bins `[lo, hi)`: a triangular mel filter spans a
/// few bins, so skipping its zeros makes the filterbank product ~40x
/// cheaper while summing exactly the same terms.
fn filter_bands(filters: &[f32], n_mels: usize) -> Vec<(usize, usize)> {
    (0..n_mels)
        .map(|m| {
            let row = &filters[m * N_FREQS..(m + 1) * N_FREQS];
            match row.iter().position(|&w| w != 0.0) {
                Some(lo) => {
                    let hi = N_FREQS - row.iter().rev().position(|&w| w != 0.0).unwrap_or(0);
                    (lo, hi)
                }
                None => (0, 0),
            }
        })
        .collect()
}

/// numpy's `hanning(N_FFT + 1)[:-1]` (periodic Hann), computed in f64 and
/// rounded to f32 as faster-whisper does.
fn hann_window() -> Vec<f32> {
    (0..N_FFT)
        .map(|i| {
            let x = 2.0 * std::f64::consts::PI * i as f64 / N_FFT as f64;
            (0.5 - 0.5 * x.cos()) as f32
        })
        .collect()
}

/// `log10(max(p, 1e-10))`, in f64 so the rounding is the one of the f32
/// result only.
fn log10_clamped(p: f32) -> f32 {
    f64::from(p.max(1e-10)).log10() as f32
}

/// Index into the audio of length `n` for position `i` of the signal
/// reflect-padded on both sides (numpy's `mode="reflect"`, which repeats
/// the reflection when the padding is longer than the signal).
fn reflect(i: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let j = i.rem_euclid(period);
    if j < n as isize {
        j as usize
    } else {
        (period - j) as usize
    }
}

/// log10 of the mel powers, clamped at 1e-10 (frame-major, `out.len() /
/// n_mels` frames), for the frames starting at `first`.
#[allow(clippy::too_many_arguments)]
fn mel_power_block(
    samples: &[f32],
    n_total: usize,
    first: usize,
    out: &mut [f32],
    fft: &Arc<dyn RealToComplex<f32>>,
    window: &[f32],
    bands: &[(usize, usize)],
    filters: &[f32],
) -> Result<()> {
    let n_mels = bands.len();
    let mut frame = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let mut power = vec![0.0f32; N_FREQS];
    let half = (N_FFT / 2) as isize;
    for (k, mel_out) in out.chunks_exact_mut(n_mels).enumerate() {
        let start = ((first + k) * HOP_LENGTH) as isize - half;
        let interior = start >= 0 && start as usize + N_FFT <= samples.len();
        if interior {
            let s = start as usize;
            for ((f, &x), &w) in frame.iter_mut().zip(&samples[s..s + N_FFT]).zip(window) {
                *f = x * w;
            }
        } else {
            for (j, (f, &w)) in frame.iter_mut().zip(window).enumerate() {
                let idx = reflect(start + j as isize, n_total);
                *f = samples.get(idx).copied().unwrap_or(0.0) * w;
            }
        }
        fft.process_with_scratch(&mut frame, &mut spectrum, &mut scratch)
            .map_err(|e| ModelError::Internal(format!("STFT frame: {e}")))?;
        for (p, c) in power.iter_mut().zip(&spectrum) {
            // numpy's `np.abs(c) ** 2` goes through hypot; re² + im²
            // differs from it by an ulp, far below the 1e-3 the features are
            // held to, at a fraction of the cost.
            *p = c.re * c.re + c.im * c.im;
        }
        for (m, (v, &(lo, hi))) in mel_out.iter_mut().zip(bands).enumerate() {
            let row = &filters[m * N_FREQS + lo..m * N_FREQS + hi];
            let mut acc = 0.0f64;
            for (&w, &p) in row.iter().zip(&power[lo..hi]) {
                acc += f64::from(w) * f64::from(p);
            }
            *v = log10_clamped(acc as f32);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_numpy() {
        // list(np.pad(np.arange(4), 6, mode="reflect")), printed by numpy 2.4
        let want = [0, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2, 3];
        let got: Vec<usize> = (-6..10).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn window_pads_and_trims() {
        let n_frames = 40;
        let data: Vec<f32> = (0..2 * n_frames).map(|i| i as f32 + 1.0).collect();
        let mel = LogMel {
            n_mels: 2,
            n_frames,
            data,
        };
        let w = window_content(&mel, 30, 5).unwrap();
        assert_eq!(w.data.len(), 2 * N_FRAMES);
        assert_eq!(&w.data[..6], &[31.0, 32.0, 33.0, 34.0, 35.0, 0.0]);
        assert_eq!(
            &w.data[N_FRAMES..N_FRAMES + 6],
            &[71.0, 72.0, 73.0, 74.0, 75.0, 0.0]
        );
        let w = window(&mel, 38).unwrap();
        assert_eq!(&w.data[..3], &[39.0, 40.0, 0.0]);
        assert!(window(&mel, 41).is_err());
    }
}
