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

/// A row-major matrix inside a buffer: row `i` starts at element `offset + i * ld`.
/// Elements are f32, or f16 where `f16` says so (the activations some
/// kernels hand to the cooperative-matrix products of batched decode, which
/// take them as f16 anyway); only the kernels that document it take f16.
#[derive(Clone, Copy)]
pub struct View<'a> {
    /// The buffer holding the matrix.
    pub buf: &'a Arc<Buffer>,
    /// Element index of row 0.
    pub offset: usize,
    /// Elements between consecutive rows.
    pub ld: usize,
    /// Elements are f16 rather than f32.
    pub f16: bool,
}

impl<'a> View<'a> {
    /// Rows of `ld` floats from the start of `buf`.
    pub fn new(buf: &'a Arc<Buffer>, ld: usize) -> Self {
        View {
            buf,
            offset: 0,
            ld,
            f16: false,
        }
    }

    /// Rows of `ld` f16 elements from the start of `buf`.
    pub fn new_f16(buf: &'a Arc<Buffer>, ld: usize) -> Self {
        View {
            f16: true,
            ..Self::new(buf, ld)
        }
    }

    /// The same rows, starting `cols` elements further (a column slice).
    pub fn shift(self, cols: usize) -> Self {
        View {
            offset: self.offset + cols,
            ..self
        }
    }
}

/// Refuses f16 views where `kernel` reads or writes f32 only.
pub(crate) fn expect_f32(kernel: &str, views: &[View<'_>]) -> crate::error::Result<()> {
    if views.iter().any(|v| v.f16) {
        return Err(crate::ModelError::Internal(format!(
            "{kernel} takes f32 activations only"
        )));
    }
    Ok(())
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
