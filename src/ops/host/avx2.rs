//! The one-token dots of the 32-weight formats in AVX2 + FMA, through
//! `pulp`'s tokens (each intrinsic safe to call once the token proves the
//! feature): per block, the quants widened to eight f32 lanes four times,
//! multiplied with the token's 32 inputs, the sum scaled by the block's
//! scale and the block's offset (`m` or `-centre · d`) times its inputs'
//! sum added. Four rows at a time share the loads of the inputs.

use core::arch::x86_64::{__m128i, __m256, __m256i};

use pulp::x86::V3;

use super::dot::Planes;
use crate::quant::QuantType;

/// A token's 32 inputs of one block, and their 8-lane sums.
#[derive(Clone, Copy)]
pub(super) struct XBlock {
    pub(super) x: [__m256; 4],
    pub(super) sum: __m256,
}

/// The token's inputs by block (`x.len()` a multiple of 32).
pub(super) fn x_blocks(simd: V3, x: &[f32]) -> Vec<XBlock> {
    struct Op<'a>(V3, &'a [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = Vec<XBlock>;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> Vec<XBlock> {
            let Op(simd, x) = self;
            bytemuck::cast_slice::<f32, [[f32; 8]; 4]>(x)
                .iter()
                .map(|b| {
                    let v = b.map(pulp::cast::<[f32; 8], __m256>);
                    let sum = simd.avx._mm256_add_ps(
                        simd.avx._mm256_add_ps(v[0], v[1]),
                        simd.avx._mm256_add_ps(v[2], v[3]),
                    );
                    XBlock { x: v, sum }
                })
                .collect()
        }
    }
    pulp::Simd::vectorize(simd, Op(simd, x))
}

/// A 16-byte load.
#[inline(always)]
fn load16(b: &[u8]) -> __m128i {
    pulp::cast::<[u8; 16], __m128i>(b[..16].try_into().unwrap_or([0; 16]))
}

/// The 32 nibbles of 16 bytes (low ones weights 0..16) as integers.
#[inline(always)]
fn nibble_ints(simd: V3, qs: &[u8]) -> [__m256i; 4] {
    let q = load16(qs);
    let mask = simd.sse2._mm_set1_epi8(0x0F);
    let lo = simd.sse2._mm_and_si128(q, mask);
    let hi = simd
        .sse2
        ._mm_and_si128(simd.sse2._mm_srli_epi16::<4>(q), mask);
    [
        simd.avx2._mm256_cvtepu8_epi32(lo),
        simd.avx2
            ._mm256_cvtepu8_epi32(simd.sse2._mm_srli_si128::<8>(lo)),
        simd.avx2._mm256_cvtepu8_epi32(hi),
        simd.avx2
            ._mm256_cvtepu8_epi32(simd.sse2._mm_srli_si128::<8>(hi)),
    ]
}

/// How a format's quants become levels: its code, as a const parameter.
mod kind {
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q4_1: u8 = 2;
    pub const Q5_0: u8 = 3;
    pub const Q5_1: u8 = 4;
}

/// Block `b`'s 32 levels as integers in four groups of 8 (`qs`, `qh`: the
/// row's planes).
#[inline(always)]
fn ints<const K: u8>(simd: V3, qs: &[u8], qh: &[u8], b: usize) -> [__m256i; 4] {
    if K == kind::Q8_0 {
        let q = &qs[32 * b..32 * b + 32];
        let (a, c) = (load16(&q[..16]), load16(&q[16..]));
        return [
            simd.avx2._mm256_cvtepi8_epi32(a),
            simd.avx2
                ._mm256_cvtepi8_epi32(simd.sse2._mm_srli_si128::<8>(a)),
            simd.avx2._mm256_cvtepi8_epi32(c),
            simd.avx2
                ._mm256_cvtepi8_epi32(simd.sse2._mm_srli_si128::<8>(c)),
        ];
    }
    if K == kind::Q5_0 || K == kind::Q5_1 {
        let h = &qh[4 * b..4 * b + 4];
        let high = bit_bytes(simd, u32::from_le_bytes([h[0], h[1], h[2], h[3]]));
        let q = load16(&qs[16 * b..16 * b + 16]);
        let mask = simd.sse2._mm_set1_epi8(0x0F);
        let lo = simd.sse2._mm_and_si128(q, mask);
        let hi = simd
            .sse2
            ._mm_and_si128(simd.sse2._mm_srli_epi16::<4>(q), mask);
        let v = simd.avx2._mm256_or_si256(
            simd.avx._mm256_set_m128i(hi, lo),
            simd.avx2
                ._mm256_and_si256(high, simd.avx._mm256_set1_epi8(0x10)),
        );
        let (a, c) = (
            simd.avx._mm256_castsi256_si128(v),
            simd.avx2._mm256_extracti128_si256::<1>(v),
        );
        return [
            simd.avx2._mm256_cvtepu8_epi32(a),
            simd.avx2
                ._mm256_cvtepu8_epi32(simd.sse2._mm_srli_si128::<8>(a)),
            simd.avx2._mm256_cvtepu8_epi32(c),
            simd.avx2
                ._mm256_cvtepu8_epi32(simd.sse2._mm_srli_si128::<8>(c)),
        ];
    }
    nibble_ints(simd, &qs[16 * b..16 * b + 16])
}

/// Byte `j` all ones where bit `j` of `bits` is set, else zero: each byte
/// takes the byte of `bits` holding its bit, every other bit forced on, and
/// compares with all ones.
#[inline(always)]
fn bit_bytes(simd: V3, bits: u32) -> __m256i {
    let v = simd.avx._mm256_set1_epi32(bits as i32);
    let spread = simd.avx._mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bytes = simd.avx2._mm256_shuffle_epi8(v, spread);
    let others = simd.avx._mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    simd.avx2._mm256_cmpeq_epi8(
        simd.avx2._mm256_or_si256(bytes, others),
        simd.avx._mm256_set1_epi64x(-1),
    )
}

/// `y[i] = W[r0 + i] · x` for the rows of `y`, `x` by block ([`x_blocks`]).
///
/// Per block and row, `d·Σq·x` (+ `m·Σx` for the formats with an offset,
/// `m = -centre·d` for the centred ones): two partial sums of the levels
/// times the inputs, one FMA into the row's accumulator. Four rows share
/// the loads of the inputs, and the next four rows' quants are prefetched:
/// without that one core reads weights at half the speed it streams memory.
pub(super) fn dot_rows(simd: V3, w: &Planes<'_>, r0: usize, x: &[XBlock], y: &mut [f32]) {
    struct Op<'a> {
        simd: V3,
        w: &'a Planes<'a>,
        r0: usize,
        x: &'a [XBlock],
        y: &'a mut [f32],
    }
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op { simd, w, r0, x, y } = self;
            match w.t {
                QuantType::Q8_0 => rows::<{ kind::Q8_0 }>(simd, w, r0, x, y),
                QuantType::Q4_0 => rows::<{ kind::Q4_0 }>(simd, w, r0, x, y),
                QuantType::Q4_1 => rows::<{ kind::Q4_1 }>(simd, w, r0, x, y),
                QuantType::Q5_0 => rows::<{ kind::Q5_0 }>(simd, w, r0, x, y),
                _ => rows::<{ kind::Q5_1 }>(simd, w, r0, x, y),
            }
        }
    }
    pulp::Simd::vectorize(simd, Op { simd, w, r0, x, y });
}

/// [`dot_rows`] for one format, four rows at a time.
#[inline(always)]
fn rows<const K: u8>(simd: V3, w: &Planes<'_>, r0: usize, x: &[XBlock], y: &mut [f32]) {
    let mut sc = Vec::new();
    w.rows_scales(r0, y.len(), &mut sc);
    let per_row = sc.len() / y.len().max(1);
    for (c, ys) in y.chunks_mut(4).enumerate() {
        let r = r0 + 4 * c;
        let sc = &sc[4 * c * per_row..];
        match ys.len() {
            4 => group::<K, 4>(simd, w, r, x, ys, sc),
            3 => group::<K, 3>(simd, w, r, x, ys, sc),
            2 => group::<K, 2>(simd, w, r, x, ys, sc),
            _ => group::<K, 1>(simd, w, r, x, ys, sc),
        }
    }
}

/// The dots of rows `r..r + R` (`sc`: their scales, from row `r` on).
#[inline(always)]
fn group<const K: u8, const R: usize>(
    simd: V3,
    w: &Planes<'_>,
    r: usize,
    x: &[XBlock],
    y: &mut [f32],
    sc: &[f32],
) {
    let five = K == kind::Q5_0 || K == kind::Q5_1;
    let offset = K == kind::Q4_1 || K == kind::Q5_1;
    let centre = match K {
        kind::Q4_0 => 8.0,
        kind::Q5_0 => 16.0,
        _ => 0.0,
    };
    let ns = if offset { 2 } else { 1 };
    let nb = x.len();
    let bytes = if K == kind::Q8_0 { 32 } else { 16 };
    // Exact lengths up front, so that the loop's indexing needs no checks.
    let qs: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(0, r + i)[..nb * bytes]);
    let qh: [&[u8]; R] = std::array::from_fn(|i| {
        if five {
            &w.row_plane(1, r + i)[..nb * 4]
        } else {
            &[]
        }
    });
    let sc: [&[f32]; R] = std::array::from_fn(|i| &sc[i * nb * ns..(i + 1) * nb * ns]);
    // Four rows on: past the chunk's end a prefetch is only a hint.
    let ahead: [*const u8; R] =
        std::array::from_fn(|i| qs[i].as_ptr().wrapping_add(4 * nb * bytes));
    let mut acc = [simd.avx._mm256_setzero_ps(); R];
    for (b, xb) in x.iter().enumerate() {
        for i in 0..R {
            let next = ahead[i].wrapping_add(b * bytes);
            simd.sse
                ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(next.cast());
            let q = ints::<K>(simd, qs[i], qh[i], b).map(|v| simd.avx._mm256_cvtepi32_ps(v));
            let mut s0 = simd.avx._mm256_mul_ps(q[0], xb.x[0]);
            let mut s1 = simd.avx._mm256_mul_ps(q[1], xb.x[1]);
            s0 = simd.fma._mm256_fmadd_ps(q[2], xb.x[2], s0);
            s1 = simd.fma._mm256_fmadd_ps(q[3], xb.x[3], s1);
            let d = sc[i][b * ns];
            acc[i] = simd.fma._mm256_fmadd_ps(
                simd.avx._mm256_set1_ps(d),
                simd.avx._mm256_add_ps(s0, s1),
                acc[i],
            );
            if offset || centre != 0.0 {
                let m = if offset {
                    sc[i][b * ns + 1]
                } else {
                    -centre * d
                };
                acc[i] = simd
                    .fma
                    ._mm256_fmadd_ps(simd.avx._mm256_set1_ps(m), xb.sum, acc[i]);
            }
        }
    }
    for i in 0..R {
        y[i] = pulp::cast::<__m256, [f32; 8]>(acc[i]).iter().sum();
    }
}

/// `y[r * n + t] = w[r] · x[t]` for `nr` rows of `w` and `n` tokens of `x`
/// (rows of `k`, a multiple of 8): register blocks of 3 rows × 4 tokens
/// (twelve accumulators, each step 7 loads for 12 FMAs), smaller blocks at
/// the edges.
pub(super) fn tile(simd: V3, w: &[f32], nr: usize, x: &[f32], n: usize, k: usize, y: &mut [f32]) {
    struct Op<'a> {
        simd: V3,
        w: &'a [f32],
        nr: usize,
        x: &'a [f32],
        n: usize,
        k: usize,
        y: &'a mut [f32],
    }
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op {
                simd,
                w,
                nr,
                x,
                n,
                k,
                y,
            } = self;
            let (wr, xr) = (rows8(w, k), rows8(x, k));
            // Slices of K small enough that a slice of every row of the
            // tile and of four tokens stay in L1 while each is reused: the
            // tile's rows across all tokens, the tokens across the rows.
            let groups = k / 8;
            for c0 in (0..groups).step_by(KC / 8) {
                let c1 = (c0 + KC / 8).min(groups);
                let ws: Vec<&[[f32; 8]]> = wr.iter().map(|r| &r[c0..c1]).collect();
                let xs: Vec<&[[f32; 8]]> = xr.iter().map(|r| &r[c0..c1]).collect();
                let mut t = 0;
                while t < n {
                    let ts = if n - t >= 4 { 4 } else { 1 };
                    let mut r = 0;
                    while r < nr {
                        let rs = if nr - r >= 3 { 3 } else { 1 };
                        let sums = match (rs, ts) {
                            (3, 4) => block::<3, 4>(simd, &ws[r..r + 3], &xs[t..t + 4]),
                            (3, _) => block::<3, 1>(simd, &ws[r..r + 3], &xs[t..t + 1]),
                            (_, 4) => block::<1, 4>(simd, &ws[r..r + 1], &xs[t..t + 4]),
                            _ => block::<1, 1>(simd, &ws[r..r + 1], &xs[t..t + 1]),
                        };
                        for (i, row) in sums.iter().enumerate().take(rs) {
                            for (j, &v) in row.iter().enumerate().take(ts) {
                                let o = &mut y[(r + i) * n + t + j];
                                *o = if c0 == 0 { v } else { *o + v };
                            }
                        }
                        r += rs;
                    }
                    t += ts;
                }
            }
        }
    }
    pulp::Simd::vectorize(
        simd,
        Op {
            simd,
            w,
            nr,
            x,
            n,
            k,
            y,
        },
    );
}

/// Floats of K per slice of [`tile`].
const KC: usize = 256;

/// Packed rows of `k` floats as groups of 8.
#[inline(always)]
fn rows8(s: &[f32], k: usize) -> Vec<&[[f32; 8]]> {
    s.chunks_exact(k).map(bytemuck::cast_slice).collect()
}

/// The dot products of `R` rows and `T` tokens, each in 8 lanes.
#[inline(always)]
fn block<const R: usize, const T: usize>(
    simd: V3,
    w: &[&[[f32; 8]]],
    x: &[&[[f32; 8]]],
) -> [[f32; 4]; 3] {
    let len = w[0].len();
    // Equal lengths, known before the loop: no bounds check inside it, and
    // the row pointers stay in registers.
    let w: [&[[f32; 8]]; R] = std::array::from_fn(|i| &w[i][..len]);
    let x: [&[[f32; 8]]; T] = std::array::from_fn(|j| &x[j][..len]);
    let mut acc = [[simd.avx._mm256_setzero_ps(); T]; R];
    for c in 0..len {
        let wv: [__m256; R] = std::array::from_fn(|i| pulp::cast::<[f32; 8], __m256>(w[i][c]));
        for j in 0..T {
            let xv = pulp::cast::<[f32; 8], __m256>(x[j][c]);
            for i in 0..R {
                acc[i][j] = simd.fma._mm256_fmadd_ps(wv[i], xv, acc[i][j]);
            }
        }
    }
    let mut out = [[0.0f32; 4]; 3];
    for i in 0..R {
        for j in 0..T {
            out[i][j] = pulp::cast::<__m256, [f32; 8]>(acc[i][j]).iter().sum();
        }
    }
    out
}
