#version 450
// attention_rows: the same attention as attention.comp (causal, optional
// sliding window and soft-cap, GQA, f16 KV cache through page tables), laid
// out with DS invocations per query token instead of a workgroup per token:
// neighbouring invocations hold neighbouring queries of one head and walk the
// keys together, so each key and value row is read once per subgroup (a
// uniform load: one scalar load on CPU drivers, a broadcast on GPUs) and the
// running softmax lives in registers — no shared memory, no barriers.
// Each of the DS invocations of a query owns head_dim / DS dimensions.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;
layout(constant_id = 2) const uint DS = 1;    // invocations per query (power of two <= SUBGROUP)
layout(constant_id = 3) const uint DPL = 64;  // head_dim / DS (even): dims per invocation

layout(binding = 0) readonly buffer Q { float data_q[]; };
layout(binding = 1) readonly buffer K { uint data_k[]; };
layout(binding = 2) readonly buffer V { uint data_v[]; };
layout(binding = 3) writeonly buffer O { float data_o[]; };
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer S { int page_table[]; };
layout(binding = 6) readonly buffer T { int seq_base[]; };

#include "iface/attention.glsl"

#include "common/kv_slot.glsl"

void main() {
    const uint qpw = gl_WorkGroupSize.x / DS;                  // queries per workgroup
    const uint lid = gl_LocalInvocationID.x;
    const uint qi = gl_WorkGroupID.x * qpw + lid / DS;
    const uint part = lid % DS;
    const uint h = gl_WorkGroupID.y;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const bool live = qi < p.n_tokens;
    const uint tok = min(qi, p.n_tokens - 1u);
    const uint d0 = part * DPL;
    const uint kv_row_words = p.n_head_kv * p.head_dim / 2u;
    const uint head_word = (kvh * p.head_dim + d0) / 2u;

    float q[DPL];
    float acc[DPL];
    const uint qb = p.q_offset + tok * p.ld_q + h * p.head_dim + d0;
    [[unroll]] for (uint i = 0u; i < DPL; i++) {
        q[i] = data_q[qb + i];
        acc[i] = 0.0;
    }

    const int pos = data_pos[tok];
    const int lo = p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
    const int base = seq_base[tok];
    // Keys any query of this subgroup needs.
    const int j_lo = subgroupMin(live ? lo : 0x7fffffff);
    const int j_hi = subgroupMax(live ? pos : -1);

    float m = -1.0 / 0.0;
    float l = 0.0;
    for (int j = j_lo; j <= j_hi; j++) {
        // Queries of other sequences (batched calls) may walk past this one's
        // last position: clamp so the page-table read stays inside its table.
        const uint row = kv_slot(base, min(j, pos), p.page_size, p.ring) * kv_row_words + head_word;
        float dot_ = 0.0;
        [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
            const vec2 k = unpackHalf2x16(data_k[row + i / 2u]);
            dot_ += q[i] * k.x + q[i + 1u] * k.y;
        }
        [[unroll]] for (uint off = 1u; off < DS; off <<= 1) {
            dot_ += subgroupShuffleXor(dot_, off);
        }
        float s = dot_ * p.scale;
        if (p.softcap > 0.0) {
            s = p.softcap * tanh(s / p.softcap);
        }
        if (live && j >= lo && j <= pos) {
            const float m_new = max(m, s);
            const float corr = exp(m - m_new);
            const float w = exp(s - m_new);
            l = l * corr + w;
            [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                const vec2 v = unpackHalf2x16(data_v[row + i / 2u]);
                acc[i] = acc[i] * corr + w * v.x;
                acc[i + 1u] = acc[i + 1u] * corr + w * v.y;
            }
            m = m_new;
        }
    }
    if (live) {
        const uint ob = p.o_offset + tok * p.ld_o + h * p.head_dim + d0;
        [[unroll]] for (uint i = 0u; i < DPL; i++) {
            data_o[ob + i] = acc[i] / l;
        }
    }
}
