#version 450
// im2col: the patches of a 1-D convolution as rows, so that the convolution
// becomes one product with its weight [out_channels, channels * kernel]:
// d[t][c * kernel + j] = x(c, t * stride + j - pad), zero outside the input
// and in the padding columns up to width. x(c, s) lies at
// x_offset + c * stride_c + s * stride_t, so the input may be channel-major
// (log-mel rows) or position-major (the residual stream).

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) writeonly buffer D { float data_d[]; };

#include "iface/im2col.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    if (i >= p.n_out * p.width) {
        return;
    }
    const uint t = i / p.width, col = i % p.width;
    float v = 0.0;
    if (col < p.channels * p.kernel) {
        const uint c = col / p.kernel, j = col % p.kernel;
        const int s = int(t * p.stride + j) - int(p.pad);
        if (s >= 0 && s < int(p.n_in)) {
            v = data_x[p.x_offset + c * p.stride_c + uint(s) * p.stride_t];
        }
    }
    data_d[p.d_offset + t * p.ld_d + col] = v;
}
