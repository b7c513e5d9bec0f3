// The stores of the cooperative-matrix linear kernels: store_out(row, t, v,
// partner) writes the result v of (row, token t) with what p.flags folds in
// after the dot products (bias and accumulation as linear_out.glsl; 16:
// rows alternate gate, up and D[t, (row_offset + row) / 2] = act(gate) * up,
// 32: GELU-tanh, else SiLU; 64: llama.cpp's adjacent-pair rope on rows below
// p.rope_rows at each token's position). `partner` is the value of row ^ 1
// of the same token: with the rope or the gate, the even row's invocation
// pairs the two. With COOP_OUT_F16 defined and p.flags 128, the gated
// output goes to `data_dh` (f16, the next product's input) instead; D's
// offsets and strides then count halves.
//
// Requires before inclusion: linear_out.glsl, act.glsl, the P (positions)
// and F (inverse frequencies) bindings and matmul_coop.comp's push constants.

void store_out(uint row, uint t, float v, float partner) {
    const uint o = p.d_offset + t * p.ld_d;
    if ((p.flags & (16u | 64u)) == 0u) {
        store_linear(o + p.row_offset + row, row, v);
        return;
    }
    const bool even = (row & 1u) == 0u;
    float a = with_bias(row, v);
    float b = with_bias(row ^ 1u, partner);
    if ((p.flags & 64u) != 0u) {
        const uint orow = p.row_offset + (row & ~1u);
        const uint i = orow % p.head_dim;
        if (orow < p.rope_rows && i < p.n_rot) {
            const float theta = float(data_pos[t]) * inv_freq[i / 2u];
            const float c = cos(theta) * p.attn_factor;
            const float s = sin(theta) * p.attn_factor;
            const float x0 = even ? a : b;
            const float x1 = even ? b : a;
            const float r0 = x0 * c - x1 * s;
            const float r1 = x0 * s + x1 * c;
            a = even ? r0 : r1;
        }
        if ((p.flags & 16u) == 0u) {
            store_result(o + p.row_offset + row, a);
            return;
        }
    }
    if (even) {
        const float g = a;
        const float act = (p.flags & 32u) != 0u ? act_gelu_tanh(g) : act_silu(g);
#if defined(COOP_OUT_F16)
        if ((p.flags & 128u) != 0u) {
            data_dh[o + (p.row_offset + row) / 2u] = float16_t(act * b);
            return;
        }
#endif
        data_d[o + (p.row_offset + row) / 2u] = act * b;
    }
}
