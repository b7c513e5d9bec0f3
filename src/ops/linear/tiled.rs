//! The tiled family (`glsl/matmul.comp`): 64-row × 32-token tiles through
//! shared memory, f32 throughout; the portable path for prompts where no
//! cooperative matrices exist. It stores, adds into the output and adds the
//! bias; it folds nothing else.

use super::{LinearCall, PlainKernel, record_plain};
use crate::error::Result;
use crate::gpu::{Kernel, Recording};
use crate::ops::params::TiledParams;

const MATMUL_BM: usize = 64;
const MATMUL_BN: usize = 32;
const _: () = assert!(TiledParams::ACCUMULATE == 1 && TiledParams::BIAS == 2);

/// Records a product on the tiled kernel, one dispatch per chunk.
///
/// # Errors
/// Anything but f32 in and a plain store or accumulation out, or a value
/// beyond 32 bits.
pub(super) fn record(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    let kernel = PlainKernel {
        name: "matmul",
        kernel: Kernel::tiled(call.weight.qtype()),
        spec: Vec::new(),
        tile: (MATMUL_BM, MATMUL_BN),
        x_unit: 1,
    };
    record_plain(rec, call, kernel, |dims, flags| TiledParams { dims, flags })
}
