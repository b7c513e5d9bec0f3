#version 450
// unary: d = f(x), or d += f(x) with the ADD flag, elementwise over rows.
// OP_GELU_ERF: the exact GELU x * (1 + erf(x / sqrt 2)) / 2 of PyTorch's
// nn.GELU() (Whisper's MLP and convolution stem); OP_GELU_TANH: its tanh
// approximation (SigLIP's gelu_pytorch_tanh, ggml_gelu); OP_COPY: f(x) = x
// (with ADD, the sum of two matrices: positional embeddings into the
// residual).

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) buffer D { float data_d[]; };

#include "iface/unary.glsl"

#if defined(OP_GELU_ERF)
// erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7): GLSL has
// no erf of its own.
float erf_approx(float x) {
    const float t = 1.0 / (1.0 + 0.3275911 * abs(x));
    const float y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t
                    - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
    return x < 0.0 ? -y : y;
}

float op(float x) {
    return 0.5 * x * (1.0 + erf_approx(x * 0.7071067811865476));
}
#elif defined(OP_GELU_TANH)
#include "common/act.glsl"

float op(float x) {
    return act_gelu_tanh(x);
}
#elif defined(OP_COPY)
float op(float x) {
    return x;
}
#else
#error "no OP_* defined"
#endif

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    if (i >= p.n_rows * p.width) {
        return;
    }
    const uint r = i / p.width, c = i % p.width;
    const uint o = p.d_offset + r * p.ld_d + c;
    float v = op(data_x[p.x_offset + r * p.ld_x + c]);
    if ((p.flags & UNARY_ADD) != 0u) {
        v += data_d[o];
    }
    data_d[o] = v;
}
