// Steps the 8-bit quantizers share (quantize_q8_1.comp, and matvec_q8.comp
// quantizing f32 x in the workgroup): packing four int8 into a word, and
// the folded RMS norm's weighting of x, in the rms_norm kernel's order so
// that every quantizer rounds the same values. Needs data_norm (vec4s).

uint pack_i8x4(ivec4 q) {
    const uvec4 b = uvec4(q) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

// (t * scale) * w for the vec4 t at index v of a row, scale = 1 / rms(x);
// with (1 + w) where the norm is zero-centred.
vec4 norm_weighted(vec4 t, uint v, float scale, bool zero_centred) {
    vec4 nw = data_norm[v];
    if (zero_centred) {
        nw += 1.0;
    }
    precise vec4 xhat = t * scale;
    precise vec4 y = xhat * nw;
    return y;
}
