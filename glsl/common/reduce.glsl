// Workgroup-wide sum and max through subgroup operations and one shared slot
// per subgroup. Every invocation of the workgroup must call these (they
// contain barriers). Requires GL_KHR_shader_subgroup_arithmetic and a
// workgroup of at most 32 * 32 invocations.

shared float red_scratch[32];

float workgroup_sum(float v) {
    v = subgroupAdd(v);
    barrier();
    if (subgroupElect()) {
        red_scratch[gl_SubgroupID] = v;
    }
    barrier();
    float total = 0.0;
    for (uint i = 0u; i < gl_NumSubgroups; i++) {
        total += red_scratch[i];
    }
    return total;
}

float workgroup_max(float v) {
    v = subgroupMax(v);
    barrier();
    if (subgroupElect()) {
        red_scratch[gl_SubgroupID] = v;
    }
    barrier();
    float m = red_scratch[0];
    for (uint i = 1u; i < gl_NumSubgroups; i++) {
        m = max(m, red_scratch[i]);
    }
    return m;
}
