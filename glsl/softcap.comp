#version 450
// softcap: d = cap * tanh(d / cap) in place, on rows of floats (the final
// logit soft-cap of Gemma 2-style models, llama.cpp's ggml_softcap: a scale,
// a tanh, a scale).

layout(local_size_x_id = 0) in;

layout(binding = 0) buffer D { float data_d[]; };

#include "iface/softcap.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    if (i >= p.n_rows * p.width) {
        return;
    }
    const uint o = p.offset + (i / p.width) * p.ld + i % p.width;
    data_d[o] = p.cap * tanh(data_d[o] / p.cap);
}
