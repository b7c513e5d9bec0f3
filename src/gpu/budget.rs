//! The device-memory account of one [`GpuContext`]: bytes held by live
//! [`Buffer`]s, their high-water mark, and an optional budget that refuses
//! an allocation before the driver is asked.
//!
//! What the budget counts: device-local buffers ([`MemoryKind::Device`]:
//! weights, KV caches and page pools, activations and other scratch), at
//! their size rounded up to 4 bytes. That is what a model and its sessions
//! keep on the GPU, so a budget is the sum a user can work out from the
//! model and context sizes. Host-visible buffers (upload, readback, and the
//! 2 × 16 MiB staging ring that lives only while a model loads) live in
//! system memory on a discrete GPU; they are counted apart
//! ([`MemoryAccount::host_visible`]) and not budgeted, so a load's transient
//! staging never decides whether a model fits. Not counted at all:
//! pipelines, descriptor and command pools (driver-internal, small), and the
//! slack of the allocator's blocks (gpu-allocator sub-allocates from blocks
//! of up to 64 MiB, so the driver may hold up to one partly used block more
//! per memory type than the count).
//!
//! [`MemoryKind::Device`]: super::MemoryKind::Device
//!
//! [`GpuContext`]: super::GpuContext
//! [`Buffer`]: super::Buffer

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{ModelError, Result};

/// Device-local bytes in use, their peak, the budget (0: none), and the
/// host-visible bytes in use.
#[derive(Debug, Default)]
pub(crate) struct MemoryAccount {
    budget: AtomicU64,
    in_use: AtomicU64,
    peak: AtomicU64,
    host_visible: AtomicU64,
}

impl MemoryAccount {
    pub(crate) fn set_budget(&self, bytes: u64) {
        self.budget.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn budget(&self) -> u64 {
        self.budget.load(Ordering::Relaxed)
    }

    pub(crate) fn in_use(&self) -> u64 {
        self.in_use.load(Ordering::Relaxed)
    }

    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Bytes of host-visible buffers (not budgeted).
    pub(crate) fn host_visible(&self) -> u64 {
        self.host_visible.load(Ordering::Relaxed)
    }

    /// Counts a host-visible buffer of `bytes`.
    pub(crate) fn add_host_visible(&self, bytes: u64) {
        self.host_visible.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Gives back what [`Self::add_host_visible`] counted.
    pub(crate) fn release_host_visible(&self, bytes: u64) {
        let _ = self
            .host_visible
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(bytes))
            });
    }

    /// Counts `bytes` for `what`, or refuses them when they would take the
    /// count past the budget. A compare-and-swap loop, so that threads
    /// allocating at once cannot both squeeze under the budget.
    pub(crate) fn reserve(&self, what: &str, bytes: u64) -> Result<()> {
        let budget = self.budget();
        let mut cur = self.in_use.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(bytes);
            if budget != 0 && next > budget {
                return Err(ModelError::MemoryBudget {
                    what: what.to_string(),
                    bytes,
                    in_use: cur,
                    budget,
                });
            }
            match self
                .in_use
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Gives back what [`Self::reserve`] counted.
    pub(crate) fn release(&self, bytes: u64) {
        // Saturating: a release never takes the count below zero, even if a
        // bug paired it with no reservation.
        let _ = self
            .in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_sub(bytes))
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_account_refuses_past_budget_and_releases() {
        let m = MemoryAccount::default();
        m.set_budget(100);
        assert!(m.reserve("a", 60).is_ok());
        let e = m.reserve("b", 41).err();
        assert!(
            matches!(&e, Some(ModelError::MemoryBudget { what, bytes: 41, in_use: 60, budget: 100 }) if what == "b"),
            "{e:?}"
        );
        assert!(m.reserve("c", 40).is_ok());
        assert_eq!((m.in_use(), m.peak()), (100, 100));
        m.release(100);
        assert_eq!((m.in_use(), m.peak()), (0, 100));
        m.set_budget(0);
        assert!(m.reserve("d", u64::MAX / 2).is_ok());
    }
}
