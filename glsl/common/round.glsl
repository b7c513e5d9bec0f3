// Correctly rounded f32 division and f32 -> f16 rounding, written out so
// that no driver freedom (2.5 ulp division, packHalf2x16's rounding mode)
// moves a value off llama.cpp's: act_round.comp and quantize_q8_1.comp
// both compute quantize_row_q8_0/q8_1's scales through them.

// |a - q b|, exact enough to rank neighbouring quotients: Dekker's
// two-product instead of fma, which drivers may split into mul + add.
float remainder_of(float a, float b, float q) {
    precise float cq = 4097.0 * q;
    precise float qh = cq - (cq - q);
    precise float ql = q - qh;
    precise float cb = 4097.0 * b;
    precise float bh = cb - (cb - b);
    precise float bl = b - bh;
    precise float p = q * b;
    precise float e = ((qh * bh - p) + qh * bl + ql * bh) + ql * bl;
    precise float r = (a - p) - e;
    return abs(r);
}

// Correctly rounded a / b: Vulkan allows 2.5 ulp for division, and a scale
// one ulp off moves values that sit on a rounding boundary.
float div_rn(float a, float b) {
    float q = a / b;
    // step to a neighbour while it leaves a smaller remainder; three steps
    // cover the 2.5 ulp the driver may be off
    for (int it = 0; it < 3; ++it) {
        const uint u = floatBitsToUint(q);
        const float lo = uintBitsToFloat(u - 1u);
        const float hi = uintBitsToFloat(u + 1u);
        const float r = remainder_of(a, b, q);
        const float r_lo = remainder_of(a, b, lo);
        const float r_hi = remainder_of(a, b, hi);
        if (r_lo < r && r_lo <= r_hi) {
            q = lo;
        } else if (r_hi < r) {
            q = hi;
        } else {
            break;
        }
    }
    return q;
}

// f32 -> f16 -> f32, round to nearest even (F16C's _cvtss_sh, mode 0);
// GLSL's packHalf2x16 leaves the rounding mode to the driver.
float round_f16(float v) {
    uint u = floatBitsToUint(v);
    uint sign = u & 0x80000000u;
    uint a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return v; // inf, nan
    }
    if (a >= 0x477ff000u) {
        return uintBitsToFloat(sign | 0x7f800000u); // rounds past 65504
    }
    if (a < 0x33000000u) {
        return uintBitsToFloat(sign); // below half the smallest subnormal
    }
    int e = int(a >> 23) - 127;
    // ulp of the f16 result: 2^(e-10) for normals, 2^-24 for subnormals
    int ulp_exp = max(e, -14) - 10;
    float ulp = uintBitsToFloat(uint(ulp_exp + 127) << 23);
    float inv_ulp = uintBitsToFloat(uint(127 - ulp_exp) << 23);
    float mag = uintBitsToFloat(a);
    // scaling by powers of two is exact; roundEven rounds ties to even
    float r = roundEven(mag * inv_ulp) * ulp;
    return uintBitsToFloat(sign | floatBitsToUint(r));
}
