//! Q4_1: 32 weights per block, 4-bit quants with an f16 scale and an f16 min.
//! Follows llama.cpp's `dequantize_row_q4_1` / `quantize_row_q4_1_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

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
        let min = xb.iter().copied().fold(f32::MAX, f32::min);
        let max = xb.iter().copied().fold(-f32::MAX, f32::max);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            let xi0 = ((x0 + 0.5) as i8 as u8).min(15);
            let xi1 = ((x1 + 0.5) as i8 as u8).min(15);
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}
