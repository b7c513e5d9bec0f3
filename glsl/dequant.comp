#version 450
// dequant: expands n weights of one tensor chunk to f32, one invocation per
// weight. Validation kernel for every weight format (and the reference the
// fused kernels are compared against); not used on the hot path.

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 1) writeonly buffer D { float data_d[]; };

#include "iface/dequant.glsl"

#include "common/dequant.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                 + gl_LocalInvocationID.x;
    if (i >= p.n) {
        return;
    }
    const uint w = p.first + i;
#if defined(DENSE)
    data_d[i] = dense_elem(w);
#else
    data_d[i] = dequant_elem(p.nb, w / QK, w % QK);
#endif
}
