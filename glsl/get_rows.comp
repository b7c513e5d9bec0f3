#version 450
// get_rows: d[n, :] = scale * A[ids[n], :] for the token ids that fall into
// this weight chunk (the token embedding lookup; any DATA_A_* format).

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer A { uint data_a[]; };
layout(binding = 0) readonly buffer A4 { uvec4 data_a4[]; };
#define A4_LOADS 1   // common/dequant.glsl loads whole uvec4s
layout(binding = 1) readonly buffer I { int ids[]; };
layout(binding = 2) writeonly buffer D { vec4 data_d[]; };

#include "iface/get_rows.glsl"

#include "common/dequant.glsl"

void main() {
    const uint tok = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (tok >= p.n_tokens) {
        return;
    }
    const int id = ids[tok];
    if (id < int(p.row_start) || id >= int(p.row_start + p.n_rows)) {
        return;
    }
    const uint row = uint(id) - p.row_start;
    const uint subs = p.k / 32u;
    for (uint s = gl_LocalInvocationID.x; s < subs; s += gl_WorkGroupSize.x) {
        vec4 w[8];
        dequant_sub32(p.nb, row * subs + s, w);
        const uint o = p.d_offset + tok * p.ld_d + s * 8u;
        [[unroll]] for (uint j = 0u; j < 8u; j++) {
            data_d[o + j] = w[j] * p.scale;
        }
    }
}
