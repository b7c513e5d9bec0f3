//! Scale searches shared by the K-quant reference quantizers (Q2_K … Q6_K),
//! and the two maxima the legacy ones (Q4_0 … Q8_0) search too.
//!
//! Each function follows its namesake in llama.cpp's `ggml/src/ggml-quants.c`
//! operation for operation: the same loops, the same float expressions in the
//! same association order, the same integer truncations. That is what makes
//! the quantizers' output bytes equal llama.cpp's bit for bit (as built for
//! x86-64 without fused multiply-add; see `scripts/make-quant-fixtures.py`).
//! Rust never contracts `a * b + c` into an FMA, so writing the expressions in
//! C's order is enough. Where C stores an `int` into an 8-bit field the Rust
//! uses `as i8` / `as u8`, which truncate the same way GCC does.

use half::f16;

use super::q2_k::QK_K;

/// Below this absolute maximum a group counts as all zeros (ggml's `GROUP_MAX_EPS`).
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// Rounds to the nearest integer, ties to even, as ggml's `nearest_int` does.
///
/// ggml adds 1.5·2²³ so that the float adder does the rounding, then reads
/// the integer out of the mantissa bits. The result equals
/// `fval.round_ties_even()` for |fval| ≤ 4194303; outside that range (and for
/// NaN) it is the same deterministic garbage as ggml's release builds give,
/// which is why the bit trick is kept instead of a library call.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// f32 to IEEE half, rounding to nearest even, as ggml's `GGML_FP32_TO_FP16`.
///
/// Identical to `f16::from_f32` for every non-NaN input; a NaN becomes the
/// canonical quiet NaN `0x7E00` with the input's sign, as in ggml, instead of
/// keeping its payload.
#[inline]
pub fn fp32_to_fp16(f: f32) -> f16 {
    if f.is_nan() {
        let sign = ((f.to_bits() >> 16) & 0x8000) as u16;
        f16::from_bits(sign | 0x7E00)
    } else {
        f16::from_f32(f)
    }
}

/// f32 to bfloat16, rounding to nearest even, as ggml's `GGML_FP32_TO_BF16`
/// (a NaN keeps its upper bits and is forced quiet).
#[inline]
pub fn fp32_to_bf16_bits(f: f32) -> u16 {
    let u = f.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// The value of largest magnitude in `xs` with its sign, and that magnitude,
/// as ggml's `if (ax > amax) { amax = ax; max = x; }` loops find them starting
/// from zeros: the first of equal magnitudes wins and a NaN is never taken.
pub(crate) fn max_by_magnitude(xs: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in xs {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// The largest of `xs` and 0, as ggml's `if (x > max) max = x;` loops find it
/// starting from 0: a NaN is never taken, and an all-negative (or -0) input
/// gives +0, whose bits end up in the block.
pub(crate) fn max_or_zero(xs: &[f32]) -> f32 {
    xs.iter()
        .fold(0.0f32, |max, &v| if v > max { v } else { max })
}

/// The value of largest magnitude in `x`, keeping its sign, where the
/// symmetric searches start; `None`, with `levels` zeroed, for a group of
/// zeros (below [`GROUP_MAX_EPS`]).
fn group_max(x: &[f32], levels: &mut [i8]) -> Option<f32> {
    let (max, amax) = max_by_magnitude(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return None;
    }
    Some(max)
}

/// Symmetric quantization of `x` to levels `-nmax..nmax`, with a search over
/// 18 nearby scales minimizing weighted squared error (ggml `make_qx_quants`).
///
/// Writes `l + nmax` (in `0..2*nmax`) to `levels` and returns the scale.
/// `rmse_type` picks the weights when `qw` is `None`: 1 → x², 2 → 1,
/// 3 → |x|, other → √|x|; 0 skips the search; a negative value returns after
/// the first least-squares step, averaged with the starting scale.
pub fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    levels: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let levels = &mut levels[..n];
    let Some(max) = group_max(x, levels) else {
        return 0.0;
    };
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (q, &v) in levels.iter_mut().zip(x) {
            let l = nearest_int(iscale * v);
            *q = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        match qw {
            Some(qw) => qw[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        levels[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = weight(i);
            let lf = l as f32;
            sumlx += w * v * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (q, &v) in levels.iter_mut().zip(x) {
                let l = nearest_int(iscale * v);
                *q = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit-style quantization of `x` to levels `-nmax..nmax` (ggml
/// `make_q3_quants`); with `do_rmse`, up to five passes move single levels
/// while that lowers the x²-weighted squared error.
///
/// Writes `l + nmax` to `levels` and returns the scale.
pub fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let levels = &mut levels[..n];
    let Some(max) = group_max(x, levels) else {
        return 0.0;
    };
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            levels[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = f32::from(levels[i]);
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != i32::from(levels[i]) {
                        let nf = new_l as f32;
                        slx += w * x[i] * nf;
                        sl2 += w * nf * nf;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            levels[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for q in levels.iter_mut() {
            *q += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (q, &v) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *q = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// The search parameters of [`make_qkx2_quants`]: ggml's arguments of the
/// same names, fixed per format.
#[derive(Clone, Copy, Debug)]
pub struct Qkx2Search {
    /// Largest level (levels are `0..=nmax`).
    pub nmax: i32,
    /// Offset from `nmax` of the first inverse scale tried.
    pub rmin: f32,
    /// Step between the inverse scales tried.
    pub rdelta: f32,
    /// Steps of the search (`nstep + 1` scales tried; below 1: no search).
    pub nstep: i32,
    /// Weigh absolute errors rather than squared ones.
    pub use_mad: bool,
}

/// Asymmetric quantization of `x` to levels `0..=nmax` with a scale and a
/// min, searching `nstep + 1` scales from `rmin` in steps of `rdelta` for the
/// least weighted error (squared, or absolute with `use_mad`); ggml
/// `make_qkx2_quants`.
///
/// Writes the levels to `levels` and returns `(scale, the_min)`, where the
/// group dequantizes as `scale * l - the_min` (`the_min` ≥ 0). `x` holds at
/// most 32 values, the largest K-quant sub-block.
pub fn make_qkx2_quants(
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    search: &Qkx2Search,
) -> (f32, f32) {
    let Qkx2Search {
        nmax,
        rmin,
        rdelta,
        nstep,
        use_mad,
    } = *search;
    let n = x.len();
    let levels = &mut levels[..n];
    let mut aux_buf = [0u8; 32];
    let laux = &mut aux_buf[..n];
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        let diff = scale * f32::from(levels[i]) + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                levels.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Runs a symmetric search (`make_q3_quants`, `make_qx_quants`) on each
/// 16-weight sub-block of the super-block `xb`, in order; returns the levels
/// and each sub-block's scale (the search Q3_K and Q6_K share).
pub(crate) fn symmetric_sub_blocks(
    xb: &[f32],
    mut search: impl FnMut(&[f32], &mut [i8]) -> f32,
) -> ([i8; QK_K], [f32; QK_K / 16]) {
    let mut levels = [0i8; QK_K];
    let scales =
        std::array::from_fn(|j| search(&xb[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]));
    (levels, scales)
}

/// Runs [`make_qkx2_quants`] on each of the `N` sub-blocks of the super-block
/// `xb` (`QK_K / N` weights each, at most 32), weighing each with
/// `weigh(sub_block, weights)`; returns the levels and each sub-block's scale
/// and min (the search Q2_K, Q4_K and Q5_K share).
pub(crate) fn qkx2_sub_blocks<const N: usize>(
    xb: &[f32],
    search: &Qkx2Search,
    weigh: impl Fn(&[f32], &mut [f32]),
) -> ([u8; QK_K], [f32; N], [f32; N]) {
    let len = QK_K / N;
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; N];
    let mut mins = [0.0f32; N];
    for j in 0..N {
        let xs = &xb[len * j..len * (j + 1)];
        let mut weights = [0.0f32; 32];
        let weights = &mut weights[..len];
        weigh(xs, weights);
        let ls = &mut levels[len * j..len * (j + 1)];
        (scales[j], mins[j]) = make_qkx2_quants(xs, weights, ls, search);
    }
    (levels, scales, mins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.49, -2),
            (4_194_303.0, 4_194_303),
            (-4_194_303.0, -4_194_303),
        ] {
            assert_eq!(nearest_int(v), want, "nearest_int({v})");
        }
    }

    #[test]
    fn fp32_to_bf16_bits_rounds_to_nearest_even() {
        assert_eq!(fp32_to_bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between two bf16 values; the even one is 1.0.
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(fp32_to_bf16_bits(f32::NAN) & 0x7fc0, 0x7fc0);
    }
}
