//! Device loss: the sticky "lost" state of one [`GpuContext`], and the
//! fault-injection switch that fakes `VK_ERROR_DEVICE_LOST` for tests.
//!
//! Vulkan says that once a call returns `VK_ERROR_DEVICE_LOST` the logical
//! device cannot be used again; later calls may fail, return garbage or, on
//! some drivers, block. So the first loss seen anywhere (a submission, a fence
//! wait, an allocation, a map) marks the context lost, and every later
//! submission, recording and allocation fails at once with
//! [`ModelError::DeviceLost`] before it reaches the driver.
//!
//! [`GpuContext`]: super::GpuContext

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::{ModelError, Result};

/// A failure the gpu layer fakes on request (see `GpuContext::inject_fault`),
/// for tests of what the layers above do when the driver fails.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The `n`-th submission from now (1: the next) fails as if the driver
    /// returned `VK_ERROR_DEVICE_LOST`, and the context is lost from then on.
    /// A submission is a `vkQueueSubmit`, or on a CPU device a run of host
    /// steps of a recording, which stands in for one.
    DeviceLostAfter(u64),
    /// The `n`-th buffer allocation from now fails as if
    /// `vkAllocateMemory` returned `VK_ERROR_DEVICE_LOST`: where device
    /// memory is host-visible a model loads without any submission, so this
    /// is how a loss during a load is reached there.
    DeviceLostAtAllocation(u64),
}

/// The environment variable read when a context is created: a number `n`
/// arms [`Fault::DeviceLostAfter`]`(n)`, for C programs testing their
/// handling of `COMBS_ERR_DEVICE`.
pub const FAULT_ENV: &str = "COMBS_FAULT_DEVICE_LOST_AFTER";

/// Whether the device is lost, where that was first seen, and the armed fault.
#[derive(Debug, Default)]
pub(crate) struct DeviceHealth {
    lost: AtomicBool,
    first_seen: OnceLock<&'static str>,
    /// Submissions left before the injected loss; 0: none armed.
    lose_in: AtomicU64,
    /// Allocations left before the injected loss; 0: none armed.
    lose_at_alloc: AtomicU64,
}

impl DeviceHealth {
    /// A health record with the fault [`FAULT_ENV`] asks for, if any.
    pub(crate) fn from_env() -> Self {
        let h = Self::default();
        if let Some(n) = std::env::var(FAULT_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&n| n > 0)
        {
            h.inject(Fault::DeviceLostAfter(n));
        }
        h
    }

    pub(crate) fn inject(&self, fault: Fault) {
        match fault {
            Fault::DeviceLostAfter(n) => self.lose_in.store(n, Ordering::SeqCst),
            Fault::DeviceLostAtAllocation(n) => self.lose_at_alloc.store(n, Ordering::SeqCst),
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks the device lost, first seen in `call` unless seen before.
    pub(crate) fn mark_lost(&self, call: &'static str) -> ModelError {
        let first = *self.first_seen.get_or_init(|| call);
        self.lost.store(true, Ordering::SeqCst);
        ModelError::DeviceLost { call: first }
    }

    /// `Ok` while the device is not lost.
    pub(crate) fn check(&self) -> Result<()> {
        if self.is_lost() {
            let call = self.first_seen.get().copied().unwrap_or("an earlier call");
            return Err(ModelError::DeviceLost { call });
        }
        Ok(())
    }

    /// Called before each submission: fails if the device is lost, and
    /// fires an armed [`Fault::DeviceLostAfter`] when its count runs out.
    pub(crate) fn before_submission(&self) -> Result<()> {
        self.check()?;
        if count_down(&self.lose_in) {
            return Err(self.mark_lost("vkQueueSubmit (injected fault)"));
        }
        Ok(())
    }

    /// Called before each buffer allocation: fails if the device is lost,
    /// and fires an armed [`Fault::DeviceLostAtAllocation`].
    pub(crate) fn before_allocation(&self) -> Result<()> {
        self.check()?;
        if count_down(&self.lose_at_alloc) {
            return Err(self.mark_lost("vkAllocateMemory (injected fault)"));
        }
        Ok(())
    }
}

/// Decrements an armed count; true when it reaches zero now.
fn count_down(n: &AtomicU64) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
        0 => None,
        n => Some(n - 1),
    })
    .is_ok_and(|before| before == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lost_after_fires_on_the_nth_submission_and_sticks() {
        let h = DeviceHealth::default();
        h.inject(Fault::DeviceLostAfter(3));
        assert!(h.before_submission().is_ok());
        assert!(h.before_submission().is_ok());
        let e = h.before_submission().err();
        assert!(matches!(e, Some(ModelError::DeviceLost { .. })), "{e:?}");
        for _ in 0..3 {
            assert!(matches!(h.check(), Err(ModelError::DeviceLost { .. })));
            assert!(h.before_submission().is_err());
        }
        // The first place the loss was seen stays in the message.
        h.mark_lost("vkWaitForFences");
        let msg = h.check().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("injected fault"), "{msg}");
    }
}
