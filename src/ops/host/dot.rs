//! One token through the 32-weight formats without decoding rows first:
//! decode reads every weight once per token, so the product is bound by
//! memory, and writing the decoded row and reading it back would double
//! the traffic through the caches. Each block's quants meet the token's
//! 32 inputs in 8-lane sums, scaled per block (`d·Σq·x (+ m·Σx)`): the
//! same value as the reference dequantization followed by a dot product,
//! up to f32 rounding in another order.

use half::f16;

use crate::quant::{DeviceLayout, QuantType};

/// Whether [`dot_rows`] takes weights of `t`.
pub(super) fn fused(t: QuantType) -> bool {
    matches!(
        t,
        QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q8_0
    )
}

/// A chunk of a weight in the device layout, as the dots read it.
pub(super) struct Planes<'a> {
    pub t: QuantType,
    pub chunk: &'a [u8],
    /// Byte offset of each plane, the scale plane last.
    pub offsets: Vec<usize>,
    pub nb_row: usize,
    layout: DeviceLayout,
}

impl<'a> Planes<'a> {
    /// The planes of a chunk of `rows` rows of `cols` weights of `t`.
    pub fn new(t: QuantType, chunk: &'a [u8], rows: usize, cols: usize) -> Option<Self> {
        let layout = DeviceLayout::of(t)?;
        let nb_row = cols / t.block_size();
        let nb = rows * nb_row;
        if chunk.len() < crate::quant::device_bytes(t, nb) {
            return None;
        }
        let offsets = (0..=layout.planes.len())
            .map(|i| layout.plane_offset(i, nb))
            .collect();
        Some(Planes {
            t,
            chunk,
            offsets,
            nb_row,
            layout,
        })
    }

    pub(super) fn plane(&self, p: usize, bi: usize) -> &'a [u8] {
        let bytes = self.layout.planes[p].bytes;
        &self.chunk[self.offsets[p] + bi * bytes..self.offsets[p] + (bi + 1) * bytes]
    }

    /// Plane `p`'s bytes of row `r` (its blocks in turn).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn row_plane(&self, p: usize, r: usize) -> &'a [u8] {
        let bytes = self.layout.planes[p].bytes * self.nb_row;
        &self.chunk[self.offsets[p] + r * bytes..self.offsets[p] + (r + 1) * bytes]
    }

    /// The f16 scales of row `r` (each block's in turn), as f32 in `out`.
    pub(super) fn row_scales(&self, r: usize, out: &mut Vec<f32>) {
        self.rows_scales(r, 1, out);
    }

    /// The f16 scales of rows `r..r + n` (each block's in turn), as f32 in
    /// `out`, converted together.
    pub(super) fn rows_scales(&self, r: usize, n: usize, out: &mut Vec<f32>) {
        let ns = self.layout.scales.len();
        let o = self.offsets[self.layout.planes.len()] + 2 * r * self.nb_row * ns;
        let halves: &[f16] = bytemuck::cast_slice(&self.chunk[o..o + 2 * n * self.nb_row * ns]);
        out.resize(halves.len(), 0.0);
        super::widen_halves(halves, out);
    }
}

/// `y[i] = W[r0 + i] · x` for the rows of `y`, `x` one token's inputs.
pub(super) struct DotRows<'a> {
    pub w: &'a Planes<'a>,
    pub r0: usize,
    pub x: &'a [f32],
    pub y: &'a mut [f32],
}

impl pulp::WithSimd for DotRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let DotRows { w, r0, x, y } = self;
        let x32: &[[f32; 32]] = bytemuck::cast_slice(x);
        // Per block, the 8-lane sums of x (for the formats' offsets).
        let xs: Vec<[f32; 8]> = x32.iter().map(|b| lanes(b, &[1.0; 32])).collect();
        let mut sc = Vec::new();
        let ns = w.layout.scales.len();
        for (i, out) in y.iter_mut().enumerate() {
            w.row_scales(r0 + i, &mut sc);
            let mut acc = [0.0f32; 8];
            for (b, xb) in x32.iter().enumerate() {
                let bi = (r0 + i) * w.nb_row + b;
                let mut q = [0.0f32; 32];
                let d = sc[b * ns];
                let (scale, offset) = match w.t {
                    QuantType::Q8_0 => {
                        for (v, &u) in q.iter_mut().zip(w.plane(0, bi)) {
                            *v = f32::from(u as i8);
                        }
                        (d, 0.0)
                    }
                    QuantType::Q4_0 => {
                        nibbles(w.plane(0, bi), &mut q);
                        (d, -8.0 * d)
                    }
                    QuantType::Q4_1 => {
                        nibbles(w.plane(0, bi), &mut q);
                        (d, sc[b * ns + 1])
                    }
                    QuantType::Q5_0 => {
                        fives(w.plane(0, bi), w.plane(1, bi), &mut q);
                        (d, -16.0 * d)
                    }
                    _ => {
                        fives(w.plane(0, bi), w.plane(1, bi), &mut q);
                        (d, sc[b * ns + 1])
                    }
                };
                let s = lanes(&q, xb);
                for l in 0..8 {
                    acc[l] = scale.mul_add(s[l], offset.mul_add(xs[b][l], acc[l]));
                }
            }
            *out = acc.iter().sum();
        }
    }
}

/// `Σ a·b` over 32 values, in 8 lanes.
#[inline(always)]
fn lanes(a: &[f32; 32], b: &[f32; 32]) -> [f32; 8] {
    let mut s = [0.0f32; 8];
    for c in 0..4 {
        for l in 0..8 {
            s[l] = a[8 * c + l].mul_add(b[8 * c + l], s[l]);
        }
    }
    s
}

/// The 32 nibbles of 16 bytes: low ones weights 0..16, high ones 16..32.
#[inline(always)]
fn nibbles(qs: &[u8], q: &mut [f32; 32]) {
    for j in 0..16 {
        q[j] = f32::from(qs[j] & 0x0F);
        q[j + 16] = f32::from(qs[j] >> 4);
    }
}

/// Five-bit levels: the nibbles with the bits of `qh` on top.
#[inline(always)]
fn fives(qs: &[u8], qh: &[u8], q: &mut [f32; 32]) {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for j in 0..16 {
        q[j] = f32::from((qs[j] & 0x0F) | (((h >> j) & 1) as u8) << 4);
        q[j + 16] = f32::from((qs[j] >> 4) | (((h >> (j + 16)) & 1) as u8) << 4);
    }
}
