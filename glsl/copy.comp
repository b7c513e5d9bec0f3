#version 450
// copy: d = s in 16-byte words, each invocation striding over the buffer
// (a grid sized to keep every SM busy, not one invocation per word): the
// plain copy that measures the device's memory bandwidth.

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer S { uvec4 data_s[]; };
layout(binding = 1) writeonly buffer D { uvec4 data_d[]; };

#include "iface/copy.glsl"

void main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n_words; i += stride) {
        data_d[i] = data_s[i];
    }
}
