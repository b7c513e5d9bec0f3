// One `dequant_elem()` per weight format: element `e` (0 <= e < QK) of block
// `ib` of a tensor of `nb` blocks stored in `data_a` as types.glsl describes.
// The arithmetic follows llama.cpp's dequantize_row_* expression for
// expression and is `precise`, so results equal the CPU reference
// (src/quant/*.rs) bit for bit.
//
// Requires before inclusion: `uint data_a[]` bound as a storage buffer.

#include "common/types.glsl"

uint a_byte(uint word_base, uint byte_index) {
    return (data_a[word_base + (byte_index >> 2)] >> (8u * (byte_index & 3u))) & 0xFFu;
}

int sign_extend8(uint b) {
    return int(b << 24) >> 24;
}

#if defined(DENSE)
float dense_elem(uint i) {
#if defined(DATA_A_F32)
    return uintBitsToFloat(data_a[i]);
#elif defined(DATA_A_F16)
    vec2 v = unpackHalf2x16(data_a[i >> 1]);
    return (i & 1u) == 0u ? v.x : v.y;
#else // BF16
    uint w = data_a[i >> 1];
    return uintBitsToFloat((i & 1u) == 0u ? (w << 16) : (w & 0xFFFF0000u));
#endif
}
#else

// The word holding scale k of block ib: the f16 scales of all blocks follow
// the quant planes, two to a word (scale k in the upper half where
// ib * N_SCALES + k is odd). Kernels that hold the word as loaded until
// they need the scale read it here.
uint a_scale_word(uint nb, uint ib, uint k) {
    return data_a[nb * QWORDS + ((ib * N_SCALES + k) >> 1)];
}

// Scale k of block ib.
float a_scale(uint nb, uint ib, uint k) {
    const vec2 w = unpackHalf2x16(a_scale_word(nb, ib, k));
    return ((ib * N_SCALES + k) & 1u) == 0u ? w.x : w.y;
}

// The 6-bit scale and min of sub-block j (0..7) from a K-quant's 12-byte
// packed scales starting at word `sw` (llama.cpp get_scale_min_k4).
uvec2 scale_min_k4(uint sw, uint j) {
    if (j < 4u) {
        return uvec2(a_byte(sw, j) & 63u, a_byte(sw, j + 4u) & 63u);
    }
    uint d = (a_byte(sw, j + 4u) & 0xFu) | ((a_byte(sw, j - 4u) >> 6) << 4);
    uint m = (a_byte(sw, j + 4u) >> 4) | ((a_byte(sw, j) >> 6) << 4);
    return uvec2(d, m);
}

float dequant_elem(uint nb, uint ib, uint e) {
    const uint p0 = ib * PLANE0_WORDS;
    const uint p1 = nb * PLANE0_WORDS + ib * PLANE1_WORDS;
    const uint p2 = nb * (PLANE0_WORDS + PLANE1_WORDS) + ib * PLANE2_WORDS;
#if defined(DATA_A_Q4_0) || defined(DATA_A_Q4_1)
    const uint j = e & 15u;
    const uint q = (a_byte(p0, j) >> (e < 16u ? 0u : 4u)) & 0xFu;
    const float d = a_scale(nb, ib, 0u);
#if defined(DATA_A_Q4_0)
    precise float y = float(int(q) - 8) * d;
#else
    precise float y = float(int(q)) * d + a_scale(nb, ib, 1u);
#endif
    return y;
#elif defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
    const uint j = e & 15u;
    const uint qh = data_a[p1];
    uint q;
    if (e < 16u) {
        q = (a_byte(p0, j) & 0xFu) | (((qh >> j) << 4) & 0x10u);
    } else {
        q = (a_byte(p0, j) >> 4) | ((qh >> (j + 12u)) & 0x10u);
    }
    const float d = a_scale(nb, ib, 0u);
#if defined(DATA_A_Q5_0)
    precise float y = float(int(q) - 16) * d;
#else
    precise float y = float(int(q)) * d + a_scale(nb, ib, 1u);
#endif
    return y;
#elif defined(DATA_A_Q8_0)
    precise float y = float(sign_extend8(a_byte(p0, e))) * a_scale(nb, ib, 0u);
    return y;
#elif defined(DATA_A_Q2_K)
    const uint n = e >> 7, r = e & 127u;
    const uint j = r >> 5, half_ = (r >> 4) & 1u, l = r & 15u;
    const uint sc = a_byte(p1, n * 8u + j * 2u + half_);
    const uint q = (a_byte(p0, n * 32u + half_ * 16u + l) >> (2u * j)) & 3u;
    precise float dl = a_scale(nb, ib, 0u) * float(sc & 0xFu);
    precise float ml = a_scale(nb, ib, 1u) * float(sc >> 4);
    precise float y = dl * float(int(q)) - ml;
    return y;
#elif defined(DATA_A_Q3_K)
    const uint n = e >> 7, r = e & 127u;
    const uint j = r >> 5, half_ = (r >> 4) & 1u, l = r & 15u;
    const uint is = n * 8u + j * 2u + half_;
    // Unpack 6-bit scale `is` (llama.cpp's kmask shuffle, one scale at a time).
    uint low4, high2;
    if (is < 8u) {
        low4 = a_byte(p2, is) & 0xFu;
    } else {
        low4 = a_byte(p2, is - 8u) >> 4;
    }
    high2 = (a_byte(p2, 8u + (is & 3u)) >> (2u * (is >> 2))) & 3u;
    const int scale = int(low4 | (high2 << 4)) - 32;
    const uint q = (a_byte(p0, n * 32u + half_ * 16u + l) >> (2u * j)) & 3u;
    const uint hbit = (a_byte(p1, half_ * 16u + l) >> (n * 4u + j)) & 1u;
    precise float dl = a_scale(nb, ib, 0u) * float(scale);
    precise float y = dl * float(int(q) - (hbit != 0u ? 0 : 4));
    return y;
#elif defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
    const uint j64 = e >> 6, hi = (e >> 5) & 1u, l = e & 31u;
#if defined(DATA_A_Q4_K)
    const uint sw = p1;
#else
    const uint sw = p2;
#endif
    const uvec2 sm = scale_min_k4(sw, 2u * j64 + hi);
    uint q = (a_byte(p0, 32u * j64 + l) >> (4u * hi)) & 0xFu;
#if defined(DATA_A_Q5_K)
    q += ((a_byte(p1, l) >> (2u * j64 + hi)) & 1u) << 4;
#endif
    precise float dl = a_scale(nb, ib, 0u) * float(sm.x);
    precise float ml = a_scale(nb, ib, 1u) * float(sm.y);
    precise float y = dl * float(q) - ml;
    return y;
#elif defined(DATA_A_Q6_K)
    const uint n = e >> 7, r = e & 127u;
    const uint quarter = r >> 5, l = r & 31u;
    const uint ql_byte = a_byte(p0, n * 64u + l + (quarter & 1u) * 32u);
    const uint low = (ql_byte >> (4u * (quarter >> 1))) & 0xFu;
    const uint high = (a_byte(p1, n * 32u + l) >> (2u * quarter)) & 3u;
    const int q = int(low | (high << 4)) - 32;
    const int sc = sign_extend8(a_byte(p2, n * 8u + (l >> 4) + 2u * quarter));
    precise float dsc = a_scale(nb, ib, 0u) * float(sc);
    precise float y = dsc * float(q);
    return y;
#endif
}
#endif

// ---------------------------------------------------------------------------
// Sub-blocks of 32 weights for the fused kernels (matvec, matmul, get_rows).
// A row of K weights is K/32 sub-blocks; sub-block `s` of a tensor of `nb`
// blocks lies in block s / SUBS, part s % SUBS. Dense types use sub-blocks of
// 32 consecutive elements. Values equal dequant_elem() up to the rounding of
// a fused multiply-add (these paths are not `precise`).

#define SUBS (QK >= 32 ? QK / 32 : 1)

// Bytes 0..3 of `a`, masked by `m2` (a mask below 0x100, in both halves),
// as exact floats: each pair lands in the mantissas of two f16 1024.0s (one
// mask for two values) and widens to f32, where taking the 1024 away is
// exact. NVIDIA converts an integer to float at a quarter of the float rate.
vec4 pairs4(uint a, uint m2) {
    const vec2 e = unpackHalf2x16((a & m2) | 0x64006400u);         // bytes 0, 2
    const vec2 o = unpackHalf2x16(((a >> 8) & m2) | 0x64006400u);  // bytes 1, 3
    return vec4(e.x, o.x, e.y, o.y) - 1024.0;
}

vec4 nib4(uint w, uint shift) {
    return pairs4(w >> shift, 0x000F000Fu);
}

vec4 byte4(uint w) {
    return pairs4(w, 0x00FF00FFu);
}

// Signed bytes: offset to unsigned, taken back after the conversion.
vec4 sbyte4(uint w) {
    return pairs4(w ^ 0x80808080u, 0x00FF00FFu) - 128.0;
}

// `mask` (below 0x100) of each byte of w from bit `bit` of byte k -> component k.
vec4 bits4(uint w, uint bit, uint mask) {
    return pairs4(w >> bit, mask | (mask << 16));
}

// Words w .. w + 3 of the weights (w a multiple of 4): one 16-byte load
// where the shader declares the uvec4 alias `data_a4` of the same binding
// (A4_LOADS), else four 4-byte ones. (The prompt tiles' weights this way:
// the 8B's gate/up at 512 tokens Q4_K 1159 -> 934 us, Q6_K 1721 -> 1107 on
// an H100, docs/perf-notes.md "Session 32".)
uvec4 a_word4(uint w) {
#if defined(A4_LOADS)
    return data_a4[w >> 2];
#else
    return uvec4(data_a[w], data_a[w + 1u], data_a[w + 2u], data_a[w + 3u]);
#endif
}

void dequant_sub32(uint nb, uint s, out vec4 w[8]) {
#if defined(DENSE)
    const uint e = s * 32u;
#if defined(DATA_A_F32)
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        w[k] = uintBitsToFloat(a_word4(e + 4u * k));
    }
#elif defined(DATA_A_F16)
    [[unroll]] for (uint k = 0u; k < 8u; k += 2u) {
        const uvec4 v = a_word4((e >> 1) + 2u * k);
        w[k] = vec4(unpackHalf2x16(v.x), unpackHalf2x16(v.y));
        w[k + 1u] = vec4(unpackHalf2x16(v.z), unpackHalf2x16(v.w));
    }
#else
    [[unroll]] for (uint k = 0u; k < 8u; k += 2u) {
        const uvec4 v = a_word4((e >> 1) + 2u * k);
        w[k] = vec4(uintBitsToFloat(v.x << 16), uintBitsToFloat(v.x & 0xFFFF0000u),
                    uintBitsToFloat(v.y << 16), uintBitsToFloat(v.y & 0xFFFF0000u));
        w[k + 1u] = vec4(uintBitsToFloat(v.z << 16), uintBitsToFloat(v.z & 0xFFFF0000u),
                         uintBitsToFloat(v.w << 16), uintBitsToFloat(v.w & 0xFFFF0000u));
    }
#endif
#else
    const uint ib = s / SUBS;
    const uint part = s % SUBS;
    const uint p0 = ib * PLANE0_WORDS;
    const uint p1 = nb * PLANE0_WORDS + ib * PLANE1_WORDS;
    const uint p2 = nb * (PLANE0_WORDS + PLANE1_WORDS) + ib * PLANE2_WORDS;
#if defined(DATA_A_Q4_0) || defined(DATA_A_Q4_1) || defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
    const float d = a_scale(nb, ib, 0u);
#if defined(DATA_A_Q4_1) || defined(DATA_A_Q5_1)
    const float m = a_scale(nb, ib, 1u);
#elif defined(DATA_A_Q4_0)
    const float m = -8.0 * d;
#else
    const float m = -16.0 * d;
#endif
#if defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
    const uint qh = data_a[p1];
#endif
    const uvec4 qs = a_word4(p0);
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        const uint q = qs[k];
        vec4 lo = nib4(q, 0u);
        vec4 hi = nib4(q, 4u);
#if defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
        lo += 16.0 * vec4((qh >> (4u * k)) & 1u, (qh >> (4u * k + 1u)) & 1u,
                          (qh >> (4u * k + 2u)) & 1u, (qh >> (4u * k + 3u)) & 1u);
        hi += 16.0 * vec4((qh >> (16u + 4u * k)) & 1u, (qh >> (17u + 4u * k)) & 1u,
                          (qh >> (18u + 4u * k)) & 1u, (qh >> (19u + 4u * k)) & 1u);
#endif
        w[k] = lo * d + m;
        w[k + 4u] = hi * d + m;
    }
#elif defined(DATA_A_Q8_0)
    const float d = a_scale(nb, ib, 0u);
    const uvec4 q0 = a_word4(p0), q1 = a_word4(p0 + 4u);
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        w[k] = sbyte4(q0[k]) * d;
        w[k + 4u] = sbyte4(q1[k]) * d;
    }
#elif defined(DATA_A_Q2_K) || defined(DATA_A_Q3_K)
    // part = 4n + j: 32 weights = two halves of 16 with their own scales.
    const uint n = part >> 2, j = part & 3u;
    const float d = a_scale(nb, ib, 0u);
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        const uint is = n * 8u + j * 2u + h;
#if defined(DATA_A_Q2_K)
        const uint sc = a_byte(p1, is);
        const float dl = d * float(sc & 0xFu);
        const float ml = a_scale(nb, ib, 1u) * float(sc >> 4);
#else
        const uint low4 = is < 8u ? (a_byte(p2, is) & 0xFu) : (a_byte(p2, is - 8u) >> 4);
        const uint high2 = (a_byte(p2, 8u + (is & 3u)) >> (2u * (is >> 2))) & 3u;
        const float dl = d * float(int(low4 | (high2 << 4)) - 32);
#endif
        const uvec4 qs = a_word4(p0 + n * 8u + h * 4u);
#if defined(DATA_A_Q3_K)
        const uvec4 hms = a_word4(p1 + h * 4u);
#endif
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            const uint q = qs[k];
            vec4 v = bits4(q, 2u * j, 3u);
#if defined(DATA_A_Q2_K)
            w[h * 4u + k] = dl * v - ml;
#else
            const uint hm = hms[k];
            v -= 4.0 * (1.0 - bits4(hm, n * 4u + j, 1u));
            w[h * 4u + k] = dl * v;
#endif
        }
    }
#elif defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
    const uint j64 = part >> 1, hi = part & 1u;
#if defined(DATA_A_Q4_K)
    const uvec2 sm = scale_min_k4(p1, part);
#else
    const uvec2 sm = scale_min_k4(p2, part);
#endif
    const float dl = a_scale(nb, ib, 0u) * float(sm.x);
    const float ml = a_scale(nb, ib, 1u) * float(sm.y);
    const uvec4 q0 = a_word4(p0 + 8u * j64), q1 = a_word4(p0 + 8u * j64 + 4u);
#if defined(DATA_A_Q5_K)
    const uvec4 h0 = a_word4(p1), h1 = a_word4(p1 + 4u);
#endif
    [[unroll]] for (uint k = 0u; k < 8u; k++) {
        vec4 v = nib4(k < 4u ? q0[k] : q1[k - 4u], 4u * hi);
#if defined(DATA_A_Q5_K)
        v += 16.0 * bits4(k < 4u ? h0[k] : h1[k - 4u], part, 1u);
#endif
        w[k] = dl * v - ml;
    }
#elif defined(DATA_A_Q6_K)
    const uint n = part >> 2, quarter = part & 3u;
    const float d = a_scale(nb, ib, 0u);
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        const float dl = d * float(sign_extend8(a_byte(p2, n * 8u + h + 2u * quarter)));
        const uvec4 qls = a_word4(p0 + n * 16u + (quarter & 1u) * 8u + h * 4u);
        const uvec4 qhs = a_word4(p1 + n * 8u + h * 4u);
        [[unroll]] for (uint k = 0u; k < 4u; k++) {
            const uint l4 = h * 4u + k; // word index of l = 4*l4 .. 4*l4+3 within 32
            const uint ql = qls[k];
            const uint qh = qhs[k];
            const vec4 v = bits4(ql, 4u * (quarter >> 1), 0xFu) + 16.0 * bits4(qh, 2u * quarter, 3u) - 32.0;
            w[l4] = dl * v;
        }
    }
#endif
#endif
}
