#version 450
// attention: O[n, h] = softmax(scale * Q[n, h] . K^T + mask) V for each token
// n and head h, reading an f16 KV cache through a slot table and never
// materializing the score matrix. One workgroup per (token, head), for few
// query tokens (decode): the workgroup's invocations form G = WG / DS key
// groups of DS invocations (each owning DPL = head_dim / DS dimensions);
// group g walks keys lo + g, lo + g + G, ... with its own online softmax
// (running max, sum and output in registers), so the keys are split G ways
// and every load of a key row is wide and independent of the others; the G
// partial softmaxes are merged through shared memory at the end.
//
// Token n sees the keys at positions [lo, pos[n]] where lo = pos[n] - window + 1
// for sliding-window layers and 0 otherwise. Key at position j lives in the
// cache row kv_slot() finds through the token's sequence page table.
// Grouped-query attention: head h reads KV head h / (n_head / n_head_kv).
//
// With ATTN_STORE_NEW (decode: every token is the only new one of its
// sequence) the kernel also stores each token's new K/V rows into the cache:
// the first query head of each KV group writes them, and every head takes
// the key and value at its own position from the f32 source, rounded to f16
// exactly as stored, so no workgroup reads a cache row another one writes
// (keys clamped to pos too).
//
// With ATTN_SPLIT (flash-decoding) NSPLIT workgroups share each (token,
// head): few (token, head) pairs would leave most of a GPU idle, each
// workgroup walking every key in a chain of dependent loads. The keys
// [lo, pos] are cut at run time (a recording is replayed as the context
// grows) into NSPLIT chunks of whole iterations (G * UK keys); each split
// writes its partial softmax (max, sum, unnormalized output) to the scratch
// buffer W and counts itself done in C[token, head]; the split that counts
// last merges all partials into the output and sets the counter back to 0
// for the next dispatch. Only split 0 of a storing head stores the new rows.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#if defined(O_F16)
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
#endif

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint SUBGROUP = 32;
layout(constant_id = 2) const uint DS = 4;     // invocations per key group (power of two <= SUBGROUP)
layout(constant_id = 3) const uint DPL = 16;   // head_dim / DS (even): dims per invocation
layout(constant_id = 4) const uint UK = 2;     // keys per key group and iteration
#if defined(ATTN_SPLIT)
layout(constant_id = 5) const uint NSPLIT = 2; // workgroups per (token, head)
#else
const uint NSPLIT = 1u;
#endif

layout(binding = 0) readonly buffer Q { float data_q[]; };
layout(binding = 1) buffer K { uint data_k[]; };
layout(binding = 2) buffer V { uint data_v[]; };
#if defined(O_F16)
// The output as f16: the output projection's input in batched decode.
layout(binding = 3) writeonly buffer O { float16_t data_o[]; };
#else
layout(binding = 3) writeonly buffer O { float data_o[]; };
#endif
layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer S { int page_table[]; };
layout(binding = 6) readonly buffer T { int seq_base[]; };
layout(binding = 7) readonly buffer KN { float data_kn[]; };
layout(binding = 8) readonly buffer VN { float data_vn[]; };
#if defined(ATTN_SPLIT)
// Splits done per (token, head), zero between dispatches.
layout(binding = 9) coherent buffer C { uint data_c[]; };
// Partials per (token, head, split): max, sum, head_dim outputs. Coherent:
// another workgroup reads them, past caches that are not kept coherent.
layout(binding = 10) coherent buffer W { float data_w[]; };
#endif

#include "iface/attention.glsl"

#include "common/kv_slot.glsl"

const uint G = gl_WorkGroupSize.x / DS;
shared float s_m[G];
shared float s_l[G];
shared float s_acc[G * DS * DPL];
#if defined(ATTN_SPLIT)
shared float s_pm[NSPLIT];
shared float s_pl[NSPLIT];
shared float s_pw[NSPLIT];
shared bool s_last;
#endif

void main() {
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (wg >= p.n_tokens * p.n_head * NSPLIT) {
        return;
    }
    // The splits of one (token, head) are neighbouring workgroups.
    const uint th = wg / NSPLIT;
    const uint split = wg % NSPLIT;
    const uint tok = th / p.n_head;
    const uint h = th % p.n_head;
    const uint kvh = h / (p.n_head / p.n_head_kv);
    const uint lid = gl_LocalInvocationID.x;
    const uint g = lid / DS;
    const uint part = lid % DS;
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
    // This workgroup's keys [first, last]: all of them, or its split's
    // chunk of whole iterations (empty past the end).
    const int stride = int(G * UK);
    const int chunk = ((pos - lo + int(NSPLIT)) / int(NSPLIT) + stride - 1) / stride * stride;
    const int first = lo + int(split) * chunk;
    const int last = min(pos, first + chunk - 1);

    const bool fused = (p.flags & ATTN_STORE_NEW) != 0u;
    // This token's new K/V head row in the source (f32).
    const uint kn = p.k_new + tok * p.ld_new + kvh * p.head_dim;
    const uint vn = p.v_new + tok * p.ld_new + kvh * p.head_dim;
    if (fused && split == 0u && h % (p.n_head / p.n_head_kv) == 0u) {
        const uint row = kv_slot(base, pos, p.page_size, p.ring) * kv_row_words
                       + kvh * p.head_dim / 2u;
        for (uint w = lid; w < p.head_dim / 2u; w += gl_WorkGroupSize.x) {
            data_k[row + w] = packHalf2x16(vec2(data_kn[kn + 2u * w], data_kn[kn + 2u * w + 1u]));
            data_v[row + w] = packHalf2x16(vec2(data_vn[vn + 2u * w], data_vn[vn + 2u * w + 1u]));
        }
    }

    float m = -1.0 / 0.0;
    float l = 0.0;
    // Every invocation of a key group runs the same iterations (shuffles).
    // UK keys per iteration (j, j + G, ...): their key and value loads are
    // independent of each other and of the arithmetic, and all go out
    // before the first dot product, so an iteration waits for memory once.
    // Keys past `last` are read clamped to it and weighted 0; a clamped or
    // real key at pos of a storing call comes from the f32 source.
    for (int j0 = first + int(g); j0 <= last; j0 += stride) {
        uint kw[UK][DPL / 2u];
        uint vw[UK][DPL / 2u];
        [[unroll]] for (uint u = 0u; u < UK; u++) {
            const int j = min(j0 + int(u * G), last);
            if (fused && j == pos) {
                [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                    kw[u][i / 2u] = packHalf2x16(vec2(data_kn[kn + d0 + i], data_kn[kn + d0 + i + 1u]));
                    vw[u][i / 2u] = packHalf2x16(vec2(data_vn[vn + d0 + i], data_vn[vn + d0 + i + 1u]));
                }
            } else {
                const uint row = kv_slot(base, j, p.page_size, p.ring) * kv_row_words + head_word;
                [[unroll]] for (uint i = 0u; i < DPL / 2u; i++) {
                    kw[u][i] = data_k[row + i];
                    vw[u][i] = data_v[row + i];
                }
            }
        }
        float s[UK];
        [[unroll]] for (uint u = 0u; u < UK; u++) {
            float dot_ = 0.0;
            [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                const vec2 k = unpackHalf2x16(kw[u][i / 2u]);
                dot_ += q[i] * k.x + q[i + 1u] * k.y;
            }
            [[unroll]] for (uint off = 1u; off < DS; off <<= 1) {
                dot_ += subgroupShuffleXor(dot_, off);
            }
            float sc = dot_ * p.scale;
            if (p.softcap > 0.0) {
                sc = p.softcap * tanh(sc / p.softcap);
            }
            s[u] = j0 + int(u * G) <= last ? sc : -1.0 / 0.0;
        }
        float m_new = m;
        [[unroll]] for (uint u = 0u; u < UK; u++) {
            m_new = max(m_new, s[u]);
        }
        const float corr = exp(m - m_new);
        l *= corr;
        [[unroll]] for (uint i = 0u; i < DPL; i++) {
            acc[i] *= corr;
        }
        [[unroll]] for (uint u = 0u; u < UK; u++) {
            const float w = exp(s[u] - m_new);
            l += w;
            [[unroll]] for (uint i = 0u; i < DPL; i += 2u) {
                const vec2 v = unpackHalf2x16(vw[u][i / 2u]);
                acc[i] += w * v.x;
                acc[i + 1u] += w * v.y;
            }
        }
        m = m_new;
    }

    // Merge the key groups: rescale each to the overall max and sum (a
    // group without keys has m = -inf and weighs 0; so does a split
    // without keys, whose max stays -inf).
    if (part == 0u) {
        s_m[g] = m;
        s_l[g] = l;
    }
    [[unroll]] for (uint i = 0u; i < DPL; i++) {
        s_acc[g * DS * DPL + d0 + i] = acc[i];
    }
    barrier();
    float mm = -1.0 / 0.0;
    for (uint i = 0u; i < G; i++) {
        mm = max(mm, s_m[i]);
    }
    const bool none = mm == -1.0 / 0.0;
    float ll = 0.0;
    for (uint i = 0u; i < G; i++) {
        ll += none ? 0.0 : s_l[i] * exp(s_m[i] - mm);
    }
    const uint ob = p.o_offset + tok * p.ld_o + h * p.head_dim;
#if defined(ATTN_SPLIT)
    // Publish this split's partial, then count it; the split that counts
    // last merges. In the Vulkan memory model's terms (a coherent access
    // makes its write available, or its read visible, at device scope; a
    // memoryBarrierBuffer() is an acquire-release fence on buffer memory):
    // each invocation's partial writes precede its fence; barrier() makes
    // that fence synchronize with invocation 0's fence, which precedes the
    // atomic add (the release). In the split that counts last, its atomic
    // add precedes invocation 0's next fence (the acquire), which
    // synchronizes through the second barrier() with each invocation's
    // fence before its reads: every split's partial is seen in full. No
    // workgroup waits for another, so no split needs to be resident.
    const uint pb = (th * NSPLIT + split) * (p.head_dim + 2u);
    if (lid == 0u) {
        data_w[pb] = mm;
        data_w[pb + 1u] = ll;
    }
    for (uint d = lid; d < p.head_dim; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint i = 0u; i < G; i++) {
            a += none ? 0.0 : s_acc[i * DS * DPL + d] * exp(s_m[i] - mm);
        }
        data_w[pb + 2u + d] = a;
    }
    memoryBarrierBuffer();
    barrier();
    if (lid == 0u) {
        memoryBarrierBuffer();
        const uint done = atomicAdd(data_c[th], 1u);
        memoryBarrierBuffer();
        s_last = done == NSPLIT - 1u;
        if (s_last) {
            // Every split has counted: ready for the next dispatch.
            atomicExchange(data_c[th], 0u);
        }
    }
    barrier();
    if (!s_last) {
        return;
    }
    memoryBarrierBuffer();
    // Merge the splits as the key groups above: weights from the maxima.
    const uint pb0 = th * NSPLIT * (p.head_dim + 2u);
    for (uint i = lid; i < NSPLIT; i += gl_WorkGroupSize.x) {
        s_pm[i] = data_w[pb0 + i * (p.head_dim + 2u)];
        s_pl[i] = data_w[pb0 + i * (p.head_dim + 2u) + 1u];
    }
    barrier();
    float pm = -1.0 / 0.0;
    for (uint i = 0u; i < NSPLIT; i++) {
        pm = max(pm, s_pm[i]);
    }
    for (uint i = lid; i < NSPLIT; i += gl_WorkGroupSize.x) {
        s_pw[i] = s_pm[i] == -1.0 / 0.0 ? 0.0 : exp(s_pm[i] - pm);
    }
    barrier();
    float pl = 0.0;
    for (uint i = 0u; i < NSPLIT; i++) {
        pl += s_pw[i] * s_pl[i];
    }
    for (uint d = lid; d < p.head_dim; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint i = 0u; i < NSPLIT; i++) {
            a += s_pw[i] * data_w[pb0 + i * (p.head_dim + 2u) + 2u + d];
        }
#if defined(O_F16)
        data_o[ob + d] = float16_t(a / pl);
#else
        data_o[ob + d] = a / pl;
#endif
    }
#else
    // Invocation lid writes dims lid, lid + WG, ... of the head.
    for (uint d = lid; d < p.head_dim; d += gl_WorkGroupSize.x) {
        float a = 0.0;
        for (uint i = 0u; i < G; i++) {
            a += s_acc[i * DS * DPL + d] * exp(s_m[i] - mm);
        }
#if defined(O_F16)
        data_o[ob + d] = float16_t(a / ll);
#else
        data_o[ob + d] = a / ll;
#endif
    }
#endif
}
