//! The workgroup-scope family (`glsl/matmul_cm2.comp`, where the device has
//! `VK_NV_cooperative_matrix2`): the driver distributes each tile's
//! cooperative matrices over the workgroup and stages their loads; weights
//! come through a decode callback per format. Same bindings, push constants
//! and folded epilogues (bias, accumulation, rope, gated activation) as
//! `matmul_coop.comp`.

use super::coop::{CoopTile, Epilogue, tile_groups};
use super::{Input, LinearCall, unsupported};
use crate::error::Result;
use crate::gpu::{Binding, Kernel, Recording};
use crate::ops::params::CoopParams;
use crate::quant::WeightChunk;

/// Records one chunk's product on the workgroup-scope kernel.
///
/// # Errors
/// Input other than f32 or f16 activations, an f16 output from f32 input,
/// sums of squares out, a tile that is not a workgroup-scope tile the device
/// accepts, or a value beyond 32 bits.
pub(super) fn record_chunk(
    rec: &mut Recording,
    call: &LinearCall<'_>,
    chunk: &WeightChunk,
    tile: CoopTile,
) -> Result<()> {
    let t = call.weight.qtype();
    let (kernel, f16_in) = match call.input {
        Input::F32(_) => (Kernel::cm2(t), false),
        Input::F16(_) => (Kernel::cm2_f16(t), true),
        Input::Normed { .. } | Input::NormedBySquares { .. } => {
            return Err(unsupported("matmul_cm2", call));
        }
    };
    let Some(ep) = Epilogue::of(call.output) else {
        return Err(unsupported("matmul_cm2", call));
    };
    // f16 input comes with the f16 gated output (the next product's input).
    if (ep.f16_out && !f16_in) || !tile.nv2 {
        return Err(unsupported("matmul_cm2", call));
    }
    let groups = tile_groups(rec.context(), tile, chunk.n_rows, call.n())?;
    let mut flags = call.store_flags(CoopParams::ACCUMULATE, CoopParams::BIAS)
        | ep.flags(CoopParams::GLU, CoopParams::GELU, CoopParams::ROPE);
    if ep.f16_out {
        flags |= CoopParams::OUT_F16;
    }
    let params = CoopParams {
        dims: super::chunk_dims(call, chunk, 1)?,
        flags,
        rope: ep.rope_fields()?,
    };
    let rope = ep.rope.map(|r| *r.rope());
    let xb = call.input.x().buf();
    rec.dispatch(
        kernel,
        &tile.spec()?,
        &[
            Binding::read(&chunk.buffer),
            Binding::read(xb),
            Binding::write(call.output.out().buf()),
            Binding::read(call.bias.unwrap_or(xb)),
            Binding::read(rope.map_or(xb, |r| r.positions)),
            Binding::read(rope.map_or(xb, |r| r.inv_freq)),
            // The f16 alias of D (gated f16 outputs); unused by the f32 variant.
            Binding::write(call.output.out().buf()),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}
