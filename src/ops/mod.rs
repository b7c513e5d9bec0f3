//! One Rust wrapper per kernel family: push-constant structs, shape checks,
//! variant choice and dispatch recording (never submission), plus the scalar
//! reference each kernel is tested against.

pub mod act_round;
pub mod attention;
pub mod dequant;
pub mod get_rows;
pub mod glu;
pub mod linear;
pub mod rms_norm;
pub mod rope;

use std::sync::Arc;

use crate::gpu::{Buffer, GpuContext};

/// A row-major f32 matrix inside a buffer: row `i` starts at float `offset + i * ld`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    /// The buffer holding the matrix.
    pub buf: &'a Arc<Buffer>,
    /// Float index of row 0.
    pub offset: usize,
    /// Floats between consecutive rows.
    pub ld: usize,
}

impl<'a> View<'a> {
    /// Rows of `ld` floats from the start of `buf`.
    pub fn new(buf: &'a Arc<Buffer>, ld: usize) -> Self {
        View { buf, offset: 0, ld }
    }

    /// The same rows, starting `cols` floats further (a column slice).
    pub fn shift(self, cols: usize) -> Self {
        View {
            offset: self.offset + cols,
            ..self
        }
    }
}

/// Workgroup size for elementwise kernels.
pub(crate) const ELEMENTWISE_WG: u32 = 256;

/// The subgroup size kernels may rely on, or 1 where the driver may pick
/// another size at run time (then kernels use their shared-memory paths).
pub(crate) fn kernel_subgroup(ctx: &GpuContext) -> u32 {
    let c = ctx.caps();
    if c.subgroup_size_control || c.min_subgroup_size == c.max_subgroup_size {
        c.subgroup_size
    } else {
        1
    }
}

/// Converts a size to the u32 a push constant carries.
///
/// # Errors
/// The value does not fit 32 bits.
pub(crate) fn pc_u32(name: &'static str, v: usize) -> crate::Result<u32> {
    u32::try_from(v).map_err(|_| crate::ModelError::invalid(name, format!("{v} exceeds 32 bits")))
}
