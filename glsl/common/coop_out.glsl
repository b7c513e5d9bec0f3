// The stores of the cooperative-matrix linear kernels: store_out(row, t, v,
// partner) writes the result v of (row, token t) with what p.flags folds in
// after the dot products (bias and accumulation as linear_out.glsl;
// LINEAR_GLU: rows alternate gate, up and D[t, (row_offset + row) / 2] =
// act(gate) * up, LINEAR_GELU: GELU-tanh, else SiLU; LINEAR_ROPE: llama.cpp's
// adjacent-pair rope on rows below p.rope_rows at each token's position).
// `partner` is the value of row ^ 1 of the same token: with the rope or the
// gate, the even row's invocation pairs the two. With COOP_OUT_F16 defined
// and LINEAR_OUT_F16, the gated
// output goes to `data_dh` (f16, the next product's input) instead; D's
// offsets and strides then count halves.
//
// Requires before inclusion: linear_out.glsl, act.glsl, rope.glsl, the P (positions)
// and F (inverse frequencies) bindings and the coop or skinny interface.

void store_out(uint row, uint t, float v, float partner) {
    const uint o = p.d_offset + t * p.ld_d;
    if ((p.flags & (LINEAR_GLU | LINEAR_ROPE)) == 0u) {
        store_linear(o + p.row_offset + row, row, v);
        return;
    }
    const bool even = (row & 1u) == 0u;
    float a = with_bias(row, v);
    float b = with_bias(row ^ 1u, partner);
    if ((p.flags & LINEAR_ROPE) != 0u) {
        const uint orow = p.row_offset + (row & ~1u);
        const uint i = orow % p.head_dim;
        if (orow < p.rope_rows && i < p.n_rot) {
            const vec2 r = rope_pair(even ? a : b, even ? b : a, data_pos[t], inv_freq[i / 2u],
                                     p.attn_factor);
            a = even ? r.x : r.y;
        }
        if ((p.flags & LINEAR_GLU) == 0u) {
            store_result(o + p.row_offset + row, a);
            return;
        }
    }
    if (even) {
        const float g = a;
        const float act = (p.flags & LINEAR_GELU) != 0u ? act_gelu_tanh(g) : act_silu(g);
#if defined(COOP_OUT_F16)
        if ((p.flags & LINEAR_OUT_F16) != 0u) {
            data_dh[o + (p.row_offset + row) / 2u] = float16_t(act * b);
            return;
        }
#endif
        data_d[o + (p.row_offset + row) / 2u] = act * b;
    }
}
