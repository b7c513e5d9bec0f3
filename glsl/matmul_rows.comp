#version 450
// matmul_rows: D[n, row] = A[row, :] . X[n, :] with one invocation per weight
// row, looping over the tokens of a tile. Every invocation of a subgroup
// reads the same activation values, so activation loads are uniform (one
// scalar load on SIMD-on-CPU drivers like lavapipe, a broadcast on GPUs);
// only the weights are loaded per invocation, once per tile of TN tokens.
// The variant for devices without fast per-invocation gathers.

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;

layout(constant_id = 1) const uint TN = 8;   // tokens per tile
layout(constant_id = 2) const uint RPI = 4;  // rows per invocation

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
layout(binding = 1) readonly buffer X { vec4 data_x[]; };
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

#include "iface/rows.glsl"

#include "common/dequant.glsl"
#include "common/linear_out.glsl"

void main() {
    // Invocation i of the workgroup owns rows base + i + r * WG for r < RPI.
    const uint base = gl_WorkGroupID.x * gl_WorkGroupSize.x * RPI + gl_LocalInvocationID.x;
    const uint tok0 = gl_WorkGroupID.y * TN;
    const uint subs = p.k / 32u;

    float acc[RPI][TN];
    [[unroll]] for (uint r = 0u; r < RPI; r++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            acc[r][j] = 0.0;
        }
    }
    const uint n_here = min(TN, p.n - tok0);
    for (uint s = 0u; s < subs; s++) {
        vec4 w[RPI][8];
        [[unroll]] for (uint r = 0u; r < RPI; r++) {
            // Rows past the end load row m-1 (in bounds); their results are dropped.
            const uint row_c = min(base + r * gl_WorkGroupSize.x, p.m - 1u);
            dequant_sub32(p.nb, row_c * subs + s, w[r]);
        }
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            if (j < n_here) {
                const uint xb = p.x_offset + (tok0 + j) * p.ld_x + s * 8u;
                [[unroll]] for (uint q = 0u; q < 8u; q++) {
                    const vec4 xv = data_x[xb + q];
                    [[unroll]] for (uint r = 0u; r < RPI; r++) {
                        acc[r][j] += dot(w[r][q], xv);
                    }
                }
            }
        }
    }
    [[unroll]] for (uint r = 0u; r < RPI; r++) {
      const uint row = base + r * gl_WorkGroupSize.x;
      if (row >= p.m) {
          continue;
      }
      [[unroll]] for (uint j = 0u; j < TN; j++) {
        if (j < n_here) {
            const uint o = p.d_offset + (tok0 + j) * p.ld_d + p.row_offset + row;
            store_linear(o, row, acc[r][j]);
        }
      }
    }
}
