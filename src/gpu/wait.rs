//! How the host waits for a submission: blocking in the driver, or polling
//! the fence (the default: a decode step lasts milliseconds, and the wake-up
//! after a blocking wait can add tens of microseconds).

use ash::vk;

use super::context::GpuContext;
use crate::error::Result;

/// How the host waits for a submitted command buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Sleep in `vkWaitForFences` until the driver wakes the thread.
    Block,
    /// Poll the fence, yielding the core between polls, for up to
    /// [`POLL_LIMIT`]; then block. A decode step lasts milliseconds, and
    /// the wake-up after a blocking wait can add tens of microseconds.
    Poll,
}

/// Longest a [`WaitMode::Poll`] wait polls before it blocks.
pub const POLL_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

// Polling by default: on the H200 a submission's round trip took 20 µs
// polling against 44 µs blocking (`combs kernel-bench --sync`), which was
// 10% of SmolLM2's decode step (tg128 745 against 644 tok/s).
static WAIT_MODE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// The way [`Recording::submit_and_wait`] waits (process-wide).
///
/// [`Recording::submit_and_wait`]: super::Recording::submit_and_wait
pub fn wait_mode() -> WaitMode {
    if WAIT_MODE.load(std::sync::atomic::Ordering::Relaxed) {
        WaitMode::Poll
    } else {
        WaitMode::Block
    }
}

/// Sets the way [`Recording::submit_and_wait`] waits, for every recording of the process.
///
/// [`Recording::submit_and_wait`]: super::Recording::submit_and_wait
pub fn set_wait_mode(mode: WaitMode) {
    WAIT_MODE.store(mode == WaitMode::Poll, std::sync::atomic::Ordering::Relaxed);
}

/// How long one blocking `vkWaitForFences` lasts before the wait checks
/// whether another thread saw the device lost: a driver must return
/// `VK_ERROR_DEVICE_LOST` from a wait in finite time, but a hung device that
/// no call has reported yet would otherwise keep an infinite wait forever.
const BLOCK_SLICE_NS: u64 = 1_000_000_000;

fn wait_fence(ctx: &GpuContext, fence: vk::Fence, mode: WaitMode) -> Result<()> {
    let dev = ctx.device();
    if mode == WaitMode::Poll {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < POLL_LIMIT {
            // SAFETY: the fence belongs to this device.
            match unsafe { dev.get_fence_status(fence) } {
                Ok(true) => return Ok(()),
                Ok(false) => std::thread::yield_now(),
                Err(e) => return Err(ctx.vk_error("vkGetFenceStatus", e)),
            }
        }
    }
    loop {
        // SAFETY: the fence belongs to this device.
        match unsafe { dev.wait_for_fences(&[fence], true, BLOCK_SLICE_NS) } {
            Ok(()) => return Ok(()),
            Err(vk::Result::TIMEOUT) => ctx.check_alive()?,
            Err(e) => return Err(ctx.vk_error("vkWaitForFences", e)),
        }
    }
}

/// Waits for `fence` as `mode` says, then resets it even when the wait
/// failed.
///
/// # Errors
/// The wait or the reset failed, or the device was lost
/// ([`ModelError::DeviceLost`]) before the fence signaled.
///
/// [`ModelError::DeviceLost`]: crate::error::ModelError::DeviceLost
pub(crate) fn wait_and_reset(ctx: &GpuContext, fence: vk::Fence, mode: WaitMode) -> Result<()> {
    let waited = wait_fence(ctx, fence, mode);
    // SAFETY: the fence is signaled or the device is lost; reset is valid either way.
    let reset = unsafe { ctx.device().reset_fences(&[fence]) };
    waited?;
    reset.map_err(|r| ctx.vk_error("vkResetFences", r))
}
