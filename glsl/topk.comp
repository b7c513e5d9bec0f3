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
// merge (TOPK_MERGE) takes one row per workgroup, in two phases without a
// barrier in their rounds: each subgroup merges the sorted lists its lanes
// own (up to OWN each) into a list in shared memory, k rounds of subgroup
// maxima over the lists' heads; then the first subgroup merges those
// lists into the row's k best.
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
const uint MAX_K = 256u;
// Each subgroup's merged list, as (key, index).
shared uvec2 s_list[NSUB * MAX_K];

// The key and index of list entry e (0 for none).
uvec2 entry(const uvec2 e) {
    const uint key = e.y == NONE ? 0u : order_key(e.x);
    return uvec2(key, key == 0u ? NONE : e.y);
}

// Whether a ranks before b.
bool before(const uvec2 a, const uvec2 b) {
    return a.x > b.x || (a.x == b.x && a.y < b.y);
}

void main() {
    const uint lid = gl_LocalInvocationID.x;
    const uint row = gl_WorkGroupID.x;
    const uint lists = p.width;
    const uint sg = gl_SubgroupID;
    const uint lane = gl_SubgroupInvocationID;
    // Phase A, each subgroup on its own: the lists its invocations own
    // (lid + j * WG) merged into its list in shared memory.
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
        if (before(cur[j], best)) {
            best = cur[j];
            best_j = j;
        }
    }
    for (uint r = 0u; r < p.k; r++) {
        const uint m = subgroupMax(best.x);
        if (m == 0u) {
            for (uint j = r + lane; j < p.k; j += gl_SubgroupSize) {
                s_list[sg * p.k + j] = uvec2(0u, NONE);
            }
            break;
        }
        const uint mi = subgroupMin(best.x == m ? best.y : NONE);
        if (best.x == m && best.y == mi) {
            s_list[sg * p.k + r] = best;
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
                if (before(cur[j], best)) {
                    best = cur[j];
                    best_j = j;
                }
            }
        }
    }
    barrier();
    if (sg != 0u) {
        return;
    }
    // Phase B, subgroup 0: the subgroups' lists merged into the row's k best.
    const uint OWN_B = 8u;   // NSUB <= 8 * subgroup size (the host's check)
    uint hb[OWN_B];
    uvec2 cb[OWN_B];
    [[unroll]] for (uint j = 0u; j < OWN_B; j++) {
        const uint l = lane + j * gl_SubgroupSize;
        hb[j] = 0u;
        cb[j] = l < gl_NumSubgroups ? s_list[l * p.k] : uvec2(0u, NONE);
    }
    best = uvec2(0u, NONE);
    best_j = 0u;
    [[unroll]] for (uint j = 0u; j < OWN_B; j++) {
        if (before(cb[j], best)) {
            best = cb[j];
            best_j = j;
        }
    }
    const uint out_base = row * p.k;
    for (uint r = 0u; r < p.k; r++) {
        const uint m = subgroupMax(best.x);
        if (m == 0u) {
            // Every candidate taken: the rest of the list is empty.
            for (uint j = r + lane; j < p.k; j += gl_SubgroupSize) {
                data_out[out_base + j] = uvec2(NAN_BITS, NONE);
            }
            break;
        }
        const uint mi = subgroupMin(best.x == m ? best.y : NONE);
        if (best.x == m && best.y == mi) {
            data_out[out_base + r] = uvec2(key_value(m), mi);
            [[unroll]] for (uint j = 0u; j < OWN_B; j++) {
                if (j == best_j) {
                    hb[j]++;
                    const uint l = lane + j * gl_SubgroupSize;
                    cb[j] = hb[j] < p.k ? s_list[l * p.k + hb[j]] : uvec2(0u, NONE);
                }
            }
            best = uvec2(0u, NONE);
            best_j = 0u;
            [[unroll]] for (uint j = 0u; j < OWN_B; j++) {
                if (before(cb[j], best)) {
                    best = cb[j];
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
