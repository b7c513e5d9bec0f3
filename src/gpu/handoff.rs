//! Hand-off between dependent dispatches: the chain state of a
//! [`super::Recording`] whose kernels wait for each other through memory
//! instead of pipeline barriers (`glsl/common/handoff.glsl`).
//!
//! Every dispatch of a chain gets two slots of one small buffer: the slot
//! of the dispatch before it, which it waits on until that dispatch's last
//! workgroup sets its `done` word, and its own, where its workgroups count
//! themselves. Each dispatch therefore starts its work only after the one
//! before has finished, and by induction after every earlier dispatch of
//! the chain: the order a barrier between each pair gives, without the
//! drain and restart of the GPU a barrier costs. A chain starts after a
//! full barrier (and a fill that clears the slots, once per command
//! buffer) and ends with one before any command without a twin. A waiter
//! that gives up (about a second) sets a host-visible fault word, and the
//! submission fails with [`crate::ModelError::HandoffTimeout`].

use std::sync::Arc;

use super::buffer::{Buffer, MemoryKind};
use super::context::GpuContext;
use crate::error::Result;

/// The environment switch: `COMBS_HANDOFF=1` chains dispatches by hand-off.
pub const HANDOFF_ENV: &str = "COMBS_HANDOFF";

/// Whether the environment asks for hand-offs.
pub fn requested() -> bool {
    std::env::var(HANDOFF_ENV).is_ok_and(|v| v == "1")
}

/// The environment's filter on which kernels hand off (for finding the one
/// a driver mishandles): `COMBS_HANDOFF_KERNELS=matvec,rms_norm` lets only
/// kernels whose names start with one of the entries hand off,
/// `COMBS_HANDOFF_KERNELS=-matmul_coop` all but those.
pub const HANDOFF_KERNELS_ENV: &str = "COMBS_HANDOFF_KERNELS";

/// Whether [`HANDOFF_KERNELS_ENV`] lets the kernel named `name` hand off.
pub(crate) fn kernel_allowed(name: &str) -> bool {
    static FILTER: std::sync::OnceLock<(Vec<String>, Vec<String>)> = std::sync::OnceLock::new();
    let (only, not) = FILTER.get_or_init(|| {
        let v = std::env::var(HANDOFF_KERNELS_ENV).unwrap_or_default();
        let entries = v.split(',').map(str::trim).filter(|e| !e.is_empty());
        let (not, only): (Vec<&str>, Vec<&str>) = entries.partition(|e| e.starts_with('-'));
        (
            only.iter().map(|e| e.to_string()).collect(),
            not.iter().map(|e| e[1..].to_string()).collect(),
        )
    });
    (only.is_empty() || only.iter().any(|e| name.starts_with(e.as_str())))
        && !not.iter().any(|e| name.starts_with(e.as_str()))
}

/// Slots per command buffer (slot 0 is always done: a chain's first
/// dispatch waits on it; the last is never given out, so it never
/// completes: [`super::Fault::HandoffStall`] waits on it). Past them,
/// dispatches take barriers again.
pub(crate) const SLOTS: u32 = 4096;

/// Bytes of a slot's words: count, done, two unused.
pub(crate) const SLOT_BYTES: u64 = 16;

/// A recording's hand-off slots and where its chain stands.
pub(crate) struct Chain {
    /// The slots.
    pub buffer: Arc<Buffer>,
    /// One host-visible word a waiter that gave up sets.
    pub fault: Arc<Buffer>,
    /// Bytes between slots (a slot, rounded up to the device's storage
    /// offset alignment).
    pub stride: u64,
    /// The next slot to give out in this command buffer.
    pub next: u32,
    /// The previous dispatch's slot while the chain goes on.
    pub last: Option<u32>,
}

impl Chain {
    /// Allocates the slots.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn new(ctx: &Arc<GpuContext>) -> Result<Self> {
        let stride = SLOT_BYTES.max(ctx.caps().storage_offset_alignment);
        let buffer = Buffer::new(
            ctx,
            stride * u64::from(SLOTS),
            MemoryKind::Device,
            "hand-off slots",
        )?;
        let fault = Buffer::new(ctx, 16, MemoryKind::Readback, "hand-off fault word")?;
        Ok(Chain {
            buffer,
            fault,
            stride,
            next: 1,
            last: None,
        })
    }

    /// Whether this command buffer has cleared the slots: it has given
    /// one out.
    pub fn cleared(&self) -> bool {
        self.next > 1
    }

    /// Starts over in a new command buffer (which clears the slots again).
    pub fn restart(&mut self) {
        self.next = 1;
        self.last = None;
    }
}
