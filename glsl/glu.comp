#version 450
// glu: d = act(g) * u elementwise for N tokens (SwiGLU with ACT_SILU, GeGLU
// with ACT_GELU_TANH, llama.cpp ggml_silu / ggml_gelu numerics). g and u are
// column slices, or interleaved (gate, up) pairs with step 2.

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer G { float data_g[]; };
layout(binding = 1) readonly buffer U { float data_u[]; };
layout(binding = 2) writeonly buffer D { float data_d[]; };

#include "iface/glu.glsl"

#include "common/act.glsl"

float act(float x) {
#if defined(ACT_SILU)
    return act_silu(x);
#elif defined(ACT_GELU_TANH)
    return act_gelu_tanh(x);
#else
#error "no ACT_* defined"
#endif
}

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    if (i >= p.n_tokens * p.width) {
        return;
    }
    const uint tok = i / p.width;
    const uint c = i % p.width;
    const float g = data_g[p.g_offset + tok * p.ld_g + c * p.step];
    const float u = data_u[p.u_offset + tok * p.ld_u + c * p.step];
    data_d[p.d_offset + tok * p.ld_d + c] = act(g) * u;
}
