#version 450
// matmul_skinny: D[n, row] = A[row, :] . X[n, :] for a few tokens (batched
// decode) on devices with VK_KHR_cooperative_matrix (f16 16x16x16, f32
// accumulation). matmul_coop.comp's tiles step the whole workgroup through
// K between barriers, which at 16 tokens leaves the memory system idle
// while each step's loads arrive. Here every subgroup streams on its own:
// it owns TM 16-row matrices and every WK-th chunk of BK columns; per
// chunk it stages its 16 tokens of activations in its own part of shared
// memory once, keeps them in registers as B matrices, and then dequantizes
// its TM row tiles one after another through its own 16-row staging area
// (the next tile's weights loaded while the current one multiplies), so
// the activations are read once per TM * 16 rows and shared memory does
// not grow with TM. No barrier but its own until the end, where the WK
// subgroups of each row group add their results in turn and the sum is
// stored with matmul_coop.comp's epilogue (common/coop_out.glsl).
// Same bindings and push constants as matmul_coop.comp; a workgroup covers
// WM * TM * 16 rows and TN * 16 tokens (gl_WorkGroupID.y: the token block).
// With TN > 1 each dequantized weight tile serves TN 16-token blocks: at 64
// tokens of a batched decode step the weights are dequantized, staged and
// loaded once instead of four times.
// X needs 4-element alignment. With X_F16, X holds f16 activations (offsets
// and strides in halves), copied rather than converted. Binding 6 aliases
// D as f16 for the gated output of LINEAR_OUT_F16 (common/coop_out.glsl).
//
// The RMS norm between two products of batched decode, without a dispatch
// of its own (~9 us each on the H200 for a few rows): with LINEAR_SQUARES_OUT,
// the product adding into the residual stream (x += W h) also writes, per
// token, the sum of squares of each 16 rows it stored (SQ[sq_offset + t *
// sq_groups + row / 16]). The NORM_IN variant (f32 X) reads X as
// that residual and multiplies it by the norm's weight (binding 8; 1 + w
// with LINEAR_NORM_ZERO_CENTRED) while staging it, each token's 1 / rms from those sums
// applied to its results at the end. (That code in the plain f32 variant,
// even untaken, cost it registers and occupancy: llama-1b's down
// projection at 16 tokens 30.8 -> 43.9 us on the H200.)

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable

layout(local_size_x_id = 0) in;                   // 32 * WM * WK
layout(constant_id = 1) const uint SUBGROUP = 32; // the size the layout assumes
layout(constant_id = 2) const uint WM = 1;        // subgroups along rows
layout(constant_id = 3) const uint WK = 8;        // subgroups along K
layout(constant_id = 4) const uint TM = 1;        // 16-row matrices per subgroup
layout(constant_id = 5) const uint BK = 64;       // columns per chunk (multiple of 64)
layout(constant_id = 6) const uint TN = 1;        // 16-token blocks per workgroup

// The matrices' side and the lanes of a subgroup the layout is written
// for: 16 and 32 wherever combs runs this kernel. scripts/coop-lavapipe.sh
// sets 8 and 8 to run it on lavapipe's 8x8 matrices and 8-lane subgroups;
// the sums of squares (LINEAR_SQUARES_OUT) assume 16-row tiles.
const uint MS = 16u;
const uint LANES = 32u;
// true (scripts/coop-lavapipe.sh): every subgroup walks as many K chunks,
// those past K all zeros, since lavapipe's subgroup-scope matrices go wrong
// where the subgroups of a workgroup run different numbers of them.
const bool UNIFORM_CHUNKS = false;
const uint NSG = WM * WK;
const uint TOK = MS * TN;           // tokens per workgroup
const uint WGS = NSG * LANES;
const uint SPC = BK / 32u;          // sub-blocks per row and chunk
const uint VPC = BK / 4u;           // 4-element vectors per token and chunk
const uint A_SUBS = MS * SPC / LANES; // weight sub-blocks per invocation and row tile
const uint X_VECS = TOK * VPC / LANES;
const uint KM = BK / MS;            // B matrices per chunk
const uint MV = MS / 4u;            // f16vec4s along one matrix's side
// f16vec4 row stride of a subgroup's tiles; the 8 extra halves spread rows
// over banks (cooperative-matrix loads need strides of whole 16 bytes).
const uint S4 = (BK + 8u) / 4u;

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
#if defined(X_F16)
layout(binding = 1) readonly buffer X { f16vec4 data_xh4[]; };
#else
layout(binding = 1) readonly buffer X { vec4 data_x4[]; };
#endif
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

#include "iface/skinny.glsl"

layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer F { float inv_freq[]; };
layout(binding = 6) buffer DH { float16_t data_dh[]; };
layout(binding = 7) buffer SQ { float data_sq[]; };
layout(binding = 8) readonly buffer NW { vec4 data_nw4[]; };
#define COOP_OUT_F16 1

#include "common/dequant.glsl"
#include "common/linear_out.glsl"
#include "common/act.glsl"
#include "common/rope.glsl"
#include "common/coop_out.glsl"

// Per subgroup: one 16-row tile of weights and its TOK tokens of the current chunk.
shared f16vec4 sa[NSG * MS * S4];
shared f16vec4 sx[NSG * TOK * S4];
// Per row group: the sum of its K subgroups' results, token-major 16 x 16
// tiles, (row tile, token block) in row-tile-major order.
shared float sc[WM * TM * TN * MS * MS];
// NORM_IN: each token's 1 / rms of the workgroup's TOK.
shared float sr[TOK];

#if defined(DATA_A_Q4_0)
// This invocation's weights of the next row tile, as loaded: four words of
// nibbles and the block's scale. Dequantized only when stored, after the
// current tile's products, so the loads' latency hides behind them (and
// five registers per sub-block hold them instead of sixteen).
uvec4 wraw[A_SUBS];
// The word holding each sub-block's f16 scale, converted at the store; bit
// i of wodd: the upper half; of wvalid: the sub-block lies inside the
// weight. The loads go out unconditionally (sub-block 0 where outside):
// a load under a condition, or a conversion of what it loads, leaves work
// right behind it that waits for it before the products (matmul_coop.comp,
// docs/perf-notes.md "Session 39").
uint wscale[A_SUBS];
uint wodd = 0u;
uint wvalid = 0u;
#else
// This invocation's weights of the next row tile.
f16vec4 wreg[A_SUBS][8];
#endif

#if defined(DATA_A_Q4_0)
// Q4_0 straight to f16, two weights per instruction: the bits 0x6400 | q
// are 1024 + q, less 1032 is q - 8 exactly, and the product with d rounds
// once, as the f32 path's conversion of its exact product does. At 16
// tokens the dequantization bounds the products more than their loads.
void dequant_q4_0_f16(uvec4 raw, float16_t scale, out f16vec4 w[8]) {
    const f16vec2 d = f16vec2(scale);
    const f16vec2 off = f16vec2(float16_t(1032.0));
    [[unroll]] for (uint k = 0u; k < 4u; k++) {
        const uint q = raw[k];
        // Bytes 0 and 2 of each shift, then 1 and 3: elements 4k and
        // 4k + 2, 4k + 1 and 4k + 3 (low nibbles), 16 on (high ones).
        const f16vec2 l02 = (unpackFloat2x16((q & 0x000F000Fu) | 0x64006400u) - off) * d;
        const f16vec2 l13 = (unpackFloat2x16(((q >> 8) & 0x000F000Fu) | 0x64006400u) - off) * d;
        const f16vec2 h02 = (unpackFloat2x16(((q >> 4) & 0x000F000Fu) | 0x64006400u) - off) * d;
        const f16vec2 h13 = (unpackFloat2x16(((q >> 12) & 0x000F000Fu) | 0x64006400u) - off) * d;
        w[k] = f16vec4(l02.x, l13.x, l02.y, l13.y);
        w[k + 4u] = f16vec4(h02.x, h13.x, h02.y, h13.y);
    }
}
#endif

void load_a(uint row, uint c, uint lane) {
    const uint subs = p.k / 32u;
    uint wo = 0u;
    uint wv = 0u;
    [[unroll]] for (uint i = 0u; i < A_SUBS; i++) {
        const uint u = lane + LANES * i;
        const uint r = row + u / SPC;
        const uint s = c * SPC + u % SPC;
#if defined(DATA_A_Q4_0)
        const bool ok = r < p.m && s < subs;
        const uint ib = ok ? r * subs + s : 0u;
        // One 16-byte load, not four of 4 bytes (as matmul_coop.comp).
        wraw[i] = data_a4[ib * PLANE0_WORDS / 4u];
        wscale[i] = a_scale_word(p.nb, ib, 0u);
        wo |= (ib & 1u) << i;
        wv |= ok ? 1u << i : 0u;
#else
        vec4 w[8];
        if (r < p.m && s < subs) {
            dequant_sub32(p.nb, r * subs + s, w);
        } else {
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                w[j] = vec4(0.0);
            }
        }
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            wreg[i][j] = f16vec4(w[j]);
        }
#endif
    }
#if defined(DATA_A_Q4_0)
    wodd = wo;
    wvalid = wv;
#endif
}

void store_a(uint abase, uint lane) {
    [[unroll]] for (uint i = 0u; i < A_SUBS; i++) {
        const uint u = lane + LANES * i;
        const uint o = abase + (u / SPC) * S4 + (u % SPC) * 8u;
#if defined(DATA_A_Q4_0)
        f16vec4 w[8];
        // (a zero scale makes the padding's weights zeros)
        const vec2 dw = unpackHalf2x16(wscale[i]);
        const float d = (wvalid >> i & 1u) == 0u ? 0.0 : (wodd >> i & 1u) != 0u ? dw.y : dw.x;
        dequant_q4_0_f16(wraw[i], float16_t(d), w);
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            sa[o + j] = w[j];
        }
#else
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            sa[o + j] = wreg[i][j];
        }
#endif
    }
}

// The norm's weight of columns col..col + 3 (NORM_IN), 1 + w with LINEAR_NORM_ZERO_CENTRED.
vec4 norm_weight(uint col) {
    if (col >= p.k) {
        return vec4(0.0);
    }
    vec4 w = data_nw4[col / 4u];
    if ((p.flags & LINEAR_NORM_ZERO_CENTRED) != 0u) {
        w += 1.0;
    }
    return w;
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint sg = tid / SUBGROUP;
    const uint lane = tid % SUBGROUP;
    const uint sm = sg % WM;
    const uint sk = sg / WM;
    const uint row0 = gl_WorkGroupID.x * WM * TM * MS;
    const uint tok0 = gl_WorkGroupID.y * TOK;
    const uint srow = row0 + sm * TM * MS;    // this subgroup's first row
    const uint base = sg * MS * S4;           // its staging areas
    const uint xbase = sg * TOK * S4;
    const uint chunks = (p.k + BK - 1u) / BK;
    const uint first = sk;   // this subgroup's first chunk
    const uint stride = WK;
    // The chunks this workgroup's subgroups walk.
    const uint walk = UNIFORM_CHUNKS ? (chunks + stride - 1u) / stride * stride : chunks;

    // acc[i * TN + u]: row tile i, token block u
    coopmat<float, gl_ScopeSubgroup, MS, MS, gl_MatrixUseAccumulator> acc[TM * TN];
    [[unroll]] for (uint i = 0u; i < TM * TN; i++) {
        acc[i] = coopmat<float, gl_ScopeSubgroup, MS, MS, gl_MatrixUseAccumulator>(0.0);
    }

#if defined(NORM_IN)
    // The sums of squares of this subgroup's tokens (sg, sg + NSG, ...),
    // the first 128 per token loaded together with the first weights.
    const uint PRO_T = (TOK + NSG - 1u) / NSG;
    float part[PRO_T][4];
    [[unroll]] for (uint it = 0u; it < PRO_T; it++) {
        const uint tl = sg + it * NSG;
        const uint b = p.sq_offset + (tok0 + tl) * p.sq_groups;
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            const uint g = lane + LANES * j;
            part[it][j] = tl < TOK && tok0 + tl < p.n && g < p.sq_groups ? data_sq[b + g] : 0.0;
        }
    }
#endif
    if (first < walk) {
        load_a(srow, first, lane);
    }
#if defined(NORM_IN)
    [[unroll]] for (uint it = 0u; it < PRO_T; it++) {
        const uint tl = sg + it * NSG;
        float ss = (part[it][0] + part[it][1]) + (part[it][2] + part[it][3]);
        const uint b = p.sq_offset + (tok0 + tl) * p.sq_groups;
        if (tl < TOK && tok0 + tl < p.n) {
            for (uint g = lane + 4u * LANES; g < p.sq_groups; g += LANES) {
                ss += data_sq[b + g];
            }
        }
        ss = subgroupAdd(ss);
        if (tl < TOK && lane == 0u) {
            // (tokens past n: 1 / sqrt(eps), never the smallest)
            sr[tl] = inversesqrt(ss / float(p.k) + p.eps);
        }
    }
    barrier();
    // One scale for the workgroup's tokens, the smallest 1 / rms: staged
    // values x * w * scale stay within f16's range (|x| / rms <= sqrt(k)),
    // and the epilogue multiplies each token's sums by its 1 / rms / scale.
    // A token of far smaller rms than the largest is staged that much
    // closer to f16's subnormals (combs folds the norm into decode steps
    // only, not into prompts, whose first tokens can dwarf the rest).
    // Per-token scales at staging cost registers (8 per invocation) and
    // with them occupancy: qkv at 16 tokens 20 against 14 us on the H200.
    float scale = sr[0];
    [[unroll]] for (uint i = 1u; i < TOK; i++) {
        scale = min(scale, sr[i]);
    }
    scale = min(scale, 65504.0);
#endif
    for (uint c = first; c < walk; c += stride) {
#if defined(NORM_IN)
        // Where VPC divides 32, all of a lane's vectors share 4 columns:
        // one load of the norm's weight per chunk.
        const bool shared_cols = LANES % VPC == 0u;
        vec4 nw = vec4(1.0);
        if (shared_cols) {
            nw = norm_weight(c * BK + 4u * (lane % VPC)) * scale;
        }
#endif
        // f32 activations one 16-token block at a time: with all of them
        // in flight the loaded vectors took registers (and occupancy):
        // llama-1b gate/up with the norm folded in, 64 tokens, four row
        // tiles and two blocks, 131.6 us, 117.8 this way, on the H200 (one
        // block: 84.5; Plan::folds_norm_from_squares keeps such weights on
        // f16 input past 32 tokens).
#if defined(X_F16)
        [[unroll]] for (uint i = 0u; i < X_VECS; i++) {
#else
        [[dont_unroll]] for (uint i0 = 0u; i0 < X_VECS; i0 += X_VECS / TN) {
        [[unroll]] for (uint i = i0; i < i0 + X_VECS / TN; i++) {
#endif
            const uint v = lane + LANES * i;
            const uint t = v / VPC;
            const uint col = c * BK + 4u * (v % VPC);
            f16vec4 x = f16vec4(0.0);
            if (tok0 + t < p.n && col < p.k) {
#if defined(X_F16)
                x = data_xh4[(p.x_offset + (tok0 + t) * p.ld_x + col) / 4u];
#else
                vec4 xf = data_x4[(p.x_offset + (tok0 + t) * p.ld_x + col) / 4u];
#if defined(NORM_IN)
                xf *= shared_cols ? nw : norm_weight(col) * scale;
#endif
                x = f16vec4(xf);
#endif
            }
            sx[xbase + t * S4 + v % VPC] = x;
        }
#if !defined(X_F16)
        }
#endif
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        // mb[u * KM + j]: token block u, columns 16 j..16 j + 15
        coopmat<float16_t, gl_ScopeSubgroup, MS, MS, gl_MatrixUseB> mb[KM * TN];
        [[unroll]] for (uint u = 0u; u < TN; u++) {
            [[unroll]] for (uint j = 0u; j < KM; j++) {
                // B(k, t) = sx[t * S4 + k / 4]: column-major
                coopMatLoad(mb[u * KM + j], sx, xbase + u * MS * S4 + MV * j, S4,
                            gl_CooperativeMatrixLayoutColumnMajor);
            }
        }
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            store_a(base, lane);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            // The next tile's weights (or the next chunk's first) load
            // while this one multiplies.
            // Q4_0's unconditionally (the last chunk's last tile loads its
            // own weights again, unused), so no merge after a branch waits
            // on them either.
#if defined(DATA_A_Q4_0)
            if (i + 1u < TM) {
                load_a(srow + MS * (i + 1u), c, lane);
            } else {
                load_a(srow, c + stride < walk ? c + stride : c, lane);
            }
#else
            if (i + 1u < TM) {
                load_a(srow + MS * (i + 1u), c, lane);
            } else if (c + stride < walk) {
                load_a(srow, c + stride, lane);
            }
#endif
            [[unroll]] for (uint j = 0u; j < KM; j++) {
                coopmat<float16_t, gl_ScopeSubgroup, MS, MS, gl_MatrixUseA> ma;
                // A(r, k) = sa[r * S4 + k / 4]: row-major
                coopMatLoad(ma, sa, base + MV * j, S4, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint u = 0u; u < TN; u++) {
                    acc[i * TN + u] = coopMatMulAdd(ma, mb[u * KM + j], acc[i * TN + u]);
                }
            }
            // The next stores overwrite what these loads read.
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }

    // The K subgroups of a row group add into its tiles in turn.
    [[unroll]] for (uint g = 0u; g < WK; g++) {
        if (sk == g) {
            [[unroll]] for (uint i = 0u; i < TM * TN; i++) {
                // sc[o + token * 16 + row]
                const uint o = (sm * TM * TN + i) * MS * MS;
                if (g > 0u) {
                    coopmat<float, gl_ScopeSubgroup, MS, MS, gl_MatrixUseAccumulator> prev;
                    coopMatLoad(prev, sc, o, MS, gl_CooperativeMatrixLayoutColumnMajor);
                    acc[i] = acc[i] + prev;
                }
                coopMatStore(acc[i], sc, o, MS, gl_CooperativeMatrixLayoutColumnMajor);
            }
        }
        barrier();
    }
    // Element e of tile q / 256 (row tile rt = q / 256 / TN of the
    // workgroup, token block u = q / 256 % TN): row 16 rt + e % 16, token
    // 16 u + e / 16; rows r and r ^ 1 of a token are elements e and e ^ 1.
    const bool squares = (p.flags & LINEAR_SQUARES_OUT) != 0u;
    for (uint q = tid; q < WM * TM * TN * MS * MS; q += WGS) {
        const uint e = q % (MS * MS);
        const uint row = row0 + (q / (MS * MS) / TN) * MS + e % MS;
        const uint tl = (q / (MS * MS) % TN) * MS + e / MS;
        const uint t = tok0 + tl;
#if defined(NORM_IN)
        const float f = sr[tl] / scale;
#else
        const float f = 1.0;
#endif
        if (row < p.m && t < p.n) {
            if (squares) {
                // (no partners: no rope or gate with LINEAR_SQUARES_OUT)
                const uint o = p.d_offset + t * p.ld_d + p.row_offset + row;
                const float v = store_result(o, with_bias(row, sc[q] * f));
                sc[q] = v * v;
            } else {
                store_out(row, t, sc[q] * f, sc[q ^ 1u] * f);
            }
        } else if (squares) {
            sc[q] = 0.0;
        }
    }
    if (squares) {
        barrier();
        for (uint j = tid; j < WM * TM * TOK; j += WGS) {
            const uint rt = j / TOK;     // row tile
            const uint tl = j % TOK;
            const uint tile = rt * TN + tl / MS;
            const uint tt = tl % MS;     // token in the tile
            const uint row = row0 + rt * MS;
            const uint t = tok0 + tl;
            if (row < p.m && t < p.n) {
                float ss = 0.0;
                // starting at row tt: the 16 tokens' reads fall in distinct banks
                [[unroll]] for (uint i = 0u; i < MS; i++) {
                    ss += sc[tile * MS * MS + tt * MS + (i + tt) % MS];
                }
                data_sq[p.sq_offset + t * p.sq_groups + (p.row_offset + row) / 16u] = ss;
            }
        }
    }
}
