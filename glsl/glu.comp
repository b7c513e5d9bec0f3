#version 450
// glu: d = act(g) * u elementwise for N tokens (SwiGLU with ACT_SILU, GeGLU
// with ACT_GELU_TANH, llama.cpp ggml_silu / ggml_gelu numerics).

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer G { float data_g[]; };
layout(binding = 1) readonly buffer U { float data_u[]; };
layout(binding = 2) writeonly buffer D { float data_d[]; };

layout(push_constant) uniform Params {
    uint n_tokens;
    uint width;
    uint ld_g;
    uint ld_u;
    uint ld_d;
    uint g_offset;
    uint u_offset;
    uint d_offset;
} p;

float act(float x) {
#if defined(ACT_SILU)
    return x / (1.0 + exp(-x));
#elif defined(ACT_GELU_TANH)
    const float k = 0.7978845608028654; // sqrt(2 / pi)
    const float inner = k * x * (1.0 + 0.044715 * x * x);
    // tanh through exp keeps large |inner| finite on every driver.
    const float t = 1.0 - 2.0 / (exp(2.0 * inner) + 1.0);
    return 0.5 * x * (1.0 + t);
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
    const float g = data_g[p.g_offset + tok * p.ld_g + c];
    const float u = data_u[p.u_offset + tok * p.ld_u + c];
    data_d[p.d_offset + tok * p.ld_d + c] = act(g) * u;
}
