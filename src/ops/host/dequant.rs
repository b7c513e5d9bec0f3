//! Rows of a weight, from its device layout (`quant::layout`: each quant
//! plane of every block, then the f16 scales) to f32 on the host: what the
//! host products multiply with. Every value equals the reference
//! dequantizer's (`quant::dequantize`) bit for bit: the 32-weight formats
//! decode their planes directly in loops the compiler vectorizes; the
//! others gather each block back into its GGUF bytes and run the reference.

use half::f16;
use half::slice::HalfFloatSliceExt;

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
        halves.convert_to_f32_slice(&mut sc);
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
                _ => gathered(t, layout, chunk, planes, bi, y)?,
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

/// Block `bi` gathered back into its GGUF bytes and expanded by the reference.
fn gathered(
    t: QuantType,
    layout: &DeviceLayout,
    chunk: &[u8],
    planes: &[usize],
    bi: usize,
    y: &mut [f32],
) -> Result<()> {
    let mut block = [0u8; 256];
    let bb = t.block_bytes();
    for (p, plane) in layout.planes.iter().enumerate() {
        let src = &chunk[planes[p] + bi * plane.bytes..planes[p] + (bi + 1) * plane.bytes];
        block[plane.src_offset..plane.src_offset + plane.bytes].copy_from_slice(src);
    }
    let sp = layout.scale_plane();
    let s = planes[layout.planes.len()] + bi * sp.bytes;
    block[sp.src_offset..sp.src_offset + sp.bytes].copy_from_slice(&chunk[s..s + sp.bytes]);
    crate::quant::dequantize(t, &block[..bb], y)
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
