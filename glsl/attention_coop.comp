#version 450
// attention_coop: the attention of attention_blocks.comp (causal, optional
// sliding window and soft-cap, GQA, f16 KV cache through page tables, runs
// of tokens of several sequences in one block) on cooperative matrices
// (VK_KHR_cooperative_matrix, f16 16x16x16, f32 accumulation), for prompts
// and encoders on GPUs that have them.
//
// A workgroup of NSG subgroups takes BR = 16 * NSG consecutive query tokens
// of one head; subgroup sg owns 16 of them, so each query row's online
// softmax lives in one subgroup and needs no workgroup barrier. Per tile of
// BC keys the workgroup stages the keys and values in shared memory (f16;
// the next tile's loads are issued before this tile's products), then each
// subgroup
//   - multiplies its queries (f16, held as matrices for the whole walk) by
//     the keys: S = Q K^T, 16 x BC, through its shared area;
//   - runs the online softmax with two lanes per row, each over half the
//     row's columns (read in a rotated order, so the 32 lanes hit 32 banks):
//     mask, scale, soft-cap, max and sum across the pair by one shuffle, and
//     P = exp(S - m) as f16 into shared memory, m trailing the row's
//     maximum by up to MAX_LAG;
//   - adds P V into its output, held as accumulator matrices; only when a
//     row's maximum passed m by more than that does m move and the output
//     go through shared memory to be rescaled row by row (with random
//     scores, at every early tile where m followed the maximum exactly:
//     the 8B's heads at 2048 tokens took 1.85x as long on the H100).
// Tiles a subgroup's queries cannot see (causal prompts, windows, other
// sequences' runs) are skipped by that subgroup. As in llama.cpp's
// cooperative-matrix flash attention, queries and probabilities are rounded
// to f16 for the products; scores, sums and outputs stay f32. With O_F16
// the output is written as f16: the output projection's input where it
// runs on f16 tiles, which would round it to f16 the same way.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_KHR_shader_subgroup_vote : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable

layout(local_size_x_id = 0) in;              // 32 * NSG
layout(constant_id = 1) const uint NSG = 4;  // subgroups (16 queries each)
layout(constant_id = 2) const uint D = 64;   // head_dim (multiple of 16)
layout(constant_id = 3) const uint BC = 64;  // keys per tile (32 or 64)

const uint BR = 16u * NSG;
// How far a row's running maximum may trail its scores: e^10 < 65504, the
// largest f16 (the probabilities' type in the P V products).
const float MAX_LAG = 10.0;
const uint WGS = 32u * NSG;
const uint SKV = D / 4u + 2u;     // f16vec4 stride of a staged row (bank spread)
const uint HB = BC / 2u;          // key columns per lane
const uint D8 = D / 8u;           // uvec4 words of one head row
// Floats per row of a subgroup's area: a tile's scores, or OC of the
// output's matrices at a time while they are rescaled (64 columns at most,
// so that 128-wide heads fit four subgroups in 48 KB).
const uint DC = D < 64u ? D : 64u;
const uint SF = BC > DC ? BC : DC;
// (a divisor of D / 16: four where it divides, else two or one)
const uint OC = SF / 16u >= D / 16u ? D / 16u
              : (D / 16u) % (SF / 16u) == 0u ? SF / 16u
              : (D / 16u) % 2u == 0u ? 2u : 1u;
// Per invocation and tile: uvec4 words of keys (and as many of values).
const uint KV_WORDS = (BC * D8 + WGS - 1u) / WGS;

layout(binding = 0) readonly buffer Q { float data_q[]; };
layout(binding = 1) readonly buffer K { uvec4 data_k[]; };
layout(binding = 2) readonly buffer V { uvec4 data_v[]; };
#if defined(O_F16)
layout(binding = 3) writeonly buffer O { float16_t data_o[]; };
#else
layout(binding = 3) writeonly buffer O { float data_o[]; };
#endif
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer S { int page_table[]; };
layout(binding = 6) readonly buffer T { int seq_base[]; };

#include "iface/attention.glsl"

#include "common/kv_slot.glsl"

// Keys (rows 0..BC-1) then values (rows BC..2BC-1) of a tile; the block's
// queries before the walk (BR <= 2 BC rows).
shared f16vec4 skv[2u * BC * SKV];
// Per subgroup 16 rows of SF floats: the scores of a tile, or its output
// while rescaled.
shared float s_f[NSG * 16u * SF];
shared float16_t s_p[NSG * 16u * BC];
shared float s_row[NSG * 16u];     // per row: the rescale factor, at the end 1 / sum
shared int s_pos[BR];
shared int s_lo[BR];

uvec4 k_regs[KV_WORDS];
uvec4 v_regs[KV_WORDS];

int lowest_key(int pos) {
    return p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
}

f16vec4 halves(uint a, uint b) {
    return f16vec4(unpackFloat2x16(a), unpackFloat2x16(b));
}

// This invocation's words of the tile of keys j0.. (rows past j_hi repeat
// j_hi's, weighted 0).
void load_tile(int base, int j0, int j_hi, uint row_words4, uint head_word4) {
    const uint lid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0u; i < KV_WORDS; i++) {
        const uint w = lid + i * WGS;
        if (w < BC * D8) {
            const int j = min(j0 + int(w / D8), j_hi);
            const uint at = kv_slot(base, j, p.page_size, p.ring) * row_words4 + head_word4 + w % D8;
            k_regs[i] = data_k[at];
            v_regs[i] = data_v[at];
        }
    }
}

void store_tile() {
    const uint lid = gl_LocalInvocationID.x;
    [[unroll]] for (uint i = 0u; i < KV_WORDS; i++) {
        const uint w = lid + i * WGS;
        if (w < BC * D8) {
            const uint r = w / D8;
            const uint c = w % D8;
            skv[r * SKV + 2u * c] = halves(k_regs[i].x, k_regs[i].y);
            skv[r * SKV + 2u * c + 1u] = halves(k_regs[i].z, k_regs[i].w);
            skv[(BC + r) * SKV + 2u * c] = halves(v_regs[i].x, v_regs[i].y);
            skv[(BC + r) * SKV + 2u * c + 1u] = halves(v_regs[i].z, v_regs[i].w);
        }
    }
}

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint sg = lid / 32u;
    const uint lane = lid % 32u;
    // Workgroups in launch order take every head's last query block, then
    // every head's one before, ...: under a causal mask the last blocks walk
    // the most keys, so the longest start first and the short ones fill the
    // last wave (and the heads of a KV group run side by side, sharing its
    // tiles in L2).
    const uint lin = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uint h = lin % p.n_head;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint q0 = (gl_NumWorkGroups.x - 1u - lin / p.n_head) * BR;
    const uint nq = min(BR, p.n_tokens - q0);
    const uint row_words4 = p.n_head_kv * D8;   // uvec4 words of a cache row
    const uint head_word4 = kvh * D8;
    const uint r0 = sg * 16u;                    // this subgroup's first row
    const uint f0 = r0 * SF;                     // and its float area
    // The softmax lanes: row r (of the subgroup's 16), half hf of the columns.
    const uint r = lane % 16u;
    const uint hf = lane / 16u;
    const uint row = r0 + r;

    // The block's queries, f16, into skv; their positions and lowest keys.
    for (uint w = lid; w < BR * (D / 4u); w += WGS) {
        const uint qr = w / (D / 4u);
        const uint c = w % (D / 4u);
        const uint tok = q0 + min(qr, nq - 1u);
        const uint qb = p.q_offset + tok * p.ld_q + h * D + 4u * c;
        skv[qr * SKV + c] = f16vec4(vec4(data_q[qb], data_q[qb + 1u], data_q[qb + 2u], data_q[qb + 3u]));
    }
    for (uint i = lid; i < BR; i += WGS) {
        const int pos = data_pos[q0 + min(i, nq - 1u)];
        s_pos[i] = pos;
        s_lo[i] = lowest_key(pos);
    }
    barrier();
    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> qm[D / 16u];
    [[unroll]] for (uint d = 0u; d < D / 16u; d++) {
        coopMatLoad(qm[d], skv, r0 * SKV + 4u * d, SKV, gl_CooperativeMatrixLayoutRowMajor);
    }
    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> o[D / 16u];
    [[unroll]] for (uint d = 0u; d < D / 16u; d++) {
        o[d] = coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
    }

    // This lane's row: running max and sum (both lanes of a row hold them).
    float m = -1.0 / 0.0;
    float l = 0.0;
    const int pos = s_pos[row];
    const int lo = s_lo[row];

    uint done = 0u;
    while (done < nq) {
        // The run of queries from `done` on that read the same sequence.
        const int base = seq_base[q0 + done];
        uint end = done + 1u;
        while (end < nq && seq_base[q0 + end] == base) {
            end++;
        }
        const int j_lo = lowest_key(data_pos[q0 + done]);
        const int j_hi = data_pos[q0 + end - 1u];
        const bool in_run = row >= done && row < end;
        // The keys this subgroup's rows of the run see.
        const int see_lo = subgroupMin(in_run ? lo : 0x7fffffff);
        const int see_hi = subgroupMax(in_run ? pos : -1);
        load_tile(base, j_lo, j_hi, row_words4, head_word4);
        for (int j0 = j_lo; j0 <= j_hi; j0 += int(BC)) {
            barrier();   // the last tile (or the queries) no longer read
            store_tile();
            barrier();
            if (j0 + int(BC) <= j_hi) {
                load_tile(base, j0 + int(BC), j_hi, row_words4, head_word4);
            }
            if (see_hi < j0 || see_lo > j0 + int(BC) - 1) {
                continue;   // no row of this subgroup sees a key of the tile
            }

            // S = Q K^T: B(k = dim, n = key) is the staged key row, column-major.
            [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
                coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> acc =
                    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
                [[unroll]] for (uint d = 0u; d < D / 16u; d++) {
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> km;
                    coopMatLoad(km, skv, (16u * c) * SKV + 4u * d, SKV,
                                gl_CooperativeMatrixLayoutColumnMajor);
                    acc = coopMatMulAdd(qm[d], km, acc);
                }
                coopMatStore(acc, s_f, f0 + 16u * c, SF, gl_CooperativeMatrixLayoutRowMajor);
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();

            // The online softmax of this lane's half row.
            float sc[HB];
            float mx = -1.0 / 0.0;
            [[unroll]] for (uint i = 0u; i < HB; i++) {
                const uint col = hf * HB + (i + r + 16u * hf) % HB;
                const int j = j0 + int(col);
                float s = s_f[f0 + r * SF + col] * p.scale;
                if (p.softcap > 0.0) {
                    s = p.softcap * tanh(s / p.softcap);
                }
                sc[i] = (in_run && j >= lo && j <= pos) ? s : -1.0 / 0.0;
                mx = max(mx, sc[i]);
            }
            // The running maximum moves only where the tile's exceeds it by
            // more than MAX_LAG (or from -inf, where the output and sum are
            // still zero): the probabilities exp(s - m) are then at most
            // e^MAX_LAG, which f16 holds, and the output goes through shared
            // memory to be rescaled far less often (the same quotient, other
            // roundings).
            const float t_max = max(mx, subgroupShuffleXor(mx, 16u));
            const bool move = t_max > m + MAX_LAG;
            const float m_new = move ? t_max : m;
            float corr = 1.0;
            float sum = 0.0;
            [[unroll]] for (uint i = 0u; i < HB; i++) {
                const uint col = hf * HB + (i + r + 16u * hf) % HB;
                float e = 0.0;
                if (m_new > -1.0 / 0.0) {
                    e = exp(sc[i] - m_new);
                }
                sum += e;
                s_p[r0 * BC + r * BC + col] = float16_t(e);
            }
            if (move && m > -1.0 / 0.0) {
                corr = exp(m - m_new);
            }
            l = l * corr + sum + subgroupShuffleXor(sum, 16u);
            m = m_new;

            if (subgroupAny(corr != 1.0)) {
                // Rescale the output rows through the (no longer read) score area.
                if (hf == 0u) {
                    s_row[row] = corr;
                }
                subgroupBarrier();
                [[unroll]] for (uint d0 = 0u; d0 < D / 16u; d0 += OC) {
                    [[unroll]] for (uint d = 0u; d < OC; d++) {
                        coopMatStore(o[d0 + d], s_f, f0 + 16u * d, SF,
                                     gl_CooperativeMatrixLayoutRowMajor);
                    }
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    for (uint e = lane; e < 256u * OC; e += 32u) {
                        const uint c = 16u * OC;
                        s_f[f0 + (e / c) * SF + e % c] *= s_row[r0 + e / c];
                    }
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    [[unroll]] for (uint d = 0u; d < OC; d++) {
                        coopMatLoad(o[d0 + d], s_f, f0 + 16u * d, SF,
                                    gl_CooperativeMatrixLayoutRowMajor);
                    }
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                }
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();

            // O += P V: B(k = key, n = dim) is the staged value row, row-major.
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> pm[BC / 16u];
            [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
                coopMatLoad(pm[c], s_p, r0 * BC + 16u * c, BC, gl_CooperativeMatrixLayoutRowMajor);
            }
            [[unroll]] for (uint d = 0u; d < D / 16u; d++) {
                [[unroll]] for (uint c = 0u; c < BC / 16u; c++) {
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> vm;
                    coopMatLoad(vm, skv, (BC + 16u * c) * SKV + 4u * d, SKV,
                                gl_CooperativeMatrixLayoutRowMajor);
                    o[d] = coopMatMulAdd(pm[c], vm, o[d]);
                }
            }
            subgroupBarrier();   // s_f and s_p are rewritten by the next tile
        }
        done = end;
    }

    if (hf == 0u) {
        s_row[row] = l > 0.0 ? 1.0 / l : 0.0;
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    [[unroll]] for (uint d0 = 0u; d0 < D / 16u; d0 += OC) {
        [[unroll]] for (uint d = 0u; d < OC; d++) {
            coopMatStore(o[d0 + d], s_f, f0 + 16u * d, SF, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        const uint c = 16u * OC;
        for (uint e = lane; e < 16u * c; e += 32u) {
            const uint rr = r0 + e / c;
            if (rr < nq) {
                const uint d = 16u * d0 + e % c;
                const float v = s_f[f0 + (e / c) * SF + e % c] * s_row[rr];
#if defined(O_F16)
                data_o[p.o_offset + (q0 + rr) * p.ld_o + h * D + d] = float16_t(v);
#else
                data_o[p.o_offset + (q0 + rr) * p.ld_o + h * D + d] = v;
#endif
            }
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }
}
