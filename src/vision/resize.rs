//! PIL's `Image.resize(size, Image.LANCZOS)` on RGB8 images, bit for bit:
//! the numerics of Pillow's `libImaging/Resample.c` (`precompute_coeffs`,
//! `normalize_coeffs_8bpc`, `ImagingResampleHorizontal_8bpc` /
//! `Vertical_8bpc`), which transformers' Idefics3 image processor calls for
//! every resize and llama.cpp's mtmd copies (`resize_pillow`).
//!
//! Why not a crate: `image::imageops::resize` uses a different Lanczos
//! window and filters in f32 without PIL's per-pass rounding, and
//! `fast_image_resize`'s convolution, though "PIL-like", quantizes its
//! weights to a precision chosen per filter (i16 coefficients) instead of
//! PIL's 22-bit ones, so pixels move by a step here and there. The
//! preprocessing is specified as bit-exact where transformers is, so the
//! ~100 lines below reproduce Pillow's arithmetic exactly:
//!
//! - the filter is `sinc(x) * sinc(x / 3)` on `[-3, 3)`, its support
//!   widened by the downscale factor (`support = 3 * max(in / out, 1)`);
//! - each output pixel's weights are normalized to sum 1 in f64, then
//!   rounded to fixed point with 22 fraction bits (away from zero at .5);
//! - the horizontal pass runs first (over only the source rows the vertical
//!   pass reads), then the vertical one. Pillow 13 runs the vertical pass
//!   first when the height shrinks by more than twice what the width does
//!   ([`PassOrder::Pillow13`]), which moves some pixels of such downscales
//!   by up to 3 levels; Pillow 11.3 and mtmd's port always go horizontal
//!   first, the default here, since the SmolVLM references pin Pillow 11.3;
//! - each pass accumulates in i32 from a rounding bias of `2^21` and clamps
//!   to u8, so the intermediate image is uint8 as PIL's is;
//! - a pass whose size does not change is skipped, and an unchanged size is
//!   a copy (PIL returns `self.copy()`).
//!
//! Rows are independent within a pass, so both passes run in parallel over
//! output rows (rayon). The vertical pass is a multiply-add of whole rows;
//! the horizontal pass transposes blocks of 16 rows so that each tap is a
//! multiply-add over 48 contiguous lanes too. Both are compiled for the
//! SIMD level `pulp` detects (AVX2 on x86-64), where the compiler
//! vectorizes them; the arithmetic is the same integer arithmetic at any
//! level.

use rayon::prelude::*;

use super::image::RgbImage;
use crate::error::Result;

const PRECISION_BITS: u32 = 32 - 8 - 2;
/// Lanczos' support radius (a = 3) in source pixels at scale 1.
const LANCZOS_SUPPORT: f64 = 3.0;
const CHANNELS: usize = 3;

/// The order of the two passes, which decides the rounding of the uint8
/// image between them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PassOrder {
    /// Always horizontal first: Pillow up to 11.3 at least, and mtmd's
    /// port (the references the SmolVLM fixtures pin).
    #[default]
    HorizontalFirst,
    /// Pillow 13's rule: vertical first when the height shrinks by more
    /// than twice what the width does.
    Pillow13,
}

/// Resizes an RGB8 image with PIL's LANCZOS filter, horizontal pass first
/// (Pillow 11.3, mtmd).
///
/// # Errors
/// [`crate::ModelError::InvalidArgument`] for a target size that is empty
/// or past the image bounds.
pub fn resize_lanczos(src: &RgbImage, width: u32, height: u32) -> Result<RgbImage> {
    resize_lanczos_ordered(src, width, height, PassOrder::HorizontalFirst)
}

/// [`resize_lanczos`] with the pass order of a given Pillow.
///
/// # Errors
/// [`crate::ModelError::InvalidArgument`] for a target size that is empty
/// or past the image bounds.
pub fn resize_lanczos_ordered(
    src: &RgbImage,
    width: u32,
    height: u32,
    order: PassOrder,
) -> Result<RgbImage> {
    super::image::check_size(width, height)?;
    let (in_w, in_h) = (src.width() as usize, src.height() as usize);
    let (out_w, out_h) = (width as usize, height as usize);
    if (in_w, in_h) == (out_w, out_h) {
        return Ok(src.clone());
    }
    let horiz = Coeffs::new(in_w, out_w);
    let mut vert = Coeffs::new(in_h, out_h);

    if out_w == in_w {
        let data = vertical_pass(src.data(), in_w, &vert);
        return Ok(RgbImage::from_parts(width, height, data));
    }
    if out_h == in_h {
        let data = horizontal_pass(src.data(), in_w, &horiz);
        return Ok(RgbImage::from_parts(width, height, data));
    }
    // Pillow 13: vertical first when the height shrinks by more than twice
    // what the width does; horizontal first otherwise and in older Pillow.
    let shrink_h = in_h as i64 - out_h as i64;
    let shrink_w = in_w as i64 - out_w as i64;
    if order == PassOrder::Pillow13 && shrink_h > 0 && shrink_h > shrink_w * 2 {
        let tmp = vertical_pass(src.data(), in_w, &vert);
        let data = horizontal_pass(&tmp, in_w, &horiz);
        return Ok(RgbImage::from_parts(width, height, data));
    }
    // Only the rows the vertical pass reads get a horizontal pass.
    let first = vert.bounds[0].0;
    let (lmin, lcnt) = vert.bounds[out_h - 1];
    let last = lmin + lcnt;
    let rows = &src.data()[first * in_w * CHANNELS..last * in_w * CHANNELS];
    let tmp = horizontal_pass(rows, in_w, &horiz);
    for b in &mut vert.bounds {
        b.0 -= first;
    }
    let data = vertical_pass(&tmp, out_w, &vert);
    Ok(RgbImage::from_parts(width, height, data))
}

/// One dimension's filter: for each output index, the first source index
/// and the count it reads, and `ksize` fixed-point weights (zero past the
/// count).
struct Coeffs {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

impl Coeffs {
    /// Pillow's `precompute_coeffs` (box = the whole source) followed by
    /// `normalize_coeffs_8bpc`.
    fn new(in_size: usize, out_size: usize) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = LANCZOS_SUPPORT * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let ss = 1.0 / filterscale;
        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut pre = vec![0f64; ksize];
        for (xx, k_out) in weights.chunks_exact_mut(ksize).enumerate() {
            let center = (xx as f64 + 0.5) * scale;
            // C's (int) cast truncates toward zero, as `as i64` does.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let mut ww = 0.0;
            for (x, w) in pre.iter_mut().enumerate().take(count) {
                *w = lanczos(((x + xmin) as f64 - center + 0.5) * ss);
                ww += *w;
            }
            for (x, k) in k_out.iter_mut().enumerate().take(count) {
                let w = if ww != 0.0 { pre[x] / ww } else { pre[x] };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                *k = if w < 0.0 {
                    (fixed - 0.5) as i32
                } else {
                    (fixed + 0.5) as i32
                };
            }
            bounds.push((xmin, count));
        }
        Coeffs {
            ksize,
            bounds,
            weights,
        }
    }

    fn kernel(&self, i: usize) -> (usize, &[i32]) {
        let (min, count) = self.bounds[i];
        (min, &self.weights[i * self.ksize..i * self.ksize + count])
    }
}

fn sinc(x: f64) -> f64 {
    if x == 0.0 {
        return 1.0;
    }
    let x = x * std::f64::consts::PI;
    x.sin() / x
}

fn lanczos(x: f64) -> f64 {
    if (-LANCZOS_SUPPORT..LANCZOS_SUPPORT).contains(&x) {
        sinc(x) * sinc(x / LANCZOS_SUPPORT)
    } else {
        0.0
    }
}

/// Pillow's `clip8`: the accumulator's integer part, clamped to a byte.
#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

const BIAS: i32 = 1 << (PRECISION_BITS - 1);

/// Source rows transposed together by the horizontal pass, so that one
/// tap is a multiply-add over `BLOCK_ROWS * 3` contiguous lanes (vectors)
/// instead of three scalars.
const BLOCK_ROWS: usize = 16;
const LANES: usize = BLOCK_ROWS * CHANNELS;

/// Resamples each row of `rows` (rows of `in_w` RGB pixels) to the output
/// width of `c`.
fn horizontal_pass(rows: &[u8], in_w: usize, c: &Coeffs) -> Vec<u8> {
    let out_w = c.bounds.len();
    let n_rows = rows.len() / (in_w * CHANNELS);
    let mut out = vec![0u8; n_rows * out_w * CHANNELS];
    out.par_chunks_mut(BLOCK_ROWS * out_w * CHANNELS)
        .zip(rows.par_chunks(BLOCK_ROWS * in_w * CHANNELS))
        .for_each_init(Vec::new, |columns, (dst, src)| {
            pulp::Arch::new().dispatch(HorizontalBlock {
                src,
                in_w,
                c,
                dst,
                columns,
            });
        });
    out
}

/// Up to [`BLOCK_ROWS`] rows of one horizontal pass.
struct HorizontalBlock<'a> {
    src: &'a [u8],
    in_w: usize,
    c: &'a Coeffs,
    dst: &'a mut [u8],
    /// Scratch: the block column-major, `[in_w][BLOCK_ROWS][3]`.
    columns: &'a mut Vec<[u8; LANES]>,
}

impl pulp::WithSimd for HorizontalBlock<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let HorizontalBlock {
            src,
            in_w,
            c,
            dst,
            columns,
        } = self;
        let row_in = in_w * CHANNELS;
        let row_out = c.bounds.len() * CHANNELS;
        let n = src.len() / row_in;
        // Rows past `n` (the last block) keep stale values; their sums are
        // never stored.
        columns.resize(in_w, [0; LANES]);
        for (r, row) in src.chunks_exact(row_in).enumerate() {
            for (col, px) in columns.iter_mut().zip(row.chunks_exact(CHANNELS)) {
                col[r * CHANNELS..(r + 1) * CHANNELS].copy_from_slice(px);
            }
        }
        for xx in 0..c.bounds.len() {
            let (xmin, k) = c.kernel(xx);
            let mut acc = [BIAS; LANES];
            for (col, &w) in columns[xmin..xmin + k.len()].iter().zip(k) {
                for (a, &p) in acc.iter_mut().zip(col) {
                    *a = a.wrapping_add(i32::from(p).wrapping_mul(w));
                }
            }
            let mut px = [0u8; LANES];
            for (p, &a) in px.iter_mut().zip(&acc) {
                *p = clip8(a);
            }
            for (r, v) in px.chunks_exact(CHANNELS).take(n).enumerate() {
                let at = r * row_out + xx * CHANNELS;
                dst[at..at + CHANNELS].copy_from_slice(v);
            }
        }
    }
}

/// Resamples the columns of `src` (rows of `width` RGB pixels) to the
/// output height of `c`, whose bounds index rows of `src`.
fn vertical_pass(src: &[u8], width: usize, c: &Coeffs) -> Vec<u8> {
    let stride = width * CHANNELS;
    let out_h = c.bounds.len();
    let mut out = vec![0u8; out_h * stride];
    out.par_chunks_mut(stride).enumerate().for_each_init(
        || vec![0i32; stride],
        |acc, (yy, dst)| {
            let (ymin, k) = c.kernel(yy);
            pulp::Arch::new().dispatch(VerticalRow {
                src: &src[ymin * stride..(ymin + k.len()) * stride],
                k,
                acc,
                dst,
            });
        },
    );
    out
}

/// One output row of a vertical pass: row-wise multiply-adds of the
/// source rows it reads.
struct VerticalRow<'a> {
    src: &'a [u8],
    k: &'a [i32],
    acc: &'a mut [i32],
    dst: &'a mut [u8],
}

impl pulp::WithSimd for VerticalRow<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let VerticalRow { src, k, acc, dst } = self;
        let stride = dst.len();
        // Column chunks of CHUNK lanes, all taps each, so the sums stay in
        // registers instead of a row of memory read and written per tap.
        const CHUNK: usize = 32;
        let whole = stride - stride % CHUNK;
        for j in (0..whole).step_by(CHUNK) {
            let mut sums = [BIAS; CHUNK];
            for (t, &w) in k.iter().enumerate() {
                let row = &src[t * stride + j..t * stride + j + CHUNK];
                for (a, &p) in sums.iter_mut().zip(row) {
                    *a = a.wrapping_add(i32::from(p).wrapping_mul(w));
                }
            }
            for (d, &a) in dst[j..j + CHUNK].iter_mut().zip(&sums) {
                *d = clip8(a);
            }
        }
        let tail = &mut acc[..stride - whole];
        tail.fill(BIAS);
        for (t, &w) in k.iter().enumerate() {
            let row = &src[t * stride + whole..(t + 1) * stride];
            for (a, &p) in tail.iter_mut().zip(row) {
                *a = a.wrapping_add(i32::from(p).wrapping_mul(w));
            }
        }
        for (d, &a) in dst[whole..].iter_mut().zip(tail.iter()) {
            *d = clip8(a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coeffs_sum_to_one_in_fixed_point() {
        for (i, o) in [(7, 3), (3, 7), (2048, 512), (1024, 2048), (1, 5), (5, 1)] {
            let c = Coeffs::new(i, o);
            for xx in 0..o {
                let (min, k) = c.kernel(xx);
                assert!(min + k.len() <= i);
                let sum: i64 = k.iter().map(|&w| i64::from(w)).sum();
                // Each weight rounds by at most half a unit.
                assert!(
                    (sum - (1 << PRECISION_BITS)).abs() <= k.len() as i64,
                    "{i}->{o}: {sum}"
                );
            }
        }
    }
}
