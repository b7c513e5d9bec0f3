#version 450
// topk: the k largest values of each row of logits with their indices, best
// first: what a sampler needs from a decode step instead of the whole row
// (128k floats per sequence over the bus). Order: larger value first, the
// lower index first among equal values (-0 counts as +0); NaN is never a
// candidate. A row with fewer than k candidates ends its list with
// (NaN, 0xffffffff) entries.
//
// Two passes. The first (default variant) takes a chunk of WG * PER values
// of one row per workgroup (gl_WorkGroupID.x: chunk, .y: row); each
// subgroup selects the k best of its lanes' PER values each, with subgroup
// operations only (no barrier; each lane keeps its keys' maxima by groups
// of 8, so a taken key rescans 8 and the group maxima), and writes them as
// one list: NSUB lists per
// chunk, those of subgroups the device did not form holding no entry. The
// merge (TOPK_MERGE) takes one row per workgroup: each invocation owns up to
// OWN of the row's sorted lists, and k rounds of a workgroup-wide maximum
// over the lists' heads (subgroup maxima through shared memory, two
// alternating slots, one barrier a round) write the row's k best; the
// invocation holding each winner writes it and moves that list on. (Rounds
// inside subgroups first, then one subgroup over their lists, was slower:
// twice the rounds, each waiting on the winner's load of its next entry.)
//
// Output entries are uvec2(value bits, index).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_arithmetic : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint PER = 32;   // values per invocation (first pass)
layout(constant_id = 2) const uint NSUB = 4;   // the most subgroups of a workgroup
layout(constant_id = 3) const uint OWN = 16;   // lists per invocation (merge)

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

#if defined(TOPK_MERGE)
shared uint s_key[2][64];
shared uint s_idx[2][64];

// The key and index of list entry e (0 for none).
uvec2 entry(const uvec2 e) {
    const uint key = e.y == NONE ? 0u : order_key(e.x);
    return uvec2(key, key == 0u ? NONE : e.y);
}

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.x;
    const uint lists = p.width;
    const uint out_base = row * p.k;
    // Heads of the lists this invocation owns (lid + j * WG), as entry().
    uint head[OWN];
    uvec2 cur[OWN];
    [[unroll]] for (uint j = 0u; j < OWN; j++) {
        const uint l = lid + j * gl_WorkGroupSize.x;
        head[j] = 0u;
        cur[j] = l < lists ? entry(data_in[(row * lists + l) * p.k]) : uvec2(0u, NONE);
    }
    uint best_j = 0u;
    uvec2 best = uvec2(0u, NONE);
    [[unroll]] for (uint j = 0u; j < OWN; j++) {
        if (cur[j].x > best.x || (cur[j].x == best.x && cur[j].y < best.y)) {
            best = cur[j];
            best_j = j;
        }
    }
    for (uint r = 0u; r < p.k; r++) {
        const uint m = subgroupMax(best.x);
        const uint mi = subgroupMin(best.x == m ? best.y : NONE);
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
        if (best.x == top && best.y == top_idx) {
            data_out[out_base + r] = uvec2(key_value(top), top_idx);
            [[unroll]] for (uint j = 0u; j < OWN; j++) {
                if (j == best_j) {
                    head[j]++;
                    const uint l = lid + j * gl_WorkGroupSize.x;
                    cur[j] = head[j] < p.k ? entry(data_in[(row * lists + l) * p.k + head[j]])
                                           : uvec2(0u, NONE);
                }
            }
            best = uvec2(0u, NONE);
            best_j = 0u;
            [[unroll]] for (uint j = 0u; j < OWN; j++) {
                if (cur[j].x > best.x || (cur[j].x == best.x && cur[j].y < best.y)) {
                    best = cur[j];
                    best_j = j;
                }
            }
        }
    }
}
#else
const uint GS = 8u;          // keys per group (PER a multiple of it)
const uint NG = PER / GS;

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.y;
    const uint c0 = gl_WorkGroupID.x * p.chunk;
    const uint x_base = p.offset + row * p.ld;
    const uint lists_base = (row * gl_NumWorkGroups.x + gl_WorkGroupID.x) * NSUB;
    const uint out_base = (lists_base + gl_SubgroupID) * p.k;
    // Lane values at consecutive positions of the chunk, a subgroup's lanes
    // side by side (coalesced loads): value j of invocation lid is at
    // c0 + lid + j * WG.
    uint key[PER];
    [[unroll]] for (uint j = 0u; j < PER; j++) {
        const uint i = c0 + lid + j * gl_WorkGroupSize.x;
        key[j] = i < p.width ? order_key(floatBitsToUint(data_x[x_base + i])) : 0u;
    }
    // Each lane's best key by groups of GS: a taken key costs a rescan of
    // its group and of the group maxima, not of all PER keys. The first of
    // equal keys is the lowest index: positions grow with j.
    uint gkey[NG], gj[NG];
    [[unroll]] for (uint g = 0u; g < NG; g++) {
        gkey[g] = 0u;
        gj[g] = g * GS;
        [[unroll]] for (uint jj = 0u; jj < GS; jj++) {
            if (key[g * GS + jj] > gkey[g]) {
                gkey[g] = key[g * GS + jj];
                gj[g] = g * GS + jj;
            }
        }
    }
    uint best_j = 0u, best_key = 0u;
    [[unroll]] for (uint g = 0u; g < NG; g++) {
        if (gkey[g] > best_key) {
            best_key = gkey[g];
            best_j = gj[g];
        }
    }
    uint best_idx = best_key == 0u ? NONE : c0 + lid + best_j * gl_WorkGroupSize.x;
    for (uint r = 0u; r < p.k; r++) {
        const uint top = subgroupMax(best_key);
        if (top == 0u) {
            for (uint j = r + gl_SubgroupInvocationID; j < p.k; j += gl_SubgroupSize) {
                data_out[out_base + j] = uvec2(NAN_BITS, NONE);
            }
            break;
        }
        const uint top_idx = subgroupMin(best_key == top ? best_idx : NONE);
        if (best_key == top && best_idx == top_idx) {
            data_out[out_base + r] = uvec2(key_value(top), top_idx);
            const uint bg = best_j / GS;
            [[unroll]] for (uint g = 0u; g < NG; g++) {
                if (g == bg) {
                    gkey[g] = 0u;
                    gj[g] = g * GS;
                    [[unroll]] for (uint jj = 0u; jj < GS; jj++) {
                        const uint j = g * GS + jj;
                        if (j == best_j) {
                            key[j] = 0u;
                        }
                        if (key[j] > gkey[g]) {
                            gkey[g] = key[j];
                            gj[g] = j;
                        }
                    }
                }
            }
            best_key = 0u;
            best_j = 0u;
            [[unroll]] for (uint g = 0u; g < NG; g++) {
                if (gkey[g] > best_key) {
                    best_key = gkey[g];
                    best_j = gj[g];
                }
            }
            best_idx = best_key == 0u ? NONE : c0 + lid + best_j * gl_WorkGroupSize.x;
        }
    }
    // Lists of subgroups this device did not form: empty.
    if (gl_SubgroupID == 0u) {
        for (uint s = gl_NumSubgroups + gl_SubgroupInvocationID; s < NSUB; s += gl_SubgroupSize) {
            data_out[(lists_base + s) * p.k] = uvec2(NAN_BITS, NONE);
        }
    }
}
#endif
