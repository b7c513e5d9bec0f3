//! Q5_0: 32 weights per block, 5-bit quants around 16 (low nibbles plus a
//! 32-bit mask of fifth bits), one f16 scale.
//! Follows llama.cpp's `dequantize_row_q5_0` / `quantize_row_q5_0_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK5_0: usize = 32;

/// One GGUF Q5_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bit of each weight, little-endian u32.
    pub qh: [u8; 4],
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// Expands blocks to f32.
pub fn dequantize_row_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK5_0)) {
        let d = b.d.to_f32();
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK5_0 / 2 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((u32::from(b.qs[j]) & 0x0F) | xh0) as i32 - 16;
            let x1 = ((u32::from(b.qs[j]) >> 4) | xh1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK5_0 / 2] = x1 as f32 * d;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into blocks, as llama.cpp's reference does.
pub fn quantize_row_q5_0(x: &[f32], out: &mut [BlockQ5_0]) {
    for (xb, b) in x.chunks_exact(QK5_0).zip(out.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK5_0 / 2 + j] * id;
            // C: `MIN(31, (int8_t)(x + 16.5f))` stored in a uint8_t.
            let xi0 = 31.min(i32::from(c_f32_to_i8(x0 + 16.5))) as u8;
            let xi1 = 31.min(i32::from(c_f32_to_i8(x1 + 16.5))) as u8;
            b.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (u32::from(xi0 & 0x10) >> 4) << j;
            qh |= (u32::from(xi1 & 0x10) >> 4) << (j + QK5_0 / 2);
        }
        b.qh = qh.to_le_bytes();
    }
}
