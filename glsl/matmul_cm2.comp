#version 450
// matmul_cm2: D[n, row] = A[row, :] . X[n, :] for prompts on devices with
// VK_NV_cooperative_matrix2. A workgroup computes a BM x BN tile (weight rows
// x tokens) with workgroup-scope cooperative matrices: the driver spreads
// them over the subgroups and stages the tensor loads, which the
// subgroup-scope kernel (matmul_coop.comp) does by hand. Weights are
// decoded element by element through a decode callback (the device layout
// keeps the scales apart from the quants, so the callback finds a block by
// its coordinates, not through the pointer it is handed); activations are
// f32 rounded to f16 by a second callback, or f16 as they are with X_F16
// (which may also write a gated output as f16, LINEAR_OUT_F16).
//
// Even and odd weight rows go to two accumulators (the A loads take every
// other row), so that the epilogue can pair a row with its neighbour as
// common/coop_out.glsl does: the gated activation of interleaved gate/up
// rows and llama.cpp's adjacent-pair rope become element-wise products of
// the two halves; everything else is stored element by element by a
// per-element callback, through linear_out.glsl's stores (bias,
// accumulation, partial tiles). Bindings and push constants are
// matmul_coop.comp's.

#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable
#extension GL_EXT_buffer_reference : enable
#extension GL_EXT_shader_explicit_arithmetic_types : enable

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 128;  // weight rows per tile (even)
layout(constant_id = 2) const uint BN = 128;  // tokens per tile
layout(constant_id = 3) const uint BK = 32;   // columns per step (a multiple of 16)

const uint BMH = BM / 2u;

layout(binding = 0) readonly buffer A { uint data_a[]; };
#if defined(X_F16)
layout(binding = 1) readonly buffer X { float16_t data_x[]; };
#else
layout(binding = 1) readonly buffer X { float data_x[]; };
#endif
layout(binding = 2) buffer D { float data_d[]; };
layout(binding = 3) readonly buffer B { float data_bias[]; };

#include "iface/coop.glsl"

layout(binding = 4) readonly buffer P { int data_pos[]; };
layout(binding = 5) readonly buffer F { float inv_freq[]; };
#if defined(X_F16)
// The f16 alias of D: gated outputs for the next product's f16 input.
layout(binding = 6) buffer DH { float16_t data_dh[]; };
#endif

#include "common/dequant.glsl"
#include "common/linear_out.glsl"
#include "common/act.glsl"

// Weight (row, column block blk, element e of the block), rows counted in
// this chunk, rounded to f16 as matmul_coop.comp rounds it.
float16_t weight_at(uint row, uint blk, uint e) {
#if defined(DENSE)
    return float16_t(dense_elem(row * p.k + blk));
#elif defined(DATA_A_Q4_0)
    // (q - 8) * d is exact in f32, so one f16 rounding of the f16 product
    // equals dequant_elem's rounded result.
    const uint ib = row * (p.k / QK) + blk;
    const uint w = data_a[ib * PLANE0_WORDS + ((e & 15u) >> 2)];
    const uint q = (w >> (8u * (e & 3u) + ((e & 16u) >> 2))) & 15u;
    const uint sw = a_scale_word(p.nb, ib, 0u);
    const float16_t d = float16_t(unpackHalf2x16(sw >> (16u * (ib & 1u))).x);
    return (float16_t(q) - float16_t(8.0)) * d;
#else
    return float16_t(dequant_elem(p.nb, row * (p.k / QK) + blk, e));
#endif
}

// The pointer the tensor load hands a decode callback addresses A as an
// array of words; the callbacks go by the block coordinates instead.
layout(buffer_reference, std430, buffer_reference_align = 4) buffer WordRef { uint w; };

// Rows 2i (even view) and 2i + 1 (odd view) of the weight; dequant_elem's
// f32 rounded to f16 as matmul_coop.comp rounds it.
float16_t decode_even(const in WordRef r, const in uint32_t bc[2], const in uint32_t e[2]) {
    return weight_at(2u * bc[0], bc[1], e[1]);
}

float16_t decode_odd(const in WordRef r, const in uint32_t bc[2], const in uint32_t e[2]) {
    return weight_at(2u * bc[0] + 1u, bc[1], e[1]);
}

#if !defined(X_F16)
layout(buffer_reference, std430, buffer_reference_align = 4) buffer FloatRef { float v; };

float16_t decode_x(const in FloatRef r, const in uint32_t bc[2], const in uint32_t e[2]) {
    return float16_t(r.v);
}
#endif

// Per-element callbacks of the epilogue: (r, c) is (row pair, token) in
// the tile whose first row and token are row0 and tok0.

float biased_even(const in uint32_t r, const in uint32_t c, const in float v,
                  const in uint32_t row0, const in uint32_t tok0) {
    const uint row = row0 + 2u * r;
    return row < p.m ? with_bias(row, v) : v;
}

float biased_odd(const in uint32_t r, const in uint32_t c, const in float v,
                 const in uint32_t row0, const in uint32_t tok0) {
    const uint row = row0 + 2u * r + 1u;
    return row < p.m ? with_bias(row, v) : v;
}

// The rope's angle of pair r at token c, or -1 for a pair it leaves alone.
float rope_theta(uint r, uint c, uint row0, uint tok0) {
    const uint orow = p.row_offset + row0 + 2u * r;
    const uint i = orow % p.head_dim;
    const uint t = tok0 + c;
    if (orow >= p.rope_rows || i >= p.n_rot || t >= p.n || row0 + 2u * r >= p.m) {
        return -1.0;
    }
    return float(data_pos[t]) * inv_freq[i / 2u];
}

// cos and sin as common/rope.glsl's rope_pair scales them (1 and 0 where
// the pair is not turned).
float rope_cos(const in uint32_t r, const in uint32_t c, const in float v,
               const in uint32_t row0, const in uint32_t tok0) {
    const float th = rope_theta(r, c, row0, tok0);
    return th < 0.0 ? 1.0 : cos(th) * p.attn_factor;
}

float rope_sin(const in uint32_t r, const in uint32_t c, const in float v,
               const in uint32_t row0, const in uint32_t tok0) {
    const float th = rope_theta(r, c, row0, tok0);
    return th < 0.0 ? 0.0 : sin(th) * p.attn_factor;
}

float gate_act(const in uint32_t r, const in uint32_t c, const in float v,
               const in uint32_t row0, const in uint32_t tok0) {
    return (p.flags & LINEAR_GELU) != 0u ? act_gelu_tanh(v) : act_silu(v);
}

// Stores: plain (bias and accumulation as flagged), finished values
// (accumulation only), and the gated output at row / 2.
float put_linear(uint row, uint t, float v) {
    if (row < p.m && t < p.n) {
        store_linear(p.d_offset + t * p.ld_d + p.row_offset + row, row, v);
    }
    return v;
}

float put_even(const in uint32_t r, const in uint32_t c, const in float v,
               const in uint32_t row0, const in uint32_t tok0) {
    return put_linear(row0 + 2u * r, tok0 + c, v);
}

float put_odd(const in uint32_t r, const in uint32_t c, const in float v,
              const in uint32_t row0, const in uint32_t tok0) {
    return put_linear(row0 + 2u * r + 1u, tok0 + c, v);
}

float put_done(uint row, uint t, float v) {
    if (row < p.m && t < p.n) {
        store_result(p.d_offset + t * p.ld_d + p.row_offset + row, v);
    }
    return v;
}

float done_even(const in uint32_t r, const in uint32_t c, const in float v,
                const in uint32_t row0, const in uint32_t tok0) {
    return put_done(row0 + 2u * r, tok0 + c, v);
}

float done_odd(const in uint32_t r, const in uint32_t c, const in float v,
               const in uint32_t row0, const in uint32_t tok0) {
    return put_done(row0 + 2u * r + 1u, tok0 + c, v);
}

float put_gated(const in uint32_t r, const in uint32_t c, const in float v,
                const in uint32_t row0, const in uint32_t tok0) {
    const uint row = row0 + 2u * r;
    const uint t = tok0 + c;
    if (row < p.m && t < p.n) {
        const uint o = p.d_offset + t * p.ld_d + (p.row_offset + row) / 2u;
#if defined(X_F16)
        if ((p.flags & LINEAR_OUT_F16) != 0u) {
            data_dh[o] = float16_t(v);
            return v;
        }
#endif
        data_d[o] = v;
    }
    return v;
}

// Steps of BK columns unrolled together, so that the driver can issue
// the loads of later steps while the products of earlier ones run.
const uint UNROLL = 8u;

#define LOAD_STEP(LA_E, LA_O, LX, k0)                                                        \
    {                                                                                        \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> mx;                     \
        LOAD_X(mx, LX, k0);                                                                  \
        coopmat<float16_t, gl_ScopeWorkgroup, BMH, BK, gl_MatrixUseA> ma;                    \
        coopMatLoadTensorNV(ma, data_a, 0u, sliceTensorLayoutNV(LA_E, row0 / 2u, BMH, k0, BK), \
                            decode_even);                                                    \
        acc_e = coopMatMulAdd(ma, mx, acc_e);                                                \
        coopMatLoadTensorNV(ma, data_a, 0u, sliceTensorLayoutNV(LA_O, row0 / 2u, BMH, k0, BK), \
                            decode_odd);                                                     \
        acc_o = coopMatMulAdd(ma, mx, acc_o);                                                \
    }

#if defined(X_F16)
#define LOAD_X(mx, LX, k0) \
    coopMatLoadTensorNV(mx, data_x, p.x_offset, sliceTensorLayoutNV(LX, tok0, BN, k0, BK), transposed)
#else
#define LOAD_X(mx, LX, k0)                                                                   \
    coopMatLoadTensorNV(mx, data_x, p.x_offset, sliceTensorLayoutNV(LX, tok0, BN, k0, BK), \
                        transposed, decode_x)
#endif

#define ACC coopmat<float, gl_ScopeWorkgroup, BMH, BN, gl_MatrixUseAccumulator>

void main() {
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    const uint blocks = p.k / QK;
    const uint steps = p.k / BK;
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    ACC acc_e = ACC(0.0);
    ACC acc_o = ACC(0.0);
    if (row0 + BM <= p.m && tok0 + BN <= p.n) {
        // A whole tile: loads without bounds checks. The chunk's even and
        // odd rows are two tensors of blocks; X is [token][column], its
        // view the K x tokens operand.
        tensorLayoutNV<2> la = createTensorLayoutNV(2);
        la = setTensorLayoutBlockSizeNV(la, 1, QK);
        la = setTensorLayoutStrideNV(la, 2u * blocks, 1);
        tensorLayoutNV<2> la_even = setTensorLayoutDimensionNV(la, (p.m + 1u) / 2u, p.k);
        tensorLayoutNV<2> la_odd = setTensorLayoutDimensionNV(la, p.m / 2u, p.k);
        tensorLayoutNV<2> lx = createTensorLayoutNV(2);
        lx = setTensorLayoutDimensionNV(lx, p.n, p.k);
        lx = setTensorLayoutStrideNV(lx, p.ld_x, 1);
        uint s = 0u;
        for (; s + UNROLL <= steps; s += UNROLL) {
            [[unroll]] for (uint u = 0u; u < UNROLL; u++) {
                LOAD_STEP(la_even, la_odd, lx, (s + u) * BK)
            }
        }
        for (; s < steps; s++) {
            LOAD_STEP(la_even, la_odd, lx, s * BK)
        }
    } else {
        // A partial tile: out-of-range elements read as zero.
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> la =
            createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
        la = setTensorLayoutBlockSizeNV(la, 1, QK);
        la = setTensorLayoutStrideNV(la, 2u * blocks, 1);
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> la_even =
            setTensorLayoutDimensionNV(la, (p.m + 1u) / 2u, p.k);
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> la_odd =
            setTensorLayoutDimensionNV(la, p.m / 2u, p.k);
        tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> lx =
            createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
        lx = setTensorLayoutDimensionNV(lx, p.n, p.k);
        lx = setTensorLayoutStrideNV(lx, p.ld_x, 1);
        for (uint s = 0u; s < steps; s++) {
            LOAD_STEP(la_even, la_odd, lx, s * BK)
        }
    }

    if ((p.flags & (LINEAR_GLU | LINEAR_ROPE)) == 0u) {
        coopMatPerElementNV(acc_e, acc_e, put_even, row0, tok0);
        coopMatPerElementNV(acc_o, acc_o, put_odd, row0, tok0);
        return;
    }
    coopMatPerElementNV(acc_e, acc_e, biased_even, row0, tok0);
    coopMatPerElementNV(acc_o, acc_o, biased_odd, row0, tok0);
    if ((p.flags & LINEAR_ROPE) != 0u) {
        ACC c;
        ACC s;
        coopMatPerElementNV(c, acc_e, rope_cos, row0, tok0);
        coopMatPerElementNV(s, acc_e, rope_sin, row0, tok0);
        ACC e = acc_e * c - acc_o * s;
        acc_o = acc_e * s + acc_o * c;
        acc_e = e;
        if ((p.flags & LINEAR_GLU) == 0u) {
            coopMatPerElementNV(acc_e, acc_e, done_even, row0, tok0);
            coopMatPerElementNV(acc_o, acc_o, done_odd, row0, tok0);
            return;
        }
    }
    coopMatPerElementNV(acc_e, acc_e, gate_act, row0, tok0);
    acc_e = acc_e * acc_o;
    coopMatPerElementNV(acc_e, acc_e, put_gated, row0, tok0);
}
