//! Q5_0: 32 weights per block, 5-bit quants around 16 (low nibbles plus a
//! 32-bit mask of fifth bits), one f16 scale: Q4_0's layout and levels with
//! one more bit, whose plane here serves Q5_1 too.
//! Follows llama.cpp's `dequantize_row_q5_0` / `quantize_row_q5_0_ref`.

use half::f16;

use super::block::{Block, block};
use super::q4_0::{nibbles, pack_nibbles, symmetric_levels};

/// Weights per block.
pub const QK5_0: usize = 32;

block! {
    /// The quants of a Q5_0 or Q5_1 block: 32 five-bit levels as a plane of
    /// fifth bits and one of nibbles.
    pub struct Quants5 (20 bytes) {
        /// Fifth bit of each weight, little-endian u32.
        pub qh: [u8; 4],
        /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
        pub qs: [u8; QK5_0 / 2],
    }
}

block! {
    /// One GGUF Q5_0 block.
    pub struct BlockQ5_0 (22 bytes) {
        /// Scale.
        pub d: f16,
        /// The quants.
        pub quants: Quants5,
    }
}

impl Quants5 {
    /// The 32 levels: the nibbles, with bit `i` of `qh` as the fifth bit of
    /// level `i`.
    pub(crate) fn levels(&self) -> [u8; 32] {
        let qh = u32::from_le_bytes(self.qh);
        let low = nibbles(&self.qs);
        std::array::from_fn(|i| low[i] | ((((qh >> i) & 1) as u8) << 4))
    }

    /// Packs 32 five-bit levels as [`Quants5::levels`] reads them.
    pub(crate) fn pack(levels: &[u8; 32]) -> Self {
        let qh = levels
            .iter()
            .enumerate()
            .fold(0u32, |qh, (i, &l)| qh | (u32::from(l & 0x10) >> 4) << i);
        Quants5 {
            qh: qh.to_le_bytes(),
            qs: pack_nibbles(&levels.map(|l| l & 0x0F)),
        }
    }
}

impl Block for BlockQ5_0 {
    const QK: usize = QK5_0;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let d = self.d.to_f32();
        for (y, l) in y.iter_mut().zip(self.quants.levels()) {
            *y = (i32::from(l) - 16) as f32 * d;
        }
    }

    /// Quantizes 32 weights, as llama.cpp's reference does.
    fn quantize(xb: &[f32]) -> Self {
        let (d, levels) = symmetric_levels(xb, 5);
        BlockQ5_0 {
            d: f16::from_f32(d),
            quants: Quants5::pack(&levels),
        }
    }
}

/// Writes Q5_0 blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q5_0 kernels read: every block's 16 bytes of low nibbles, then
/// every block's 4 bytes of fifth bits, then every block's f16 scale. Device
/// bytes per weight equal the file's: 22 bytes per 32 weights (5.5 bits), so
/// decode reads each weight byte once (an odd number of blocks is padded to a
/// 32-bit word).
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q5_0, &w)?;
///     let device = combs::repack_q5_0(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..16], &blocks[6..22]); // block 0's nibbles lead
///     assert_eq!(&device[32..36], &blocks[2..6]); // then the fifth bits
///     assert_eq!(&device[40..42], &blocks[..2]); // then the scales
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q5_0 blocks.
pub fn repack_q5_0(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q5_0, src)
}
