//! Q5_K: 256 weights per block in 8 sub-blocks of 32; 5-bit quants (nibbles
//! plus high bits), 6-bit sub-block scales and mins, f16 super-scales.
//! Follows llama.cpp's `dequantize_row_q5_K` / `quantize_row_q5_K_ref`.

use super::block::{Block, block};
use super::q2_k::QK_K;
use super::q4_k::{ScalesK4, levels_k4};

block! {
    /// One GGUF Q5_K block.
    pub struct BlockQ5K (176 bytes) {
        /// Scales and mins, as in Q4_K.
        pub head: ScalesK4,
        /// Fifth bit of each quant.
        pub qh: [u8; QK_K / 8],
        /// Low 4 bits of each quant.
        pub qs: [u8; QK_K / 2],
    }
}

impl Block for BlockQ5K {
    const QK: usize = QK_K;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        self.head.dequantize(y, |j64, l| {
            let q = self.qs[32 * j64 + l];
            // Bits 2·j64 and 2·j64 + 1 of qh[l] are the fifth bits of the pair.
            let h = self.qh[l] >> (2 * j64);
            ((q & 0xF) + ((h & 1) << 4), (q >> 4) + ((h & 2) << 3))
        });
    }

    /// Quantizes 256 weights, bit for bit as llama.cpp's `quantize_row_q5_K_ref`.
    fn quantize(xb: &[f32]) -> Self {
        let (levels, head) = levels_k4(xb, 31, -0.5, 15);
        let mut y = BlockQ5K {
            head,
            qh: [0; QK_K / 8],
            qs: [0; QK_K / 2],
        };
        // Low nibbles as in Q4_K; the fifth bit of quant 64·n + j goes to bit
        // 2n of qh[j] and that of quant 64·n + 32 + j to bit 2n + 1.
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
        y
    }
}

/// Writes Q5_K blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q5_K kernels read: every block's 128 bytes of low nibbles, then
/// every block's 32 bytes of fifth bits, then every block's 12 bytes of sub-
/// block scales and mins, then every block's f16 `d` and `dmin`. Device bytes
/// per weight equal the file's: 176 bytes per 256 weights (5.5 bits), so decode
/// reads each weight byte once.
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q5K, &w)?;
///     let device = combs::repack_q5_k(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..128], &blocks[48..176]); // the nibbles lead
///     assert_eq!(&device[128..160], &blocks[16..48]); // then the fifth bits
///     assert_eq!(&device[172..176], &blocks[..4]); // d and dmin last
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q5_K blocks.
pub fn repack_q5_k(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q5K, src)
}
