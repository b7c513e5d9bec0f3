//! Q4_1: 32 weights per block, 4-bit quants with an f16 scale and an f16 min.
//! Follows llama.cpp's `dequantize_row_q4_1` / `quantize_row_q4_1_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK4_1: usize = 32;

/// One GGUF Q4_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// Expands blocks to f32.
pub fn dequantize_row_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_1)) {
        let d = b.d.to_f32();
        let m = b.m.to_f32();
        for j in 0..QK4_1 / 2 {
            let x0 = i32::from(b.qs[j] & 0x0F);
            let x1 = i32::from(b.qs[j] >> 4);
            y[j] = x0 as f32 * d + m;
            y[j + QK4_1 / 2] = x1 as f32 * d + m;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into blocks, as llama.cpp's reference does.
pub fn quantize_row_q4_1(x: &[f32], out: &mut [BlockQ4_1]) {
    for (xb, b) in x.chunks_exact(QK4_1).zip(out.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            // C: `MIN(15, (int8_t)(x + 0.5f))` stored in a uint8_t.
            let xi0 = 15.min(i32::from(c_f32_to_i8(x0 + 0.5))) as u8;
            let xi1 = 15.min(i32::from(c_f32_to_i8(x1 + 0.5))) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
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
