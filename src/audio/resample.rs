//! Sample-rate conversion to Whisper's 16 kHz, by rubato's synchronous FFT
//! resampler: a fixed integer ratio (the rates' gcd) with a windowed-sinc
//! anti-aliasing filter applied in the frequency domain. It is exact for
//! any pair of integer rates, needs no quality knobs, and its passband
//! reaches close to Nyquist as ffmpeg's default `swr` filter (what
//! faster-whisper's PyAV and openai-whisper's ffmpeg run) does; see
//! [`FFT_CHUNK`] for the one setting.

use rubato::audioadapter_buffers::direct::{SequentialSlice, SequentialSliceOfVecs};
use rubato::{Fft, FixedSync, Resampler};

use crate::error::{ModelError, Result};

/// Highest sample rate accepted: anything above is a caller's mistake (a
/// byte count or a sample count passed as the rate), not audio.
pub const MAX_SAMPLE_RATE: u32 = 1_000_000;

/// Largest sample magnitude resampled. Audio is nominally within ±1; far
/// past that, the FFT's sums overflow f32 to infinity, and rubato panics on
/// the NaN that follows (its real FFT checks the spectrum's first value).
pub const MAX_SAMPLE_MAGNITUDE: f32 = 1.0e6;

/// Input frames per FFT block, rounded up by rubato to a multiple of
/// `rate_in / gcd`. Longer blocks mean a longer sinc filter and a sharper
/// cutoff: at 4096 the 44.1 kHz -> 16 kHz filter keeps the passband flat to
/// ~7.8 kHz, within a few hundred hertz of ffmpeg's `swr` default (cutoff
/// 0.97 of Nyquist), and resamples 30 s in a few milliseconds.
pub const FFT_CHUNK: usize = 4096;

/// Input frames per FFT block: an even number of `from / gcd` units near
/// [`FFT_CHUNK`], so both the input and the output block are even. rubato
/// removes a delay of `output block / 2` samples, exact only then: an odd
/// block leaves the result half a sample late (96 kHz -> 16 kHz, or
/// 16001 Hz -> 16 kHz, at the plain chunk).
fn block_frames(from: u32, to: u32) -> usize {
    let g = gcd(from, to) as usize;
    let unit_in = from as usize / g;
    FFT_CHUNK.div_ceil(unit_in).next_multiple_of(2) * unit_in
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Refuses a sample rate of 0 or above [`MAX_SAMPLE_RATE`].
///
/// # Errors
/// [`ModelError::InvalidArgument`] naming `sample_rate`.
pub fn validate_rate(sample_rate: u32) -> Result<()> {
    if sample_rate == 0 {
        return Err(ModelError::invalid("sample_rate", "0 Hz"));
    }
    if sample_rate > MAX_SAMPLE_RATE {
        return Err(ModelError::invalid(
            "sample_rate",
            format!("{sample_rate} Hz is above the {MAX_SAMPLE_RATE} Hz accepted"),
        ));
    }
    Ok(())
}

/// `samples` (mono) at `from` Hz resampled to `to` Hz. The output has
/// `ceil(len * to / from)` samples, aligned with the input (the filter's
/// delay is removed). Equal rates return a copy.
///
/// # Errors
/// [`ModelError::InvalidArgument`] for a rate out of range, or a sample
/// that is NaN, infinite or above [`MAX_SAMPLE_MAGNITUDE`]; rubato's
/// failures as [`ModelError::Internal`].
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>> {
    validate_rate(from)?;
    validate_rate(to)?;
    if let Some(i) = samples
        .iter()
        .position(|s| !s.is_finite() || s.abs() > MAX_SAMPLE_MAGNITUDE)
    {
        return Err(ModelError::invalid(
            "samples",
            format!(
                "sample {i} is {}: audio samples must be finite and within ±{MAX_SAMPLE_MAGNITUDE}",
                samples[i]
            ),
        ));
    }
    if from == to || samples.is_empty() {
        return Ok(samples.to_vec());
    }
    let mut resampler = Fft::<f32>::new_custom(
        from as usize,
        to as usize,
        block_frames(from, to),
        1,
        1,
        rubato::WindowFunction::BlackmanHarris2,
        FixedSync::Input,
    )
    .map_err(|e| ModelError::Internal(format!("resampler {from} -> {to} Hz: {e}")))?;
    let input = SequentialSlice::new(samples, 1, samples.len())
        .map_err(|e| ModelError::Internal(format!("resampler input: {e}")))?;
    let out_len = resampler.process_all_needed_output_len(samples.len());
    let mut output = [vec![0.0f32; out_len]];
    let mut output_view = SequentialSliceOfVecs::new_mut(&mut output, 1, out_len)
        .map_err(|e| ModelError::Internal(format!("resampler output: {e}")))?;
    let (_, produced) = resampler
        .process_all_into_buffer(&input, &mut output_view, samples.len(), None)
        .map_err(|e| ModelError::Internal(format!("resampling {from} -> {to} Hz: {e}")))?;
    let [mut out] = output;
    out.truncate(produced);
    Ok(out)
}
