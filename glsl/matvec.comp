#version 450
// matvec: d[row] = A[row, :] . x for one token (decode) or a few (batched
// decode of several sequences), weights of any DATA_A_* format dequantized
// on the fly. With several tokens, neighbouring workgroups take the same rows
// for different tokens, so the rows come from memory once and from L2 for
// the other tokens. A group of TPR invocations shares
// NR consecutive rows: each invocation loads a unit of x (32 columns, 64 for
// Q4_K) once and applies it to all NR rows, so x is read from cache NR times
// less often than the weights. The workgroup's invocations form KS column
// slices of RG = WG / (TPR * KS) row groups: it covers RG * NR rows of one
// weight chunk, each slice walking its share of the columns (the slices' sums
// meet in shared memory). Row groups of one subgroup walk the same units at
// the same time, so their loads of x are the same addresses (one cache line
// serves them all): narrow groups (TPR 8) with many rows per subgroup read x
// far less often than one wide group per row.
//
// Every quantized format takes a fast path that never converts an
// integer to float (a quarter-rate instruction on NVIDIA, which bound the
// generic path at 8B): each quant q lands in the top mantissa bits of 1.0
// (two at a time, in f16), giving the exact float 1 + q / 2^b, and the dot
// product sum(v * x) is corrected with the sum of x (see unit_dot).
//
// Optional, by p.flags (iface/matvec.glsl):
//   LINEAR_ACCUMULATE: into d (residual add)   LINEAR_BIAS: add bias[row]
//   LINEAR_NORM: RMS norm folded into the input: x is the raw residual, the
//      kernel uses x * norm_w / rms(x) (LINEAR_NORM_ZERO_CENTRED: with
//      (1 + norm_w)); the group's lanes cover the whole row of x, so the sum
//      of squares comes with the loads of x.
//   LINEAR_GLU: gated FFN: rows alternate gate, up; d[(row_offset + row) / 2]
//      = act(gate) * up (LINEAR_GELU: GELU-tanh, else SiLU); needs NR even.
//   LINEAR_ROPE: llama.cpp's normal layout (pairs of adjacent dims) on output
//      rows below p.rope_rows, heads of p.head_dim, first p.n_rot dims of
//      each, at position pos[token]; needs NR even.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32; // 1: unknown, reduce through shared memory
layout(constant_id = 2) const uint TPR = 32;      // invocations per row group, a power of two
layout(constant_id = 3) const uint NR = 1;        // rows per row group
layout(constant_id = 4) const uint KS = 1;        // slices of the columns, one per lane set
layout(constant_id = 5) const uint UN = 1;        // units per lane per iteration (loads in flight)
layout(constant_id = 6) const uint XSV = 1;       // > 1: x staged in shared memory, XSV vec4s (whole units) at a time

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
layout(binding = 1) readonly buffer X { vec4 data_x[]; };
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };
layout(binding = 4) readonly buffer N { vec4 data_norm[]; };
layout(binding = 5) readonly buffer P { int data_pos[]; };
layout(binding = 6) readonly buffer F { float inv_freq[]; };

#include "iface/matvec.glsl"

#include "common/dequant.glsl"
#include "common/linear_out.glsl"
#include "common/act.glsl"
#include "common/rope.glsl"

#if defined(DATA_A_Q4_K) && !defined(Q4K_UNIT32)
#define USUBS 2       // 32-column sub-blocks per unit: both nibbles of 32 bytes
#else
#define USUBS 1
#endif
#define UVEC4 (8 * USUBS)

#if !defined(DATA_A_F32) && !defined(DATA_A_F16) && !defined(DATA_A_BF16)
#define FAST_PATH 1
#endif
// Partial sums of x per unit the fast path corrects with: one per 32
// columns; the K-quants with a scale per 16 columns one per 16.
#if defined(DATA_A_Q2_K) || defined(DATA_A_Q3_K) || defined(DATA_A_Q6_K)
#define SXN 2
#else
#define SXN USUBS
#endif
#define SXV (UVEC4 / SXN)   // vec4s of x per partial sum

#if FAST_PATH
// 1 + q / 2^b for the low b bits q (2 <= b <= 8) of each byte of w. Two
// values at a time land in the top mantissa bits of two f16 1.0s (one
// shift and one mask per pair, against one each per value for f32 1.0s,
// and no integer-to-float conversion: the integer pipe, half the width of
// the float one on NVIDIA, bound the 8B's matvecs) and widen to the same
// exact f32 values. The bits above b of each byte fall outside the masks.
vec4 bits_unit(uint w, const uint b) {
    const uint m = ((1u << b) - 1u) << (10u - b);
    const uint m2 = m | (m << 16);
    const vec2 ea = unpackHalf2x16(((w << (10u - b)) & m2) | 0x3C003C00u);   // bytes 0, 2
    const vec2 eb = unpackHalf2x16(((w >> (b - 2u)) & m2) | 0x3C003C00u);    // bytes 1, 3
    return vec4(ea.x, eb.x, ea.y, eb.y);
}

// 1 + n / 16 for the low (hi = 0) or high (hi = 1) nibble of each byte of w.
vec4 nibbles_unit(uint w, const uint hi) {
    return bits_unit(hi == 0u ? w : w >> 4, 4u);
}

// 1 + u / 256 for each byte u of w.
vec4 bytes_unit(uint w) {
    return bits_unit(w, 8u);
}

// Bits 0..3 of x to bit 0 of bytes 0..3 (the four shifted copies of x
// never overlap, so the multiply carries nothing).
uint spread4(uint x) {
    return ((x & 0xFu) * 0x00204081u) & 0x01010101u;
}

#if defined(DATA_A_Q4_K) || defined(DATA_A_Q5_K)
#include "common/q4k_scales.glsl"
#endif
#endif

// Contribution of unit u (of `units` per row) of row `row` against x values
// xv; sx[i] = sum of the x values under partial sum i (SXV vec4s each).
float unit_dot(uint row, uint u, uint units, const vec4 xv[UVEC4], const float sx[SXN]) {
#if defined(DATA_A_Q4_0) || defined(DATA_A_Q4_1)
    // Block = unit. Byte j holds column j (low nibble) and j + 16 (high).
    const uint ib = row * units + u;
    const uvec4 q = data_a4[ib];
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dot(nibbles_unit(q[i], 0u), xv[i]) + dot(nibbles_unit(q[i], 1u), xv[i + 4u]);
    }
    // s = sx + sum(q x) / 16
    const float d = a_scale(p.nb, ib, 0u);
#if defined(DATA_A_Q4_0)
    return d * (16.0 * s - 24.0 * sx[0]);              // sum((q - 8) x) d
#else
    return d * 16.0 * (s - sx[0]) + a_scale(p.nb, ib, 1u) * sx[0];
#endif
#elif defined(DATA_A_Q5_0) || defined(DATA_A_Q5_1)
    // As Q4_0, with qh's bit j (column j) and j + 16 the fifth bits.
    const uint ib = row * units + u;
    const uint qh = data_a[p.nb * PLANE0_WORDS + ib];
    const uvec4 q = data_a4[ib];
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint lo = (q[i] & 0x0F0F0F0Fu) | (spread4(qh >> (4u * i)) << 4);
        const uint hi = ((q[i] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16u + 4u * i)) << 4);
        s += dot(bits_unit(lo, 5u), xv[i]) + dot(bits_unit(hi, 5u), xv[i + 4u]);
    }
    // s = sx + sum(q x) / 32
    const float d = a_scale(p.nb, ib, 0u);
#if defined(DATA_A_Q5_0)
    return d * (32.0 * s - 48.0 * sx[0]);              // sum((q - 16) x) d
#else
    return d * 32.0 * (s - sx[0]) + a_scale(p.nb, ib, 1u) * sx[0];
#endif
#elif defined(DATA_A_Q2_K) || defined(DATA_A_Q3_K)
    // Unit = sub-block part = 4 n + j of block u / 8 (dequant_sub32's
    // layout): bits 2 j.. of 8 words of qs from word 8 n, two halves of 16
    // columns with a scale each (Q3_K: hmask's bit 4 n + j the third bit).
    const uint ib = row * (units / 8u) + u / 8u;
    const uint part = u % 8u;
    const uint n = part >> 2, j = part & 3u;
    const uint qs = (ib * PLANE0_WORDS + n * 8u) / 4u;
    const uvec4 q0 = data_a4[qs] >> (2u * j), q1 = data_a4[qs + 1u] >> (2u * j);
#if defined(DATA_A_Q3_K)
    const uint hm = (p.nb * PLANE0_WORDS + ib * PLANE1_WORDS) / 4u;
    const uvec4 h0 = data_a4[hm] >> (4u * n + j), h1 = data_a4[hm + 1u] >> (4u * n + j);
#endif
    float s0 = 0.0, s1 = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
#if defined(DATA_A_Q3_K)
        const uint a = (q0[i] & 0x03030303u) | ((h0[i] << 2) & 0x04040404u);
        const uint b = (q1[i] & 0x03030303u) | ((h1[i] << 2) & 0x04040404u);
        s0 += dot(bits_unit(a, 3u), xv[i]);
        s1 += dot(bits_unit(b, 3u), xv[i + 4u]);
#else
        s0 += dot(bits_unit(q0[i], 2u), xv[i]);
        s1 += dot(bits_unit(q1[i], 2u), xv[i + 4u]);
#endif
    }
    const uint is = n * 8u + j * 2u;   // scale of the first half; is + 1 the second
    const float d = a_scale(p.nb, ib, 0u);
#if defined(DATA_A_Q2_K)
    // Scale bytes is, is + 1: low nibble scale, high nibble min.
    const uint sc = data_a[p.nb * PLANE0_WORDS + ib * PLANE1_WORDS + is / 4u] >> (8u * (is % 4u));
    const float dmin = a_scale(p.nb, ib, 1u);
    // w = dl q - ml; sum(q x) = 4 (s - sx)
    return d * (float(sc & 0xFu) * 4.0 * (s0 - sx[0]) + float((sc >> 8) & 0xFu) * 4.0 * (s1 - sx[1]))
         - dmin * (float((sc >> 4) & 0xFu) * sx[0] + float((sc >> 12) & 0xFu) * sx[1]);
#else
    // The 6-bit scales is, is + 1 (dequant_sub32's unpacking): low 4 bits
    // from byte is (is < 8) or the high nibble of byte is - 8, high 2 bits
    // from byte 8 + is % 4 at bit 2 (is / 4).
    const uint sp = p.nb * (PLANE0_WORDS + PLANE1_WORDS) + ib * PLANE2_WORDS;
    const uvec3 sw = uvec3(data_a[sp], data_a[sp + 1u], data_a[sp + 2u]);
    float sc[2];
    [[unroll]] for (uint h = 0u; h < 2u; h++) {
        const uint k = is + h;
        const uint lw = (k & 7u) < 4u ? sw.x : sw.y;
        const uint low4 = (lw >> (8u * (k & 3u) + (k < 8u ? 0u : 4u))) & 0xFu;
        const uint high2 = (sw.z >> (8u * (k & 3u) + 2u * (k >> 2))) & 3u;
        sc[h] = float(int(low4 | (high2 << 4)) - 32);
    }
    // w = dl (q - 4); sum(q x) = 8 (s - sx)
    return d * (sc[0] * (8.0 * s0 - 12.0 * sx[0]) + sc[1] * (8.0 * s1 - 12.0 * sx[1]));
#endif
#elif defined(DATA_A_Q8_0)
    const uint ib = row * units + u;
    const uvec4 q0 = data_a4[2u * ib] ^ uvec4(0x80808080u);
    const uvec4 q1 = data_a4[2u * ib + 1u] ^ uvec4(0x80808080u);
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dot(bytes_unit(q0[i]), xv[i]) + dot(bytes_unit(q1[i]), xv[i + 4u]);
    }
    // s = sx + sum((q + 128) x) / 256
    return a_scale(p.nb, ib, 0u) * (256.0 * s - 384.0 * sx[0]);
#elif defined(DATA_A_Q4_K) && defined(Q4K_UNIT32)
    // Unit = sub-block u % 8 of block u / 8: the low (even sub-blocks) or
    // high (odd) nibbles of the 32 bytes at 32 * j64; the neighbouring
    // invocation loads the same bytes for the other nibbles.
    const uint ib = row * (units / 8u) + u / 8u;
    const uint sub = u % 8u;
    const uint qw = (ib * PLANE0_WORDS + 8u * (sub / 2u)) / 4u;
    const uint sh = 4u * (sub & 1u);
    const uvec4 q0 = data_a4[qw] >> sh;
    const uvec4 q1 = data_a4[qw + 1u] >> sh;
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dot(nibbles_unit(q0[i], 0u), xv[i]) + dot(nibbles_unit(q1[i], 0u), xv[i + 4u]);
    }
    const uvec2 sm = scale_min_words(scale_words(ib), sub);
    const float d = a_scale(p.nb, ib, 0u);
    const float dmin = a_scale(p.nb, ib, 1u);
    return d * float(sm.x) * 16.0 * (s - sx[0]) - dmin * float(sm.y) * sx[0];
#elif defined(DATA_A_Q4_K)
    // Unit = 64 columns: byte l of the 32 at 32 * j64 holds column l of
    // sub-block 2 j64 (low nibble) and of 2 j64 + 1 (high).
    const uint ib = row * (units / 4u) + u / 4u;
    const uint j64 = u % 4u;
    const uint qw = (ib * PLANE0_WORDS + 8u * j64) / 4u;
    const uvec4 q0 = data_a4[qw];
    const uvec4 q1 = data_a4[qw + 1u];
    float s0 = 0.0, s1 = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s0 += dot(nibbles_unit(q0[i], 0u), xv[i]) + dot(nibbles_unit(q1[i], 0u), xv[i + 4u]);
        s1 += dot(nibbles_unit(q0[i], 1u), xv[i + 8u]) + dot(nibbles_unit(q1[i], 1u), xv[i + 12u]);
    }
    const uvec3 sw = scale_words(ib);
    const uvec2 sm0 = scale_min_words(sw, 2u * j64);
    const uvec2 sm1 = scale_min_words(sw, 2u * j64 + 1u);
    const float d = a_scale(p.nb, ib, 0u);
    const float dmin = a_scale(p.nb, ib, 1u);
    // w = dl q - ml; sum(q x) = 16 (s - sx)
    const float dl0 = d * float(sm0.x), dl1 = d * float(sm1.x);
    return dl0 * 16.0 * (s0 - sx[0]) - dmin * float(sm0.y) * sx[0]
         + dl1 * 16.0 * (s1 - sx[1]) - dmin * float(sm1.y) * sx[1];
#elif defined(DATA_A_Q5_K)
    // Unit = sub-block u % 8 of block u / 8 (dequant_sub32's layout): the
    // low (even sub-blocks) or high (odd) nibbles of the 32 bytes at 32 j64
    // of qs, and bit `sub` of each of qh's 32 bytes as the fifth bit.
    const uint ib = row * (units / 8u) + u / 8u;
    const uint sub = u % 8u;
    const uint ql = (ib * PLANE0_WORDS + 8u * (sub / 2u)) / 4u;
    const uint qh = (p.nb * PLANE0_WORDS + ib * PLANE1_WORDS) / 4u;
    const uint ls = 4u * (sub & 1u);
    const uvec4 l0 = data_a4[ql] >> ls, l1 = data_a4[ql + 1u] >> ls;
    const uvec4 h0 = data_a4[qh] >> sub, h1 = data_a4[qh + 1u] >> sub;
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint q0 = (l0[i] & 0x0F0F0F0Fu) | ((h0[i] << 4) & 0x10101010u);
        const uint q1 = (l1[i] & 0x0F0F0F0Fu) | ((h1[i] << 4) & 0x10101010u);
        s += dot(bits_unit(q0, 5u), xv[i]) + dot(bits_unit(q1, 5u), xv[i + 4u]);
    }
    const uvec2 sm = scale_min_words(scale_words(ib), sub);
    // w = dl q - ml; sum(q x) = 32 (s - sx)
    return a_scale(p.nb, ib, 0u) * float(sm.x) * 32.0 * (s - sx[0])
         - a_scale(p.nb, ib, 1u) * float(sm.y) * sx[0];
#elif defined(DATA_A_Q6_K)
    // Unit = sub-block u % 8 of block u / 8 (dequant_sub32's layout): 32
    // low nibbles from 8 words of ql, 2 high bits each from 8 words of qh,
    // a signed 8-bit scale per 16 columns.
    const uint ib = row * (units / 8u) + u / 8u;
    const uint part = u % 8u;
    const uint n = part >> 2, quarter = part & 3u;
    const uint ql = (ib * PLANE0_WORDS + n * 16u + (quarter & 1u) * 8u) / 4u;
    const uint qh = (p.nb * PLANE0_WORDS + ib * PLANE1_WORDS + n * 8u) / 4u;
    const uint ls = 4u * (quarter >> 1), hs = 2u * quarter;
    const uvec4 l0 = data_a4[ql] >> ls, l1 = data_a4[ql + 1u] >> ls;
    const uvec4 h0 = data_a4[qh] >> hs, h1 = data_a4[qh + 1u] >> hs;
    float s0 = 0.0, s1 = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        const uint q0 = (l0[i] & 0x0F0F0F0Fu) | ((h0[i] << 4) & 0x30303030u);
        const uint q1 = (l1[i] & 0x0F0F0F0Fu) | ((h1[i] << 4) & 0x30303030u);
        s0 += dot(bits_unit(q0, 6u), xv[i]);
        s1 += dot(bits_unit(q1, 6u), xv[i + 4u]);
    }
    // Bytes n * 8 + 2 quarter and the next of the scales: one word.
    const uint sw = data_a[p.nb * (PLANE0_WORDS + PLANE1_WORDS) + ib * PLANE2_WORDS + 2u * n + quarter / 2u]
                  >> (16u * (quarter & 1u));
    const float sc0 = float(int(sw << 24) >> 24), sc1 = float(int(sw << 16) >> 24);
    // s = sx + sum(q x) / 64; sum((q - 32) x) = 64 s - 96 sx
    return a_scale(p.nb, ib, 0u) * (sc0 * (64.0 * s0 - 96.0 * sx[0]) + sc1 * (64.0 * s1 - 96.0 * sx[1]));
#else
    vec4 w[8];
    dequant_sub32(p.nb, row * units + u, w);
    float s = 0.0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        s += dot(w[j], xv[j]);
    }
    return s;
#endif
}

// Shuffles reduce within runs of SG lanes; wider row groups go through shared memory.
const uint SG = TPR < SUBGROUP ? TPR : SUBGROUP;
shared float red[gl_WorkGroupSize.x * (NR + 1u)];

// x staged once per workgroup (with the folded norm's weights applied), so
// the row groups read it from shared memory rather than each from cache.
// Lanes read whole units at a stride of UVEC4 vec4s: a vec4's slot is
// XOR-swizzled by its unit's index so the lanes of a quarter-subgroup hit
// distinct banks.
shared vec4 xs[XSV];
shared float ss_part[(gl_WorkGroupSize.x + 3u) / 4u]; // a slot per subgroup (4+ lanes each)
uint xs_slot(uint v) {
    return v ^ ((v / UVEC4) & 7u);
}

void main() {
    const uint RG = gl_WorkGroupSize.x / (TPR * KS);
    const uint rows_per_wg = RG * NR;
    const uint wgl = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint tok = wgl % p.n_tok;
    const uint wg = wgl / p.n_tok;
    const uint x_off = p.x_offset + tok * p.ld_x;
    const uint d_off = p.d_offset + tok * p.ld_d;
    const uint lid = gl_LocalInvocationID.x;
    const uint lane = lid % TPR;
    const uint rg = (lid / TPR) % RG;
    const uint slice = lid / (TPR * RG);
    const uint row0 = wg * rows_per_wg + rg * NR;
    const uint units = p.k / (32u * USUBS);
    const uint per_slice = (units + KS - 1u) / KS;
    const uint u_lo = slice * per_slice;
    const uint u_hi = min(units, u_lo + per_slice);
    const bool norm = (p.flags & LINEAR_NORM) != 0u;
    const bool norm1 = (p.flags & LINEAR_NORM_ZERO_CENTRED) != 0u;

    // acc[NR]: the sum of squares of x for the folded norm.
    float acc[NR + 1];
    [[unroll]] for (uint r = 0u; r <= NR; r++) {
        acc[r] = 0.0;
    }
    const bool staged = XSV > 1u;
    // Staged x goes through shared memory in chunks of XSV vec4s (whole
    // units); unstaged, the whole row is one pass.
    const uint chunk_units = staged ? XSV / UVEC4 : units;
    float ss_all = 0.0;
    for (uint c0 = 0u; c0 < units; c0 += chunk_units) {
        const uint c1 = min(units, c0 + chunk_units);
        if (staged) {
            if (c0 > 0u) {
                barrier();   // every row group is done with the last chunk
            }
            float ss = 0.0;
            // Four vec4s (and their norm weights) in flight per invocation:
            // one load per iteration paid a round trip to memory each.
            const uint nv = (c1 - c0) * UVEC4;
            const uint wgs = gl_WorkGroupSize.x;
            for (uint v0 = lid; v0 < nv; v0 += 4u * wgs) {
                vec4 t[4];
                [[unroll]] for (uint j = 0u; j < 4u; j++) {
                    t[j] = data_x[x_off + c0 * UVEC4 + min(v0 + j * wgs, nv - 1u)];
                }
                // The norm's weights in a run of their own behind one branch:
                // loads behind a branch per vec4 wait for each other.
                if (norm) {
                    vec4 nw[4];
                    [[unroll]] for (uint j = 0u; j < 4u; j++) {
                        nw[j] = data_norm[c0 * UVEC4 + min(v0 + j * wgs, nv - 1u)];
                    }
                    [[unroll]] for (uint j = 0u; j < 4u; j++) {
                        ss += v0 + j * wgs < nv ? dot(t[j], t[j]) : 0.0;
                        t[j] *= norm1 ? nw[j] + 1.0 : nw[j];
                    }
                }
                [[unroll]] for (uint j = 0u; j < 4u; j++) {
                    const uint v = v0 + j * wgs;
                    if (v < nv) {
                        xs[xs_slot(v)] = t[j];
                    }
                }
            }
            if (norm) {
                ss = subgroupAdd(ss);
                if (subgroupElect()) {
                    ss_part[gl_SubgroupID] = ss;
                }
            }
            barrier();
            if (norm) {
                for (uint i = 0u; i < gl_NumSubgroups; i++) {
                    ss_all += ss_part[i];
                }
            }
        }
        // This slice's units inside the chunk.
        const uint lo = max(u_lo, c0);
        const uint hi = min(u_hi, c1);
        if (row0 < p.m) {
            for (uint u0 = lo + lane; u0 < hi; u0 += TPR * UN) {
              [[unroll]] for (uint i = 0u; i < UN; i++) {
                // Past the slice: a duplicate of a live unit, weighted 0, so the
                // loads of all UN units go out together.
                const bool live = u0 + i * TPR < hi;
                const uint u = live ? u0 + i * TPR : u0;
                const uint xb = u * UVEC4;
                vec4 xv[UVEC4];
                if (staged) {
                    [[unroll]] for (uint j = 0u; j < UVEC4; j++) {
                        xv[j] = xs[xs_slot((u - c0) * UVEC4 + j)];
                    }
                } else {
                    [[unroll]] for (uint j = 0u; j < UVEC4; j++) {
                        xv[j] = data_x[x_off + xb + j];
                    }
                }
                if (norm && !staged) {
                    vec4 sq = vec4(0.0);
                    [[unroll]] for (uint j = 0u; j < UVEC4; j++) {
                        sq += xv[j] * xv[j];
                        vec4 nw = data_norm[xb + j];
                        if (norm1) {
                            nw += 1.0;
                        }
                        xv[j] *= nw;
                    }
                    if (live) {
                        acc[NR] += (sq.x + sq.y) + (sq.z + sq.w);
                    }
                }
                float sx[SXN];
#if FAST_PATH
                [[unroll]] for (uint h = 0u; h < SXN; h++) {
                    vec4 t = vec4(0.0);
                    [[unroll]] for (uint j = 0u; j < SXV; j++) {
                        t += xv[SXV * h + j];
                    }
                    sx[h] = (t.x + t.y) + (t.z + t.w);
                }
#else
                sx[0] = 0.0;
#endif
                // No branch per row (rows past the chunk read its last row and
                // are never stored): the loads of all NR rows go out together
                // instead of one round trip to memory per row.
                [[unroll]] for (uint r = 0u; r < NR; r++) {
                    const float d = unit_dot(min(row0 + r, p.m - 1u), u, units, xv, sx);
                    acc[r] += live ? d : 0.0;
                }
              }
            }
        }
    }

    [[unroll]] for (uint r = 0u; r <= NR; r++) {
        [[unroll]] for (uint off = SG / 2u; off > 0u; off >>= 1) {
            acc[r] += subgroupShuffleXor(acc[r], off);
        }
    }
    if (TPR > SG || KS > 1u) {
        // One partial per run of SG lanes of each slice, in the row group's
        // PARTS consecutive slots; the group's first lane of slice 0 sums them.
        const uint runs = TPR / SG;
        const uint parts = runs * KS;
        if (lid % SG == 0u) {
            const uint slot = rg * parts + slice * runs + lane / SG;
            [[unroll]] for (uint r = 0u; r <= NR; r++) {
                red[slot * (NR + 1u) + r] = acc[r];
            }
        }
        barrier();
        if (lane == 0u && slice == 0u) {
            [[unroll]] for (uint r = 0u; r <= NR; r++) {
                float t = 0.0;
                for (uint i = 0u; i < parts; i++) {
                    t += red[(rg * parts + i) * (NR + 1u) + r];
                }
                acc[r] = t;
            }
        }
    }
    if (lane != 0u || slice != 0u) {
        return;
    }
    const float ssq = staged ? ss_all : acc[NR];
    const float inv = norm ? inversesqrt(ssq / float(p.k) + p.eps) : 1.0;
    float v[NR];
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        v[r] = with_bias(row0 + r, acc[r] * inv);
    }
    if ((p.flags & LINEAR_ROPE) != 0u) {
        // The rope kernel's arithmetic, on the values it would have read.
        [[unroll]] for (uint r = 0u; r + 1u < NR; r += 2u) {
            const uint o = p.row_offset + row0 + r;
            const uint i = o % p.head_dim;
            if (row0 + r + 1u < p.m && o < p.rope_rows && i < p.n_rot) {
                const vec2 rot = rope_pair(v[r], v[r + 1u], data_pos[tok], inv_freq[i / 2u],
                                           p.attn_factor);
                v[r] = rot.x;
                v[r + 1u] = rot.y;
            }
        }
    }
    if ((p.flags & LINEAR_GLU) != 0u) {
        [[unroll]] for (uint r = 0u; r + 1u < NR; r += 2u) {
            const uint row = row0 + r;
            if (row + 1u < p.m) {
                const float g = v[r];
                const float a = (p.flags & LINEAR_GELU) != 0u ? act_gelu_tanh(g) : act_silu(g);
                data_d[d_off + (p.row_offset + row) / 2u] = a * v[r + 1u];
            }
        }
        return;
    }
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        const uint row = row0 + r;
        if (row < p.m) {
            store_result(d_off + p.row_offset + row, v[r]);
        }
    }
}
