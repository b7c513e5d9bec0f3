//! The rows family (`glsl/matmul_rows.comp`): one invocation per output row
//! (several rows each) walking tiles of tokens, activations loaded as
//! uniform vec4s; the kernel CPU devices such as lavapipe run, where a
//! workgroup is one thread and its invocations are SIMD lanes. It stores,
//! adds into the output and adds the bias; it folds nothing else.

use super::{LinearCall, PlainKernel, record_plain};
use crate::error::{ModelError, Result};
use crate::gpu::{Kernel, Recording};
use crate::ops::params::RowsParams;

/// Invocations per workgroup.
const ROWS_WG: usize = 64;
const _: () = assert!(RowsParams::ACCUMULATE == 1 && RowsParams::BIAS == 2);

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
    let x = call.input.x();
    let (offset, _, _, ld) = x.layout();
    if !offset.is_multiple_of(4) || !ld.is_multiple_of(4) {
        return Err(ModelError::kernel(
            "matmul_rows",
            format!("input at float {offset} stride {ld} (vec4 loads)"),
        ));
    }
    let (tn, rpi) = rows_tiling(call.n());
    let kernel = PlainKernel {
        name: "matmul_rows",
        kernel: Kernel::rows(call.weight.qtype()),
        spec: vec![ROWS_WG as u32, tn as u32, rpi as u32],
        tile: (ROWS_WG * rpi, tn),
        x_unit: 4,
    };
    record_plain(rec, call, kernel, |dims, flags| RowsParams { dims, flags })
}
