//! Q8_0: 32 weights per block, signed 8-bit quants, one f16 scale.
//! Follows llama.cpp's `dequantize_row_q8_0` / `quantize_row_q8_0_ref`.

use bytemuck::{Pod, Zeroable};
use half::f16;

use super::x86_cast::c_f32_to_i8;

/// Weights per block.
pub const QK8_0: usize = 32;

/// One GGUF Q8_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants (i8 stored as u8 bytes).
    pub qs: [u8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Expands blocks to f32.
pub fn dequantize_row_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK8_0)) {
        let d = b.d.to_f32();
        for (yj, &q) in y.iter_mut().zip(&b.qs) {
            *yj = f32::from(q as i8) * d;
        }
    }
}

/// Quantizes `x` (a multiple of 32 long) into blocks, as llama.cpp's reference does.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xb, b) in x.chunks_exact(QK8_0).zip(out.iter_mut()) {
        // C: `amax = MAX(amax, fabsf(v))`, whose comparison a NaN wins.
        let amax = xb
            .iter()
            .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f16::from_f32(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            // C: `qs[j] = roundf(x0)` into an int8_t.
            *q = c_f32_to_i8((v * id).round()) as u8;
        }
    }
}
