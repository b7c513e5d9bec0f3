//! Q4_K: 256 weights per block in 8 sub-blocks of 32; 4-bit quants, 6-bit
//! sub-block scales and mins, f16 super-scales. Follows llama.cpp's
//! `dequantize_row_q4_K` / `quantize_row_q4_K_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::kquant_search::{fp32_to_fp16, make_qkx2_quants, nearest_int};
use super::q2_k::QK_K;

/// One GGUF Q4_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each.
    pub scales: [u8; 12],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Scale and min of sub-block `j` (0..8) from packed 6-bit scales (llama.cpp `get_scale_min_k4`).
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Expands blocks to f32.
pub fn dequantize_row_q4_k(blocks: &[BlockQ4K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        for j64 in 0..QK_K / 64 {
            let q = &b.qs[32 * j64..32 * j64 + 32];
            let (sc1, m1) = get_scale_min_k4(2 * j64, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * j64 + 1, &b.scales);
            let d1 = d * f32::from(sc1);
            let m1 = min * f32::from(m1);
            let d2 = d * f32::from(sc2);
            let m2 = min * f32::from(m2);
            let y = &mut y[64 * j64..64 * j64 + 64];
            for l in 0..32 {
                y[l] = d1 * f32::from(q[l] & 0xF) - m1;
                y[l + 32] = d2 * f32::from(q[l] >> 4) - m2;
            }
        }
    }
}

/// Searches scale and min of each 32-weight sub-block of one super-block and
/// packs them as 6-bit multiples of the super-scales `d` and `dmin` (the part
/// `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` share).
///
/// Returns the levels of the search (`0..=nmax`), which sub-blocks whose
/// scale rounds to zero keep.
pub(crate) fn search_scales_mins_k4(
    xb: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    scales_out: &mut [u8; 12],
) -> ([u8; QK_K], f16, f16) {
    let mut levels = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &xb[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        // Weights favour large values, floored by the sub-block's RMS.
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0.0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    for j in 0..QK_K / 32 {
        // ggml stores the rounded value in a uint8_t before clamping.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            scales_out[j] = ls;
            scales_out[j + 4] = lm;
        } else {
            scales_out[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            scales_out[j - 4] |= (ls >> 4) << 6;
            scales_out[j] |= (lm >> 4) << 6;
        }
    }
    (
        levels,
        fp32_to_fp16(max_scale / 63.0),
        fp32_to_fp16(max_min / 63.0),
    )
}

/// Requantizes each 32-weight sub-block against its rounded 6-bit scale and
/// min, leaving the search's levels where the scale rounded to zero.
pub(crate) fn requantize_k4(
    xb: &[f32],
    nmax: i32,
    d: f16,
    dmin: f16,
    scales: &[u8; 12],
    levels: &mut [u8; QK_K],
) {
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let d = d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for ii in 0..32 {
            let l = nearest_int((xb[32 * j + ii] + dm) / d);
            levels[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) into blocks, bit for bit as
/// llama.cpp's `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_k(x: &[f32], out: &mut [BlockQ4K]) {
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut levels, d, dmin) = search_scales_mins_k4(xb, 15, -1.0, 20, &mut y.scales);
        y.d = d;
        y.dmin = dmin;
        requantize_k4(xb, 15, d, dmin, &y.scales, &mut levels);
        for j in (0..QK_K).step_by(64) {
            for l in 0..32 {
                y.qs[j / 2 + l] = levels[j + l] | (levels[j + l + 32] << 4);
            }
        }
    }
}
