//! Q3_K: 256 weights per block in 16 sub-blocks of 16; 3-bit quants (2 low
//! bits plus a high-bit mask), 6-bit signed sub-block scales, an f16
//! super-scale. Follows llama.cpp's `dequantize_row_q3_K` / `quantize_row_q3_K_ref`.

use bytemuck::Zeroable;
use half::f16;

use super::block::{Block, block};
use super::kquant_search::{
    fp32_to_fp16, make_q3_quants, max_by_magnitude, nearest_int, symmetric_sub_blocks,
};
use super::q2_k::QK_K;

block! {
    /// One GGUF Q3_K block.
    pub struct BlockQ3K (110 bytes) {
        /// High (third) bit of each quant.
        pub hmask: [u8; QK_K / 8],
        /// Low 2 bits of each quant.
        pub qs: [u8; QK_K / 4],
        /// 16 packed 6-bit scales.
        pub scales: [u8; 12],
        /// Super-block scale.
        pub d: f16,
    }
}

/// The 16 signed scales (before the -32 offset) packed in `scales`.
pub fn unpack_q3_k_scales(scales: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (is, o) in out.iter_mut().enumerate() {
        let low4 = if is < 8 {
            scales[is] & 0xF
        } else {
            scales[is - 8] >> 4
        };
        let high2 = (scales[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
        *o = low4 | (high2 << 4);
    }
    out
}

impl Block for BlockQ3K {
    const QK: usize = QK_K;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let d_all = self.d.to_f32();
        let scales = unpack_q3_k_scales(&self.scales);
        let mut yi = 0;
        let mut is = 0;
        let mut m = 1u8;
        for n in 0..2 {
            let q = &self.qs[32 * n..32 * n + 32];
            for shift in [0u32, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * (i32::from(scales[is]) - 32) as f32;
                    is += 1;
                    for l in 0..16 {
                        let low = i32::from((q[16 * half + l] >> shift) & 3);
                        let high = if self.hmask[16 * half + l] & m != 0 {
                            0
                        } else {
                            4
                        };
                        y[yi] = dl * (low - high) as f32;
                        yi += 1;
                    }
                }
                m <<= 1;
            }
        }
    }

    /// Quantizes 256 weights, bit for bit as llama.cpp's `quantize_row_q3_K_ref`.
    fn quantize(xb: &[f32]) -> Self {
        let (mut levels, scales) = symmetric_sub_blocks(xb, |x, l| make_q3_quants(4, x, l, true));
        let (max_scale, _) = max_by_magnitude(&scales);

        let mut y = BlockQ3K::zeroed();
        y.scales = [0; 12];
        if max_scale != 0.0 {
            // The scale of largest magnitude maps to -32, keeping its sign.
            let iscale = -32.0 / max_scale;
            for (j, &scale) in scales.iter().enumerate() {
                // ggml stores the rounded value in an int8_t before clamping.
                let l = nearest_int(iscale * scale) as i8;
                let l = (l.clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    y.scales[j] = l & 0xF;
                } else {
                    y.scales[j - 8] |= (l & 0xF) << 4;
                }
                y.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
            }
            y.d = fp32_to_fp16(1.0 / iscale);
        } else {
            y.d = fp32_to_fp16(0.0);
        }

        // Requantize against the rounded scales; a sub-block whose scale
        // rounded to zero keeps the levels of the search, as in ggml.
        let packed = unpack_q3_k_scales(&y.scales);
        for j in 0..QK_K / 16 {
            let sc = i32::from(packed[j]) - 32;
            let d = y.d.to_f32() * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3);
                levels[16 * j + ii] = (l + 4) as i8;
            }
        }

        // The high bit of quant j goes to bit j / 32 of hmask[j % 32].
        y.hmask = [0; QK_K / 8];
        for (j, l) in levels.iter_mut().enumerate() {
            if *l > 3 {
                y.hmask[j % (QK_K / 8)] |= 1 << (j / (QK_K / 8));
                *l -= 4;
            }
        }
        for j in (0..QK_K).step_by(128) {
            for l in 0..32 {
                let q = |k: usize| levels[j + l + k] as u8;
                y.qs[j / 4 + l] = q(0) | (q(32) << 2) | (q(64) << 4) | (q(96) << 6);
            }
        }
        y
    }
}
