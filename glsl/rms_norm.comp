#version 450
// rms_norm: d[row] = x[row] / sqrt(mean(x[row]^2) + eps) * w, one workgroup
// per row (llama.cpp ggml_rms_norm followed by the weight multiply). Rows may
// come in groups (a token's heads inside a wider row): row = group g, member r.
// Flags: 1: multiply by (1 + w) instead of w; 2: add the result into d
// (residual after a post-norm); 4: no weight.

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) readonly buffer W { float data_w[]; };
layout(binding = 2) buffer D { float data_d[]; };

layout(push_constant) uniform Params {
    uint n_cols;
    uint n_rows;
    uint ld_x;
    uint ld_d;
    uint x_offset;
    uint d_offset;
    float eps;
    uint flags;
    uint group;       // rows per group (a token's heads)
    uint ld_group_x;  // floats between groups of x
    uint ld_group_d;  // floats between groups of d
} p;

#include "common/reduce.glsl"

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (row >= p.n_rows) {
        return;
    }
    const uint g = row / p.group, r = row % p.group;
    const uint xb = p.x_offset + g * p.ld_group_x + r * p.ld_x;
    const uint db = p.d_offset + g * p.ld_group_d + r * p.ld_d;
    float ss = 0.0;
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        const float v = data_x[xb + i];
        ss += v * v;
    }
    ss = workgroup_sum(ss);
    const float scale = inversesqrt(ss / float(p.n_cols) + p.eps);
    for (uint i = gl_LocalInvocationID.x; i < p.n_cols; i += gl_WorkGroupSize.x) {
        float w = (p.flags & 4u) != 0u ? 1.0 : data_w[i];
        if ((p.flags & 1u) != 0u) {
            w += 1.0;
        }
        float r = data_x[xb + i] * scale * w;
        if ((p.flags & 2u) != 0u) {
            r += data_d[db + i];
        }
        data_d[db + i] = r;
    }
}
