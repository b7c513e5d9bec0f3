#version 450
// matmul_coop: D[n, row] = A[row, :] . X[n, :] for N tokens on devices with
// VK_KHR_cooperative_matrix (f16 16x16x16, f32 accumulation). Each workgroup
// of four subgroups computes a BM x BN tile (weight rows x tokens), stepping
// K by BK: weights are dequantized (one 32-weight sub-block per invocation)
// and activations converted to f16 into shared memory, then every subgroup
// multiplies its 32 x 32 quarter as 2 x 2 cooperative matrices. The result
// goes through shared memory so partial tiles, bias and accumulation are
// handled per element, with coalesced stores.
// Same bindings and push constants as matmul.comp.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable

layout(local_size_x_id = 0) in;                   // 128: four subgroups
layout(constant_id = 1) const uint SUBGROUP = 32; // the size the tiling assumes

#define BM 64
#define BN 64
#define BK 64
#define SA (BK + 8)   // f16 row stride of the weight tile (bank spread)
#define SX (BK + 8)   // f16 row stride of the activation tile
#define SC (BN + 4)   // f32 row stride of the result tile

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) readonly buffer X { float data_x[]; };
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

layout(push_constant) uniform Params {
    uint k;           // columns (a multiple of 32)
    uint m;           // rows in this chunk
    uint nb;          // blocks in this chunk
    uint row_offset;  // output column of the chunk's first row
    uint n;           // tokens
    uint ld_x;        // stride between tokens of X, floats
    uint ld_d;        // stride between tokens of D, floats
    uint x_offset;    // float index of X[0, 0]
    uint d_offset;    // float index of D[0, 0]
    uint flags;       // 1: D += result, 2: add bias[row_offset + row]
} p;

#include "common/dequant.glsl"
#include "common/linear_out.glsl"

shared float16_t sa[BM * SA];
shared float16_t sx[BN * SX];
shared float sc[BM * SC];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    const uint subs = p.k / 32u;
    const uint sg = tid / SUBGROUP;
    const uint sg_row = (sg & 1u) * 32u;   // this subgroup's rows in the tile
    const uint sg_tok = (sg >> 1) * 32u;   // and tokens

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[2][2];
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        [[unroll]] for (uint j = 0u; j < 2u; j++) {
            acc[i][j] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
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
            const uint base = r * SA + half_ * 32u;
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                sa[base + 4u * j] = float16_t(w[j].x);
                sa[base + 4u * j + 1u] = float16_t(w[j].y);
                sa[base + 4u * j + 2u] = float16_t(w[j].z);
                sa[base + 4u * j + 3u] = float16_t(w[j].w);
            }
        }
        // Activations: BN tokens x BK floats, consecutive invocations on
        // consecutive columns.
        [[unroll]] for (uint i = 0u; i < (BN * BK) / 128u; i++) {
            const uint idx = tid + 128u * i;
            const uint t = idx / BK;
            const uint c = idx % BK;
            float v = 0.0;
            if (tok0 + t < p.n && kk + c < p.k) {
                v = data_x[p.x_offset + (tok0 + t) * p.ld_x + kk + c];
            }
            sx[t * SX + c] = float16_t(v);
        }
        barrier();
        [[unroll]] for (uint c = 0u; c < BK; c += 16u) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> ma[2];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> mb[2];
            [[unroll]] for (uint i = 0u; i < 2u; i++) {
                // A(m, k) = sa[(row) * SA + k]: row-major
                coopMatLoad(ma[i], sa, (sg_row + 16u * i) * SA + c, SA,
                            gl_CooperativeMatrixLayoutRowMajor);
                // B(k, n) = sx[(token) * SX + k]: column-major
                coopMatLoad(mb[i], sx, (sg_tok + 16u * i) * SX + c, SX,
                            gl_CooperativeMatrixLayoutColumnMajor);
            }
            [[unroll]] for (uint i = 0u; i < 2u; i++) {
                [[unroll]] for (uint j = 0u; j < 2u; j++) {
                    acc[i][j] = coopMatMulAdd(ma[i], mb[j], acc[i][j]);
                }
            }
        }
        barrier();
    }

    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        [[unroll]] for (uint j = 0u; j < 2u; j++) {
            coopMatStore(acc[i][j], sc, (sg_row + 16u * i) * SC + sg_tok + 16u * j, SC,
                         gl_CooperativeMatrixLayoutRowMajor);
        }
    }
    barrier();
    // sc[row * SC + token]; consecutive invocations write consecutive rows.
    [[unroll]] for (uint i = 0u; i < (BM * BN) / 128u; i++) {
        const uint idx = tid + 128u * i;
        const uint r = idx % BM;
        const uint t = idx / BM;
        const uint row = row0 + r;
        if (row < p.m && tok0 + t < p.n) {
            const uint o = p.d_offset + (tok0 + t) * p.ld_d + p.row_offset + row;
            store_linear(o, row, sc[r * SC + t]);
        }
    }
}
