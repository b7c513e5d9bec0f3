//! Q4_1: 32 weights per block, 4-bit quants with an f16 scale and an f16 min.
//! Follows llama.cpp's `dequantize_row_q4_1` / `quantize_row_q4_1_ref`; the
//! asymmetric levels here serve Q5_1 too.

use half::f16;

use super::block::{Block, block};
use super::q4_0::{nibbles, pack_nibbles};
use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK4_1: usize = 32;

block! {
    /// One GGUF Q4_1 block.
    pub struct BlockQ4_1 (20 bytes) {
        /// Scale.
        pub d: f16,
        /// Minimum.
        pub m: f16,
        /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
        pub qs: [u8; QK4_1 / 2],
    }
}

impl Block for BlockQ4_1 {
    const QK: usize = QK4_1;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (y, l) in y.iter_mut().zip(nibbles(&self.qs)) {
            *y = f32::from(l) * d + m;
        }
    }

    /// Quantizes 32 weights, as llama.cpp's reference does.
    fn quantize(xb: &[f32]) -> Self {
        // C: `MIN(15, (int8_t)(x + 0.5f))` stored in a uint8_t.
        let (d, min, levels) =
            asymmetric_levels(xb, 15.0, |x| 15.min(i32::from(c_f32_to_i8(x))) as u8);
        BlockQ4_1 {
            d: f16::from_f32(d),
            m: f16::from_f32(min),
            qs: pack_nibbles(&levels),
        }
    }
}

/// The scale, the min and the 32 levels of an asymmetric legacy block with
/// levels `0..=nmax` (Q4_1: 15, Q5_1: 31): level `to_level(x' + 0.5)` for
/// `x'` the weight's distance from the min in steps of the scale.
pub(crate) fn asymmetric_levels(
    xb: &[f32],
    nmax: f32,
    to_level: impl Fn(f32) -> u8,
) -> (f32, f32, [u8; 32]) {
    let (min, max) = min_max(xb);
    let d = (max - min) / nmax;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let levels = std::array::from_fn(|j| to_level((xb[j] - min) * id + 0.5));
    (d, min, levels)
}

/// The block's minimum and maximum as C's `if (v < min) min = v; if (v > max) max = v;`
/// loop finds them (NaN never taken, the first of equal zeros kept), starting
/// from `FLT_MAX` / `-FLT_MAX`.
pub(crate) fn min_max(xb: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}
