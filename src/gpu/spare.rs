//! Command pools, fences and descriptor pools of finished recordings, kept
//! for the next recording instead of destroyed. Creating them took ~0.3 ms
//! of every prompt on an H100 (`rec_setup` under `COMBS_LOAD_PROFILE=1`),
//! time the GPU waited before the call's first dispatch.

use std::sync::Mutex;

use ash::vk;

use super::context::lock;

/// Kits kept at most: one per recording alive at once in the usual case
/// (a session's call, a batch step, an upload), a few more for threads.
const MAX_SPARE: usize = 8;

/// What a recording needs before its first command: a command pool with
/// no command buffers, an unsignaled fence, and descriptor pools with no
/// sets allocated.
pub(crate) struct RecordingKit {
    /// The command pool.
    pub pool: vk::CommandPool,
    /// The fence of the recording's submissions.
    pub fence: vk::Fence,
    /// Descriptor pools, reset.
    pub descriptor_pools: Vec<vk::DescriptorPool>,
}

/// The spare kits of one device.
#[derive(Default)]
pub(crate) struct SpareKits {
    kits: Mutex<Vec<RecordingKit>>,
}

impl SpareKits {
    /// A spare kit, if one is kept.
    pub fn take(&self) -> Option<RecordingKit> {
        lock(&self.kits).pop()
    }

    /// Keeps `kit` for a later recording, or destroys it when enough are kept.
    ///
    /// # Safety
    /// `kit` is of `dev` and in the state [`RecordingKit`] describes (the
    /// caller reset it); nothing pending uses it.
    pub unsafe fn give(&self, dev: &ash::Device, kit: RecordingKit) {
        let mut kits = lock(&self.kits);
        if kits.len() < MAX_SPARE {
            kits.push(kit);
        } else {
            drop(kits);
            // SAFETY: per this function's contract.
            unsafe { destroy(dev, kit) };
        }
    }

    /// Destroys every kit kept.
    ///
    /// # Safety
    /// `dev` is the device they were made on, about to be destroyed.
    pub unsafe fn destroy_all(&self, dev: &ash::Device) {
        for kit in lock(&self.kits).drain(..) {
            // SAFETY: per this function's contract.
            unsafe { destroy(dev, kit) };
        }
    }
}

/// Destroys the objects of `kit`.
///
/// # Safety
/// They are of `dev` and not in use.
pub(crate) unsafe fn destroy(dev: &ash::Device, kit: RecordingKit) {
    // SAFETY: per this function's contract.
    unsafe {
        for p in kit.descriptor_pools {
            dev.destroy_descriptor_pool(p, None);
        }
        if kit.fence != vk::Fence::null() {
            dev.destroy_fence(kit.fence, None);
        }
        dev.destroy_command_pool(kit.pool, None);
    }
}
