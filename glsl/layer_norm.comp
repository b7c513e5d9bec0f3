#version 450
// layer_norm: d[row] = (x[row] - mean) / sqrt(var + eps) * w + b, one
// workgroup per row (PyTorch's LayerNorm with weight and bias: the biased
// variance, eps inside the square root). The variance is the mean of the
// squared deviations from the mean, a second pass over the row, so rows far
// from zero keep their precision.

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) readonly buffer W { float data_w[]; };
layout(binding = 2) readonly buffer B { float data_b[]; };
layout(binding = 3) writeonly buffer D { float data_d[]; };

#include "iface/layer_norm.glsl"

#include "common/reduce.glsl"

void main() {
    const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    // Every invocation reaches the barriers in workgroup_sum: rows past the
    // end only skip their loads and stores.
    const bool live = row < p.n_rows;
    const uint wg = gl_WorkGroupSize.x;
    const uint tid = gl_LocalInvocationID.x;
    const uint xb = p.x_offset + row * p.ld_x;
    const uint db = p.d_offset + row * p.ld_d;
    float s = 0.0;
    if (live) {
        for (uint i = tid; i < p.n_cols; i += wg) {
            s += data_x[xb + i];
        }
    }
    const float mean = workgroup_sum(s) / float(p.n_cols);
    float ss = 0.0;
    if (live) {
        for (uint i = tid; i < p.n_cols; i += wg) {
            const float dx = data_x[xb + i] - mean;
            ss += dx * dx;
        }
    }
    const float scale = inversesqrt(workgroup_sum(ss) / float(p.n_cols) + p.eps);
    if (live) {
        for (uint i = tid; i < p.n_cols; i += wg) {
            data_d[db + i] = (data_x[xb + i] - mean) * scale * data_w[i] + data_b[i];
        }
    }
}
