//! Q6_K: 256 weights per block in 16 sub-blocks of 16; 6-bit quants (low
//! nibbles plus 2 high bits), signed 8-bit sub-block scales, an f16
//! super-scale. Follows llama.cpp's `dequantize_row_q6_K` / `quantize_row_q6_K_ref`.

use bytemuck::Zeroable;
use half::f16;

use super::block::{Block, block};
use super::kquant_search::{
    GROUP_MAX_EPS, fp32_to_fp16, make_qx_quants, max_by_magnitude, nearest_int,
    symmetric_sub_blocks,
};
use super::q2_k::QK_K;

block! {
    /// One GGUF Q6_K block.
    pub struct BlockQ6K (210 bytes) {
        /// Low 4 bits of each quant.
        pub ql: [u8; QK_K / 2],
        /// High 2 bits of each quant.
        pub qh: [u8; QK_K / 4],
        /// Sub-block scales (i8 stored as u8).
        pub scales: [u8; QK_K / 16],
        /// Super-block scale.
        pub d: f16,
    }
}

impl Block for BlockQ6K {
    const QK: usize = QK_K;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for n in 0..2 {
            let ql = &self.ql[64 * n..64 * n + 64];
            let qh = &self.qh[32 * n..32 * n + 32];
            let sc = &self.scales[8 * n..8 * n + 8];
            let y = &mut y[128 * n..128 * n + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
                let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                let s = |k: usize| f32::from(sc[is + k] as i8);
                y[l] = d * s(0) * q1 as f32;
                y[l + 32] = d * s(2) * q2 as f32;
                y[l + 64] = d * s(4) * q3 as f32;
                y[l + 96] = d * s(6) * q4 as f32;
            }
        }
    }

    /// Quantizes 256 weights, bit for bit as llama.cpp's `quantize_row_q6_K_ref`.
    fn quantize(xb: &[f32]) -> Self {
        let (mut levels, scales) =
            symmetric_sub_blocks(xb, |x, l| make_qx_quants(32, x, l, 1, None));
        let (max_scale, max_abs_scale) = max_by_magnitude(&scales);

        let mut y = BlockQ6K::zeroed();
        if max_abs_scale < GROUP_MAX_EPS {
            y.d = fp32_to_fp16(0.0);
            return y;
        }

        // The scale of largest magnitude maps to -128, keeping its sign.
        let iscale = -128.0 / max_scale;
        y.d = fp32_to_fp16(1.0 / iscale);
        for (s, &scale) in y.scales.iter_mut().zip(&scales) {
            // ggml stores the clamped int in an int8_t (so -129 would wrap).
            *s = nearest_int(iscale * scale).min(127) as i8 as u8;
        }

        // Requantize against the rounded scales; a sub-block whose scale
        // rounded to zero keeps the levels of the search, as in ggml.
        for j in 0..QK_K / 16 {
            let d = y.d.to_f32() * f32::from(y.scales[j] as i8);
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let l = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                levels[16 * j + ii] = (l + 32) as i8;
            }
        }

        for j in (0..QK_K).step_by(128) {
            let ql = &mut y.ql[j / 2..j / 2 + 64];
            let qh = &mut y.qh[j / 4..j / 4 + 32];
            for l in 0..32 {
                let q = |k: usize| levels[j + l + k] as u8;
                ql[l] = (q(0) & 0xF) | ((q(64) & 0xF) << 4);
                ql[l + 32] = (q(32) & 0xF) | ((q(96) & 0xF) << 4);
                qh[l] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
        y
    }
}

/// Writes Q6_K blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q6_K kernels read: every block's 128 bytes of low nibbles, then
/// every block's 64 bytes of high bits, then every block's 16 sub-block scales,
/// then every block's f16 `d` (the whole padded to a 32-bit word). Device bytes
/// per weight equal the file's: 210 bytes per 256 weights (6.5625 bits), so
/// decode reads each weight byte once.
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q6K, &w)?;
///     let device = combs::repack_q6_k(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..128], &blocks[..128]); // block 0's low nibbles lead
///     assert_eq!(&device[256..320], &blocks[128..192]); // then the high bits
///     assert_eq!(&device[416..418], &blocks[208..210]); // d last
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q6_K blocks.
pub fn repack_q6_k(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q6K, src)
}
