//! The rows family (`glsl/matmul_rows.comp`): one invocation per output row
//! (several rows each) walking tiles of tokens, activations loaded as
//! uniform vec4s; the kernel CPU devices such as lavapipe run, where a
//! workgroup is one thread and its invocations are SIMD lanes. It stores,
//! adds into the output and adds the bias; it folds nothing else.

use super::{ChunkDims, Input, LinearCall, Output, unsupported};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};
use crate::ops::params::RowsParams;
use crate::ops::pc_u32;

/// Invocations per workgroup.
const ROWS_WG: usize = 64;

/// (tokens per tile, rows per invocation) for `n` tokens: tiles as wide as
/// the batch (up to a register budget) so each weight is dequantized once
/// per tile.
fn rows_tiling(n: usize) -> (usize, usize) {
    // Wider tiles ran somewhat faster on lavapipe (16 rows per invocation for
    // one token, 16 tokens × 8 rows for batches) but LLVM then takes minutes
    // to compile the 13 weight formats' pipelines, which every process pays.
    match n {
        1 => (1, 8),
        2..=8 => (8, 4),
        _ => (16, 4),
    }
}

/// Records a product on the rows kernel, one dispatch per chunk.
///
/// # Errors
/// Anything but 4-float-aligned f32 in and a plain store or accumulation
/// out, or a value beyond 32 bits.
pub(super) fn record(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    let (Input::F32(x), Output::Store(out) | Output::Accumulate(out)) = (call.input, call.output)
    else {
        return Err(unsupported("matmul_rows", call));
    };
    if !x.offset.is_multiple_of(4) || !x.ld.is_multiple_of(4) {
        return Err(ModelError::kernel(
            "matmul_rows",
            format!("input at float {} stride {} (vec4 loads)", x.offset, x.ld),
        ));
    }
    let flags = call.store_flags(RowsParams::ACCUMULATE, RowsParams::BIAS);
    let n = call.n();
    let (tn, rpi) = rows_tiling(n);
    for chunk in call.weight.chunks() {
        let d = ChunkDims::new(call, chunk, 4)?;
        let params = RowsParams {
            k: d.k,
            m: d.m,
            nb: d.nb,
            row_offset: d.row_offset,
            n: d.n,
            ld_x: d.ld_x,
            ld_d: d.ld_d,
            x_offset: d.x_offset,
            d_offset: d.d_offset,
            flags,
        };
        let groups = [
            pc_u32("groups", chunk.n_rows.div_ceil(ROWS_WG * rpi))?,
            pc_u32("groups", n.div_ceil(tn))?,
            1,
        ];
        rec.dispatch(
            Kernel::rows(call.weight.qtype()),
            &[ROWS_WG as u32, tn as u32, rpi as u32],
            &[
                Binding::read(&chunk.buffer),
                Binding::read(x.buf),
                Binding::write(out.buf),
                Binding::read(call.bias.unwrap_or(x.buf)),
            ],
            bytemuck::bytes_of(&params),
            groups,
        )?;
    }
    Ok(())
}
