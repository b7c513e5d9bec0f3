//! Float-to-integer conversions as C code compiled by GCC for x86-64 performs
//! them, for the legacy quantizers (`quantize_row_q4_0_ref` … `q8_0_ref` in
//! ggml-quants.c) that store `(int8_t)x` or `(uint8_t)x` straight from a float.
//!
//! GCC emits `cvttss2si` (truncate to a 32-bit int) and keeps the low byte.
//! For a NaN or an out-of-range value `cvttss2si` yields `i32::MIN`, so the
//! byte is 0, where Rust's saturating `as i8` would give 127 or -128. That
//! happens in llama.cpp's outputs for blocks whose largest magnitude is so
//! small (below ~4e-37) that `1/d` overflows to infinity; emulating it keeps
//! combs' quantized bytes equal to llama.cpp's on every input.

/// x86's `cvttss2si`: truncation toward zero; NaN or out of `i32` range gives `i32::MIN`.
#[inline]
pub(crate) fn cvtt_f32_i32(x: f32) -> i32 {
    // -2^31 is representable and converts exactly; 2^31 and above are out of
    // range; NaN is in no range.
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// C's `(int8_t)x` for a float `x`, as GCC compiles it for x86-64.
#[inline]
pub(crate) fn c_f32_to_i8(x: f32) -> i8 {
    cvtt_f32_i32(x) as i8
}

/// C's `(uint8_t)x` for a float `x`, as GCC compiles it for x86-64.
#[inline]
pub(crate) fn c_f32_to_u8(x: f32) -> u8 {
    cvtt_f32_i32(x) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cvtt_matches_x86_on_special_values() {
        assert_eq!(cvtt_f32_i32(f32::INFINITY), i32::MIN);
        assert_eq!(cvtt_f32_i32(f32::NEG_INFINITY), i32::MIN);
        assert_eq!(cvtt_f32_i32(f32::NAN), i32::MIN);
        assert_eq!(cvtt_f32_i32(2_147_483_648.0), i32::MIN);
        assert_eq!(cvtt_f32_i32(-2_147_483_648.0), i32::MIN);
        assert_eq!(cvtt_f32_i32(-3.7), -3);
        assert_eq!(cvtt_f32_i32(16.99), 16);
        assert_eq!(c_f32_to_i8(f32::INFINITY), 0);
        assert_eq!(c_f32_to_i8(300.0), 44);
        assert_eq!(c_f32_to_i8(-1.5), -1);
        assert_eq!(c_f32_to_u8(f32::NAN), 0);
        assert_eq!(c_f32_to_u8(31.9), 31);
    }
}
