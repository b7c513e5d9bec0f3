#version 450
// matvec: d[row] = A[row, :] . x for one token (decode), weights of any
// DATA_A_* format dequantized on the fly in sub-blocks of 32. TPR invocations
// share a row; the workgroup covers WG / TPR rows of one weight chunk.
// Optional: accumulate into d (residual add) and add a bias.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;
layout(constant_id = 2) const uint TPR = 32;   // invocations per row, a power of two

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer X { vec4 data_x[]; };
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

layout(push_constant) uniform Params {
    uint k;           // columns (a multiple of 32)
    uint m;           // rows in this chunk
    uint nb;          // blocks in this chunk
    uint row_offset;  // output index of the chunk's first row
    uint x_offset;    // vec4 index of the input vector
    uint d_offset;    // output index of row 0 of the whole weight
    uint flags;       // 1: d += result, 2: add bias[row_offset + row]
} p;

#include "common/dequant.glsl"

shared float partial[gl_WorkGroupSize.x];

void main() {
    const uint rows_per_wg = gl_WorkGroupSize.x / TPR;
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint lane = gl_LocalInvocationID.x % TPR;
    const uint row = wg * rows_per_wg + gl_LocalInvocationID.x / TPR;
    const uint subs = p.k / 32u;

    float acc = 0.0;
    if (row < p.m) {
        for (uint s = lane; s < subs; s += TPR) {
            vec4 w[8];
            dequant_sub32(p.nb, row * subs + s, w);
            const uint xb = p.x_offset + s * 8u;
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                acc += dot(w[j], data_x[xb + j]);
            }
        }
    }
    if (TPR <= SUBGROUP) {
        // Rows are aligned groups of TPR lanes inside one subgroup.
        [[unroll]] for (uint off = TPR / 2u; off > 0u; off >>= 1) {
            acc += subgroupShuffleXor(acc, off);
        }
    } else {
        partial[gl_LocalInvocationID.x] = acc;
        barrier();
        for (uint off = TPR / 2u; off > 0u; off >>= 1) {
            if (lane < off) {
                partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + off];
            }
            barrier();
        }
        acc = partial[gl_LocalInvocationID.x];
    }
    if (lane == 0u && row < p.m) {
        const uint o = p.d_offset + p.row_offset + row;
        float r = acc;
        if ((p.flags & 2u) != 0u) {
            r += data_bias[p.row_offset + row];
        }
        if ((p.flags & 1u) != 0u) {
            r += data_d[o];
        }
        data_d[o] = r;
    }
}
