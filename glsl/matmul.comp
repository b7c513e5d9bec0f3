#version 450
// matmul: D[n, row] = A[row, :] . X[n, :] for N tokens (prefill, batched
// decode). Portable tiled kernel: each workgroup computes a BM x BN tile
// (weight rows x tokens), stepping K by 64 through shared memory; every
// invocation dequantizes one 32-weight sub-block per step.
// Optional: accumulate into D (residual add) and add a bias.

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = 128) in;

#define BM 64
#define BN 32
#define BK 64
#define TM 4      // rows per invocation
#define TN 4      // tokens per invocation

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
layout(binding = 1) readonly buffer X { float data_x[]; };
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

#include "iface/tiled.glsl"

#include "common/dequant.glsl"
#include "common/linear_out.glsl"

shared float sa[BM][BK + 1];
shared float sx[BN][BK + 1];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    const uint subs = p.k / 32u;
    // Thread tile: rows tr*TM .. +TM, tokens tc*TN .. +TN.
    const uint tr = tid % (BM / TM);
    const uint tc = tid / (BM / TM);

    float acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            acc[i][j] = 0.0;
        }
    }

    for (uint kk = 0u; kk < p.k; kk += BK) {
        // Weights: BM rows x 2 sub-blocks = 128 sub-blocks, one per invocation.
        {
            const uint r = tid >> 1;
            const uint half_ = tid & 1u;
            const uint s = kk / 32u + half_;
            vec4 w[8];
            if (row0 + r < p.m && s < subs) {
                dequant_sub32(p.nb, (row0 + r) * subs + s, w);
            } else {
                [[unroll]] for (uint j = 0u; j < 8u; j++) {
                    w[j] = vec4(0.0);
                }
            }
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                sa[r][half_ * 32u + 4u * j] = w[j].x;
                sa[r][half_ * 32u + 4u * j + 1u] = w[j].y;
                sa[r][half_ * 32u + 4u * j + 2u] = w[j].z;
                sa[r][half_ * 32u + 4u * j + 3u] = w[j].w;
            }
        }
        // Activations: BN tokens x BK floats.
        [[unroll]] for (uint i = 0u; i < (BN * BK) / 128u; i++) {
            const uint idx = tid + 128u * i;
            const uint t = idx / BK;
            const uint c = idx % BK;
            float v = 0.0;
            if (tok0 + t < p.n && kk + c < p.k) {
                v = data_x[p.x_offset + (tok0 + t) * p.ld_x + kk + c];
            }
            sx[t][c] = v;
        }
        barrier();
        [[unroll]] for (uint c = 0u; c < BK; c++) {
            float a[TM];
            float b[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                a[i] = sa[tr * TM + i][c];
            }
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                b[j] = sx[tc * TN + j][c];
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    acc[i][j] += a[i] * b[j];
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint i = 0u; i < TM; i++) {
        const uint row = row0 + tr * TM + i;
        if (row >= p.m) {
            continue;
        }
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            const uint t = tok0 + tc * TN + j;
            if (t >= p.n) {
                continue;
            }
            const uint o = p.d_offset + t * p.ld_d + p.row_offset + row;
            store_linear(o, row, acc[i][j]);
        }
    }
}
