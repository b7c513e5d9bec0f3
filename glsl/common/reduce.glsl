// Workgroup-wide sum and max through subgroup operations and one shared slot
// per subgroup. Every invocation of the workgroup must call these (they
// contain barriers). Requires GL_KHR_shader_subgroup_arithmetic and
// subgroups of at least 4 invocations (DeviceCaps::check_required): a slot
// for each of the most subgroups the workgroup can be split into, which
// is not wg / the device's reported size where the driver picks it.

shared float red_scratch[(gl_WorkGroupSize.x + 3u) / 4u];

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
