//! Rows of a weight, from its device layout (`quant::layout`: each quant
//! plane of every block, then the f16 scales) to f32 on the host: what the
//! host products multiply with. Every value equals the reference
//! dequantizer's (`quant::dequantize`) bit for bit: every format decodes
//! its planes directly, in loops the compiler vectorizes, with the
//! reference's operations in the reference's order (the K-quants' sub-block
//! scale and min products first, then `scale·q - min`).

use half::f16;

use crate::error::{ModelError, Result};
use crate::quant::{DeviceLayout, QuantType};

/// Expands rows `r0..r0 + n` of a weight chunk of `chunk_rows` rows of
/// `cols` weights, stored in `chunk` in the device layout of `t`, into `out`
/// (`n × cols` f32, row-major).
///
/// # Errors
/// A chunk too short for its rows, or `out` not `n × cols` long.
pub fn dequant_rows(
    t: QuantType,
    chunk: &[u8],
    chunk_rows: usize,
    cols: usize,
    r0: usize,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let qk = t.block_size();
    let nb_row = cols / qk;
    if !cols.is_multiple_of(qk) || out.len() != n * cols || r0 + n > chunk_rows {
        return Err(ModelError::Internal(format!(
            "dequantizing rows {r0}..{} of {chunk_rows} x {cols} of {t} into {}",
            r0 + n,
            out.len()
        )));
    }
    let Some(layout) = DeviceLayout::of(t) else {
        return dense_rows(t, chunk, cols, r0, out);
    };
    let nb = chunk_rows * nb_row;
    if chunk.len() < crate::quant::device_bytes(t, nb) {
        return Err(ModelError::Internal(format!(
            "a chunk of {} bytes for {nb} blocks of {t}",
            chunk.len()
        )));
    }
    let planes: Vec<usize> = (0..=layout.planes.len())
        .map(|i| layout.plane_offset(i, nb))
        .collect();
    let scales = &chunk[planes[layout.planes.len()]..];
    super::arch().dispatch(Blocks {
        t,
        layout: &layout,
        chunk,
        planes: &planes,
        scales,
        first: r0 * nb_row,
        out,
    })
}

/// The blocks of some rows, decoded with the SIMD level `pulp` detected.
struct Blocks<'a> {
    t: QuantType,
    layout: &'a DeviceLayout,
    chunk: &'a [u8],
    planes: &'a [usize],
    scales: &'a [u8],
    first: usize,
    out: &'a mut [f32],
}

impl pulp::WithSimd for Blocks<'_> {
    type Output = Result<()>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> Result<()> {
        let Blocks {
            t,
            layout,
            chunk,
            planes,
            scales,
            first,
            out,
        } = self;
        let ns = layout.scales.len();
        let count = out.len() / t.block_size();
        // The blocks' scales, converted together (F16C where present).
        let halves: &[f16] =
            bytemuck::cast_slice(&scales[2 * first * ns..2 * (first + count) * ns]);
        let mut sc = vec![0.0f32; halves.len()];
        super::widen_halves(halves, &mut sc);
        for (j, y) in out.chunks_exact_mut(t.block_size()).enumerate() {
            let bi = first + j;
            let plane = |p: usize| {
                let bytes = layout.planes[p].bytes;
                &chunk[planes[p] + bi * bytes..planes[p] + (bi + 1) * bytes]
            };
            let scale = |k: usize| sc[j * ns + k];
            match t {
                QuantType::Q4_0 => nibbles(plane(0), y, |q| (i32::from(q) - 8) as f32 * scale(0)),
                QuantType::Q4_1 => {
                    let (d, m) = (scale(0), scale(1));
                    nibbles(plane(0), y, |q| f32::from(q) * d + m);
                }
                QuantType::Q5_0 => {
                    let d = scale(0);
                    fives(plane(0), plane(1), y, |q| (i32::from(q) - 16) as f32 * d);
                }
                QuantType::Q5_1 => {
                    let (d, m) = (scale(0), scale(1));
                    fives(plane(0), plane(1), y, |q| f32::from(q) * d + m);
                }
                QuantType::Q8_0 => {
                    let d = scale(0);
                    for (v, &q) in y.iter_mut().zip(plane(0)) {
                        *v = f32::from(q as i8) * d;
                    }
                }
                QuantType::Q2K => q2_k(plane(0), plane(1), scale(0), scale(1), y),
                QuantType::Q3K => q3_k(plane(0), plane(1), plane(2), scale(0), y),
                QuantType::Q4K => k4(plane(0), None, plane(1), scale(0), scale(1), y),
                QuantType::Q5K => k4(plane(0), Some(plane(1)), plane(2), scale(0), scale(1), y),
                QuantType::Q6K => q6_k(plane(0), plane(1), plane(2), scale(0), y),
                _ => {
                    return Err(ModelError::Internal(format!(
                        "no host decoder for the device layout of {t}"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The two nibbles of each of 16 bytes: low ones are weights 0..16, high
/// ones 16..32.
#[inline(always)]
fn nibbles(qs: &[u8], y: &mut [f32], f: impl Fn(u8) -> f32) {
    let (lo, hi) = y.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = f(q & 0x0F);
        *h = f(q >> 4);
    }
}

/// Five-bit levels: the nibbles with bit `i` of the little-endian `qh` as
/// the fifth bit of weight `i`.
#[inline(always)]
fn fives(qs: &[u8], qh: &[u8], y: &mut [f32], f: impl Fn(u8) -> f32) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let (lo, hi) = y.split_at_mut(16);
    for (i, ((l, h), &q)) in lo.iter_mut().zip(hi.iter_mut()).zip(qs).enumerate() {
        let b_lo = ((qh >> i) & 1) as u8;
        let b_hi = ((qh >> (i + 16)) & 1) as u8;
        *l = f((q & 0x0F) | (b_lo << 4));
        *h = f((q >> 4) | (b_hi << 4));
    }
}

/// Q2_K: 16 sub-blocks of 16, 2-bit levels, 4-bit scale and min each.
#[inline(always)]
fn q2_k(qs: &[u8], scales: &[u8], d: f32, min: f32, y: &mut [f32]) {
    // Levels of weight `128·n + 32·si + j`: bits `2·si` of `qs[32·n + j]`.
    let mut levels = [0u8; 256];
    for n in 0..2 {
        for si in 0..4 {
            let out = &mut levels[128 * n + 32 * si..128 * n + 32 * si + 32];
            for (v, &b) in out.iter_mut().zip(&qs[32 * n..32 * n + 32]) {
                *v = ((u32::from(b) >> (2 * si)) & 3) as u8;
            }
        }
    }
    for ((ys, ls), &sc) in y
        .chunks_exact_mut(16)
        .zip(levels.chunks_exact(16))
        .zip(scales)
    {
        let dl = d * f32::from(sc & 0xF);
        let ml = min * f32::from(sc >> 4);
        affine(ys, ls, dl, ml);
    }
}

/// Q3_K: 16 sub-blocks of 16, 2-bit levels with a high bit (`hmask`,
/// clear: minus 4), 6-bit signed scales.
#[inline(always)]
fn q3_k(qs: &[u8], hmask: &[u8], packed: &[u8], d_all: f32, y: &mut [f32]) {
    let mut sc12 = [0u8; 12];
    sc12.copy_from_slice(&packed[..12]);
    let scales = crate::quant::q3_k::unpack_q3_k_scales(&sc12);
    // Levels of weight `128·n + 32·si + j`: bits `2·si` of `qs[32·n + j]`,
    // minus 4 where bit `4·n + si` of `hmask[j]` is clear.
    let mut levels = [0i32; 256];
    for n in 0..2 {
        for si in 0..4 {
            let m = 1u8 << (4 * n + si);
            let out = &mut levels[128 * n + 32 * si..128 * n + 32 * si + 32];
            let q = &qs[32 * n..32 * n + 32];
            for ((v, &b), &h) in out.iter_mut().zip(q).zip(&hmask[..32]) {
                let low = i32::from((b >> (2 * si)) & 3);
                *v = low - if h & m != 0 { 0 } else { 4 };
            }
        }
    }
    for (is, (ys, ls)) in y
        .chunks_exact_mut(16)
        .zip(levels.chunks_exact(16))
        .enumerate()
    {
        let dl = d_all * (i32::from(scales[is]) - 32) as f32;
        for (v, &l) in ys.iter_mut().zip(ls) {
            *v = dl * l as f32;
        }
    }
}

/// Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins; byte `l`
/// of each 32 of `qs` holds position `l` of two sub-blocks (low and high
/// nibble), bits `2·j64` and `2·j64 + 1` of `qh[l]` their fifth bits.
#[inline(always)]
fn k4(qs: &[u8], qh: Option<&[u8]>, packed: &[u8], d: f32, min: f32, y: &mut [f32]) {
    let mut sc12 = [0u8; 12];
    sc12.copy_from_slice(&packed[..12]);
    let scale_min = |j: usize| {
        let (sc, m) = crate::quant::q4_k::get_scale_min_k4(j, &sc12);
        (d * f32::from(sc), min * f32::from(m))
    };
    let mut l1 = [0u8; 32];
    let mut l2 = [0u8; 32];
    for j64 in 0..4 {
        let (d1, m1) = scale_min(2 * j64);
        let (d2, m2) = scale_min(2 * j64 + 1);
        let q = &qs[32 * j64..32 * j64 + 32];
        for ((a, b), &v) in l1.iter_mut().zip(l2.iter_mut()).zip(q) {
            *a = v & 0xF;
            *b = v >> 4;
        }
        if let Some(qh) = qh {
            // Masks rather than a shift by `j64`: x86 has no byte shifts.
            let (m1, m2) = (1u8 << (2 * j64), 2u8 << (2 * j64));
            for ((a, b), &h) in l1.iter_mut().zip(l2.iter_mut()).zip(&qh[..32]) {
                *a += if h & m1 != 0 { 16 } else { 0 };
                *b += if h & m2 != 0 { 16 } else { 0 };
            }
        }
        let (lo, hi) = y[64 * j64..64 * j64 + 64].split_at_mut(32);
        affine(lo, &l1, d1, m1);
        affine(hi, &l2, d2, m2);
    }
}

/// `y[i] = d·q[i] - m`, eight at a time (fixed-size groups the compiler
/// turns into vector conversions; the loop as written stays scalar).
#[inline(always)]
fn affine(y: &mut [f32], q: &[u8], d: f32, m: f32) {
    for (ys, qs) in y.chunks_exact_mut(8).zip(q.chunks_exact(8)) {
        let qs: [u8; 8] = qs.try_into().unwrap_or([0; 8]);
        let v: [f32; 8] = std::array::from_fn(|i| d * f32::from(qs[i]) - m);
        ys.copy_from_slice(&v);
    }
}

/// Q6_K: 16 sub-blocks of 16, 6-bit levels (low nibbles in `ql`, two high
/// bits in `qh`) centred on 32, 8-bit signed scales.
#[inline(always)]
fn q6_k(ql_all: &[u8], qh_all: &[u8], scales: &[u8], d: f32, y: &mut [f32]) {
    for n in 0..2 {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &scales[8 * n..8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        // `d · scale` of each sub-block, as the reference multiplies first.
        let ds: [f32; 8] = std::array::from_fn(|k| d * f32::from(sc[k] as i8));
        for l in 0..32 {
            let is = l / 16;
            let q1 = i32::from((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
            let q2 = i32::from((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = ds[is] * q1 as f32;
            y[l + 32] = ds[is + 2] * q2 as f32;
            y[l + 64] = ds[is + 4] * q3 as f32;
            y[l + 96] = ds[is + 6] * q4 as f32;
        }
    }
}

/// Rows of a dense weight (stored as in the file, row-major).
fn dense_rows(t: QuantType, chunk: &[u8], cols: usize, r0: usize, out: &mut [f32]) -> Result<()> {
    let width = t.block_bytes();
    let start = r0 * cols * width;
    let bytes = chunk
        .get(start..start + out.len() * width)
        .ok_or_else(|| ModelError::Internal(format!("dense rows past a chunk of {t}")))?;
    crate::quant::dequantize(t, bytes, out)
}
