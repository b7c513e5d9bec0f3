#version 450
// rope: rotates pairs of each head's first n_rot dimensions in place by
// pos * inv_freq[i] (llama.cpp ggml_rope_ext; inv_freq carries the base,
// frequency factors and linear/llama3 scaling, computed on the CPU).
// Normal layout pairs (2i, 2i+1); NeoX layout pairs (i, i + n_rot/2).

layout(local_size_x_id = 0) in;

layout(binding = 0) buffer X { float data_x[]; };
layout(binding = 1) readonly buffer P { int data_pos[]; };
layout(binding = 2) readonly buffer F { float inv_freq[]; };

#include "iface/rope.glsl"
#include "common/rope.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    const uint half_rot = p.n_rot / 2u;
    if (i >= p.n_tokens * p.n_heads * half_rot) {
        return;
    }
    const uint pair = i % half_rot;
    const uint head = (i / half_rot) % p.n_heads;
    const uint tok = i / (half_rot * p.n_heads);
    const uint base = p.offset + tok * p.ld + head * p.head_dim;
    const uint a = base + ((p.flags & ROPE_NEOX) != 0u ? pair : 2u * pair);
    const uint b = a + ((p.flags & ROPE_NEOX) != 0u ? half_rot : 1u);
    const vec2 r = rope_pair(data_x[a], data_x[b], data_pos[tok], inv_freq[pair], p.attn_factor);
    data_x[a] = r.x;
    data_x[b] = r.y;
}
