//! What one dispatch binds: buffer ranges with how the dispatch uses them
//! (the recording tracks hazards by it), and the workgroup counts of a
//! one-dimensional dispatch within the device's limits.

use std::sync::Arc;

use super::buffer::Buffer;
use super::context::GpuContext;

/// How a dispatch uses a bound buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only read.
    Read,
    /// Written (and possibly read).
    Write,
}

/// A buffer range bound to one descriptor of a dispatch.
#[derive(Clone)]
pub struct Binding<'a> {
    /// The buffer.
    pub buffer: &'a Arc<Buffer>,
    /// Start of the range in bytes (a multiple of `minStorageBufferOffsetAlignment`).
    pub offset: u64,
    /// Length in bytes; `None` for the rest of the buffer.
    pub size: Option<u64>,
    /// Read or write.
    pub access: Access,
}

impl<'a> Binding<'a> {
    /// The whole buffer, read only.
    pub fn read(buffer: &'a Arc<Buffer>) -> Self {
        Binding {
            buffer,
            offset: 0,
            size: None,
            access: Access::Read,
        }
    }

    /// The whole buffer, written.
    pub fn write(buffer: &'a Arc<Buffer>) -> Self {
        Binding {
            buffer,
            offset: 0,
            size: None,
            access: Access::Write,
        }
    }

    /// A sub-range of this binding's buffer.
    pub fn range(mut self, offset: u64, size: u64) -> Self {
        self.offset = offset;
        self.size = Some(size);
        self
    }
}

/// Workgroup counts for `n` groups, folded into y when x would pass the device limit.
/// Kernels recover the linear id as `gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x`
/// and must ignore ids `>= n`.
pub fn groups_1d(ctx: &GpuContext, n: u32) -> [u32; 3] {
    let max_x = ctx.caps().max_workgroup_count[0].clamp(1, 65535);
    if n <= max_x {
        [n.max(1), 1, 1]
    } else {
        [max_x, n.div_ceil(max_x), 1]
    }
}
