#version 450
// matvec_q8: d[row] = A[row, :] . x for one token (decode) or a few, with x
// already quantized to 8-bit blocks (quantize_q8_1.comp) and Q4_0 / Q8_0
// weights multiplied in integers: packed 4x8-bit dot products (dp4a, 4
// multiply-adds per instruction) instead of matvec.comp's dequantization to
// f32 (~150 ALU operations per 32 weights, the bound of that kernel on the
// H200). Per 32-column unit, as ggml-cpu's vec_dot_q4_0_q8_0 / q8_0_q8_0:
//   sumi = sum(qw * qx) (Q4_0: - 8 * sum(qx)), exact in int32;
//   value = float(sumi) * d_w * d_x.
// So the result is llama.cpp's CPU dot product up to f32 summation order.
// Q4_K weights (X_F32 only): x is quantized as ggml-cpu's q8_K (256-blocks,
// f32 scale from the signed extreme, quantize_row_q8_K_ref) and each
// 32-column sub-block gives (d sc sumi - dmin m sum(qx)) d_x, the terms of
// vec_dot_q4_K_q8_K. An invocation takes two sub-blocks (64 columns, one
// load of their 32 bytes) per step, or one with Q4K_UNIT32.
//
// The layout is matvec.comp's (see its header): row groups of TPR lanes
// sharing NR rows (one load of x per unit for all NR rows), KS column
// slices, UN units in flight, a subgroup reduction; x is 36 bytes per unit,
// read through cache without staging.
//
// x (binding 1, words): token t's row at x_offset + t * ld_x (multiples of
// 4, for uvec4 loads): K/32 units of 8 words of int8, then K/32 words of
// (f16 d, int16 sum(q)).
//
// X_F32: x is the f32 row itself (binding 1, vec4s: x_offset and ld_x count
// vec4s), quantized by every workgroup into shared memory (XU = K/32 units)
// exactly as quantize_q8_1.comp does. Each workgroup repeats the
// quantization of its token's row, a few hundred operations per unit,
// which costs less than a dispatch of its own and the barrier before the
// product.
// With LINEAR_NORM (+ LINEAR_NORM_ZERO_CENTRED, weights in binding 6) x is
// the raw residual and the RMS norm is folded in: the workgroup quantizes
// x * w and multiplies its sums by 1 / rms(x) at the end, from squares
// taken with the same loads. Quantizing x * w / rms first needed a pass
// over the row and a workgroup reduction before the quantization could
// start (~4 us of each such product on the H200, 12% of an 8B decode
// step). The quants are those of the normed row but where x * w / rms
// lies within a rounding of a half step (the scale cancels in q = x / d),
// and each block's scale is an f32 (amax / 127, times 1 / rms) where
// quantize_q8_1 rounds it to f16.
//
// Optional, by p.flags (iface/matvec_q8.glsl): LINEAR_ACCUMULATE,
// LINEAR_BIAS, LINEAR_GLU (+ LINEAR_GELU), LINEAR_ROPE, as matvec.comp.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_integer_dot_product : require
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32; // 1: unknown, reduce through shared memory
layout(constant_id = 2) const uint TPR = 32;      // invocations per row group, a power of two
layout(constant_id = 3) const uint NR = 1;        // rows per row group
layout(constant_id = 4) const uint KS = 1;        // slices of the columns, one per lane set
layout(constant_id = 5) const uint UN = 1;        // units per lane per iteration (loads in flight)
layout(constant_id = 6) const uint XU = 1;        // X_F32: units of x quantized into shared memory

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#if defined(X_F32)
layout(binding = 1) readonly buffer XF { vec4 data_xf[]; };
layout(binding = 6) readonly buffer NW { vec4 data_norm[]; };
#else
layout(binding = 1) readonly buffer X { uint data_xw[]; };
layout(binding = 1) readonly buffer X4 { uvec4 data_x4[]; };
#endif
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer F { float inv_freq[]; };

#include "iface/matvec_q8.glsl"

#include "common/dequant.glsl"
#include "common/linear_out.glsl"
#include "common/act.glsl"
#include "common/rope.glsl"
#if defined(X_F32)
#include "common/round.glsl"
#include "common/quantize_q8.glsl"
#endif

#if !defined(DATA_A_Q4_0) && !defined(DATA_A_Q8_0) && !defined(DATA_A_Q4_K)
#error "matvec_q8 takes Q4_0, Q8_0 or Q4_K weights"
#endif
#if defined(DATA_A_Q4_K)
#if !defined(X_F32)
#error "Q4_K weights take x in f32 (q8_K blocks are quantized in the workgroup)"
#endif
#define X_Q8K 1
#include "common/q4k_scales.glsl"
#if !defined(Q4K_UNIT32)
#define Q4K_PAIRS 1
#endif
#endif

// sumi * d_w of unit u of row `row` against x's quants (xa: columns 0..15,
// xb: 16..31) and their sum sx.
float unit_dot(uint row, uint u, uint units, const uvec4 xa, const uvec4 xb, const int sx) {
#if defined(DATA_A_Q4_0)
    const uint ib = row * units + u;
    // Byte j holds column j (low nibble) and j + 16 (high): the low nibbles
    // of word i meet x's word i, the high ones word i + 4. Nibbles 0..15
    // are non-negative int8s, so the signed dot product takes them as they are.
    const uvec4 q = data_a4[ib];
    int s = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dotPacked4x8EXT(int(q[i] & 0x0F0F0F0Fu), int(xa[i]));
        s += dotPacked4x8EXT(int((q[i] >> 4) & 0x0F0F0F0Fu), int(xb[i]));
    }
    s -= 8 * sx;
    return float(s) * a_scale(p.nb, ib, 0u);
#elif defined(DATA_A_Q8_0)
    const uint ib = row * units + u;
    const uvec4 q0 = data_a4[2u * ib];
    const uvec4 q1 = data_a4[2u * ib + 1u];
    int s = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dotPacked4x8EXT(int(q0[i]), int(xa[i]));
        s += dotPacked4x8EXT(int(q1[i]), int(xb[i]));
    }
    return float(s) * a_scale(p.nb, ib, 0u);
#else
    // Unit = sub-block u % 8 of block u / 8: the low (even sub-blocks) or
    // high (odd) nibbles of the 32 bytes of its pair, byte l = column l.
    const uint kb = row * (units / 8u) + u / 8u;
    const uint sub = u % 8u;
    const uint qw = (kb * PLANE0_WORDS + 8u * (sub / 2u)) / 4u;
    const uint sh = 4u * (sub & 1u);
    const uvec4 q0 = (data_a4[qw] >> sh) & 0x0F0F0F0Fu;
    const uvec4 q1 = (data_a4[qw + 1u] >> sh) & 0x0F0F0F0Fu;
    int s = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s += dotPacked4x8EXT(int(q0[i]), int(xa[i]));
        s += dotPacked4x8EXT(int(q1[i]), int(xb[i]));
    }
    const uvec2 sm = scale_min_words(scale_words(kb), sub);
    return (a_scale(p.nb, kb, 0u) * float(sm.x)) * float(s)
         - (a_scale(p.nb, kb, 1u) * float(sm.y)) * float(sx);
#endif
}

#if defined(Q4K_PAIRS)
// Q4_K over 64-column steps: sub-blocks 2j and 2j + 1 of block j / 4 (j
// counts pairs of units) share one load of their 32 bytes (low nibbles the
// first, high the second) and of the block's scales, where 32-column units
// load each twice (in neighbouring invocations). Unit terms as unit_dot's;
// the two are added before the product with x's scale, which their
// 256-block gives both.
float pair_dot(uint row, uint j, uint units, const uvec4 xa0, const uvec4 xb0, const int sx0,
               const uvec4 xa1, const uvec4 xb1, const int sx1) {
    const uint kb = row * (units / 8u) + j / 4u;
    const uint j64 = j % 4u;
    const uint qw = (kb * PLANE0_WORDS + 8u * j64) / 4u;
    const uvec4 w0 = data_a4[qw];
    const uvec4 w1 = data_a4[qw + 1u];
    int s0 = 0, s1 = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        s0 += dotPacked4x8EXT(int(w0[i] & 0x0F0F0F0Fu), int(xa0[i]));
        s0 += dotPacked4x8EXT(int(w1[i] & 0x0F0F0F0Fu), int(xb0[i]));
        s1 += dotPacked4x8EXT(int((w0[i] >> 4) & 0x0F0F0F0Fu), int(xa1[i]));
        s1 += dotPacked4x8EXT(int((w1[i] >> 4) & 0x0F0F0F0Fu), int(xb1[i]));
    }
    const uvec3 sw = scale_words(kb);
    const uvec2 sm0 = scale_min_words(sw, 2u * j64);
    const uvec2 sm1 = scale_min_words(sw, 2u * j64 + 1u);
    const float d = a_scale(p.nb, kb, 0u);
    const float dmin = a_scale(p.nb, kb, 1u);
    return ((d * float(sm0.x)) * float(s0) - (dmin * float(sm0.y)) * float(sx0))
         + ((d * float(sm1.x)) * float(s1) - (dmin * float(sm1.y)) * float(sx1));
}
// Units of x per step of the column loop.
const uint UW = 2u;
#else
const uint UW = 1u;
#endif

// Shuffles reduce within runs of SG lanes; wider row groups go through shared memory.
const uint SG = TPR < SUBGROUP ? TPR : SUBGROUP;
shared float red[gl_WorkGroupSize.x * NR];

#if defined(X_F32)
// The token's row quantized: unit u's 32 int8 in xs_q[2u], xs_q[2u + 1],
// its (f16 d, int16 sum) word in xs_s[u], as quantize_q8_1.comp lays them out.
shared uvec4 xs_q[2u * XU];
shared uint xs_s[XU];
// Each subgroup's sum of squares of x (LINEAR_NORM).
shared float xs_ss[(gl_WorkGroupSize.x + 3u) / 4u]; // a slot per subgroup (4+ lanes each)
#if !defined(X_Q8K)
// Unit u's scale as an f32: the f16 of xs_s[u] without LINEAR_NORM, the
// unrounded amax / 127 of x * w with it.
shared float xs_df[XU];
#endif
#if defined(X_Q8K)
// q8_K: each unit's signed extreme, then each 256-block's f32 scale.
shared float xs_e[XU];
shared float xs_d[(XU + 7u) / 8u];
#endif

// This invocation's sum of squares of x into its subgroup's slot of xs_ss
// (LINEAR_NORM; read after the quantizer's last barrier).
void store_squares(float ss) {
    ss = subgroupAdd(ss);
    if (subgroupElect()) {
        xs_ss[gl_SubgroupID] = ss;
    }
}

// quantize_q8_1.comp's arithmetic for the row at vec4 xv, one unit per
// invocation; every invocation must call it (barriers).
void quantize_row(const uint xv, const uint units) {
    const uint lid = gl_LocalInvocationID.x;
    const uint wg = gl_WorkGroupSize.x;
    const bool norm = (p.flags & LINEAR_NORM) != 0u;
    const bool norm1 = (p.flags & LINEAR_NORM_ZERO_CENTRED) != 0u;
    // x * w: 1 / rms comes at the end (see the header).
    const float scale = 1.0;
    float ss = 0.0;
#if defined(X_Q8K)
    // act_round.comp's ROUND_Q8_K, a unit per invocation: the signed value of
    // largest magnitude of each 256-block (the first on ties) through shared
    // memory, iscale = -127 / it, q = min(127, roundEven(iscale x)), d = 1 / iscale.
    for (uint u0 = 0u; u0 < units; u0 += wg) {
        const uint u = u0 + lid;
        const bool live = u < units;
        vec4 v[8];
        float amax = 0.0;
        float m = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            vec4 t = live ? data_xf[xv + 8u * u + j] : vec4(0.0);
            if (norm) {
                ss += dot(t, t);
            }
            if (norm && live) {
                t = norm_weighted(t, 8u * u + j, scale, norm1);
            }
            v[j] = t;
            [[unroll]] for (uint c = 0u; c < 4u; c++) {
                if (abs(t[c]) > amax) {
                    amax = abs(t[c]);
                    m = t[c];
                }
            }
        }
        if (live) {
            xs_e[u] = m;
        }
        barrier();
        if (live) {
            // wg is a multiple of 8: a block's units are in this round.
            const uint b0 = u & ~7u;
            float bmax = 0.0;
            float bm = 0.0;
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                const float e = xs_e[b0 + j];
                if (abs(e) > bmax) {
                    bmax = abs(e);
                    bm = e;
                }
            }
            const float iscale = bmax != 0.0 ? div_rn(-127.0, bm) : 0.0;
            int sum = 0;
            uint w[8];
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                precise vec4 s = iscale * v[j];
                const ivec4 q = ivec4(min(vec4(127.0), roundEven(s)));
                sum += (q.x + q.y) + (q.z + q.w);
                w[j] = pack_i8x4(q);
            }
            xs_q[2u * u] = uvec4(w[0], w[1], w[2], w[3]);
            xs_q[2u * u + 1u] = uvec4(w[4], w[5], w[6], w[7]);
            xs_s[u] = uint(sum) << 16;
            if (u == b0) {
                xs_d[u / 8u] = bmax != 0.0 ? div_rn(1.0, iscale) : 0.0;
            }
        }
        barrier();
    }
    if (norm) {
        store_squares(ss);
        barrier();
    }
#else
    for (uint u = lid; u < units; u += wg) {
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            vec4 t = data_xf[xv + 8u * u + j];
            if (norm) {
                ss += dot(t, t);
                t = norm_weighted(t, 8u * u + j, scale, norm1);
            }
            v[j] = t;
            const vec4 a = abs(t);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        const float d = norm ? div_rn(amax, 127.0) : round_f16(div_rn(amax, 127.0));
        const float inv = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
        int sum = 0;
        uint w[8];
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            precise vec4 s = v[j] * inv;
            const ivec4 q = ivec4(roundEven(s));
            sum += (q.x + q.y) + (q.z + q.w);
            w[j] = pack_i8x4(q);
        }
        xs_q[2u * u] = uvec4(w[0], w[1], w[2], w[3]);
        xs_q[2u * u + 1u] = uvec4(w[4], w[5], w[6], w[7]);
        xs_s[u] = (packHalf2x16(vec2(d, 0.0)) & 0xFFFFu) | (uint(sum) << 16);
        xs_df[u] = d;
    }
    if (norm) {
        store_squares(ss);
    }
    barrier();
#endif
}
#define X_QA(u) xs_q[2u * (u)]
#define X_QB(u) xs_q[2u * (u) + 1u]
#define X_SC(u) xs_s[u]
#if defined(X_Q8K)
#define X_DX(u, w) xs_d[(u) / 8u]
#else
#define X_DX(u, w) xs_df[u]
#endif
#else
#define X_DX(u, w) unpackHalf2x16(w).x
#define X_QA(u) data_x4[xq / 4u + 2u * (u)]
#define X_QB(u) data_x4[xq / 4u + 2u * (u) + 1u]
#define X_SC(u) data_xw[xsc + (u)]
#endif

void main() {
    const uint RG = gl_WorkGroupSize.x / (TPR * KS);
    const uint rows_per_wg = RG * NR;
    const uint wgl = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint tok = wgl % p.n_tok;
    const uint wg = wgl / p.n_tok;
    const uint xq = p.x_offset + tok * p.ld_x;
    const uint d_off = p.d_offset + tok * p.ld_d;
    const uint lid = gl_LocalInvocationID.x;
    const uint lane = lid % TPR;
    const uint rg = (lid / TPR) % RG;
    const uint slice = lid / (TPR * RG);
    const uint row0 = wg * rows_per_wg + rg * NR;
    const uint units = p.k / 32u;
    const uint xsc = xq + 8u * units;
#if defined(X_F32)
    // Before any invocation leaves: the quantizer has barriers.
    quantize_row(xq, units);
#endif
    const uint steps = units / UW;
    const uint per_slice = (steps + KS - 1u) / KS;
    const uint u_lo = slice * per_slice;
    const uint u_hi = min(steps, u_lo + per_slice);

    float acc[NR];
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        acc[r] = 0.0;
    }
    if (row0 < p.m) {
        for (uint u0 = u_lo + lane; u0 < u_hi; u0 += TPR * UN) {
            [[unroll]] for (uint i = 0u; i < UN; i++) {
                // Past the slice: a duplicate of a live unit, weighted 0, so the
                // loads of all UN units go out together.
                const bool live = u0 + i * TPR < u_hi;
                const uint u = live ? u0 + i * TPR : u0;
#if defined(Q4K_PAIRS)
                const uint ua = 2u * u;
                const uvec4 xa0 = X_QA(ua);
                const uvec4 xb0 = X_QB(ua);
                const uvec4 xa1 = X_QA(ua + 1u);
                const uvec4 xb1 = X_QB(ua + 1u);
                const int sx0 = int(X_SC(ua)) >> 16;
                const int sx1 = int(X_SC(ua + 1u)) >> 16;
                const float dx = X_DX(ua, 0u);
                [[unroll]] for (uint r = 0u; r < NR; r++) {
                    const float v = pair_dot(min(row0 + r, p.m - 1u), u, units, xa0, xb0, sx0,
                                             xa1, xb1, sx1) * dx;
                    acc[r] += live ? v : 0.0;
                }
#else
                const uvec4 xa = X_QA(u);
                const uvec4 xb = X_QB(u);
                const uint xw = X_SC(u);
                const float dx = X_DX(u, xw);
                const int sx = int(xw) >> 16;
                // No branch per row (rows past the chunk read its last row and
                // are never stored): the loads of all NR rows go out together.
                [[unroll]] for (uint r = 0u; r < NR; r++) {
                    const float v = unit_dot(min(row0 + r, p.m - 1u), u, units, xa, xb, sx) * dx;
                    acc[r] += live ? v : 0.0;
                }
#endif
            }
        }
    }

    [[unroll]] for (uint r = 0u; r < NR; r++) {
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
            [[unroll]] for (uint r = 0u; r < NR; r++) {
                red[slot * NR + r] = acc[r];
            }
        }
        barrier();
        if (lane == 0u && slice == 0u) {
            [[unroll]] for (uint r = 0u; r < NR; r++) {
                float t = 0.0;
                for (uint i = 0u; i < parts; i++) {
                    t += red[(rg * parts + i) * NR + r];
                }
                acc[r] = t;
            }
        }
    }
    if (lane != 0u || slice != 0u) {
        return;
    }
    float inv = 1.0;
#if defined(X_F32)
    if ((p.flags & LINEAR_NORM) != 0u) {
        float ss = 0.0;
        for (uint i = 0u; i < gl_NumSubgroups; i++) {
            ss += xs_ss[i];
        }
        inv = inversesqrt(ss / float(p.k) + p.eps);
    }
#endif
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
