//! The device layout of every weight format and the `repack` step that writes
//! it from GGUF blocks. `glsl/common/types.glsl` is the GPU side of the same
//! table; the two must agree plane for plane.
//!
//! A quantized tensor of `nb` blocks becomes, in one buffer of 32-bit words:
//! each quant plane in turn (`nb * words` words; a plane is a byte range copied
//! verbatim from every GGUF block), then the scale plane (`nb * n_scales` f16,
//! the block's scales as stored), padded to a word. Every quant plane is
//! word-aligned, so kernels read quants with wide loads, and the layout takes
//! exactly the file's bytes: decode reads every byte of the weights once per
//! token (f32 scales cost Q4_0 11% more bytes). Dense types keep their GGUF
//! bytes unchanged.

use super::QuantType;
use crate::error::{ModelError, Result};

/// Where one quant plane comes from inside a GGUF block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    /// Byte offset of the plane's bytes inside the GGUF block.
    pub src_offset: usize,
    /// Bytes per block (a multiple of 4).
    pub bytes: usize,
}

/// The device layout of one quantized format.
#[derive(Clone, Copy, Debug)]
pub struct DeviceLayout {
    /// Quant planes in device order.
    pub planes: &'static [Plane],
    /// Byte offsets of the f16 scales inside the GGUF block, in device order
    /// (consecutive: the scale plane copies them as one range).
    pub scales: &'static [usize],
}

const fn p(src_offset: usize, bytes: usize) -> Plane {
    Plane { src_offset, bytes }
}

impl DeviceLayout {
    /// The layout of `t`, or `None` for dense types (stored verbatim).
    pub fn of(t: QuantType) -> Option<DeviceLayout> {
        // Each arm names the GGUF block's fields in order; the `const` blocks
        // make the plane arrays statics.
        let (planes, scales): (&'static [Plane], &'static [usize]) = match t {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => return None,
            // d, qs[16]
            QuantType::Q4_0 => (const { &[p(2, 16)] }, &[0]),
            // d, m, qs[16]
            QuantType::Q4_1 => (const { &[p(4, 16)] }, &[0, 2]),
            // d, qh[4], qs[16]
            QuantType::Q5_0 => (const { &[p(6, 16), p(2, 4)] }, &[0]),
            // d, m, qh[4], qs[16]
            QuantType::Q5_1 => (const { &[p(8, 16), p(4, 4)] }, &[0, 2]),
            // d, qs[32]
            QuantType::Q8_0 => (const { &[p(2, 32)] }, &[0]),
            // scales[16], qs[64], d, dmin
            QuantType::Q2K => (const { &[p(16, 64), p(0, 16)] }, &[80, 82]),
            // hmask[32], qs[64], scales[12], d
            QuantType::Q3K => (const { &[p(32, 64), p(0, 32), p(96, 12)] }, &[108]),
            // d, dmin, scales[12], qs[128]
            QuantType::Q4K => (const { &[p(16, 128), p(4, 12)] }, &[0, 2]),
            // d, dmin, scales[12], qh[32], qs[128]
            QuantType::Q5K => (const { &[p(48, 128), p(16, 32), p(4, 12)] }, &[0, 2]),
            // ql[128], qh[64], scales[16], d
            QuantType::Q6K => (const { &[p(0, 128), p(128, 64), p(192, 16)] }, &[208]),
        };
        Some(DeviceLayout { planes, scales })
    }

    /// Device bytes per block: all quant planes plus the f16 scales.
    pub fn block_bytes(&self) -> usize {
        self.planes.iter().map(|p| p.bytes).sum::<usize>() + 2 * self.scales.len()
    }

    /// The scale plane as a byte range of each GGUF block.
    pub fn scale_plane(&self) -> Plane {
        p(self.scales[0], 2 * self.scales.len())
    }

    /// Byte offset of plane `i` (the scale plane is `i == planes.len()`) in a
    /// tensor of `nb` blocks.
    pub fn plane_offset(&self, i: usize, nb: usize) -> usize {
        nb * self.planes[..i.min(self.planes.len())]
            .iter()
            .map(|p| p.bytes)
            .sum::<usize>()
    }
}

/// Device bytes for `nb` blocks (or `nb` elements of a dense type) of `t`.
pub fn device_bytes(t: QuantType, nb: usize) -> usize {
    match DeviceLayout::of(t) {
        Some(l) => (nb * l.block_bytes()).next_multiple_of(4),
        None => (nb * t.block_bytes()).next_multiple_of(4),
    }
}

/// Writes the device layout of the GGUF blocks in `src` (whole blocks of `t`)
/// into `dst`, which must hold [`device_bytes`] for that many blocks.
///
/// # Panics
/// If `src` is not whole blocks or `dst` has the wrong size; callers size both
/// from the tensor's checked shape.
pub fn repack(t: QuantType, src: &[u8], dst: &mut [u8]) {
    let bb = t.block_bytes();
    assert!(src.len().is_multiple_of(bb), "repack: partial block");
    let nb = src.len() / bb;
    assert_eq!(dst.len(), device_bytes(t, nb), "repack: destination size");
    let Some(layout) = DeviceLayout::of(t) else {
        dst[..src.len()].copy_from_slice(src);
        dst[src.len()..].fill(0);
        return;
    };
    for (i, plane) in layout.planes.iter().enumerate() {
        let base = layout.plane_offset(i, nb);
        repack_plane(src, bb, plane, &mut dst[base..base + nb * plane.bytes]);
    }
    let base = layout.plane_offset(layout.planes.len(), nb);
    let sp = layout.scale_plane();
    repack_plane(src, bb, &sp, &mut dst[base..base + nb * sp.bytes]);
    dst[base + nb * sp.bytes..].fill(0);
}

/// The device layout of the GGUF blocks in `src` as a new vector: the
/// checked form of [`repack`] behind the named `repack_q4_0` ... `repack_q6_k`.
///
/// # Errors
/// `src` is not a whole number of blocks of `t`.
pub fn repack_vec(t: QuantType, src: &[u8]) -> Result<Vec<u8>> {
    let bb = t.block_bytes();
    if !src.len().is_multiple_of(bb) {
        return Err(ModelError::invalid(
            "blocks",
            format!("{} bytes are not whole {t} blocks of {bb} bytes", src.len()),
        ));
    }
    let mut dst = vec![0u8; device_bytes(t, src.len() / bb)];
    repack(t, src, &mut dst);
    Ok(dst)
}

/// Copies one plane's bytes out of every block of `src` into `dst`.
pub fn repack_plane(src: &[u8], block_bytes: usize, plane: &Plane, dst: &mut [u8]) {
    for (block, out) in src
        .chunks_exact(block_bytes)
        .zip(dst.chunks_exact_mut(plane.bytes))
    {
        out.copy_from_slice(&block[plane.src_offset..plane.src_offset + plane.bytes]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_block_sizes_match_the_documented_layouts() {
        let expect = [
            (QuantType::Q4_0, 18),
            (QuantType::Q4_1, 20),
            (QuantType::Q5_0, 22),
            (QuantType::Q5_1, 24),
            (QuantType::Q8_0, 34),
            (QuantType::Q2K, 84),
            (QuantType::Q3K, 110),
            (QuantType::Q4K, 144),
            (QuantType::Q5K, 176),
            (QuantType::Q6K, 210),
        ];
        for (t, bytes) in expect {
            let l = DeviceLayout::of(t).expect("quantized");
            assert_eq!(l.block_bytes(), bytes, "{t}");
            // Planes and scales cover the GGUF block exactly once.
            let covered: usize =
                l.planes.iter().map(|p| p.bytes).sum::<usize>() + 2 * l.scales.len();
            assert_eq!(covered, t.block_bytes(), "{t}");
            assert!(l.planes.iter().all(|p| p.bytes % 4 == 0), "{t}");
            // The scales are one range of the block.
            assert!(l.scales.windows(2).all(|w| w[1] == w[0] + 2), "{t}");
        }
    }
}
