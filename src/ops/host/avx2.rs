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

/// The four 8-weight groups of a block's 32 levels, as f32 lanes.
type Levels = [__m256; 4];

/// A token's 32 inputs of one block, and their 8-lane sums.
#[derive(Clone, Copy)]
pub(super) struct XBlock {
    x: [__m256; 4],
    sum: __m256,
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

/// The levels of one block of `w`'s type.
#[inline(always)]
fn levels(simd: V3, w: &Planes<'_>, bi: usize) -> Levels {
    let ints: [__m256i; 4] = match w.t {
        QuantType::Q8_0 => {
            let q = w.plane(0, bi);
            let (a, b) = (load16(&q[..16]), load16(&q[16..]));
            [
                simd.avx2._mm256_cvtepi8_epi32(a),
                simd.avx2
                    ._mm256_cvtepi8_epi32(simd.sse2._mm_srli_si128::<8>(a)),
                simd.avx2._mm256_cvtepi8_epi32(b),
                simd.avx2
                    ._mm256_cvtepi8_epi32(simd.sse2._mm_srli_si128::<8>(b)),
            ]
        }
        QuantType::Q4_0 | QuantType::Q4_1 => nibble_ints(simd, w.plane(0, bi)),
        _ => {
            let mut n = nibble_ints(simd, w.plane(0, bi));
            let h = w.plane(1, bi);
            let qh = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as i32;
            let all = simd.avx._mm256_set1_epi32(qh);
            let one = simd.avx._mm256_set1_epi32(1);
            for (g, v) in n.iter_mut().enumerate() {
                let g = 8 * g as i32;
                let shifts =
                    simd.avx
                        ._mm256_setr_epi32(g, g + 1, g + 2, g + 3, g + 4, g + 5, g + 6, g + 7);
                let bit = simd
                    .avx2
                    ._mm256_and_si256(simd.avx2._mm256_srlv_epi32(all, shifts), one);
                *v = simd
                    .avx2
                    ._mm256_or_si256(*v, simd.avx2._mm256_slli_epi32::<4>(bit));
            }
            n
        }
    };
    ints.map(|i| simd.avx._mm256_cvtepi32_ps(i))
}

/// `y[i] = W[r0 + i] · x` for the rows of `y`, `x` by block ([`x_blocks`]).
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
            let centre = match w.t {
                QuantType::Q4_0 => Some(8.0),
                QuantType::Q5_0 => Some(16.0),
                QuantType::Q8_0 => Some(0.0),
                _ => None,
            };
            let ns = if centre.is_some() { 1 } else { 2 };
            let mut sc = Vec::new();
            for (i, out) in y.iter_mut().enumerate() {
                w.row_scales(r0 + i, &mut sc);
                let mut acc = simd.avx._mm256_setzero_ps();
                for (b, xb) in x.iter().enumerate() {
                    let q = levels(simd, w, (r0 + i) * w.nb_row + b);
                    let mut s = simd.avx._mm256_mul_ps(q[0], xb.x[0]);
                    for (qg, xg) in q.iter().zip(&xb.x).skip(1) {
                        s = simd.fma._mm256_fmadd_ps(*qg, *xg, s);
                    }
                    let d = sc[b * ns];
                    let m = match centre {
                        Some(c) => -c * d,
                        None => sc[b * ns + 1],
                    };
                    acc = simd.fma._mm256_fmadd_ps(simd.avx._mm256_set1_ps(d), s, acc);
                    acc = simd
                        .fma
                        ._mm256_fmadd_ps(simd.avx._mm256_set1_ps(m), xb.sum, acc);
                }
                *out = pulp::cast::<__m256, [f32; 8]>(acc).iter().sum();
            }
        }
    }
    pulp::Simd::vectorize(simd, Op { simd, w, r0, x, y });
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
            let mut r = 0;
            while r < nr {
                let rs = (nr - r).min(3);
                let mut t = 0;
                while t < n {
                    let ts = (n - t).min(4);
                    let sums = match (rs, ts) {
                        (3, 4) => block::<3, 4>(simd, &wr[r..r + 3], &xr[t..t + 4]),
                        (3, _) => block::<3, 1>(simd, &wr[r..r + 3], &xr[t..t + 1]),
                        (_, 4) => block::<1, 4>(simd, &wr[r..r + 1], &xr[t..t + 4]),
                        _ => block::<1, 1>(simd, &wr[r..r + 1], &xr[t..t + 1]),
                    };
                    let (br, bt) = match (rs, ts) {
                        (3, 4) => (3, 4),
                        (3, _) => (3, 1),
                        (_, 4) => (1, 4),
                        _ => (1, 1),
                    };
                    for i in 0..br {
                        for j in 0..bt {
                            y[(r + i) * n + t + j] = sums[i][j];
                        }
                    }
                    t += bt;
                }
                r += if rs == 3 { 3 } else { 1 };
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
