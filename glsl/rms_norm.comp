#version 450
// rms_norm: d[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w, one workgroup
// per row (llama.cpp ggml_rms_norm followed by the weight multiply). Rows may
// come in groups (a token's heads inside a wider row): row = group g, member r.
// Flags: 1: multiply by (1 + w) instead of w; 2: add the result into d
// (residual after a post-norm); 4: no weight. With OUT_F16, d is f16 (the
// input of batched decode's cooperative-matrix products; no RMS_NORM_ADD).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#if defined(OUT_F16)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) readonly buffer W { float data_w[]; };
#if defined(OUT_F16)
layout(binding = 2) buffer D { float16_t data_d[]; };
#else
layout(binding = 2) buffer D { float data_d[]; };
#endif

#include "iface/rms_norm.glsl"

#include "common/reduce.glsl"

// Elements per invocation kept in registers.
const uint RV = 16u;

// d[o] = xhat * w (+ d[o]) for column i.
void store(uint o, uint i, float xhat) {
    float w = (p.flags & RMS_NORM_NO_WEIGHT) != 0u ? 1.0 : data_w[i];
    if ((p.flags & RMS_NORM_ZERO_CENTRED) != 0u) {
        w += 1.0;
    }
    float r = xhat * w;
#if defined(OUT_F16)
    data_d[o] = float16_t(r);
#else
    if ((p.flags & RMS_NORM_ADD) != 0u) {
        r += data_d[o];
    }
    data_d[o] = r;
#endif
}

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.n_rows) {
        return;
    }
    const uint g = row / p.group, r = row % p.group;
    const uint xb = p.x_offset + g * p.ld_group_x + r * p.ld_x;
    const uint db = p.d_offset + g * p.ld_group_d + r * p.ld_d;
    // Rows up to RV elements per invocation stay in registers between the
    // two passes, their loads all issued at once: a loop of dependent
    // loads made a 2048-wide norm of 16 rows take ~7 us on the H200.
    const uint wg = gl_WorkGroupSize.x;
    const uint tid = gl_LocalInvocationID.x;
    const bool cached = p.n_cols <= wg * RV;
    float v[RV];
    float ss = 0.0;
    if (cached) {
        [[unroll]] for (uint j = 0u; j < RV; j++) {
            const uint i = tid + j * wg;
            v[j] = i < p.n_cols ? data_x[xb + i] : 0.0;
        }
        [[unroll]] for (uint j = 0u; j < RV; j++) {
            ss += v[j] * v[j];
        }
    } else {
        for (uint i = tid; i < p.n_cols; i += wg) {
            const float x = data_x[xb + i];
            ss += x * x;
        }
    }
    ss = workgroup_sum(ss);
    const float scale = inversesqrt(ss / float(p.n_cols) + p.eps);
    if (cached) {
        [[unroll]] for (uint j = 0u; j < RV; j++) {
            const uint i = tid + j * wg;
            if (i < p.n_cols) {
                store(db + i, i, v[j] * scale);
            }
        }
    } else {
        for (uint i = tid; i < p.n_cols; i += wg) {
            store(db + i, i, data_x[xb + i] * scale);
        }
    }
}
