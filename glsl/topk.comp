#version 450
// topk: the k largest values of each row of logits with their indices, best
// first: what a sampler needs from a decode step instead of the whole row
// (128k floats per sequence over the bus). Order: larger value first, the
// lower index first among equal values (-0 counts as +0); NaN is never a
// candidate. A row with fewer than k candidates ends its list with
// (NaN, 0xffffffff) entries.
//
// Two passes. The first (default variant) takes a chunk of WG * PER values
// of one row per workgroup (gl_WorkGroupID.x: chunk, .y: row) and writes
// that chunk's k best as a list; the merge (TOPK_MERGE) takes one row per
// workgroup, one invocation per list, and merges the row's sorted lists
// into its final k. A row of one chunk needs only the first pass.
//
// Both select the same way, k rounds of a workgroup-wide maximum: each
// invocation keeps its own best candidate; subgroup maxima go through
// shared memory (two alternating slots, so one barrier a round suffices)
// and the invocation holding the winner writes it out and moves on to its
// next best. k is small (a sampler's top-k), so k rounds beat sorting the
// chunk.
//
// Output entries are uvec2(value bits, index).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint PER = 16;   // values per invocation (first pass)

layout(binding = 0) readonly buffer X { float data_x[]; };
layout(binding = 1) readonly buffer C { uvec2 data_in[]; };
layout(binding = 2) writeonly buffer O { uvec2 data_out[]; };

#include "iface/topk.glsl"

const uint NONE = 0xFFFFFFFFu;
const uint NAN_BITS = 0x7FC00000u;

// An unsigned key ordered as the floats are; 0 for NaN (never chosen).
uint order_key(uint u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        return 0u;
    }
    if (u == 0x80000000u) {
        u = 0u;
    }
    return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

// The value of a key (a -0 comes back as +0).
uint key_value(uint key) {
    return (key & 0x80000000u) != 0u ? (key & 0x7FFFFFFFu) : ~key;
}

shared uint s_key[2][64];
shared uint s_idx[2][64];

void main() {
    const uint lid = gl_LocalInvocationID.x;
#if defined(TOPK_MERGE)
    const uint row = gl_WorkGroupID.x;
    const uint lists = p.width;
    const uint in_base = (row * lists + lid) * p.k;
    const uint out_base = row * p.k;
    uint head = 0u;
    uint best_key = 0u, best_idx = NONE;
    if (lid < lists) {
        const uvec2 e = data_in[in_base];
        best_key = e.y == NONE ? 0u : order_key(e.x);
        best_idx = best_key == 0u ? NONE : e.y;
    }
#else
    const uint row = gl_WorkGroupID.y;
    const uint c0 = gl_WorkGroupID.x * p.chunk;
    const uint x_base = p.offset + row * p.ld;
    const uint out_base = (row * gl_NumWorkGroups.x + gl_WorkGroupID.x) * p.k;
    uint key[PER];
    [[unroll]] for (uint j = 0u; j < PER; j++) {
        const uint i = c0 + lid + j * gl_WorkGroupSize.x;
        key[j] = i < p.width ? order_key(floatBitsToUint(data_x[x_base + i])) : 0u;
    }
    // The first of equal keys is the lowest index: positions grow with j.
    uint best_j = 0u, best_key = 0u;
    [[unroll]] for (uint j = 0u; j < PER; j++) {
        if (key[j] > best_key) {
            best_key = key[j];
            best_j = j;
        }
    }
    uint best_idx = best_key == 0u ? NONE : c0 + lid + best_j * gl_WorkGroupSize.x;
#endif

    for (uint r = 0u; r < p.k; r++) {
        const uint m = subgroupMax(best_key);
        const uint mi = subgroupMin(best_key == m ? best_idx : NONE);
        const uint b = r & 1u;
        if (subgroupElect()) {
            s_key[b][gl_SubgroupID] = m;
            s_idx[b][gl_SubgroupID] = mi;
        }
        barrier();
        uint top = 0u, top_idx = NONE;
        for (uint s = 0u; s < gl_NumSubgroups; s++) {
            const uint k2 = s_key[b][s], i2 = s_idx[b][s];
            if (k2 > top || (k2 == top && i2 < top_idx)) {
                top = k2;
                top_idx = i2;
            }
        }
        if (top == 0u) {
            // Every candidate taken: the rest of the list is empty.
            for (uint j = r + lid; j < p.k; j += gl_WorkGroupSize.x) {
                data_out[out_base + j] = uvec2(NAN_BITS, NONE);
            }
            break;
        }
        if (best_key == top && best_idx == top_idx) {
            data_out[out_base + r] = uvec2(key_value(top), top_idx);
#if defined(TOPK_MERGE)
            head++;
            best_key = 0u;
            best_idx = NONE;
            if (head < p.k) {
                const uvec2 e = data_in[in_base + head];
                best_key = e.y == NONE ? 0u : order_key(e.x);
                best_idx = best_key == 0u ? NONE : e.y;
            }
#else
            [[unroll]] for (uint j = 0u; j < PER; j++) {
                if (j == best_j) {
                    key[j] = 0u;
                }
            }
            best_key = 0u;
            best_j = 0u;
            [[unroll]] for (uint j = 0u; j < PER; j++) {
                if (key[j] > best_key) {
                    best_key = key[j];
                    best_j = j;
                }
            }
            best_idx = best_key == 0u ? NONE : c0 + lid + best_j * gl_WorkGroupSize.x;
#endif
        }
    }
}
