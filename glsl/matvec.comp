#version 450
// matvec: d[row] = A[row, :] . x for one token (decode), weights of any
// DATA_A_* format dequantized on the fly in sub-blocks of 32. A group of TPR
// invocations shares NR consecutive rows: each invocation loads a sub-block
// of x once and applies it to all NR rows, so x is read from cache NR times
// less often than the weights (at NR = 1 it outweighs them several times).
// The workgroup covers (WG / TPR) * NR rows of one weight chunk.
// Optional: accumulate into d (residual add) and add a bias.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;
layout(constant_id = 2) const uint TPR = 32;   // invocations per row, a power of two
layout(constant_id = 3) const uint NR = 1;     // rows per group of TPR invocations

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
#include "common/linear_out.glsl"

shared float partial[gl_WorkGroupSize.x];

void main() {
    const uint rows_per_wg = (gl_WorkGroupSize.x / TPR) * NR;
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint lane = gl_LocalInvocationID.x % TPR;
    const uint row0 = wg * rows_per_wg + (gl_LocalInvocationID.x / TPR) * NR;
    const uint subs = p.k / 32u;

    float acc[NR];
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        acc[r] = 0.0;
    }
    if (row0 < p.m) {
        for (uint s = lane; s < subs; s += TPR) {
            const uint xb = p.x_offset + s * 8u;
            vec4 xv[8];
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                xv[j] = data_x[xb + j];
            }
            [[unroll]] for (uint r = 0u; r < NR; r++) {
                if (row0 + r < p.m) {
                    vec4 w[8];
                    dequant_sub32(p.nb, (row0 + r) * subs + s, w);
                    [[unroll]] for (uint j = 0u; j < 8u; j++) {
                        acc[r] += dot(w[j], xv[j]);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint r = 0u; r < NR; r++) {
        float a = acc[r];
        if (TPR <= SUBGROUP) {
            // Row groups are aligned runs of TPR lanes inside one subgroup.
            [[unroll]] for (uint off = TPR / 2u; off > 0u; off >>= 1) {
                a += subgroupShuffleXor(a, off);
            }
        } else {
            barrier();
            partial[gl_LocalInvocationID.x] = a;
            barrier();
            for (uint off = TPR / 2u; off > 0u; off >>= 1) {
                if (lane < off) {
                    partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + off];
                }
                barrier();
            }
            a = partial[gl_LocalInvocationID.x];
        }
        const uint row = row0 + r;
        if (lane == 0u && row < p.m) {
            const uint o = p.d_offset + p.row_offset + row;
            store_linear(o, row, a);
        }
    }
}
