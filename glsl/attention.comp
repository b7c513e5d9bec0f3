#version 450
// attention: O[n, h] = softmax(scale * Q[n, h] . K^T + mask) V for each token
// n and head h, reading an f16 KV cache through a slot table and never
// materializing the score matrix: keys are processed in tiles of the
// workgroup size with an online softmax (running max and sum).
//
// Token n sees the keys at positions [lo, pos[n]] where lo = pos[n] - window + 1
// for sliding-window layers and 0 otherwise. Key at position j lives in the
// cache row kv_slot() finds through the token's sequence page table. Grouped-query attention: head h reads KV head h / (n_head / n_head_kv).

#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;

layout(binding = 0) readonly buffer Q { float data_q[]; };
layout(binding = 1) readonly buffer K { uint data_k[]; };
layout(binding = 2) readonly buffer V { uint data_v[]; };
layout(binding = 3) writeonly buffer O { float data_o[]; };
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer S { int page_table[]; };
layout(binding = 6) readonly buffer T { int seq_base[]; };

layout(push_constant) uniform Params {
    uint n_tokens;
    uint n_head;
    uint n_head_kv;
    uint head_dim;    // even, at most MAX_HEAD_DIM
    uint ld_q;
    uint q_offset;
    uint ld_o;
    uint o_offset;
    float scale;
    float softcap;    // 0: none
    uint window;      // 0: full causal attention
    uint page_size;   // cache rows per page
    uint ring;        // 0, or the ring size of a window-only cache
} p;

#define MAX_HEAD_DIM 256

#include "common/reduce.glsl"
#include "common/kv_slot.glsl"

shared float sq[MAX_HEAD_DIM];
shared float sp[gl_WorkGroupSize.x];

void main() {
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (wg >= p.n_tokens * p.n_head) {
        return;
    }
    const uint tok = wg / p.n_head;
    const uint h = wg % p.n_head;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint tid = gl_LocalInvocationID.x;
    const uint wgs = gl_WorkGroupSize.x;
    const uint hd = p.head_dim;
    const uint kv_row_words = p.n_head_kv * hd / 2u;
    const uint kv_head_word = kvh * hd / 2u;

    for (uint d = tid; d < hd; d += wgs) {
        sq[d] = data_q[p.q_offset + tok * p.ld_q + h * hd + d];
    }
    barrier();

    const int pos = data_pos[tok];
    const int lo = p.window > 0u ? max(0, pos - int(p.window) + 1) : 0;
    const int base = seq_base[tok];

    // Each invocation owns output dims tid, tid + wgs, ... (at most 4 with hd 256, wgs 64).
    float acc[MAX_HEAD_DIM / 32];
    for (uint i = 0u; i < MAX_HEAD_DIM / 32; i++) {
        acc[i] = 0.0;
    }
    float m = -1.0 / 0.0;
    float l = 0.0;

    for (int t0 = lo; t0 <= pos; t0 += int(wgs)) {
        const int j = t0 + int(tid);
        float s = -1.0 / 0.0;
        if (j <= pos) {
            const uint kb = kv_slot(base, j, p.page_size, p.ring) * kv_row_words + kv_head_word;
            float dot_ = 0.0;
            for (uint d2 = 0u; d2 < hd / 2u; d2++) {
                const vec2 k = unpackHalf2x16(data_k[kb + d2]);
                dot_ += sq[2u * d2] * k.x + sq[2u * d2 + 1u] * k.y;
            }
            s = dot_ * p.scale;
            if (p.softcap > 0.0) {
                s = p.softcap * tanh(s / p.softcap);
            }
        }
        const float tile_max = workgroup_max(s);
        const float new_m = max(m, tile_max);
        const float e = j <= pos ? exp(s - new_m) : 0.0;
        const float tile_sum = workgroup_sum(e);
        const float corr = exp(m - new_m);
        l = l * corr + tile_sum;
        m = new_m;
        sp[tid] = e;
        barrier();
        const uint n_keys = uint(min(int(wgs), pos - t0 + 1));
        uint i = 0u;
        for (uint d = tid; d < hd; d += wgs, i++) {
            float a = acc[i] * corr;
            for (uint jj = 0u; jj < n_keys; jj++) {
                const uint vb = kv_slot(base, t0 + int(jj), p.page_size, p.ring) * kv_row_words + kv_head_word;
                const vec2 v = unpackHalf2x16(data_v[vb + d / 2u]);
                a += sp[jj] * ((d & 1u) == 0u ? v.x : v.y);
            }
            acc[i] = a;
        }
        barrier();
    }
    uint i = 0u;
    for (uint d = tid; d < hd; d += wgs, i++) {
        data_o[p.o_offset + tok * p.ld_o + h * hd + d] = acc[i] / l;
    }
}
