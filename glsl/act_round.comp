#version 450
// act_round: d = the values llama.cpp's CPU backend multiplies a weight row
// with, for N tokens of activations x. Before a dot product with a quantized
// weight, ggml-cpu converts the activation row to the weight's "vec_dot_type"
// (q8_0 / q8_1 for the 32-blocks, q8_K for the K-quants, f16, bf16); this
// kernel writes dequant(quant(x)) so an exact f32 matmul on the result equals
// llama.cpp's integer dot product up to f32 summation order.
//
//   ROUND_Q8_0: one invocation per 32-block; d = amax/127 stored as f16,
//               q = roundEven(x * (127/amax)) (the AVX2 path of
//               quantize_row_q8_0 / q8_1); value = q * f16(d).
//   ROUND_Q8_K: one invocation per 256-block; the signed element of largest
//               magnitude m (first one on ties), iscale = -127/m,
//               q = min(127, roundEven(iscale * x)); value = q * (1/iscale)
//               (quantize_row_q8_K_ref).
//   ROUND_F16:  one invocation per element; round to nearest even f16.
//   ROUND_BF16: one invocation per element; round to nearest even bf16.

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) writeonly buffer D { float data_d[]; };

#include "iface/act_round.glsl"

#if defined(ROUND_Q8_0)
#define BLOCK 32
#elif defined(ROUND_Q8_K)
#define BLOCK 256
#elif defined(ROUND_F16) || defined(ROUND_BF16)
#define BLOCK 1
#else
#error "no ROUND_* defined"
#endif

#include "common/round.glsl"

// f32 -> bf16 -> f32, ggml_compute_fp32_to_bf16 (nearest even, quiet NaN).
float round_bf16(float v) {
    uint u = floatBitsToUint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return uintBitsToFloat((u | 0x00400000u) & 0xffff0000u);
    }
    u = (u + (0x7fffu + ((u >> 16) & 1u))) & 0xffff0000u;
    return uintBitsToFloat(u);
}

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    const uint per_token = p.width / BLOCK;
    if (i >= p.n_tokens * per_token) {
        return;
    }
    const uint tok = i / per_token;
    const uint c0 = (i % per_token) * BLOCK;
    const uint xs = p.x_offset + tok * p.ld_x + c0;
    const uint ds = p.d_offset + tok * p.ld_d + c0;

#if defined(ROUND_Q8_0)
    float amax = 0.0;
    for (uint j = 0; j < BLOCK; ++j) {
        amax = max(amax, abs(data_x[xs + j]));
    }
    const float d = round_f16(div_rn(amax, 127.0));
    const float id = amax != 0.0 ? div_rn(127.0, amax) : 0.0;
    for (uint j = 0; j < BLOCK; ++j) {
        precise float s = data_x[xs + j] * id;
        precise float v = roundEven(s) * d;
        data_d[ds + j] = v;
    }
#elif defined(ROUND_Q8_K)
    float amax = 0.0;
    float m = 0.0;
    for (uint j = 0; j < BLOCK; ++j) {
        const float v = data_x[xs + j];
        if (abs(v) > amax) {
            amax = abs(v);
            m = v;
        }
    }
    if (amax == 0.0) {
        for (uint j = 0; j < BLOCK; ++j) {
            data_d[ds + j] = 0.0;
        }
        return;
    }
    const float iscale = div_rn(-127.0, m);
    const float d = div_rn(1.0, iscale);
    for (uint j = 0; j < BLOCK; ++j) {
        precise float s = iscale * data_x[xs + j];
        precise float v = min(127.0, roundEven(s)) * d;
        data_d[ds + j] = v;
    }
#elif defined(ROUND_F16)
    data_d[ds] = round_f16(data_x[xs]);
#elif defined(ROUND_BF16)
    data_d[ds] = round_bf16(data_x[xs]);
#endif
}
