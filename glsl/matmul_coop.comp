#version 450
// matmul_coop: D[n, row] = A[row, :] . X[n, :] for N tokens on devices with
// VK_KHR_cooperative_matrix (f16 16x16x16, f32 accumulation). A workgroup of
// WM x WN x WK subgroups computes a BM x BN tile (weight rows x tokens),
// stepping K by KSTEP = WK * BK columns: weights are dequantized (one
// 32-weight sub-block per invocation and step) and activations converted to
// f16 into shared memory; subgroup (sm, sn, sk) multiplies its TM x TN
// cooperative matrices over columns sk * BK .. of the step, so WK > 1 splits
// K inside the workgroup (skinny products of few tokens keep many
// workgroups busy that way). The loads of the next step are issued after the
// current step's products, which the matrix units work through meanwhile;
// Q4_0 (and, on most tiles, Q4_K) weights, held raw until staged, go out
// before the products (after the step's second barrier).
// The result goes through shared memory (per subgroup, or all partial tiles
// when K is split) so partial tiles, bias and accumulation are handled per
// element, with coalesced stores.
// The bindings of matmul.comp, the push constants of iface/coop.glsl, and an
// epilogue (common/coop_out.glsl) that folds in what matvec.comp folds after
// its dot products: the gated activation of interleaved gate/up rows and
// llama.cpp's adjacent-pair rope. X needs 4-float alignment. With X_F16, X
// holds f16 activations (copied into the tiles, not converted; offsets and
// strides count halves), and a gated output may go out as f16 (LINEAR_OUT_F16).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable

layout(local_size_x_id = 0) in;                   // 32 * WM * WN * WK
layout(constant_id = 1) const uint SUBGROUP = 32; // the size the tiling assumes
layout(constant_id = 2) const uint WM = 2;        // subgroups along rows
layout(constant_id = 3) const uint WN = 2;        // subgroups along tokens
layout(constant_id = 4) const uint WK = 1;        // subgroups along K
layout(constant_id = 5) const uint TM = 2;        // 16-row matrices per subgroup
layout(constant_id = 6) const uint TN = 2;        // 16-token matrices per subgroup
layout(constant_id = 7) const uint BK = 64;       // columns per subgroup and step (multiple of 32)
layout(constant_id = 8) const uint SC = 1024;     // floats of the result staging area
layout(constant_id = 9) const bool RAW_Q4K = true; // Q4_K held raw until staged (below)

const uint BM = WM * TM * 16u;
const uint BN = WN * TN * 16u;
const uint KSTEP = WK * BK;
const uint SA = KSTEP + 8u;   // f16 row stride of the tiles (bank spread)
const uint SA4 = SA / 4u;     // the same in f16vec4s: the tiles are stored 8 bytes at a time
const uint NSG = WM * WN * WK;
const uint WGS = NSG * 32u;
// Per invocation and step: weight sub-blocks and vec4s of activations.
const uint A_SUBS = (BM * KSTEP / 32u + WGS - 1u) / WGS;
const uint X_VECS = (BN * KSTEP / 4u + WGS - 1u) / WGS;
#if defined(X_F16) && !defined(DATA_A_Q4_0)
// f16 activations in pairs of vec4s (16-byte loads) where the rows allow
// (x_in_pairs). Not for Q4_0: on an H100 pairs made its 8B Q/K/V and
// gate/up at 512 tokens 10% slower (measured while the loads were still
// waited for before the products; not re-timed since), where they made
// Q4_K's Q/K/V 28% faster and Q6_K's, Q8_0's gate/up 5-6%
// (docs/perf-notes.md, "Session 32", "Session 39").
#define X_IN_PAIRS 1
const uint X_PAIRS = (BN * KSTEP / 8u + WGS - 1u) / WGS;
const uint X_REGS = X_VECS > 2u * X_PAIRS ? X_VECS : 2u * X_PAIRS;
#else
const uint X_REGS = X_VECS;
#endif

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
#if defined(X_F16)
layout(binding = 1) readonly buffer X { f16vec4 data_xh4[]; };
#if defined(X_IN_PAIRS)
layout(binding = 1) readonly buffer X8 { uvec4 data_xu4[]; };
#endif
#else
layout(binding = 1) readonly buffer X { vec4 data_x4[]; };
#endif
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

#include "iface/coop.glsl"

layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer F { float inv_freq[]; };
#if defined(X_F16)
// The f16 alias of D: gated outputs for the next product's f16 input.
layout(binding = 6) buffer DH { float16_t data_dh[]; };
#define COOP_OUT_F16 1
#endif

#include "common/dequant.glsl"
#include "common/linear_out.glsl"
#include "common/act.glsl"
#include "common/rope.glsl"
#include "common/coop_out.glsl"

// f16vec4 elements, so that staging a step is one 8-byte store per four
// values rather than four 2-byte ones; coopMatLoad takes offsets and
// strides in elements of the array (KSTEP and the padding are multiples of 4).
shared f16vec4 sa[BM * SA4];
shared f16vec4 sx[BN * SA4];
shared float sc[SC];

// This invocation's share of one step, loaded ahead of the products.
f16vec4 wreg[A_SUBS][8];
f16vec4 xreg[X_REGS];
#if defined(X_IN_PAIRS)
uvec4 xraw[X_PAIRS];   // pairs of f16 vec4s as loaded, unpacked at the staging
#endif
#if defined(DATA_A_Q4_0)
// Q4_0 sub-blocks are held raw (quants, scale: 5 registers, not 16) from
// their load to the staging, which dequantizes; so the next step's loads go
// out before the products and arrive while the matrix units work.
#define RAW_W 1
uvec4 wq[A_SUBS];
float wd[A_SUBS];
#endif
#if defined(DATA_A_Q4_K)
#include "common/q4k_scales.glsl"
// Q4_K sub-blocks likewise where RAW_Q4K: the 32 bytes holding their
// nibbles, the block's packed scales and its two f16 scales (13 registers,
// not 16), dequantized at the staging. On the H100 at 512 tokens (llama-8b)
// the 128 x 128 and 64 x 64 tiles gain by it (output 164 -> 123 us, down
// 542 -> 453) and the 128 x 64 tile of two workgroups per SM loses
// (gate/up 1168 -> 1410): the planner sets it per tile.
#define RAW_K 1
uvec4 kq0[A_SUBS];
uvec4 kq1[A_SUBS];
uvec3 ksw[A_SUBS];
uint kdd[A_SUBS];
uint kpart[A_SUBS];
#endif

// Which of this invocation's loads of the step in flight lie inside the
// weight (bit i: sub-block i) and the activations (bit i: vec4 or pair i).
// Raw loads go out unconditionally from clamped addresses and these masks
// zero what lies outside at the staging: a load under a condition leaves a
// merge of the loaded and the zero value right behind it, which NVIDIA's
// compiler resolves there, waiting for the load before the products
// (`scripts/sass.py` on the H100's tiles, docs/perf-notes.md "Session 39").
uint wvalid = 0u;
uint xvalid = 0u;

// Whether this variant's loads hold raw words (issued before the products).
#if defined(RAW_K)
const bool RAW_NOW = RAW_Q4K;
#elif defined(RAW_W)
const bool RAW_NOW = true;
#else
const bool RAW_NOW = false;
#endif

#if defined(X_IN_PAIRS)
// Whether every row of f16 activations starts on 16 bytes (offset and
// stride multiples of 8 halves; columns step by 8): then each invocation
// loads them as pairs of vec4s, one 16-byte load each.
bool x_in_pairs() {
    return ((p.x_offset | p.ld_x) & 7u) == 0u;
}
#endif

void load_step(uint step, uint tid, uint row0, uint tok0) {
    const uint subs = p.k / 32u;
    const uint spr = KSTEP / 32u;   // sub-blocks per tile row and step
    uint wv = 0u;
    [[unroll]] for (uint i = 0u; i < A_SUBS; i++) {
        const uint q = tid + i * WGS;
        const uint r = q / spr;
        const uint s = step * spr + q % spr;
#if defined(RAW_K)
        if (RAW_Q4K) {
            // Outside the weight: block 0's words, zeroed at the staging.
            const bool ok = q < BM * spr && row0 + r < p.m && s < subs;
            const uint part = ok ? s % 8u : 0u;
            const uint ib = ok ? ((row0 + r) * subs + s) / 8u : 0u;
            const uint qw = (ib * PLANE0_WORDS + 8u * (part >> 1)) / 4u;
            kq0[i] = data_a4[qw];
            kq1[i] = data_a4[qw + 1u];
            ksw[i] = scale_words(ib);
            kdd[i] = a_scale_word(p.nb, ib, 0u);   // d and dmin, two f16
            kpart[i] = part;
            wv |= ok ? 1u << i : 0u;
            continue;
        }
#elif defined(RAW_W)
        {
            // Outside the weight: sub-block 0, zeroed at the staging.
            const bool ok = q < BM * spr && row0 + r < p.m && s < subs;
            const uint ib = ok ? (row0 + r) * subs + s : 0u;
            // One 16-byte load, not four of 4 bytes: the 8B's gate/up
            // at 512 tokens 944 -> 775 us on the H100.
            wq[i] = data_a4[ib * PLANE0_WORDS / 4u];
            wd[i] = a_scale(p.nb, ib, 0u);
            wv |= ok ? 1u << i : 0u;
            continue;
        }
#endif
        vec4 w[8];
        if (q < BM * spr && row0 + r < p.m && s < subs) {
            dequant_sub32(p.nb, (row0 + r) * subs + s, w);
        } else {
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                w[j] = vec4(0.0);
            }
        }
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            wreg[i][j] = f16vec4(w[j]);
        }
    }
    wvalid = wv;
    const uint vpr = KSTEP / 4u;    // vec4s per token row and step
    uint xv = 0u;
#if defined(X_IN_PAIRS)
    if (x_in_pairs()) {
        [[unroll]] for (uint i = 0u; i < X_PAIRS; i++) {
            const uint v = 2u * (tid + i * WGS);   // the first vec4 of the pair
            const uint t = v / vpr;
            const uint c = step * KSTEP + 4u * (v % vpr);
            // Outside the activations: their first pair, zeroed at the staging.
            const bool ok = v < BN * vpr && tok0 + t < p.n && c < p.k;
            xraw[i] = data_xu4[(p.x_offset + (ok ? (tok0 + t) * p.ld_x + c : 0u)) / 8u];
            xv |= ok ? 1u << i : 0u;
        }
        xvalid = xv;
        return;
    }
#endif
    [[unroll]] for (uint i = 0u; i < X_VECS; i++) {
        const uint v = tid + i * WGS;
        const uint t = v / vpr;
        const uint c = step * KSTEP + 4u * (v % vpr);
#if defined(X_F16)
        // Outside the activations: their first vec4, zeroed at the staging.
        const bool ok = v < BN * vpr && tok0 + t < p.n && c < p.k;
        xreg[i] = data_xh4[(p.x_offset + (ok ? (tok0 + t) * p.ld_x + c : 0u)) / 4u];
        xv |= ok ? 1u << i : 0u;
#else
        vec4 x = vec4(0.0);
        if (v < BN * vpr && tok0 + t < p.n && c < p.k) {
            x = data_x4[(p.x_offset + (tok0 + t) * p.ld_x + c) / 4u];
        }
        xreg[i] = f16vec4(x);
        xv |= 1u << i;   // zeroed at the load
#endif
    }
    xvalid = xv;
}

void store_step(uint tid) {
    const uint spr = KSTEP / 32u;
    [[unroll]] for (uint i = 0u; i < A_SUBS; i++) {
        const uint q = tid + i * WGS;
        if (q < BM * spr) {
            const uint base = (q / spr) * SA4 + (q % spr) * 8u;
#if defined(RAW_K)
            if (RAW_Q4K) {
                // dequant_sub32's arithmetic, on the held words.
                const uvec2 sm = scale_min_words(ksw[i], kpart[i]);
                const vec2 dm = (wvalid >> i & 1u) != 0u ? unpackHalf2x16(kdd[i]) : vec2(0.0);
                const float dl = dm.x * float(sm.x);
                const float ml = dm.y * float(sm.y);
                const uint sh = 4u * (kpart[i] & 1u);
                [[unroll]] for (uint k = 0u; k < 4u; k++) {
                    sa[base + k] = f16vec4(dl * nib4(kq0[i][k], sh) - ml);
                    sa[base + k + 4u] = f16vec4(dl * nib4(kq1[i][k], sh) - ml);
                }
                continue;
            }
#elif defined(RAW_W)
            {
                const float d = (wvalid >> i & 1u) != 0u ? wd[i] : 0.0;
                const float m = -8.0 * d;
                [[unroll]] for (uint k = 0u; k < 4u; k++) {
                    sa[base + k] = f16vec4(nib4(wq[i][k], 0u) * d + m);
                    sa[base + k + 4u] = f16vec4(nib4(wq[i][k], 4u) * d + m);
                }
                continue;
            }
#endif
            [[unroll]] for (uint j = 0u; j < 8u; j++) {
                sa[base + j] = wreg[i][j];
            }
        }
    }
    const uint vpr = KSTEP / 4u;
#if defined(X_IN_PAIRS)
    if (x_in_pairs()) {
        [[unroll]] for (uint i = 0u; i < X_PAIRS; i++) {
            const uint v = 2u * (tid + i * WGS);
            if (v < BN * vpr) {
                const uint at = (v / vpr) * SA4 + v % vpr;
                const uvec4 u = (xvalid >> i & 1u) != 0u ? xraw[i] : uvec4(0u);
                sx[at] = f16vec4(unpackFloat2x16(u.x), unpackFloat2x16(u.y));
                sx[at + 1u] = f16vec4(unpackFloat2x16(u.z), unpackFloat2x16(u.w));
            }
        }
        return;
    }
#endif
    [[unroll]] for (uint i = 0u; i < X_VECS; i++) {
        const uint v = tid + i * WGS;
        if (v < BN * vpr) {
            sx[(v / vpr) * SA4 + v % vpr] = (xvalid >> i & 1u) != 0u ? xreg[i] : f16vec4(0.0);
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    const uint sg = tid / SUBGROUP;
    const uint lane = tid % SUBGROUP;
    const uint sk = sg / (WM * WN);
    const uint sm = sg % WM;
    const uint sn = (sg / WM) % WN;
    const uint sg_row = sm * TM * 16u;   // this subgroup's rows in the tile
    const uint sg_tok = sn * TN * 16u;   // and tokens
    const uint sg_col = sk * BK;         // and columns of each step

    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            acc[i][j] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
        }
    }

    const uint steps = (p.k + KSTEP - 1u) / KSTEP;
    load_step(0u, tid, row0, tok0);
    for (uint step = 0u; step < steps; step++) {
        barrier();
        store_step(tid);
        barrier();
        // Raw weights and activations wait in registers until the next
        // staging: load them now, ahead of the products. After the
        // barrier, not before it: 3% faster on the H200 (gate/up of the 8B
        // at 512 tokens 1108 -> 1072 us). (Formats dequantized at load
        // would stall here on their loads instead: measured slower, see
        // docs/perf-notes.md.)
        // Unconditional (the last step loads its own words again, unused),
        // so that no merge after a branch waits on them either.
        if (RAW_NOW) {
            load_step(min(step + 1u, steps - 1u), tid, row0, tok0);
        }
        [[unroll]] for (uint c = 0u; c < BK; c += 16u) {
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> ma[TM];
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> mb[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                // A(m, k) = half k of sa[row * SA4 + k / 4]: row-major
                coopMatLoad(ma[i], sa, ((sg_row + 16u * i) * SA + sg_col + c) / 4u, SA4,
                            gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                // B(k, n) = half k of sx[token * SA4 + k / 4]: column-major
                coopMatLoad(mb[j], sx, ((sg_tok + 16u * j) * SA + sg_col + c) / 4u, SA4,
                            gl_CooperativeMatrixLayoutColumnMajor);
            }
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    acc[i][j] = coopMatMulAdd(ma[i], mb[j], acc[i][j]);
                }
            }
        }
        if (!RAW_NOW && step + 1u < steps) {
            load_step(step + 1u, tid, row0, tok0);
        }
    }

    if (WK == 1u) {
        // Each subgroup stages one 16 x 16 result at a time in its own area:
        // sc[base + token * 16 + row], consecutive lanes on consecutive rows.
        const uint base = sg * 256u;
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                coopMatStore(acc[i][j], sc, base, 16, gl_CooperativeMatrixLayoutColumnMajor);
                subgroupMemoryBarrierShared();
                subgroupBarrier();
                [[unroll]] for (uint e = lane; e < 256u; e += SUBGROUP) {
                    const uint r = sg_row + 16u * i + e % 16u;
                    const uint t = sg_tok + 16u * j + e / 16u;
                    const uint row = row0 + r;
                    // rows r and r ^ 1 of a token are elements e and e ^ 1
                    const float v = sc[base + e];
                    const float partner = sc[base + (e ^ 1u)];
                    if (row < p.m && tok0 + t < p.n) {
                        store_out(row, tok0 + t, v, partner);
                    }
                }
                subgroupBarrier();
            }
        }
    } else {
        // Every K-group's partial tile, tile-wide: sc[sk * BM * BN + token * BM + row].
        barrier();
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            [[unroll]] for (uint j = 0u; j < TN; j++) {
                coopMatStore(acc[i][j], sc,
                             sk * BM * BN + (sg_tok + 16u * j) * BM + sg_row + 16u * i, BM,
                             gl_CooperativeMatrixLayoutColumnMajor);
            }
        }
        barrier();
        for (uint e = tid; e < BM * BN; e += WGS) {
            float v = 0.0;
            float partner = 0.0;
            [[unroll]] for (uint g = 0u; g < WK; g++) {
                v += sc[g * BM * BN + e];
                partner += sc[g * BM * BN + (e ^ 1u)];
            }
            const uint r = e % BM;
            const uint t = e / BM;
            const uint row = row0 + r;
            if (row < p.m && tok0 + t < p.n) {
                store_out(row, tok0 + t, v, partner);
            }
        }
    }
}
