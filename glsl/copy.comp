#version 450
// copy: d = s in 16-byte words, each invocation striding over the buffer
// (a grid sized to keep every SM busy, not one invocation per word): the
// plain copy that measures the device's memory bandwidth. Its hand-off twin
// (common/handoff.glsl) measures what a dependent dispatch costs without a
// barrier (`combs kernel-bench --handoff`).

layout(local_size_x_id = 0) in;

#include "common/handoff.glsl"

layout(binding = 0) HCOHERENT readonly buffer S { uvec4 data_s[]; };
layout(binding = 1) HCOHERENT writeonly buffer D { uvec4 data_d[]; };

#include "iface/copy.glsl"

void kernel_main() {
    const uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    for (uint i = gl_GlobalInvocationID.x; i < p.n_words; i += stride) {
        data_d[i] = data_s[i];
    }
}
