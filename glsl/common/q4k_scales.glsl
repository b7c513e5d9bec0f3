// Q4_K's packed 6-bit scales and mins, shared by the matvecs that take a
// 32-column sub-block per invocation (matvec.comp's Q4K_UNIT32,
// matvec_q8.comp). Needs data_a (words), p.nb and the plane sizes.

// The 6-bit scale and min of sub-block j (0..7) from the three words of a
// block's packed scales (llama.cpp get_scale_min_k4), without branching on
// j: neighbouring invocations hold different sub-blocks.
uvec2 scale_min_words(uvec3 w, uint j) {
    const uint sh = 8u * (j & 3u);
    const uint a = (w.x >> sh) & 0xFFu;
    const uint b = (w.y >> sh) & 0xFFu;
    const uint c = (w.z >> sh) & 0xFFu;
    const bool lo = j < 4u;
    return uvec2(lo ? (a & 63u) : ((c & 0xFu) | ((a >> 6) << 4)),
                 lo ? (b & 63u) : ((c >> 4) | ((b >> 6) << 4)));
}

uvec3 scale_words(uint ib) {
#if defined(DATA_A_Q5_K)
    const uint sw = p.nb * (PLANE0_WORDS + PLANE1_WORDS) + ib * PLANE2_WORDS;  // after qs, qh
#else
    const uint sw = p.nb * PLANE0_WORDS + ib * PLANE1_WORDS;
#endif
    return uvec3(data_a[sw], data_a[sw + 1u], data_a[sw + 2u]);
}
