//! Q2_K: 256 weights per block in 16 sub-blocks of 16; 2-bit quants, 4-bit
//! sub-block scales and mins, f16 super-scales. Follows llama.cpp's
//! `dequantize_row_q2_K` / `quantize_row_q2_K_ref`.

use bytemuck::Zeroable;
use half::f16;

use super::block::{Block, block};
use super::kquant_search::{Qkx2Search, fp32_to_fp16, max_or_zero, nearest_int, qkx2_sub_blocks};

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

block! {
    /// One GGUF Q2_K block.
    pub struct BlockQ2K (84 bytes) {
        /// Low nibble: sub-block scale; high nibble: sub-block min.
        pub scales: [u8; QK_K / 16],
        /// 2-bit quants, four per byte.
        pub qs: [u8; QK_K / 4],
        /// Super-block scale of the scales.
        pub d: f16,
        /// Super-block scale of the mins.
        pub dmin: f16,
    }
}

impl Block for BlockQ2K {
    const QK: usize = QK_K;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        let mut yi = 0;
        let mut is = 0;
        for n in 0..2 {
            let q = &self.qs[32 * n..32 * n + 32];
            for shift in [0u32, 2, 4, 6] {
                for half in 0..2 {
                    let sc = self.scales[is];
                    is += 1;
                    let dl = d * f32::from(sc & 0xF);
                    let ml = min * f32::from(sc >> 4);
                    for l in 0..16 {
                        let qv = (q[16 * half + l] >> shift) & 3;
                        y[yi] = dl * f32::from(qv) - ml;
                        yi += 1;
                    }
                }
            }
        }
    }

    /// Quantizes 256 weights, bit for bit as llama.cpp's
    /// `quantize_row_q2_K_ref` (what `llama-quantize` writes without an
    /// importance matrix).
    fn quantize(xb: &[f32]) -> Self {
        // Sub-block scales and mins are stored as 4-bit multiples of the super-scales.
        const Q4SCALE: f32 = 15.0;
        const SEARCH: Qkx2Search = Qkx2Search {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let (mut levels, scales, mins) = qkx2_sub_blocks::<{ QK_K / 16 }>(xb, &SEARCH, |xs, w| {
            for (w, &v) in w.iter_mut().zip(xs) {
                *w = v.abs();
            }
        });
        let max_scale = max_or_zero(&scales);
        let max_min = max_or_zero(&mins);

        let mut y = BlockQ2K::zeroed();
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &scale) in y.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * scale) as u8;
            }
            y.d = fp32_to_fp16(max_scale / Q4SCALE);
        } else {
            y.scales = [0; QK_K / 16];
            y.d = fp32_to_fp16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &min) in y.scales.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * min) << 4) as u8;
            }
            y.dmin = fp32_to_fp16(max_min / Q4SCALE);
        } else {
            y.dmin = fp32_to_fp16(0.0);
        }

        // Requantize against the rounded scales; a sub-block whose scale
        // rounded to zero keeps the levels of the search, as in ggml.
        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * f32::from(y.scales[j] & 0xF);
            if d == 0.0 {
                continue;
            }
            let dm = y.dmin.to_f32() * f32::from(y.scales[j] >> 4);
            for ii in 0..16 {
                let l = nearest_int((xb[16 * j + ii] + dm) / d);
                levels[16 * j + ii] = l.clamp(0, 3) as u8;
            }
        }

        for j in (0..QK_K).step_by(128) {
            for l in 0..32 {
                y.qs[j / 4 + l] = levels[j + l]
                    | (levels[j + l + 32] << 2)
                    | (levels[j + l + 64] << 4)
                    | (levels[j + l + 96] << 6);
            }
        }
        y
    }
}
