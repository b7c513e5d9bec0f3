#version 450
// rope: rotates pairs of each head's first n_rot dimensions in place by
// pos * inv_freq[i] (llama.cpp ggml_rope_ext; inv_freq carries the base,
// frequency factors and linear/llama3 scaling, computed on the CPU).
// Normal layout pairs (2i, 2i+1); NeoX layout pairs (i, i + n_rot/2).

layout(local_size_x_id = 0) in;

layout(binding = 0) buffer X { float data_x[]; };
layout(binding = 1) readonly buffer P { int data_pos[]; };
layout(binding = 2) readonly buffer F { float inv_freq[]; };

layout(push_constant) uniform Params {
    uint n_tokens;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint ld;          // floats between tokens
    uint offset;      // float index of token 0, head 0
    uint neox;        // 0: normal, 1: NeoX
    float attn_factor;
} p;

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
    const float theta = float(data_pos[tok]) * inv_freq[pair];
    const float c = cos(theta) * p.attn_factor;
    const float s = sin(theta) * p.attn_factor;
    const uint base = p.offset + tok * p.ld + head * p.head_dim;
    const uint a = base + (p.neox != 0u ? pair : 2u * pair);
    const uint b = a + (p.neox != 0u ? half_rot : 1u);
    const float x0 = data_x[a];
    const float x1 = data_x[b];
    data_x[a] = x0 * c - x1 * s;
    data_x[b] = x0 * s + x1 * c;
}
