//! `combs_runtime`: one Vulkan device (instance, logical device, queue and
//! allocator), shared by the models loaded on it.

use std::sync::Arc;

use super::args::{guard_create, guard_free, invalid, options};
use super::guard::guard_const;
use super::status::combs_status;
use crate::gpu::GpuContext;

/// A Vulkan device. Models loaded on it keep it alive, so it may be freed
/// before them.
pub struct combs_runtime {
    pub(crate) ctx: Arc<GpuContext>,
}

/// Options of `combs_runtime_create()`; start from
/// `combs_runtime_default_options()`. Fields may be appended, never reordered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_runtime_options {
    /// Vulkan device index (as `combs info --devices` lists them); -1: the
    /// `COMBS_DEVICE` environment variable, else the first discrete GPU,
    /// else the first integrated one, else any (lavapipe on the CPU).
    pub device_index: i32,
    /// Device-memory budget in bytes for everything loaded on this runtime
    /// (0: none, the default). Device-local buffers count: weights, KV
    /// caches and page pools, activations and other scratch; host-visible
    /// upload, readback and load-time staging buffers (system memory on a
    /// discrete GPU) do not. A model load or session creation that would go
    /// past it fails with `COMBS_ERR_OUT_OF_MEMORY` and a message naming the
    /// tensor, cache or buffer, the bytes asked for, the bytes in use and
    /// the budget; what it had allocated is freed and the runtime stays
    /// usable. (The driver refusing memory gives the same status.)
    pub memory_budget: u64,
}

/// The default runtime options (`device_index` -1, `memory_budget` 0).
#[unsafe(no_mangle)]
pub extern "C" fn combs_runtime_default_options() -> combs_runtime_options {
    let d = combs_runtime_options {
        device_index: -1,
        memory_budget: 0,
    };
    guard_const("combs_runtime_default_options", d)
}

/// Opens a Vulkan device. `opts` may be NULL for the defaults. On success
/// `*out` receives a runtime to release with `combs_runtime_free()`; on
/// failure it is set to NULL.
///
/// The environment variable `COMBS_FAULT_DEVICE_LOST_AFTER=n`, read here,
/// makes the runtime's `n`-th submission fail as if the device were lost,
/// for testing a program's handling of `COMBS_ERR_DEVICE`.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `out`, `device_index` below -1 or past
/// the last device, a malformed `COMBS_DEVICE`), `COMBS_ERR_DEVICE` (no
/// Vulkan loader or device), `COMBS_ERR_UNSUPPORTED` (the device lacks a
/// feature combs needs).
///
/// # Safety
/// `opts` is NULL or points to a `combs_runtime_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_runtime_create(
    opts: *const combs_runtime_options,
    out: *mut *mut combs_runtime,
) -> combs_status {
    let make = || {
        // SAFETY: opts is NULL or a valid options struct.
        let o = unsafe { options(opts, combs_runtime_default_options()) };
        let index = match o.device_index {
            -1 => None,
            i if i >= 0 => Some(i as usize),
            i => return Err(invalid("device_index", format!("{i} is below -1"))),
        };
        let ctx = GpuContext::new(index)?;
        ctx.set_memory_budget(o.memory_budget);
        Ok(combs_runtime { ctx })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_runtime_create", out, make) }
}

/// Releases a runtime (NULL: no-op). Models loaded on it stay usable.
///
/// # Safety
/// `rt` is NULL or a runtime from `combs_runtime_create()` not freed before
/// and not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_runtime_free(rt: *mut combs_runtime) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_runtime_free", rt) }
}

/// The device context behind a runtime handle, for tests of the C API that
/// inspect or steer the gpu layer (memory in use, injected faults). Not part
/// of the C API.
///
/// # Safety
/// `rt` is NULL or a live runtime from `combs_runtime_create()`.
#[doc(hidden)]
pub unsafe fn runtime_context(rt: *const combs_runtime) -> Option<Arc<GpuContext>> {
    // SAFETY: per this function's contract.
    unsafe { rt.as_ref() }.map(|r| r.ctx.clone())
}
