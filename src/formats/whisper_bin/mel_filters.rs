//! The mel filterbank whisper.cpp files carry, computed as openai-whisper's
//! `assets/mel_filters.npz` holds it: `librosa.filters.mel(sr=16000,
//! n_fft=400, n_mels=n)`, Slaney mel scale and Slaney area normalization.
//! CTranslate2 directories do not store the filterbank, so the converter
//! computes it here. Follows librosa's arithmetic step by step (f64, the
//! triangle weights stored to f32 before the normalization multiplies them,
//! the product stored to f32 again) so the values match the npz's to the
//! last bit or so.

use crate::models::speech::{N_FFT, SAMPLE_RATE};

/// Hz per mel below 1 kHz on the Slaney scale.
const F_SP: f64 = 200.0 / 3.0;
/// Where the Slaney scale turns logarithmic.
const MIN_LOG_HZ: f64 = 1000.0;
const MIN_LOG_MEL: f64 = MIN_LOG_HZ / F_SP;

fn log_step() -> f64 {
    6.4f64.ln() / 27.0
}

/// `librosa.hz_to_mel(f, htk=False)`.
fn hz_to_mel(f: f64) -> f64 {
    if f >= MIN_LOG_HZ {
        MIN_LOG_MEL + (f / MIN_LOG_HZ).ln() / log_step()
    } else {
        f / F_SP
    }
}

/// `librosa.mel_to_hz(m, htk=False)`.
fn mel_to_hz(m: f64) -> f64 {
    if m >= MIN_LOG_MEL {
        MIN_LOG_HZ * (log_step() * (m - MIN_LOG_MEL)).exp()
    } else {
        F_SP * m
    }
}

/// `numpy.linspace(start, stop, num)`: `i * step + start`, the last value exactly `stop`.
fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    let step = (stop - start) / (num - 1) as f64;
    let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
    if let Some(last) = v.last_mut() {
        *last = stop;
    }
    v
}

/// The filterbank of `n_mels` bins (80, or 128 for large-v3): `n_mels` rows of
/// `N_FFT / 2 + 1` weights, row-major.
pub fn mel_filters(n_mels: usize) -> Vec<f32> {
    let n_bins = N_FFT / 2 + 1;
    let sr = f64::from(SAMPLE_RATE);
    // librosa.fft_frequencies: numpy.fft.rfftfreq(n_fft, 1/sr)
    let df = 1.0 / (N_FFT as f64 * (1.0 / sr));
    let fft_freqs: Vec<f64> = (0..n_bins).map(|k| k as f64 * df).collect();
    let mel_f: Vec<f64> = linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), n_mels + 2)
        .into_iter()
        .map(mel_to_hz)
        .collect();
    let mut out = vec![0f32; n_mels * n_bins];
    for (i, row) in out.chunks_exact_mut(n_bins).enumerate() {
        let (lo, mid, hi) = (mel_f[i], mel_f[i + 1], mel_f[i + 2]);
        let enorm = 2.0 / (hi - lo);
        for (w, &f) in row.iter_mut().zip(&fft_freqs) {
            let lower = -(lo - f) / (mid - lo);
            let upper = (hi - f) / (hi - mid);
            let tri = 0f64.max(lower.min(upper)) as f32;
            *w = (f64::from(tri) * enorm) as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mel_filters_rows_are_normalized_triangles() {
        let f = mel_filters(80);
        let n_bins = N_FFT / 2 + 1;
        assert_eq!(f.len(), 80 * n_bins);
        for row in f.chunks_exact(n_bins) {
            // one contiguous run of positive weights, rising then falling
            let nz: Vec<usize> = (0..n_bins).filter(|&k| row[k] > 0.0).collect();
            let (first, last) = (nz[0], nz[nz.len() - 1]);
            assert_eq!(nz.len(), last - first + 1);
            let peak = (first..=last)
                .max_by(|&a, &b| row[a].total_cmp(&row[b]))
                .unwrap_or(first);
            assert!((first..peak).all(|k| row[k] <= row[k + 1]));
            assert!((peak..last).all(|k| row[k] >= row[k + 1]));
        }
    }
}
