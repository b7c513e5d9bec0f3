//! Q5_K: 256 weights per block in 8 sub-blocks of 32; 5-bit quants (nibbles
//! plus high bits), 6-bit sub-block scales and mins, f16 super-scales.
//! Follows llama.cpp's `dequantize_row_q5_K` / `quantize_row_q5_K_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::q2_k::QK_K;
use super::q4_k::{get_scale_min_k4, requantize_k4, search_scales_mins_k4};

/// One GGUF Q5_K block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 8 scales and 8 mins, 6 bits each.
    pub scales: [u8; 12],
    /// Fifth bit of each quant.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits of each quant.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// Expands blocks to f32.
pub fn dequantize_row_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        let min = b.dmin.to_f32();
        for j64 in 0..QK_K / 64 {
            let ql = &b.qs[32 * j64..32 * j64 + 32];
            let (sc1, m1) = get_scale_min_k4(2 * j64, &b.scales);
            let (sc2, m2) = get_scale_min_k4(2 * j64 + 1, &b.scales);
            let d1 = d * f32::from(sc1);
            let m1 = min * f32::from(m1);
            let d2 = d * f32::from(sc2);
            let m2 = min * f32::from(m2);
            let u1 = 1u8 << (2 * j64);
            let u2 = 2u8 << (2 * j64);
            let y = &mut y[64 * j64..64 * j64 + 64];
            for l in 0..32 {
                let h1 = if b.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if b.qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * f32::from((ql[l] & 0xF) + h1) - m1;
                y[l + 32] = d2 * f32::from((ql[l] >> 4) + h2) - m2;
            }
        }
    }
}

/// Quantizes `x` (a multiple of 256 long) into blocks, bit for bit as
/// llama.cpp's `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_k(x: &[f32], out: &mut [BlockQ5K]) {
    for (xb, y) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let (mut levels, d, dmin) = search_scales_mins_k4(xb, 31, -0.5, 15, &mut y.scales);
        y.d = d;
        y.dmin = dmin;
        requantize_k4(xb, 31, d, dmin, &y.scales, &mut levels);
        // Low nibbles as in Q4_K; the fifth bit of quant 64·n + j goes to bit
        // 2n of qh[j] and that of quant 64·n + 32 + j to bit 2n + 1.
        y.qh = [0; QK_K / 8];
        for n in (0..QK_K).step_by(64) {
            let m1 = 1u8 << (n / 32);
            let m2 = 2u8 << (n / 32);
            for j in 0..32 {
                let mut l1 = levels[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    y.qh[j] |= m1;
                }
                let mut l2 = levels[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    y.qh[j] |= m2;
                }
                y.qs[n / 2 + j] = l1 | (l2 << 4);
            }
        }
    }
}
