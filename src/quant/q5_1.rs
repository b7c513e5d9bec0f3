//! Q5_1: 32 weights per block, 5-bit quants with an f16 scale and an f16 min.
//! Follows llama.cpp's `dequantize_row_q5_1` / `quantize_row_q5_1_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::x86_cast::c_f32_to_u8;

/// Weights per block.
pub const QK5_1: usize = 32;

/// One GGUF Q5_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bit of each weight, little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// Expands blocks to f32.
pub fn dequantize_row_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK5_1)) {
        let d = b.d.to_f32();
        let m = b.m.to_f32();
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK5_1 / 2 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = (u32::from(b.qs[j]) & 0x0F) | xh0;
            let x1 = (u32::from(b.qs[j]) >> 4) | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + QK5_1 / 2] = x1 as f32 * d + m;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into blocks, as llama.cpp's reference does.
pub fn quantize_row_q5_1(x: &[f32], out: &mut [BlockQ5_1]) {
    for (xb, b) in x.chunks_exact(QK5_1).zip(out.iter_mut()) {
        let (min, max) = super::q4_1::min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        b.m = f16::from_f32(min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK5_1 / 2 + j] - min) * id;
            // C: `(uint8_t)(x + 0.5f)`.
            let xi0 = c_f32_to_u8(x0 + 0.5);
            let xi1 = c_f32_to_u8(x1 + 0.5);
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (u32::from(xi0 & 0x10) >> 4) << j;
            qh |= (u32::from(xi1 & 0x10) >> 4) << (j + QK5_1 / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}
