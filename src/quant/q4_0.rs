//! Q4_0: 32 weights per block, 4-bit unsigned quants around 8, one f16 scale.
//! Follows llama.cpp's `dequantize_row_q4_0` / `quantize_row_q4_0_ref`; the
//! nibble layout and the symmetric levels here serve Q5_0 too.

use half::f16;

use super::block::{Block, block};
use super::kquant_search::max_by_magnitude;
use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK4_0: usize = 32;

block! {
    /// One GGUF Q4_0 block.
    pub struct BlockQ4_0 (18 bytes) {
        /// Scale.
        pub d: f16,
        /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
        pub qs: [u8; QK4_0 / 2],
    }
}

impl Block for BlockQ4_0 {
    const QK: usize = QK4_0;

    /// Expands the block to f32 (the reference every Q4_0 kernel is tested against).
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, l) in y.iter_mut().zip(nibbles(&self.qs)) {
            *y = (i32::from(l) - 8) as f32 * d;
        }
    }

    /// Quantizes 32 weights, as llama.cpp's reference does.
    fn quantize(xb: &[f32]) -> Self {
        let (d, levels) = symmetric_levels(xb, 4);
        BlockQ4_0 {
            d: f16::from_f32(d),
            qs: pack_nibbles(&levels),
        }
    }
}

/// The 32 low nibbles of a legacy block's quants: those of `qs[j]` are
/// weights `j` (low) and `j + 16` (high).
pub(crate) fn nibbles(qs: &[u8; 16]) -> [u8; 32] {
    std::array::from_fn(|i| {
        if i < 16 {
            qs[i] & 0x0F
        } else {
            qs[i - 16] >> 4
        }
    })
}

/// Packs 32 levels below 16 as [`nibbles`] reads them, as ggml does for Q4_0
/// and Q4_1 (`qs[j] = l[j] | l[j + 16] << 4`, without masking).
pub(crate) fn pack_nibbles(levels: &[u8; 32]) -> [u8; 16] {
    std::array::from_fn(|j| levels[j] | (levels[j + 16] << 4))
}

/// The scale and the 32 levels of a symmetric legacy block of `bits` bits
/// (Q4_0: 4, Q5_0: 5): the weight of largest magnitude maps to
/// `-2^(bits-1)`, keeping its sign, and a level is C's
/// `MIN(2^bits - 1, (int8_t)(x / d + 2^(bits-1) + 0.5f))` stored in a uint8_t.
pub(crate) fn symmetric_levels(xb: &[f32], bits: u32) -> (f32, [u8; 32]) {
    let half = (1 << (bits - 1)) as f32;
    let top = (1 << bits) - 1;
    let (max, _) = max_by_magnitude(xb);
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let levels = std::array::from_fn(|j| {
        let x = xb[j] * id;
        top.min(i32::from(c_f32_to_i8(x + (half + 0.5)))) as u8
    });
    (d, levels)
}

/// Writes Q4_0 blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q4_0 kernels read: every block's 16 bytes of nibbles, then every
/// block's f16 scale. Device bytes per weight equal the file's: 18 bytes per 32
/// weights (4.5 bits), so decode reads each weight byte once (an odd number of
/// blocks is padded to a 32-bit word).
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q4_0, &w)?;
///     let device = combs::repack_q4_0(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..16], &blocks[2..18]); // block 0's nibbles lead
///     assert_eq!(&device[32..34], &blocks[..2]); // then the scales
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q4_0 blocks.
pub fn repack_q4_0(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q4_0, src)
}
