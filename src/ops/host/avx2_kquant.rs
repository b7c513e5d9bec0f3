//! The one-token dots of Q4_K, Q5_K and Q6_K in AVX2 + FMA, as
//! [`super::avx2`] does the 32-weight formats: per sub-block, the levels
//! widened to f32 and multiplied with the token's inputs in two partial
//! sums, scaled by the sub-block's `d·scale` (minus `dmin·min · Σx` for
//! Q4_K and Q5_K; Q6_K's centre of 32 comes off the integers). Four rows
//! share the loads of the inputs; the next four rows' quants are prefetched.

use core::arch::x86_64::{__m256, __m256i};

use pulp::x86::V3;

use super::avx2::XBlock;
use super::dot::Planes;
use crate::quant::QuantType;
use crate::quant::q4_k::get_scale_min_k4;

/// Whether [`dot_rows`] takes weights of `t`.
pub(super) fn fused(t: QuantType) -> bool {
    matches!(t, QuantType::Q4K | QuantType::Q5K | QuantType::Q6K)
}

/// `y[i] = W[r0 + i] · x` for the rows of `y`, `x` by 32-input block
/// (eight per super-block).
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
            let mut sc = Vec::new();
            w.rows_scales(r0, y.len(), &mut sc);
            let per_row = sc.len() / y.len().max(1);
            // Groups of four rows, then the rest one at a time.
            let full = y.len() / 4 * 4;
            let (quads, rest) = y.split_at_mut(full);
            let groups = quads
                .chunks_mut(4)
                .chain(rest.chunks_mut(1))
                .scan(0, |row, ys| {
                    let r = *row;
                    *row += ys.len();
                    Some((r, ys))
                });
            for (i, ys) in groups {
                let (r, sc) = (r0 + i, &sc[i * per_row..]);
                match (w.t, ys.len()) {
                    (QuantType::Q6K, 4) => q6_k::<4>(simd, w, r, x, ys, sc),
                    (QuantType::Q6K, _) => q6_k::<1>(simd, w, r, x, ys, sc),
                    (QuantType::Q5K, 4) => k4::<true, 4>(simd, w, r, x, ys, sc),
                    (QuantType::Q5K, _) => k4::<true, 1>(simd, w, r, x, ys, sc),
                    (_, 4) => k4::<false, 4>(simd, w, r, x, ys, sc),
                    _ => k4::<false, 1>(simd, w, r, x, ys, sc),
                }
            }
        }
    }
    pulp::Simd::vectorize(simd, Op { simd, w, r0, x, y });
}

/// 32 bytes.
#[inline(always)]
fn load32(b: &[u8]) -> __m256i {
    pulp::cast::<[u8; 32], __m256i>(b[..32].try_into().unwrap_or([0; 32]))
}

/// The 32 byte-sized levels of `v` as four groups of 8 f32, less `centre`.
#[inline(always)]
fn widen(simd: V3, v: __m256i, centre: i32) -> [__m256; 4] {
    let (lo, hi) = (
        simd.avx._mm256_castsi256_si128(v),
        simd.avx2._mm256_extracti128_si256::<1>(v),
    );
    let c = simd.avx._mm256_set1_epi32(centre);
    [
        lo,
        simd.sse2._mm_srli_si128::<8>(lo),
        hi,
        simd.sse2._mm_srli_si128::<8>(hi),
    ]
    .map(|h| {
        let i = simd.avx2._mm256_cvtepu8_epi32(h);
        simd.avx
            ._mm256_cvtepi32_ps(simd.avx2._mm256_sub_epi32(i, c))
    })
}

/// `Σ q·x` of 32 levels and a block of inputs, in two partial sums: the
/// first 16 inputs' and the last 16's.
#[inline(always)]
fn halves(simd: V3, q: [__m256; 4], xb: &XBlock) -> (__m256, __m256) {
    let a = simd
        .fma
        ._mm256_fmadd_ps(q[1], xb.x[1], simd.avx._mm256_mul_ps(q[0], xb.x[0]));
    let b = simd
        .fma
        ._mm256_fmadd_ps(q[3], xb.x[3], simd.avx._mm256_mul_ps(q[2], xb.x[2]));
    (a, b)
}

/// Bytes of `v` shifted right by `s` bits, each keeping only `mask`.
#[inline(always)]
fn bits<const S: i32>(simd: V3, v: __m256i, mask: i8) -> __m256i {
    simd.avx2._mm256_and_si256(
        simd.avx2._mm256_srli_epi16::<S>(v),
        simd.avx._mm256_set1_epi8(mask),
    )
}

/// Prefetches the line at `p`, a hint only (past the chunk's end too).
#[inline(always)]
fn prefetch(simd: V3, p: *const u8) {
    simd.sse
        ._mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
}

/// Q4_K (or Q5_K with `FIVE`) dots of rows `r..r + R`; `sc`: each row's
/// super-blocks' `d, dmin`.
#[inline(always)]
fn k4<const FIVE: bool, const R: usize>(
    simd: V3,
    w: &Planes<'_>,
    r: usize,
    x: &[XBlock],
    y: &mut [f32],
    sc: &[f32],
) {
    let nb = x.len() / 8;
    let scales_plane = if FIVE { 2 } else { 1 };
    let qs: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(0, r + i)[..128 * nb]);
    let qh: [&[u8]; R] = std::array::from_fn(|i| {
        if FIVE {
            &w.row_plane(1, r + i)[..32 * nb]
        } else {
            &[]
        }
    });
    let packed: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(scales_plane, r + i)[..12 * nb]);
    let sc: [&[f32]; R] = std::array::from_fn(|i| &sc[2 * i * nb..2 * (i + 1) * nb]);
    let mut acc = [simd.avx._mm256_setzero_ps(); R];
    for b in 0..nb {
        for i in 0..R {
            let ahead = qs[i].as_ptr().wrapping_add(4 * 128 * nb + 128 * b);
            prefetch(simd, ahead);
            prefetch(simd, ahead.wrapping_add(64));
            let (d, dmin) = (sc[i][2 * b], sc[i][2 * b + 1]);
            let mut s12 = [0u8; 12];
            s12.copy_from_slice(&packed[i][12 * b..12 * b + 12]);
            let high = if FIVE {
                load32(&qh[i][32 * b..])
            } else {
                simd.avx._mm256_setzero_si256()
            };
            for j64 in 0..4 {
                let v = load32(&qs[i][128 * b + 32 * j64..]);
                let mut lo = simd
                    .avx2
                    ._mm256_and_si256(v, simd.avx._mm256_set1_epi8(0x0F));
                let mut hi = bits::<4>(simd, v, 0x0F);
                if FIVE {
                    // Bits 2·j64 and 2·j64 + 1 of each qh byte: the fifth
                    // bits of the pair of sub-blocks.
                    let one = |m: i8| {
                        let set = simd.avx2._mm256_cmpeq_epi8(
                            simd.avx2
                                ._mm256_and_si256(high, simd.avx._mm256_set1_epi8(m)),
                            simd.avx._mm256_set1_epi8(m),
                        );
                        simd.avx2
                            ._mm256_and_si256(set, simd.avx._mm256_set1_epi8(0x10))
                    };
                    lo = simd.avx2._mm256_or_si256(lo, one(1 << (2 * j64)));
                    hi = simd.avx2._mm256_or_si256(hi, one(2 << (2 * j64)));
                }
                for (h, levels) in [lo, hi].into_iter().enumerate() {
                    let sub = 2 * j64 + h;
                    let (s, m) = get_scale_min_k4(sub, &s12);
                    let xb = &x[8 * b + sub];
                    let (p, q) = halves(simd, widen(simd, levels, 0), xb);
                    let ds = simd.avx._mm256_set1_ps(d * f32::from(s));
                    acc[i] = simd
                        .fma
                        ._mm256_fmadd_ps(ds, simd.avx._mm256_add_ps(p, q), acc[i]);
                    let dm = simd.avx._mm256_set1_ps(-(dmin * f32::from(m)));
                    acc[i] = simd.fma._mm256_fmadd_ps(dm, xb.sum, acc[i]);
                }
            }
        }
    }
    for i in 0..R {
        y[i] = pulp::cast::<__m256, [f32; 8]>(acc[i]).iter().sum();
    }
}

/// Q6_K dots of rows `r..r + R`; `sc`: each row's super-blocks' `d`.
#[inline(always)]
fn q6_k<const R: usize>(
    simd: V3,
    w: &Planes<'_>,
    r: usize,
    x: &[XBlock],
    y: &mut [f32],
    sc: &[f32],
) {
    let nb = x.len() / 8;
    let ql: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(0, r + i)[..128 * nb]);
    let qh: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(1, r + i)[..64 * nb]);
    let scales: [&[u8]; R] = std::array::from_fn(|i| &w.row_plane(2, r + i)[..16 * nb]);
    let sc: [&[f32]; R] = std::array::from_fn(|i| &sc[i * nb..(i + 1) * nb]);
    let mut acc = [simd.avx._mm256_setzero_ps(); R];
    for b in 0..nb {
        for i in 0..R {
            let ahead = ql[i].as_ptr().wrapping_add(4 * 128 * nb + 128 * b);
            prefetch(simd, ahead);
            prefetch(simd, ahead.wrapping_add(64));
            prefetch(simd, qh[i].as_ptr().wrapping_add(4 * 64 * nb + 64 * b));
            let d = sc[i][b];
            let s = &scales[i][16 * b..16 * b + 16];
            for n in 0..2 {
                let l0 = load32(&ql[i][128 * b + 64 * n..]);
                let l1 = load32(&ql[i][128 * b + 64 * n + 32..]);
                let h = load32(&qh[i][64 * b + 32 * n..]);
                let low = simd.avx._mm256_set1_epi8(0x0F);
                let top = |v: __m256i| simd.avx2._mm256_slli_epi16::<4>(v);
                // Positions 32·g + l of this half: low nibbles of the first
                // and second 32 bytes of ql, then their high nibbles; the
                // two high bits of each from successive pairs of qh's bits.
                let groups = [
                    simd.avx2._mm256_or_si256(
                        simd.avx2._mm256_and_si256(l0, low),
                        top(bits::<0>(simd, h, 3)),
                    ),
                    simd.avx2._mm256_or_si256(
                        simd.avx2._mm256_and_si256(l1, low),
                        top(bits::<2>(simd, h, 3)),
                    ),
                    simd.avx2
                        ._mm256_or_si256(bits::<4>(simd, l0, 0x0F), top(bits::<4>(simd, h, 3))),
                    simd.avx2
                        ._mm256_or_si256(bits::<4>(simd, l1, 0x0F), top(bits::<6>(simd, h, 3))),
                ];
                for (g, levels) in groups.into_iter().enumerate() {
                    let xb = &x[8 * b + 4 * n + g];
                    let (p, q) = halves(simd, widen(simd, levels, 32), xb);
                    let sa = d * f32::from(s[8 * n + 2 * g] as i8);
                    let sb = d * f32::from(s[8 * n + 2 * g + 1] as i8);
                    acc[i] = simd
                        .fma
                        ._mm256_fmadd_ps(simd.avx._mm256_set1_ps(sa), p, acc[i]);
                    acc[i] = simd
                        .fma
                        ._mm256_fmadd_ps(simd.avx._mm256_set1_ps(sb), q, acc[i]);
                }
            }
        }
    }
    for i in 0..R {
        y[i] = pulp::cast::<__m256, [f32; 8]>(acc[i]).iter().sum();
    }
}
