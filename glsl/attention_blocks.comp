#version 450
// attention_blocks: the same attention as attention.comp (causal, optional
// sliding window and soft-cap, GQA, f16 KV cache through page tables), for
// prompts: a workgroup takes a block of BR = WG / QT consecutive query
// tokens of one head, QT invocations per query (each owning DPL = head_dim /
// QT dimensions), and walks the keys in tiles of BC rows that the whole
// workgroup stages in shared memory once, so every key row comes from cache
// once per block rather than once per query. Per tile each query computes
// its BC scores (independent, so the loads and sums overlap), then one
// online-softmax update.
//
// Tokens of several sequences may share a block (batched prompts): the
// block is walked once per run of tokens with the same sequence table.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;
layout(constant_id = 2) const uint QT = 4;     // invocations per query (power of two <= SUBGROUP)
layout(constant_id = 3) const uint DPL = 16;   // head_dim / QT (even): dims per invocation
layout(constant_id = 4) const uint BC = 32;    // keys per tile

layout(binding = 0) readonly buffer Q { float data_q[]; };
layout(binding = 1) readonly buffer K { uint data_k[]; };
layout(binding = 2) readonly buffer V { uint data_v[]; };
layout(binding = 3) writeonly buffer O { float data_o[]; };
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer S { int page_table[]; };
layout(binding = 6) readonly buffer T { int seq_base[]; };

#include "iface/attention.glsl"

#include "common/kv_slot.glsl"

const uint HW = QT * DPL / 2u;   // words of one head's key (or value) row
shared uint sk[BC * HW];
shared uint sv[BC * HW];

int lowest_key(int pos) {
    return p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
}

void main() {
    const uint br = gl_WorkGroupSize.x / QT;   // queries per block
    const uint lid = gl_LocalInvocationID.x;
    const uint h = gl_WorkGroupID.y;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint q0 = gl_WorkGroupID.x * br;
    const uint qi = lid / QT;                  // this invocation's query in the block
    const uint part = lid % QT;
    const uint nq = min(br, p.n_tokens - q0);
    const bool live = qi < nq;
    const uint tok = q0 + min(qi, nq - 1u);
    const uint d0 = part * DPL;
    const uint kv_row_words = p.n_head_kv * p.head_dim / 2u;
    const uint head_word = kvh * p.head_dim / 2u;

    float q[DPL];
    float acc[DPL];
    const uint qb = p.q_offset + tok * p.ld_q + h * p.head_dim + d0;
    [[unroll]] for (uint i = 0u; i < DPL; i++) {
        q[i] = data_q[qb + i];
        acc[i] = 0.0;
    }
    const int pos = data_pos[tok];
    const int lo = lowest_key(pos);

    float m = -1.0 / 0.0;
    float l = 0.0;
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
        const bool mine = live && qi >= done && qi < end;
        for (int j0 = j_lo; j0 <= j_hi; j0 += int(BC)) {
            barrier();   // the last tile is no longer read
            for (uint w = lid; w < BC * HW; w += gl_WorkGroupSize.x) {
                const int j = min(j0 + int(w / HW), j_hi);
                const uint row = kv_slot(base, j, p.page_size, p.ring) * kv_row_words
                               + head_word + w % HW;
                sk[w] = data_k[row];
                sv[w] = data_v[row];
            }
            barrier();
            if (mine) {
                // All QT invocations of a query are here together: the
                // shuffles stay among them.
                float sc[BC];
                float mx = -1.0 / 0.0;
                [[unroll]] for (uint jj = 0u; jj < BC; jj++) {
                    const uint kb = jj * HW + d0 / 2u;
                    float dot_ = 0.0;
                    [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                        const vec2 k = unpackHalf2x16(sk[kb + i / 2u]);
                        dot_ += q[i] * k.x + q[i + 1u] * k.y;
                    }
                    [[unroll]] for (uint off = 1u; off < QT; off <<= 1) {
                        dot_ += subgroupShuffleXor(dot_, off);
                    }
                    float s = dot_ * p.scale;
                    if (p.softcap > 0.0) {
                        s = p.softcap * tanh(s / p.softcap);
                    }
                    const int j = j0 + int(jj);
                    sc[jj] = (j >= lo && j <= pos) ? s : -1.0 / 0.0;
                    mx = max(mx, sc[jj]);
                }
                const float m_new = max(m, mx);
                if (m_new > -1.0 / 0.0) {
                    const float corr = exp(m - m_new);
                    l *= corr;
                    [[unroll]] for (uint i = 0u; i < DPL; i++) {
                        acc[i] *= corr;
                    }
                    [[unroll]] for (uint jj = 0u; jj < BC; jj++) {
                        const float w = exp(sc[jj] - m_new);
                        l += w;
                        const uint vb = jj * HW + d0 / 2u;
                        [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                            const vec2 v = unpackHalf2x16(sv[vb + i / 2u]);
                            acc[i] += w * v.x;
                            acc[i + 1u] += w * v.y;
                        }
                    }
                    m = m_new;
                }
            }
        }
        done = end;
    }
    if (live) {
        const uint ob = p.o_offset + tok * p.ld_o + h * p.head_dim + d0;
        [[unroll]] for (uint i = 0u; i < DPL; i++) {
            data_o[ob + i] = acc[i] / l;
        }
    }
}
