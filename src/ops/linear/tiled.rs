//! The tiled family (`glsl/matmul.comp`): 64-row × 32-token tiles through
//! shared memory, f32 throughout; the portable path for prompts where no
//! cooperative matrices exist. It stores, adds into the output and adds the
//! bias; it folds nothing else.

use super::{ChunkDims, Input, LinearCall, Output, unsupported};
use crate::error::Result;
use crate::gpu::{Binding, Kernel, Recording};
use crate::ops::params::TiledParams;
use crate::ops::pc_u32;

const MATMUL_BM: usize = 64;
const MATMUL_BN: usize = 32;

/// Records a product on the tiled kernel, one dispatch per chunk.
///
/// # Errors
/// Anything but f32 in and a plain store or accumulation out, or a value
/// beyond 32 bits.
pub(super) fn record(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    let (Input::F32(x), Output::Store(out) | Output::Accumulate(out)) = (call.input, call.output)
    else {
        return Err(unsupported("matmul", call));
    };
    let flags = call.store_flags(TiledParams::ACCUMULATE, TiledParams::BIAS);
    for chunk in call.weight.chunks() {
        let d = ChunkDims::new(call, chunk, 1)?;
        let params = TiledParams {
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
            pc_u32("groups", chunk.n_rows.div_ceil(MATMUL_BM))?,
            pc_u32("groups", call.n().div_ceil(MATMUL_BN))?,
            1,
        ];
        rec.dispatch(
            Kernel::tiled(call.weight.qtype()),
            &[],
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
