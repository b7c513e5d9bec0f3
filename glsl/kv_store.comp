#version 450
// kv_store: writes N tokens' K or V rows (f32) into an f16 cache at the cache
// row of each token's position (through its sequence's page table, see
// common/kv_slot.glsl), so a recorded decode step stays valid as positions advance.

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer S { float data_s[]; };
layout(binding = 1) writeonly buffer C { uint data_c[]; };
layout(binding = 2) readonly buffer P { int data_pos[]; };
layout(binding = 3) readonly buffer PT { int page_table[]; };
layout(binding = 4) readonly buffer B { int seq_base[]; };

#include "iface/kv_store.glsl"

#include "common/kv_slot.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    const uint half_w = p.width / 2u;
    if (i >= p.n_tokens * half_w) {
        return;
    }
    const uint tok = i / half_w;
    const uint e = 2u * (i % half_w);
    const uint src = p.offset + tok * p.ld + e;
    const uint slot = kv_slot(seq_base[tok], data_pos[tok], p.page_size, p.ring);
    data_c[slot * half_w + e / 2u] = packHalf2x16(vec2(data_s[src], data_s[src + 1u]));
}
