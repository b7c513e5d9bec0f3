#version 450
// quantize_q8_1: each token row of K floats of x to K/32 blocks of 8-bit
// integers with an f16 scale, the input of the integer-dot-product matvec
// (matvec_q8.comp). Per block, llama.cpp's quantize_row_q8_1 (its AVX2
// path, as act_round.comp's ROUND_Q8_0): d = f16(amax / 127),
// q = roundEven(x * (127 / amax)), both divisions correctly rounded. Where
// block_q8_1 keeps s = f16(d * sum(q)), this keeps sum(q) itself (an int16),
// so Q4_0's offset of 8 comes out of the integer sum exactly, as in
// ggml-cpu's vec_dot_q4_0_q8_0.
//
// Layout of one token's row (words, from d_offset + tok * ld_d):
//   qs plane   : K/32 blocks of 8 words, q[4j..4j+3] in word j, byte i of a
//                word = q[4j + i] (two's complement)
//   scale plane: K/32 words, f16 d in the low half, sum(q) (int16) in the high
//
// One invocation per 4 values, 8 per block, QWG / 8 blocks per workgroup;
// a token's row is spread over ceil(K / (4 QWG)) workgroups so that a
// decode row is quantized by many SMs at once (one workgroup per token
// left a 4096-wide row on one SM for 6-11 us on an H200).
// Optional, by p.flags (iface/quantize_q8_1.glsl):
//   QUANTIZE_NORM: x is the raw residual; quantize (x / rms(x)) * w, the
//      rms_norm kernel's arithmetic (QUANTIZE_NORM_ZERO_CENTRED: with
//      (1 + w)). Every workgroup of a row sums the whole row's squares
//      itself: a second pass over 16-56 KB of L2 costs less than a second
//      dispatch.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

#define QWG 256u

layout(local_size_x = 256) in;

layout(binding = 0) readonly buffer X { vec4 data_x[]; };
layout(binding = 1) writeonly buffer D { uint data_q[]; };
layout(binding = 2) readonly buffer N { vec4 data_norm[]; };

#include "iface/quantize_q8_1.glsl"

#include "common/reduce.glsl"
#include "common/round.glsl"
#include "common/quantize_q8.glsl"

shared float sh_amax[QWG];
shared int sh_sum[QWG];

void main() {
    const uint vecs = p.k / 4u;
    const uint chunks = (vecs + QWG - 1u) / QWG;
    const uint id = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint tok = id / chunks;
    // Uniform per workgroup: the barriers below are reached by all or none.
    if (tok >= p.n_tokens) {
        return;
    }
    const uint lid = gl_LocalInvocationID.x;
    const uint v = (id % chunks) * QWG + lid;
    const bool live = v < vecs;
    const uint blocks = p.k / 32u;
    const uint xs = p.x_offset + tok * p.ld_x;
    const uint qs = p.d_offset + tok * p.ld_d;
    const bool norm = (p.flags & QUANTIZE_NORM) != 0u;
    const bool norm1 = (p.flags & QUANTIZE_NORM_ZERO_CENTRED) != 0u;

    float scale = 1.0;
    if (norm) {
        float ss = 0.0;
        for (uint i = lid; i < vecs; i += QWG) {
            const vec4 t = data_x[xs + i];
            ss += dot(t, t);
        }
        ss = workgroup_sum(ss);
        scale = inversesqrt(ss / float(p.k) + p.eps);
    }

    vec4 t = live ? data_x[xs + v] : vec4(0.0);
    if (norm && live) {
        t = norm_weighted(t, v, scale, norm1);
    }
    const vec4 a = abs(t);
    sh_amax[lid] = max(max(a.x, a.y), max(a.z, a.w));
    barrier();
    // The 8 invocations of a block are lid & ~7 .. lid | 7, all in this
    // workgroup (QWG is a multiple of 8 and so is each chunk's start).
    const uint b0 = lid & ~7u;
    float amax = 0.0;
    [[unroll]] for (uint j = 0u; j < 8u; j++) {
        amax = max(amax, sh_amax[b0 + j]);
    }
    const float d = round_f16(div_rn(amax, 127.0));
    const float inv = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
    precise vec4 s = t * inv;
    const ivec4 q = ivec4(roundEven(s));
    sh_sum[lid] = (q.x + q.y) + (q.z + q.w);
    // Word v of the qs plane is word v % 8 of block v / 8.
    if (live) {
        data_q[qs + v] = pack_i8x4(q);
    }
    barrier();
    if (live && (lid & 7u) == 0u) {
        int sum = 0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            sum += sh_sum[b0 + j];
        }
        // d is already an f16 value: packHalf2x16's rounding mode cannot move it.
        data_q[qs + 8u * blocks + v / 8u] = (packHalf2x16(vec2(d, 0.0)) & 0xFFFFu) | (uint(sum) << 16);
    }
}
