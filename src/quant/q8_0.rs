//! Q8_0: 32 weights per block, signed 8-bit quants, one f16 scale.
//! Follows llama.cpp's `dequantize_row_q8_0` / `quantize_row_q8_0_ref`.

use bytemuck::Zeroable;
use half::f16;

use super::block::{Block, block};
use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK8_0: usize = 32;

block! {
    /// One GGUF Q8_0 block.
    pub struct BlockQ8_0 (34 bytes) {
        /// Scale.
        pub d: f16,
        /// Quants (i8 stored as u8 bytes).
        pub qs: [u8; QK8_0],
    }
}

impl Block for BlockQ8_0 {
    const QK: usize = QK8_0;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (yj, &q) in y.iter_mut().zip(&self.qs) {
            *yj = f32::from(q as i8) * d;
        }
    }

    /// Quantizes 32 weights, as llama.cpp's reference does.
    fn quantize(xb: &[f32]) -> Self {
        // C: `amax = MAX(amax, fabsf(v))`, whose comparison a NaN wins.
        let amax = xb
            .iter()
            .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut b = BlockQ8_0::zeroed();
        b.d = f16::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            // C: `qs[j] = roundf(x0)` into an int8_t.
            *q = c_f32_to_i8((v * id).round()) as u8;
        }
        b
    }
}

/// Writes Q8_0 blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q8_0 kernels read: every block's 32 quants, then every block's
/// f16 scale. Device bytes per weight equal the file's: 34 bytes per 32 weights
/// (8.5 bits), so decode reads each weight byte once (an odd number of blocks
/// is padded to a 32-bit word).
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q8_0, &w)?;
///     let device = combs::repack_q8_0(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..32], &blocks[2..34]); // block 0's quants lead
///     assert_eq!(&device[64..66], &blocks[..2]); // then the scales
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q8_0 blocks.
pub fn repack_q8_0(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q8_0, src)
}
