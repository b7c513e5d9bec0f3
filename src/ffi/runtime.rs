//! `combs_runtime`: one Vulkan device (instance, logical device, queue and
//! allocator), or several with how models use them (split by layers or
//! replicated), shared by the models loaded on it.

use std::sync::Arc;

use super::args::{c_enum, guard_create, guard_free, invalid};
use super::guard::guard_const;
use super::status::combs_status;
use crate::gpu::GpuContext;
use crate::models::{LoadOptions, Placement, SplitMode};

/// A Vulkan device. Models loaded on it keep it alive, so it may be freed
/// before them.
pub struct combs_runtime {
    /// The first (or only) device.
    pub(crate) ctx: Arc<GpuContext>,
    /// Every device, in order (`ctx` first).
    pub(crate) ctxs: Vec<Arc<GpuContext>>,
    /// How models use several devices.
    pub(crate) split_mode: SplitMode,
    /// Shares of the blocks per device (empty: by free memory).
    pub(crate) tensor_split: Vec<f32>,
    /// Which replica a new session goes to.
    pub(crate) placement: Placement,
}

impl combs_runtime {
    /// `base` with this runtime's use of several devices.
    pub(crate) fn load_options(&self, base: LoadOptions) -> LoadOptions {
        LoadOptions {
            split_mode: self.split_mode,
            tensor_split: self.tensor_split.clone(),
            placement: self.placement,
            ..base
        }
    }
}

/// How a model loaded on a runtime of several devices uses them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_split_mode {
    /// Contiguous ranges of blocks per device, as llama.cpp's
    /// `--split-mode layer`: a model too big for one device; each session
    /// runs the devices one after another, its KV cache shared out with
    /// the blocks.
    COMBS_SPLIT_LAYER = 0,
    /// A whole model on every device: sessions are spread over them and
    /// `combs_batch_decode()` runs each device's sessions at once.
    COMBS_SPLIT_REPLICA = 1,
}

/// Which device a new session of a replicated model goes to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_placement {
    /// Each device in turn.
    COMBS_PLACEMENT_ROUND_ROBIN = 0,
    /// The device with the most free memory (under its budget, if set).
    COMBS_PLACEMENT_FREE_MEMORY = 1,
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
    /// usable. (The driver refusing memory gives the same status.) With
    /// several devices, the budget of each.
    pub memory_budget: u64,
    /// Several devices: `n_devices` device indices (an index may repeat:
    /// the same device opened twice, for tests on one GPU); NULL or
    /// `n_devices` 0: the one device of `device_index`. Read during
    /// `combs_runtime_create()` only.
    pub device_indices: *const i32,
    /// Entries of `device_indices` (and of `tensor_split`).
    pub n_devices: usize,
    /// How a model uses several devices.
    pub split_mode: combs_split_mode,
    /// Under `COMBS_SPLIT_LAYER`, each device's share of the blocks
    /// (`n_devices` values ≥ 0, as llama.cpp's `--tensor-split`); NULL:
    /// by each device's free memory. Read during `combs_runtime_create()`.
    pub tensor_split: *const f32,
    /// Under `COMBS_SPLIT_REPLICA`, which device a new session goes to.
    pub placement: combs_placement,
}

/// The struct as read from C memory: an enum value outside its C enum
/// must not become a Rust value.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawRuntimeOptions {
    device_index: i32,
    memory_budget: u64,
    device_indices: *const i32,
    n_devices: usize,
    split_mode: i32,
    tensor_split: *const f32,
    placement: i32,
}
const _: () = assert!(size_of::<RawRuntimeOptions>() == size_of::<combs_runtime_options>());
const _: () = assert!(size_of::<combs_split_mode>() == size_of::<i32>());
const _: () = assert!(size_of::<combs_placement>() == size_of::<i32>());

/// Most devices one runtime opens.
const MAX_DEVICES: usize = 64;

/// A device index of the C API: -1 for the default device.
fn device_index(i: i32, name: &'static str) -> super::guard::FfiResult<Option<usize>> {
    match i {
        -1 => Ok(None),
        i if i >= 0 => Ok(Some(i as usize)),
        i => Err(invalid(name, format!("{i} is below -1"))),
    }
}

/// The default runtime options (`device_index` -1, `memory_budget` 0, one
/// device, layer split by free memory, round-robin placement).
#[unsafe(no_mangle)]
pub extern "C" fn combs_runtime_default_options() -> combs_runtime_options {
    let d = combs_runtime_options {
        device_index: -1,
        memory_budget: 0,
        device_indices: std::ptr::null(),
        n_devices: 0,
        split_mode: combs_split_mode::COMBS_SPLIT_LAYER,
        tensor_split: std::ptr::null(),
        placement: combs_placement::COMBS_PLACEMENT_ROUND_ROBIN,
    };
    guard_const("combs_runtime_default_options", d)
}

/// Opens a Vulkan device, or several (`device_indices`). `opts` may be
/// NULL for the defaults. On success
/// `*out` receives a runtime to release with `combs_runtime_free()`; on
/// failure it is set to NULL.
///
/// The environment variable `COMBS_FAULT_DEVICE_LOST_AFTER=n`, read here,
/// makes the runtime's `n`-th submission fail as if the device were lost,
/// for testing a program's handling of `COMBS_ERR_DEVICE`.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `out`, `device_index` below -1 or past
/// the last device, a malformed `COMBS_DEVICE`, more than 64 devices, a
/// `split_mode` or `placement` outside its enum, a share below 0 or not
/// finite), `COMBS_ERR_DEVICE` (no
/// Vulkan loader or device), `COMBS_ERR_UNSUPPORTED` (the device lacks a
/// feature combs needs).
///
/// # Safety
/// `opts` is NULL or points to a `combs_runtime_options` whose
/// `device_indices` and `tensor_split` are NULL or point to `n_devices`
/// values each; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_runtime_create(
    opts: *const combs_runtime_options,
    out: *mut *mut combs_runtime,
) -> combs_status {
    let make = || {
        let d = combs_runtime_default_options();
        // SAFETY: opts is NULL or points to a combs_runtime_options, whose
        // layout RawRuntimeOptions mirrors.
        let o = unsafe { opts.cast::<RawRuntimeOptions>().as_ref() }
            .copied()
            .unwrap_or(RawRuntimeOptions {
                device_index: d.device_index,
                memory_budget: d.memory_budget,
                device_indices: d.device_indices,
                n_devices: d.n_devices,
                split_mode: d.split_mode as i32,
                tensor_split: d.tensor_split,
                placement: d.placement as i32,
            });
        let split_mode = c_enum(
            o.split_mode,
            &[SplitMode::Layer, SplitMode::Replica],
            "split_mode",
            "combs_split_mode (0: layer, 1: replica)",
        )?;
        let placement = c_enum(
            o.placement,
            &[Placement::RoundRobin, Placement::MostFreeMemory],
            "placement",
            "combs_placement (0: round-robin, 1: free memory)",
        )?;
        let several = !o.device_indices.is_null() && o.n_devices > 0;
        if several && o.n_devices > MAX_DEVICES {
            return Err(invalid(
                "n_devices",
                format!("{} is more than {MAX_DEVICES}", o.n_devices),
            ));
        }
        let indices: Vec<Option<usize>> = if several {
            // SAFETY: per this function's contract, n_devices indices.
            let raw = unsafe { std::slice::from_raw_parts(o.device_indices, o.n_devices) };
            raw.iter()
                .map(|&i| device_index(i, "device_indices"))
                .collect::<Result<_, _>>()?
        } else {
            vec![device_index(o.device_index, "device_index")?]
        };
        let tensor_split = if several && !o.tensor_split.is_null() {
            // SAFETY: per this function's contract, n_devices shares.
            let v = unsafe { std::slice::from_raw_parts(o.tensor_split, o.n_devices) }.to_vec();
            if v.iter().any(|s| !s.is_finite() || *s < 0.0) {
                return Err(invalid("tensor_split", format!("{v:?}: a share below 0")));
            }
            v
        } else {
            Vec::new()
        };
        let ctxs = indices
            .into_iter()
            .map(GpuContext::new)
            .collect::<Result<Vec<_>, _>>()?;
        for ctx in &ctxs {
            ctx.set_memory_budget(o.memory_budget);
        }
        let ctx = ctxs
            .first()
            .cloned()
            .ok_or_else(|| invalid("n_devices", "no device"))?;
        Ok(combs_runtime {
            ctx,
            ctxs,
            split_mode,
            tensor_split,
            placement,
        })
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
