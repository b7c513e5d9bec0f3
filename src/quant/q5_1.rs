//! Q5_1: 32 weights per block, 5-bit quants with an f16 scale and an f16 min:
//! Q4_1's levels with Q5_0's fifth bit.
//! Follows llama.cpp's `dequantize_row_q5_1` / `quantize_row_q5_1_ref`.

use half::f16;

use super::block::{Block, block};
use super::q4_1::asymmetric_levels;
use super::q5_0::Quants5;
use super::x86_cast::c_f32_to_u8;

/// Weights per block.
pub const QK5_1: usize = 32;

block! {
    /// One GGUF Q5_1 block.
    pub struct BlockQ5_1 (24 bytes) {
        /// Scale.
        pub d: f16,
        /// Minimum.
        pub m: f16,
        /// The quants, as in Q5_0.
        pub quants: Quants5,
    }
}

impl Block for BlockQ5_1 {
    const QK: usize = QK5_1;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (y, l) in y.iter_mut().zip(self.quants.levels()) {
            *y = f32::from(l) * d + m;
        }
    }

    /// Quantizes 32 weights, as llama.cpp's reference does.
    fn quantize(xb: &[f32]) -> Self {
        // C: `(uint8_t)(x + 0.5f)`, without a clamp.
        let (d, min, levels) = asymmetric_levels(xb, 31.0, c_f32_to_u8);
        BlockQ5_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            quants: Quants5::pack(&levels),
        }
    }
}
