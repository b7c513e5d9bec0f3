//! `quantize_q8_1`: token rows of f32 activations to 8-bit blocks of 32
//! with an f16 scale, the input of the integer-dot-product matvec
//! ([`super::linear::matvec_q8`]). Per block the rounding is llama.cpp's
//! `quantize_row_q8_1` (the AVX2 path, as [`super::act_round`]'s
//! `Q8_0`): `d = f16(amax / 127)`, `q = round_ties_even(x * (127 / amax))`.
//! Where `block_q8_1` keeps `s = f16(d · Σq)`, this keeps `Σq` itself, so
//! Q4_0's offset of 8 comes out of the integer sum exactly, as in ggml-cpu's
//! `vec_dot_q4_0_q8_0`. An RMS norm may be folded in (the rms_norm
//! kernel's arithmetic in its order, then the rounding).
//!
//! A token's row, in 32-bit words (`glsl/quantize_q8_1.comp`): `K/32` blocks
//! of 8 words of `int8` (byte `i` of word `j` of a block is `q[4j + i]`),
//! then `K/32` words of (`f16 d` low, `int16 Σq` high), padded to 4 words.

use std::sync::Arc;

use half::f16;

use super::params::QuantizeQ81Params;
use super::rms_norm::{NormFlavor, NormWeight};
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};

/// Values one workgroup quantizes (`QWG` invocations of 4 in
/// `glsl/quantize_q8_1.comp`).
const QUANTIZE_CHUNK: usize = 1024;

/// Token rows of 8-bit blocks in a buffer of words, as
/// `glsl/quantize_q8_1.comp` writes them.
#[derive(Clone, Copy, Debug)]
pub struct Q8Rows<'a> {
    /// The buffer.
    pub buf: &'a Arc<Buffer>,
    /// Word index of token 0's row (a multiple of 4).
    pub offset: usize,
    /// Tokens.
    pub rows: usize,
    /// Activations per token (a multiple of 32).
    pub cols: usize,
    /// Words between tokens' rows (a multiple of 4, at least [`Q8Rows::row_words`]).
    pub ld: usize,
}

impl<'a> Q8Rows<'a> {
    /// Words of one token's row of `cols` activations: 9 per block, padded
    /// to 4 so that every row starts on a 16-byte boundary.
    pub fn row_words(cols: usize) -> usize {
        (cols / 32 * 9).next_multiple_of(4)
    }

    /// `rows` packed rows of `cols` activations from the start of `buf`.
    pub fn new(buf: &'a Arc<Buffer>, rows: usize, cols: usize) -> Self {
        Q8Rows {
            buf,
            offset: 0,
            rows,
            cols,
            ld: Self::row_words(cols),
        }
    }

    /// Checks the layout: whole blocks, aligned rows inside the buffer.
    ///
    /// # Errors
    /// Columns not a multiple of 32, an unaligned offset or stride, rows
    /// that overlap or pass the buffer's end.
    pub fn check(&self, what: &'static str) -> Result<()> {
        let bad = |why: String| Err(ModelError::invalid(what, why));
        if !self.cols.is_multiple_of(32) {
            return bad(format!("{} columns (not a multiple of 32)", self.cols));
        }
        if !self.offset.is_multiple_of(4) || (self.rows > 1 && !self.ld.is_multiple_of(4)) {
            return bad(format!(
                "word offset {} / stride {} (not multiples of 4)",
                self.offset, self.ld
            ));
        }
        if self.rows > 1 && self.ld < Self::row_words(self.cols) {
            return bad(format!("stride {} below a row's words", self.ld));
        }
        let end = match self.rows {
            0 => Some(self.offset),
            r => (r - 1)
                .checked_mul(self.ld)
                .and_then(|v| v.checked_add(self.offset + Self::row_words(self.cols))),
        };
        match end.and_then(|e| e.checked_mul(4)) {
            Some(b) if b as u64 <= self.buf.size() => Ok(()),
            _ => bad(format!(
                "{} rows of {} words at {} pass the buffer's {} bytes",
                self.rows,
                self.ld,
                self.offset,
                self.buf.size()
            )),
        }
    }
}

/// Checks f32 rows that `kernel` quantizes (here, or in the integer
/// matvec's workgroups; `what` names them in errors) and the weight of the
/// norm folded in: whole
/// 32-blocks, rows on 16-byte boundaries (vec4 loads), a norm weight as
/// long as a row.
///
/// # Errors
/// As listed, or a view outside its buffer.
pub(crate) fn check_f32_rows(
    kernel: &'static str,
    what: &'static str,
    x: Mat<'_>,
    norm: Option<NormWeight<'_>>,
) -> Result<()> {
    x.check(what)?;
    if !x.cols.is_multiple_of(32) || !x.aligned4() {
        return Err(ModelError::kernel(
            kernel,
            format!("{x:?}: columns not whole blocks, or rows not on 16-byte boundaries"),
        ));
    }
    if let Some(nm) = norm
        && nm.weight.size() < 4 * x.cols as u64
    {
        return Err(ModelError::invalid(
            "norm weight",
            format!("{} bytes for {} columns", nm.weight.size(), x.cols),
        ));
    }
    Ok(())
}

/// Records `out = quantize(x)` (or of `x`'s RMS norm with `norm`'s weight),
/// each token's row spread over workgroups of 1024 values.
///
/// # Errors
/// `out` not of `x`'s shape, an unaligned `x` (vec4 loads), a norm weight
/// shorter than a row, views outside their buffers, or a value beyond 32 bits.
pub fn record_quantize_q8_1(
    rec: &mut Recording,
    x: Mat<'_>,
    norm: Option<NormWeight<'_>>,
    out: Q8Rows<'_>,
) -> Result<()> {
    if out.rows != x.rows || out.cols != x.cols {
        return Err(ModelError::Shape {
            tensor: "quantize_q8_1 output".into(),
            expected: vec![x.rows as u64, x.cols as u64],
            got: vec![out.rows as u64, out.cols as u64],
        });
    }
    check_f32_rows("quantize_q8_1", "quantize_q8_1 input", x, norm)?;
    out.check("quantize_q8_1 output")?;
    let mut flags = 0;
    if let Some(nm) = norm {
        flags |= QuantizeQ81Params::NORM;
        if nm.flavor == NormFlavor::ZeroCentred {
            flags |= QuantizeQ81Params::NORM_ZERO_CENTRED;
        }
    }
    let params = QuantizeQ81Params {
        k: pc_u32("k", x.cols)?,
        n_tokens: pc_u32("n_tokens", x.rows)?,
        ld_x: pc_u32("ld_x", x.ld / 4)?,
        x_offset: pc_u32("x_offset", x.offset / 4)?,
        ld_d: pc_u32("ld_d", out.ld)?,
        d_offset: pc_u32("d_offset", out.offset)?,
        flags,
        eps: norm.map_or(0.0, |nm| nm.eps),
    };
    let ctx = rec.context().clone();
    let chunks = x.cols.div_ceil(QUANTIZE_CHUNK);
    let n_groups = x.rows.saturating_mul(chunks);
    let groups = groups_1d(&ctx, pc_u32("groups", n_groups)?);
    rec.dispatch(
        Kernel::QuantizeQ81F32,
        &[],
        &[
            Binding::read(x.buf),
            Binding::write(out.buf),
            Binding::read(norm.map_or(x.buf, |nm| nm.weight)),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// One 32-block as the kernel writes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    /// The quants.
    pub qs: [i8; 32],
    /// The scale, `f16(amax / 127)`.
    pub d: f16,
    /// `Σq`.
    pub sum: i32,
}

/// CPU reference of one row (a multiple of 32 long): llama.cpp's
/// `quantize_row_q8_1` rounding, the blocks `glsl/quantize_q8_1.comp` writes.
pub fn quantize_row_q8_1_ref(x: &[f32]) -> Vec<BlockQ8_1> {
    x.chunks(32)
        .map(|b| {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = f16::from_f32(amax / 127.0);
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let mut qs = [0i8; 32];
            for (q, &v) in qs.iter_mut().zip(b) {
                // |v * id| <= 127 up to rounding, which round_ties_even keeps at 127.
                *q = (v * id).round_ties_even() as i8;
            }
            let sum = qs.iter().map(|&q| i32::from(q)).sum();
            BlockQ8_1 { qs, d, sum }
        })
        .collect()
}

/// Reads one token's row of blocks back from the words the kernel wrote
/// (`words` from the row's start).
pub fn unpack_row_q8_1(words: &[u32], cols: usize) -> Vec<BlockQ8_1> {
    let nb = cols / 32;
    (0..nb)
        .map(|b| {
            let mut qs = [0i8; 32];
            for (j, q) in qs.iter_mut().enumerate() {
                *q = (words[8 * b + j / 4] >> (8 * (j % 4))) as u8 as i8;
            }
            let s = words[8 * nb + b];
            BlockQ8_1 {
                qs,
                d: f16::from_bits(s as u16),
                sum: i32::from((s >> 16) as u16 as i16),
            }
        })
        .collect()
}

/// The words of one token's row of `blocks` as the kernel lays them out
/// (without the padding to 4 words): the inverse of [`unpack_row_q8_1`].
pub fn pack_row_q8_1(blocks: &[BlockQ8_1]) -> Vec<u32> {
    let mut words: Vec<u32> = blocks
        .iter()
        .flat_map(|b| {
            b.qs.chunks(4).map(|q| {
                q.iter()
                    .enumerate()
                    .fold(0u32, |w, (i, &v)| w | (u32::from(v as u8) << (8 * i)))
            })
        })
        .collect();
    words.extend(
        blocks
            .iter()
            .map(|b| u32::from(b.d.to_bits()) | (u32::from(b.sum as i16 as u16) << 16)),
    );
    words
}
