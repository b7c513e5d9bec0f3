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

/// The GGUF rows of a `[rows, cols]` tensor wherever they lie: one tensor's
/// bytes, or the rows of several tensors one after another or in turn (q/k/v
/// or gate/up stacked into one weight), read in place from the file with no
/// intermediate copy.
#[derive(Clone, Debug)]
pub struct RowSource<'a> {
    parts: Vec<&'a [u8]>,
    row_bytes: usize,
    interleave: bool,
    rows: usize,
}

impl<'a> RowSource<'a> {
    /// Rows of `row_bytes` bytes: those of `parts[0]`, then `parts[1]`, ...;
    /// with `interleave`, row 0 of each part in turn, then row 1 of each, ...
    ///
    /// # Errors
    /// A part that is not whole rows, or interleaved parts of different lengths.
    pub fn new(parts: Vec<&'a [u8]>, row_bytes: usize, interleave: bool) -> Result<Self> {
        let bad = |what: String| Err(ModelError::invalid("rows", what));
        if row_bytes == 0 {
            return bad("rows of 0 bytes".into());
        }
        if let Some(p) = parts.iter().find(|p| !p.len().is_multiple_of(row_bytes)) {
            return bad(format!(
                "{} bytes are not whole rows of {row_bytes}",
                p.len()
            ));
        }
        if interleave && parts.iter().any(|p| p.len() != parts[0].len()) {
            return bad("interleaved parts of different lengths".into());
        }
        let rows = parts.iter().map(|p| p.len() / row_bytes).sum();
        Ok(RowSource {
            parts,
            row_bytes,
            interleave,
            rows,
        })
    }

    /// One tensor's rows.
    ///
    /// # Errors
    /// As [`RowSource::new`].
    pub fn single(bytes: &'a [u8], row_bytes: usize) -> Result<Self> {
        Self::new(vec![bytes], row_bytes, false)
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Row `r`'s bytes.
    ///
    /// # Panics
    /// If `r >= self.rows()`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes;
        if self.interleave {
            let n = self.parts.len();
            let i = r / n;
            return &self.parts[r % n][i * rb..(i + 1) * rb];
        }
        let mut r = r;
        for p in &self.parts {
            let n = p.len() / rb;
            if r < n {
                return &p[r * rb..(r + 1) * rb];
            }
            r -= n;
        }
        panic!("RowSource::row: row past the end");
    }
}

/// Writes bytes `pos..pos + out.len()` of the device layout of rows
/// `row_start..row_start + n_rows` of `src` (whole blocks of `t`): any
/// piece of what [`repack`] writes for those rows, so pieces are filled in
/// parallel and straight into staging memory.
///
/// # Panics
/// If the rows or the range lie past the end of `src` or of the layout.
pub fn repack_rows(
    t: QuantType,
    src: &RowSource<'_>,
    row_start: usize,
    n_rows: usize,
    pos: usize,
    out: &mut [u8],
) {
    let bb = t.block_bytes();
    let nb_row = src.row_bytes / bb;
    let nb = n_rows * nb_row;
    let total = device_bytes(t, nb);
    assert!(pos + out.len() <= total, "repack_rows: range past the end");
    assert!(
        row_start + n_rows <= src.rows,
        "repack_rows: rows past the end"
    );
    // Each segment of the layout: its first byte, length and what fills it.
    let mut segments: Vec<(usize, usize, Option<Plane>)> = Vec::with_capacity(4);
    let data_end = match DeviceLayout::of(t) {
        None => {
            segments.push((0, nb * bb, None));
            nb * bb
        }
        Some(layout) => {
            for (i, plane) in layout.planes.iter().enumerate() {
                segments.push((layout.plane_offset(i, nb), nb * plane.bytes, Some(*plane)));
            }
            let sp = layout.scale_plane();
            let base = layout.plane_offset(layout.planes.len(), nb);
            segments.push((base, nb * sp.bytes, Some(sp)));
            base + nb * sp.bytes
        }
    };
    let end = pos + out.len();
    for (start, len, plane) in segments {
        let (a, b) = (start.max(pos), (start + len).min(end));
        if a >= b {
            continue;
        }
        let dst = &mut out[a - pos..b - pos];
        let rows = (src, row_start, nb_row, bb);
        match plane {
            Some(p) => fill_plane_rows(rows, &p, a - start, dst),
            None => fill_dense_rows(src, row_start, a - start, dst),
        }
    }
    // The padding to a whole word.
    if end > data_end {
        out[data_end.max(pos) - pos..].fill(0);
    }
}

/// Bytes `at..` of the stream of `plane` over every block of the rows.
fn fill_plane_rows(
    (src, row_start, nb_row, bb): (&RowSource<'_>, usize, usize, usize),
    plane: &Plane,
    at: usize,
    out: &mut [u8],
) {
    let pb = plane.bytes;
    let mut written = 0;
    while written < out.len() {
        let p = at + written;
        let (blk, within) = (p / pb, p % pb);
        let (r, b) = (blk / nb_row, blk % nb_row);
        let row = src.row(row_start + r);
        let rest = &mut out[written..];
        if within != 0 || rest.len() < pb {
            // A piece starting or ending inside a block.
            let n = (pb - within).min(rest.len());
            let s = b * bb + plane.src_offset + within;
            rest[..n].copy_from_slice(&row[s..s + n]);
            written += n;
        } else {
            let k = (nb_row - b).min(rest.len() / pb);
            copy_plane(
                &row[b * bb..(b + k) * bb],
                bb,
                plane.src_offset,
                pb,
                &mut rest[..k * pb],
            );
            written += k * pb;
        }
    }
}

/// Bytes `at..` of the rows one after another (dense types).
fn fill_dense_rows(src: &RowSource<'_>, row_start: usize, at: usize, out: &mut [u8]) {
    let rb = src.row_bytes;
    let mut written = 0;
    while written < out.len() {
        let p = at + written;
        let (r, within) = (p / rb, p % rb);
        let row = src.row(row_start + r);
        let n = (rb - within).min(out.len() - written);
        out[written..written + n].copy_from_slice(&row[within..within + n]);
        written += n;
    }
}

/// [`repack_plane`] with the plane's width a constant for the widths the
/// formats use, so each block's copy is a few moves rather than a `memcpy` call.
fn copy_plane(src: &[u8], bb: usize, off: usize, pb: usize, dst: &mut [u8]) {
    fn fixed<const N: usize>(src: &[u8], bb: usize, off: usize, dst: &mut [u8]) {
        for (block, out) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(N)) {
            out.copy_from_slice(&block[off..off + N]);
        }
    }
    match pb {
        2 => fixed::<2>(src, bb, off, dst),
        4 => fixed::<4>(src, bb, off, dst),
        12 => fixed::<12>(src, bb, off, dst),
        16 => fixed::<16>(src, bb, off, dst),
        32 => fixed::<32>(src, bb, off, dst),
        64 => fixed::<64>(src, bb, off, dst),
        128 => fixed::<128>(src, bb, off, dst),
        _ => repack_plane(src, bb, &p(off, pb), dst),
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

    /// Splits `len` bytes at a few awkward places (inside blocks, across
    /// planes and rows).
    fn pieces(len: usize, seed: usize) -> Vec<(usize, usize)> {
        let mut cuts = vec![0, len];
        let mut x = seed.wrapping_mul(2654435761) | 1;
        for _ in 0..7 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cuts.push(x % (len + 1));
        }
        cuts.sort_unstable();
        cuts.windows(2).map(|w| (w[0], w[1])).collect()
    }

    #[test]
    fn repack_rows_pieces_match_repack_of_stacked_rows() {
        let types = [
            QuantType::F32,
            QuantType::F16,
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q5_0,
            QuantType::Q5_1,
            QuantType::Q8_0,
            QuantType::Q2K,
            QuantType::Q3K,
            QuantType::Q4K,
            QuantType::Q5K,
            QuantType::Q6K,
        ];
        for (ti, t) in types.into_iter().enumerate() {
            let row_bytes = 3 * t.block_bytes();
            let parts: Vec<Vec<u8>> = (0..3)
                .map(|k| {
                    (0..4 * row_bytes)
                        .map(|i| (i * 7 + k * 101 + ti) as u8)
                        .collect()
                })
                .collect();
            for interleave in [false, true] {
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                let src = RowSource::new(refs, row_bytes, interleave).expect("whole rows");
                let stacked: Vec<u8> = (0..src.rows()).flat_map(|r| src.row(r)).copied().collect();
                // Every chunk of rows, as the upload splits a weight.
                for (row_start, n_rows) in [(0, 12), (0, 5), (5, 7), (11, 1)] {
                    let rows = &stacked[row_start * row_bytes..(row_start + n_rows) * row_bytes];
                    let want = repack_vec(t, rows).expect("whole blocks");
                    let mut got = vec![0xAAu8; want.len()];
                    for (a, b) in pieces(want.len(), ti + row_start) {
                        repack_rows(t, &src, row_start, n_rows, a, &mut got[a..b]);
                    }
                    assert_eq!(
                        got, want,
                        "{t} interleave {interleave} rows {row_start}+{n_rows}"
                    );
                }
            }
        }
    }

    #[test]
    fn row_source_rejects_partial_rows() {
        let a = [0u8; 36];
        let b = [0u8; 18];
        assert!(RowSource::new(vec![&a[..35]], 18, false).is_err());
        assert!(RowSource::new(vec![&a, &b], 18, true).is_err());
        assert!(RowSource::new(vec![&a, &b], 18, false).is_ok());
        assert!(RowSource::single(&a, 0).is_err());
    }
}
