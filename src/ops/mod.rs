//! One Rust wrapper per kernel family — a call struct naming its operands as
//! typed views ([`Mat`]), shape checks, variant choice and dispatch recording
//! (never submission) — plus the scalar reference each kernel is tested
//! against; and the planner ([`plan`]) that turns a model's blocks, stated
//! as what to compute, into kernels and fusions for a device and a shape.

pub mod act_round;
pub mod attention;
pub mod backend;
pub mod bandwidth;
pub mod dequant;
pub mod get_rows;
pub mod glu;
pub mod host;
pub mod im2col;
pub mod kv_store;
pub mod layer_norm;
pub mod linear;
pub mod mat;
pub mod params;
pub mod plan;
pub mod quantize_q8_1;
pub mod rms_norm;
pub mod rope;
pub mod softcap;
pub mod topk;
pub mod unary;

pub use mat::{AnyMat, DType, Elem, Mat};

use crate::gpu::{DeviceClass, GpuContext};

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

/// Whether the device is the host's CPU (lavapipe), which takes the
/// portable kernels (uniform loads, no shared-memory staging).
pub(crate) fn is_cpu(ctx: &GpuContext) -> bool {
    ctx.caps().class() == DeviceClass::Cpu
}

/// Whether `buf` holds `bytes`.
///
/// # Errors
/// `BufferTooSmall` when it does not.
pub(crate) fn room(buf: &crate::gpu::Buffer, bytes: u64) -> crate::Result<()> {
    if buf.size() < bytes {
        return Err(crate::ModelError::BufferTooSmall {
            needed: bytes as usize,
            got: buf.size() as usize,
        });
    }
    Ok(())
}

/// Converts a size to the u32 a push constant carries.
///
/// # Errors
/// The value does not fit 32 bits.
pub(crate) fn pc_u32(name: &'static str, v: usize) -> crate::Result<u32> {
    u32::try_from(v).map_err(|_| crate::ModelError::invalid(name, format!("{v} exceeds 32 bits")))
}
