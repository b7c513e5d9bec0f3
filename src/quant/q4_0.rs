//! Q4_0: 32 weights per block, 4-bit unsigned quants around 8, one f16 scale.
//! Follows llama.cpp's `dequantize_row_q4_0` / `quantize_row_q4_0_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK4_0: usize = 32;

/// One GGUF Q4_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Low nibbles: weights 0..16; high nibbles: weights 16..32.
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// Expands blocks to f32 (the reference every Q4_0 kernel is tested against).
pub fn dequantize_row_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = b.d.to_f32();
        for j in 0..QK4_0 / 2 {
            let x0 = i32::from(b.qs[j] & 0x0F) - 8;
            let x1 = i32::from(b.qs[j] >> 4) - 8;
            y[j] = x0 as f32 * d;
            y[j + QK4_0 / 2] = x1 as f32 * d;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into blocks, as llama.cpp's reference does.
pub fn quantize_row_q4_0(x: &[f32], out: &mut [BlockQ4_0]) {
    for (xb, b) in x.chunks_exact(QK4_0).zip(out.iter_mut()) {
        // The value of largest magnitude maps to -8, keeping its sign.
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        for j in 0..QK4_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK4_0 / 2 + j] * id;
            // C: `MIN(15, (int8_t)(x + 8.5f))` stored in a uint8_t.
            let xi0 = 15.min(i32::from(c_f32_to_i8(x0 + 8.5))) as u8;
            let xi1 = 15.min(i32::from(c_f32_to_i8(x1 + 8.5))) as u8;
            b.qs[j] = xi0 | (xi1 << 4);
        }
    }
}
