//! The skinny family (`glsl/matmul_skinny.comp`): cooperative-matrix
//! products of 9-128 tokens (batched decode), each subgroup streaming its
//! own chunks of K through its own staging area without workgroup
//! barriers. Besides the cooperative epilogue (rope, gated activation) it
//! takes f16 activations as they are, writes the gated output as f16, and
//! carries the RMS norm between two products: the producer writes each
//! token's sums of squares of what it stored, the consumer folds the norm
//! into its input from them.

use super::coop::{Epilogue, family_bindings, rope_fold, tile_groups};
use super::{CoopTile, Input, LinearCall, Output, unsupported};
use crate::error::Result;
use crate::gpu::{Binding, Kernel, Recording};
use crate::ops::params::SkinnyParams;
use crate::ops::pc_u32;
use crate::ops::rms_norm::NormFlavor;
use crate::quant::WeightChunk;

/// Fewest tokens the cooperative-matrix products take on GPUs that have
/// them (fewer run on the matvec, which reads each weight once per
/// token). From 4 tokens the skinny kernel's padded 16-token block costs
/// less than the matvec's repeated reads: on the H200, llama-1b, µs, matvec
/// at 4 tokens against the skinny kernel at 16: Q/K/V 13.8 / 13.6, output
/// 11.3 / 11.0, gate/up 37.9 / 29.6, down 29.2 / 27.6, head 253 / 176
/// (`combs kernel-bench --preset llama-1b --tokens 4,16 --x-f16`); at 3
/// tokens the matvec's three reads are cheaper in all but the head.
pub const SKINNY_MIN_TOKENS: usize = 4;

/// Most tokens the cooperative-matrix products stream through
/// `matmul_skinny.comp`. Up to 128 its streaming tiles (two 16-token blocks
/// per workgroup past 16 tokens) beat the tiled kernel's, whose few row
/// tiles leave most of a big GPU idle at these token counts: on the H200,
/// llama-1b at 128 tokens, Q/K/V 35.7 against 56.8 µs, output 24.2
/// against 57.2, gate/up 127.7 against 131.2, down 68.5 against 200.4
/// (`combs kernel-bench --preset llama-1b --tokens 128 --coop-tiles ...
/// --x-f16`).
pub const SKINNY_MAX_TOKENS: usize = 128;

/// Records one chunk's product on the skinny kernel.
///
/// # Errors
/// Unaligned activations, a tile that is not skinny or does not fit the
/// device, or a value beyond 32 bits.
pub(super) fn record_chunk(
    rec: &mut Recording,
    call: &LinearCall<'_>,
    chunk: &WeightChunk,
    tile: CoopTile,
) -> Result<()> {
    let x = call.input.x();
    if !x.aligned4() || !tile.skinny {
        return Err(unsupported("matmul_skinny", call));
    }
    let groups = tile_groups(rec.context(), tile, chunk.n_rows, call.n())?;
    let t = call.weight.qtype();
    let (kernel, norm) = match call.input {
        Input::F32(_) => (Kernel::skinny_f32(t), None),
        Input::F16(_) => (Kernel::skinny_f16(t), None),
        Input::NormedBySquares { norm, squares, .. } => {
            (Kernel::skinny_f32_norm(t), Some((norm, squares)))
        }
        Input::Normed { .. } => return Err(unsupported("matmul_skinny", call)),
    };
    let (ep, squares_out) = match call.output {
        // One binding carries the sums in or out, never both.
        Output::AccumulateSquares { .. } if norm.is_some() => {
            return Err(unsupported("matmul_skinny", call));
        }
        Output::AccumulateSquares { squares, .. } => (None, Some(squares)),
        out => (Epilogue::of(out), None),
    };
    let mut flags = call.store_flags(SkinnyParams::ACCUMULATE, SkinnyParams::BIAS);
    if let Some(ep) = &ep {
        flags |= ep.flags(SkinnyParams::GLU, SkinnyParams::GELU, SkinnyParams::ROPE);
        if ep.f16_out {
            flags |= SkinnyParams::OUT_F16;
        }
    }
    let folded = ep.as_ref().and_then(|e| e.rope);
    if squares_out.is_some() {
        flags |= SkinnyParams::SQUARES_OUT;
    }
    if let Some((nm, _)) = norm
        && nm.flavor == NormFlavor::ZeroCentred
    {
        flags |= SkinnyParams::NORM_ZERO_CENTRED;
    }
    let sq = squares_out.or(norm.map(|(_, s)| s));
    let params = SkinnyParams {
        dims: super::chunk_dims(call, chunk, 1)?,
        flags,
        rope: rope_fold(folded)?,
        sq_offset: pc_u32("sq_offset", sq.map_or(0, |q| q.offset))?,
        sq_groups: pc_u32("sq_groups", sq.map_or(0, |q| q.groups))?,
        eps: norm.map_or(0.0, |(nm, _)| nm.eps),
    };
    let xb = x.buf();
    let [a, xs, d, bias, pos, freq, dh] = family_bindings(call, chunk, folded);
    rec.dispatch(
        kernel,
        &tile.spec()?,
        &[
            a,
            xs,
            d,
            bias,
            pos,
            freq,
            dh,
            match (squares_out, norm) {
                (Some(s), _) => Binding::write(s.buf),
                (None, Some((_, s))) => Binding::read(s.buf),
                (None, None) => Binding::read(xb),
            },
            Binding::read(norm.map_or(xb, |(nm, _)| nm.weight)),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}
