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
// One workgroup per token. Optional, by p.flags (iface/quantize_q8_1.glsl):
//   QUANTIZE_NORM: x is the raw residual; quantize (x / rms(x)) * w, the
//      rms_norm kernel's arithmetic in its order (QUANTIZE_NORM_ZERO_CENTRED:
//      with (1 + w)).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { vec4 data_x[]; };
layout(binding = 1) writeonly buffer D { uint data_q[]; };
layout(binding = 2) readonly buffer N { vec4 data_norm[]; };

#include "iface/quantize_q8_1.glsl"

#include "common/reduce.glsl"
#include "common/round.glsl"

uint pack_i8x4(ivec4 q) {
    const uvec4 b = uvec4(q) & 0xFFu;
    return b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);
}

void main() {
    const uint tok = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    // Uniform per workgroup: the barriers below are reached by all or none.
    if (tok >= p.n_tokens) {
        return;
    }
    const uint lid = gl_LocalInvocationID.x;
    const uint wg = gl_WorkGroupSize.x;
    const uint blocks = p.k / 32u;
    const uint xs = p.x_offset + tok * p.ld_x;
    const uint qs = p.d_offset + tok * p.ld_d;
    const bool norm = (p.flags & QUANTIZE_NORM) != 0u;
    const bool norm1 = (p.flags & QUANTIZE_NORM_ZERO_CENTRED) != 0u;

    float scale = 1.0;
    if (norm) {
        float ss = 0.0;
        for (uint v = lid; v < p.k / 4u; v += wg) {
            const vec4 t = data_x[xs + v];
            ss += dot(t, t);
        }
        ss = workgroup_sum(ss);
        scale = inversesqrt(ss / float(p.k) + p.eps);
    }

    for (uint b = lid; b < blocks; b += wg) {
        vec4 v[8];
        float amax = 0.0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            vec4 t = data_x[xs + 8u * b + j];
            if (norm) {
                vec4 nw = data_norm[8u * b + j];
                if (norm1) {
                    nw += 1.0;
                }
                precise vec4 xhat = t * scale;
                precise vec4 y = xhat * nw;
                t = y;
            }
            v[j] = t;
            const vec4 a = abs(t);
            amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
        }
        const float d = round_f16(div_rn(amax, 127.0));
        const float id = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
        int sum = 0;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            precise vec4 s = v[j] * id;
            const ivec4 q = ivec4(roundEven(s));
            sum += (q.x + q.y) + (q.z + q.w);
            data_q[qs + 8u * b + j] = pack_i8x4(q);
        }
        // d is already an f16 value: packHalf2x16's rounding mode cannot move it.
        data_q[qs + 8u * blocks + b] = (packHalf2x16(vec2(d, 0.0)) & 0xFFFFu) | (uint(sum) << 16);
    }
}
