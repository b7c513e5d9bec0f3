//! The Vulkan instance, the chosen physical device, its logical device with one
//! compute queue, and the memory allocator. Everything else in `src/gpu` hangs
//! off an `Arc<GpuContext>` and destroys its own handles before the context goes.
//!
//! Device choice: an explicit index, else the `COMBS_DEVICE` environment
//! variable, else the first discrete GPU, else the first integrated GPU, else
//! whatever there is (lavapipe on a machine without a GPU).

use std::ffi::{CStr, c_char};
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use gpu_allocator::{AllocationSizes, AllocatorDebugSettings};

use super::budget::MemoryAccount;
use super::caps::{CoopMatShape, DeviceCaps};
use super::fault::{DeviceHealth, Fault};
use super::pipeline::PipelineCache;
use crate::error::{ModelError, Result};

/// Locks `m` even when a panic poisoned it: what combs guards with a mutex
/// (the queue, the allocator, caches of handles) stays consistent through a
/// panic, and a C caller must not be stuck with a dead context.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A device as `combs info --devices` lists it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Index to pass as `device_index` / `COMBS_DEVICE`.
    pub index: usize,
    /// Limits and features.
    pub caps: DeviceCaps,
    /// Why combs cannot use it, if it cannot.
    pub unusable: Option<String>,
}

/// The instance, device, compute queue and allocator shared by every GPU object.
pub struct GpuContext {
    _entry: ash::Entry,
    instance: ash::Instance,
    physical: vk::PhysicalDevice,
    device: ash::Device,
    queue: Mutex<vk::Queue>,
    queue_family: u32,
    allocator: ManuallyDrop<Mutex<Allocator>>,
    caps: DeviceCaps,
    index: usize,
    pub(crate) pipelines: PipelineCache,
    /// Calls whose pipelines a session already surveyed (see
    /// [`GpuContext::claim_survey`]).
    surveyed: Mutex<std::collections::HashSet<u64>>,
    memory: MemoryAccount,
    health: DeviceHealth,
    /// Command and descriptor pools of finished recordings, for the next.
    pub(crate) spare_kits: super::spare::SpareKits,
}

// SAFETY: Vulkan handles are plain integers/pointers owned by this context; every
// externally-synchronized object (queue, allocator) is behind a Mutex.
unsafe impl Send for GpuContext {}
// SAFETY: as above; shared access only reads immutable handles or locks.
unsafe impl Sync for GpuContext {}

fn load_entry() -> Result<ash::Entry> {
    // SAFETY: loading the system Vulkan loader library; failure is reported, not assumed.
    unsafe { ash::Entry::load() }.map_err(|e| {
        ModelError::NoDevice(format!(
            "cannot load the Vulkan loader (libvulkan.so.1): {e}; install it, e.g. \
             `apt-get install libvulkan1 mesa-vulkan-drivers`"
        ))
    })
}

fn create_instance(entry: &ash::Entry) -> Result<ash::Instance> {
    let app = vk::ApplicationInfo::default()
        .application_name(c"combs")
        .engine_name(c"combs")
        .api_version(vk::API_VERSION_1_3);
    // Portability enumeration lets MoltenVK-style drivers show up where present.
    // SAFETY: entry is a loaded Vulkan entry.
    let available = unsafe { entry.enumerate_instance_extension_properties(None) }
        .map_err(|r| ModelError::vk("vkEnumerateInstanceExtensionProperties", r))?;
    let has = |name: &CStr| {
        available
            .iter()
            .any(|e| e.extension_name_as_c_str().ok() == Some(name))
    };
    let mut exts: Vec<*const c_char> = Vec::new();
    let mut flags = vk::InstanceCreateFlags::empty();
    if has(ash::khr::portability_enumeration::NAME) {
        exts.push(ash::khr::portability_enumeration::NAME.as_ptr());
        flags |= vk::InstanceCreateFlags::ENUMERATE_PORTABILITY_KHR;
    }
    let info = vk::InstanceCreateInfo::default()
        .application_info(&app)
        .enabled_extension_names(&exts)
        .flags(flags);
    // SAFETY: info and the strings it points to outlive the call.
    unsafe { entry.create_instance(&info, None) }.map_err(|r| match r {
        vk::Result::ERROR_INCOMPATIBLE_DRIVER => ModelError::NoDevice(
            "no Vulkan driver is installed (install mesa-vulkan-drivers for a CPU device)".into(),
        ),
        r => ModelError::vk("vkCreateInstance", r),
    })
}

fn compute_queue_family(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Option<u32> {
    // SAFETY: pd comes from this instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    // Prefer a compute-only family (async compute on discrete GPUs), else any with compute.
    let compute_only = families.iter().position(|f| {
        f.queue_flags.contains(vk::QueueFlags::COMPUTE)
            && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS)
    });
    compute_only
        .or_else(|| {
            families
                .iter()
                .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        })
        .map(|i| i as u32)
}

fn device_extensions(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Vec<String> {
    // SAFETY: pd comes from this instance.
    unsafe { instance.enumerate_device_extension_properties(pd) }
        .unwrap_or_default()
        .iter()
        .filter_map(|e| {
            e.extension_name_as_c_str()
                .ok()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .collect()
}

fn read_caps(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> (DeviceCaps, Vec<String>) {
    let exts = device_extensions(instance, pd);
    let has_ext = |n: &CStr| exts.iter().any(|e| e.as_bytes() == n.to_bytes());

    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut size_ctl = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
    // SAFETY: pd comes from this instance; the pNext chain lives on this stack frame.
    let api_version = unsafe { instance.get_physical_device_properties(pd) }.api_version;
    if api_version >= vk::API_VERSION_1_3 {
        props2 = props2.push_next(&mut size_ctl);
    }
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
    let props = props2.properties;
    let limits = props.limits;

    let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
    let mut feats = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut f11)
        .push_next(&mut f12);
    if api_version >= vk::API_VERSION_1_3 {
        feats = feats.push_next(&mut f13);
    }
    // SAFETY: as above.
    unsafe { instance.get_physical_device_features2(pd, &mut feats) };

    let mut int_dot = vk::PhysicalDeviceShaderIntegerDotProductProperties::default();
    let int_dot_accelerated = if api_version >= vk::API_VERSION_1_3 {
        let mut p = vk::PhysicalDeviceProperties2::default().push_next(&mut int_dot);
        // SAFETY: as above.
        unsafe { instance.get_physical_device_properties2(pd, &mut p) };
        int_dot.integer_dot_product4x8_bit_packed_signed_accelerated == vk::TRUE
    } else {
        false
    };

    // Multiprocessors, where the driver says (NVIDIA): tile choices count
    // the waves of workgroups they make.
    let sm_count = if has_ext(ash::nv::shader_sm_builtins::NAME) {
        let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
        let mut p = vk::PhysicalDeviceProperties2::default().push_next(&mut sm);
        // SAFETY: the extension is present on this device; the chain lives on this frame.
        unsafe { instance.get_physical_device_properties2(pd, &mut p) };
        (sm.shader_sm_count > 0).then_some(sm.shader_sm_count)
    } else {
        None
    };

    let mut coop_mat_f16 = Vec::new();
    if has_ext(ash::khr::cooperative_matrix::NAME) {
        let loader = ash::khr::cooperative_matrix::Instance::new(entry, instance);
        // SAFETY: the extension is present on this device.
        if let Ok(list) = unsafe { loader.get_physical_device_cooperative_matrix_properties(pd) } {
            for p in list {
                if p.a_type == vk::ComponentTypeKHR::FLOAT16
                    && p.b_type == vk::ComponentTypeKHR::FLOAT16
                    && p.c_type == vk::ComponentTypeKHR::FLOAT32
                    && p.result_type == vk::ComponentTypeKHR::FLOAT32
                    && p.scope == vk::ScopeKHR::SUBGROUP
                {
                    coop_mat_f16.push(CoopMatShape {
                        m: p.m_size,
                        n: p.n_size,
                        k: p.k_size,
                    });
                }
            }
        }
    }

    // Workgroup-scope matrices where the driver has them and the user asks
    // for them (`COMBS_COOPMAT2=1`: on the H200 matmul_cm2.comp still runs
    // 1.4-1.6x slower than matmul_coop.comp, docs/perf-notes.md); their
    // decode callbacks take buffer references, hence the device addresses.
    let coop_mat2 = (!coop_mat_f16.is_empty()
        && has_ext(super::coopmat2::NAME)
        && f12.buffer_device_address == vk::TRUE
        && std::env::var("COMBS_COOPMAT2").is_ok_and(|v| v == "1"))
    .then(|| super::coopmat2::query(entry, instance, pd))
    .flatten();

    let timestamp_period_ns = compute_queue_family(instance, pd).and_then(|qf| {
        // SAFETY: as above.
        let fams = unsafe { instance.get_physical_device_queue_family_properties(pd) };
        let bits = fams.get(qf as usize).map(|f| f.timestamp_valid_bits)?;
        (bits > 0 && limits.timestamp_period > 0.0).then_some(limits.timestamp_period)
    });

    // SAFETY: as above.
    let mem = unsafe { instance.get_physical_device_memory_properties(pd) };
    let device_local_bytes = mem.memory_heaps[..mem.memory_heap_count as usize]
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max()
        .unwrap_or(0);

    let mut m11 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m11);
    // SAFETY: as above.
    unsafe { instance.get_physical_device_properties2(pd, &mut p2) };

    let has_size_ctl = api_version >= vk::API_VERSION_1_3
        && f13.subgroup_size_control == vk::TRUE
        && f13.compute_full_subgroups == vk::TRUE
        && size_ctl
            .required_subgroup_size_stages
            .contains(vk::ShaderStageFlags::COMPUTE);

    let caps = DeviceCaps {
        name: props
            .device_name_as_c_str()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown device".into()),
        device_type: props.device_type,
        vendor_id: props.vendor_id,
        api_version,
        subgroup_size: subgroup.subgroup_size,
        min_subgroup_size: if has_size_ctl {
            size_ctl.min_subgroup_size
        } else {
            subgroup.subgroup_size
        },
        max_subgroup_size: if has_size_ctl {
            size_ctl.max_subgroup_size
        } else {
            subgroup.subgroup_size
        },
        subgroup_size_control: has_size_ctl,
        maintenance4: api_version >= vk::API_VERSION_1_3 && f13.maintenance4 == vk::TRUE,
        subgroup_arithmetic: subgroup
            .supported_stages
            .contains(vk::ShaderStageFlags::COMPUTE)
            && subgroup.supported_operations.contains(
                vk::SubgroupFeatureFlags::BASIC
                    | vk::SubgroupFeatureFlags::ARITHMETIC
                    | vk::SubgroupFeatureFlags::SHUFFLE,
            ),
        max_storage_buffer_range: u64::from(limits.max_storage_buffer_range),
        max_memory_allocation_size: m11.max_memory_allocation_size,
        max_shared_memory: limits.max_compute_shared_memory_size,
        max_workgroup_invocations: limits.max_compute_work_group_invocations,
        max_workgroup_count: limits.max_compute_work_group_count,
        max_push_constants: limits.max_push_constants_size,
        storage_offset_alignment: limits.min_storage_buffer_offset_alignment.max(4),
        shader_float16: f12.shader_float16 == vk::TRUE,
        storage_16bit: f11.storage_buffer16_bit_access == vk::TRUE,
        shader_int8: f12.shader_int8 == vk::TRUE,
        vulkan_memory_model: f12.vulkan_memory_model == vk::TRUE
            && f12.vulkan_memory_model_device_scope == vk::TRUE,
        int_dot: api_version >= vk::API_VERSION_1_3 && f13.shader_integer_dot_product == vk::TRUE,
        int_dot_accelerated,
        coop_mat_f16,
        coop_mat2,
        timestamp_period_ns,
        device_local_bytes,
        sm_count,
        pipeline_stats: false,
    };
    (caps, exts)
}

/// Lists every Vulkan device, usable or not, in the order indices refer to them.
///
/// # Errors
/// No Vulkan loader, or the instance cannot be created.
pub fn list_devices() -> Result<Vec<DeviceInfo>> {
    let entry = load_entry()?;
    let instance = create_instance(&entry)?;
    // SAFETY: instance was just created.
    let pds = unsafe { instance.enumerate_physical_devices() };
    let out = pds
        .map_err(|r| ModelError::vk("vkEnumeratePhysicalDevices", r))
        .map(|pds| {
            pds.iter()
                .enumerate()
                .map(|(index, &pd)| {
                    let (caps, _) = read_caps(&entry, &instance, pd);
                    let unusable =
                        match (caps.check_required(), compute_queue_family(&instance, pd)) {
                            (Err(e), _) => Some(e.to_string()),
                            (Ok(()), None) => Some("no compute queue".into()),
                            (Ok(()), Some(_)) => None,
                        };
                    DeviceInfo {
                        index,
                        caps,
                        unusable,
                    }
                })
                .collect()
        });
    // SAFETY: nothing created from the instance outlives this point.
    unsafe { instance.destroy_instance(None) };
    out
}

fn rank(t: vk::PhysicalDeviceType) -> u32 {
    match t {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

/// The device index to use: `requested` if given, else `COMBS_DEVICE` (an
/// index, or `cpu` for the first usable CPU device), else none (auto).
///
/// # Errors
/// `COMBS_DEVICE` is set but is neither an index nor `cpu`, or names `cpu`
/// where there is no CPU device.
pub fn requested_device(requested: Option<usize>) -> Result<Option<usize>> {
    if requested.is_some() {
        return Ok(requested);
    }
    match std::env::var("COMBS_DEVICE") {
        Ok(v) if !v.trim().is_empty() => parse_device(v.trim()).map(Some),
        _ => Ok(None),
    }
}

/// A device as a user names it: its index, or `cpu` for the first usable
/// CPU device (lavapipe), on which combs runs its native kernels.
///
/// # Errors
/// Neither an index nor `cpu`, or no CPU device.
pub fn parse_device(name: &str) -> Result<usize> {
    if name.eq_ignore_ascii_case("cpu") {
        return list_devices()?
            .into_iter()
            .find(|d| d.caps.class() == super::DeviceClass::Cpu && d.unusable.is_none())
            .map(|d| d.index)
            .ok_or_else(|| {
                ModelError::NoDevice(
                    "no CPU Vulkan device: install Mesa's lavapipe (mesa-vulkan-drivers)".into(),
                )
            });
    }
    name.parse::<usize>().map_err(|_| {
        ModelError::invalid(
            "device",
            format!("`{name}` is neither a device index nor `cpu` (see `combs info --devices`)"),
        )
    })
}

impl GpuContext {
    /// Whether the caller is the first to survey the call `key` names (a
    /// hash of the model, its cache and the call's size): a session skips
    /// surveying a call another session on this device already surveyed,
    /// whose pipelines exist.
    pub fn claim_survey(&self, key: u64) -> bool {
        self.surveyed
            .lock()
            .map(|mut set| set.insert(key))
            .unwrap_or(true)
    }

    /// Compute pipelines created on this device so far (each kernel and
    /// specialization once; see [`crate::gpu::Recording::survey`]).
    pub fn pipelines_created(&self) -> usize {
        self.pipelines.len()
    }

    /// Opens a device: `index` if given, else `COMBS_DEVICE`, else the best available.
    ///
    /// # Errors
    /// No loader or device, an index out of range, a device lacking a required
    /// feature, or a failing Vulkan call.
    pub fn new(index: Option<usize>) -> Result<Arc<Self>> {
        let requested = requested_device(index)?;
        let entry = load_entry()?;
        let instance = create_instance(&entry)?;
        // `open` takes a clone: the loader library must stay loaded until the
        // instance is destroyed on the error path below.
        match Self::open(entry.clone(), &instance, requested) {
            Ok(ctx) => Ok(ctx),
            Err(e) => {
                // SAFETY: open() destroys what it created before failing.
                unsafe { instance.destroy_instance(None) };
                Err(e)
            }
        }
    }

    fn open(
        entry: ash::Entry,
        instance: &ash::Instance,
        requested: Option<usize>,
    ) -> Result<Arc<Self>> {
        // SAFETY: instance is live.
        let pds = unsafe { instance.enumerate_physical_devices() }
            .map_err(|r| ModelError::vk("vkEnumeratePhysicalDevices", r))?;
        if pds.is_empty() {
            return Err(ModelError::NoDevice(
                "the Vulkan loader found no device (install mesa-vulkan-drivers for a CPU device)"
                    .into(),
            ));
        }
        let candidates: Vec<(usize, vk::PhysicalDevice, DeviceCaps, Vec<String>)> = pds
            .iter()
            .enumerate()
            .map(|(i, &pd)| {
                let (caps, exts) = read_caps(&entry, instance, pd);
                (i, pd, caps, exts)
            })
            .collect();
        let chosen = match requested {
            Some(i) => {
                let c = candidates.get(i).ok_or_else(|| {
                    ModelError::invalid(
                        "device_index",
                        format!("device {i} does not exist ({} devices)", candidates.len()),
                    )
                })?;
                c.2.check_required()?;
                if compute_queue_family(instance, c.1).is_none() {
                    return Err(ModelError::MissingFeature {
                        device: c.2.name.clone(),
                        feature: "a compute queue".into(),
                    });
                }
                c
            }
            None => {
                let mut usable: Vec<_> = candidates
                    .iter()
                    .filter(|c| {
                        c.2.check_required().is_ok()
                            && compute_queue_family(instance, c.1).is_some()
                    })
                    .collect();
                usable.sort_by_key(|c| (rank(c.2.device_type), c.0));
                match usable.first() {
                    Some(c) => *c,
                    None => {
                        // Report why the first device fails; that is the one users expect.
                        candidates[0].2.check_required()?;
                        return Err(ModelError::NoDevice("no device has a compute queue".into()));
                    }
                }
            }
        };
        let (index, pd, mut caps, exts) = (chosen.0, chosen.1, chosen.2.clone(), &chosen.3);
        let queue_family = compute_queue_family(instance, pd)
            .ok_or_else(|| ModelError::Internal("compute queue vanished".into()))?;

        let has_ext = |n: &CStr| exts.iter().any(|e| e.as_bytes() == n.to_bytes());
        let mut ext_names: Vec<*const c_char> = Vec::new();
        let coop = !caps.coop_mat_f16.is_empty() && has_ext(ash::khr::cooperative_matrix::NAME);
        if coop {
            ext_names.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        let coop2 = coop && caps.coop_mat2.is_some() && has_ext(super::coopmat2::NAME);
        if coop2 {
            ext_names.push(super::coopmat2::NAME.as_ptr());
        } else {
            // Buffers take device addresses, and tiles the cm2 kernel, only
            // where the device is created with both.
            caps.coop_mat2 = None;
        }
        if has_ext(ash::khr::portability_subset::NAME) {
            ext_names.push(ash::khr::portability_subset::NAME.as_ptr());
        }
        caps.pipeline_stats = super::exec_stats::requested() && has_ext(super::exec_stats::NAME);
        if caps.pipeline_stats {
            ext_names.push(super::exec_stats::NAME.as_ptr());
        }

        let priorities = [1.0f32];
        let queue_info = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(queue_family)
            .queue_priorities(&priorities)];
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default()
            .storage_buffer16_bit_access(caps.storage_16bit);
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default()
            .shader_float16(caps.shader_float16)
            .shader_int8(caps.shader_int8)
            .vulkan_memory_model(caps.vulkan_memory_model)
            .vulkan_memory_model_device_scope(caps.vulkan_memory_model)
            .buffer_device_address(coop2);
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default()
            .subgroup_size_control(caps.subgroup_size_control)
            .compute_full_subgroups(caps.subgroup_size_control)
            .maintenance4(caps.maintenance4)
            .shader_integer_dot_product(caps.int_dot);
        let mut coop_feat =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12);
        if caps.api_version >= vk::API_VERSION_1_3 {
            features = features.push_next(&mut f13);
        }
        if coop {
            features = features.push_next(&mut coop_feat);
        }
        let mut stats_feat = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        if caps.pipeline_stats {
            features = features.push_next(&mut stats_feat);
        }
        let mut coop2_feat = super::coopmat2::Features::required();
        if coop2 {
            // SAFETY: coop2_feat lives on this frame until vkCreateDevice returns.
            features.p_next = unsafe { coop2_feat.chain(features.p_next) };
        }
        let info = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queue_info)
            .enabled_extension_names(&ext_names)
            .push_next(&mut features);
        // SAFETY: pd belongs to instance; info's pointers outlive the call.
        let device = unsafe { instance.create_device(pd, &info, None) }
            .map_err(|r| ModelError::vk("vkCreateDevice", r))?;
        // SAFETY: family and index were requested in create info.
        let queue = unsafe { device.get_device_queue(queue_family, 0) };

        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.clone(),
            device: device.clone(),
            physical_device: pd,
            debug_settings: AllocatorDebugSettings::default(),
            buffer_device_address: coop2,
            allocation_sizes: AllocationSizes::new(64 << 20, 16 << 20),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: nothing was created from the device yet.
                unsafe { device.destroy_device(None) };
                return Err(ModelError::Allocation {
                    what: "allocator".into(),
                    reason: e.to_string(),
                });
            }
        };
        Ok(Arc::new(GpuContext {
            _entry: entry,
            instance: instance.clone(),
            physical: pd,
            device,
            queue: Mutex::new(queue),
            queue_family,
            allocator: ManuallyDrop::new(Mutex::new(allocator)),
            caps,
            index,
            pipelines: PipelineCache::default(),
            surveyed: Mutex::new(std::collections::HashSet::new()),
            memory: MemoryAccount::default(),
            health: DeviceHealth::from_env(),
            spare_kits: Default::default(),
        }))
    }

    /// The logical device.
    pub fn device(&self) -> &ash::Device {
        &self.device
    }

    /// The physical device handle.
    pub fn physical_device(&self) -> vk::PhysicalDevice {
        self.physical
    }

    /// The Vulkan instance.
    pub fn instance(&self) -> &ash::Instance {
        &self.instance
    }

    /// Limits and features of the device.
    pub fn caps(&self) -> &DeviceCaps {
        &self.caps
    }

    /// Index of the device in [`list_devices`] order.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Queue family of the compute queue.
    pub fn queue_family(&self) -> u32 {
        self.queue_family
    }

    /// Submits `cmd` to the compute queue, to signal `fence` when it completes.
    ///
    /// # Errors
    /// The device is lost (before, or by this submission, or by an injected
    /// fault), or another failing `vkQueueSubmit`.
    ///
    /// # Safety
    /// `cmd` is executable (ended, not pending) and `fence` unsignaled, both
    /// of this device; whatever `cmd` uses stays alive until `fence` is waited.
    pub(crate) unsafe fn submit(&self, cmd: vk::CommandBuffer, fence: vk::Fence) -> Result<()> {
        self.health.before_submission()?;
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        let _gate = self.pipelines.submitting();
        let queue = self.queue();
        // SAFETY: per this function's contract; the queue is locked.
        unsafe { self.device.queue_submit(*queue, &submit, fence) }
            .map_err(|r| self.vk_error("vkQueueSubmit", r))
    }

    /// Submits a batch without command buffers that signals `fence` once
    /// everything submitted before it has finished.
    ///
    /// # Safety
    /// `fence` is unsignaled and not in use by another submission.
    pub(crate) unsafe fn submit_empty(&self, fence: vk::Fence) -> Result<()> {
        self.health.check()?;
        let _gate = self.pipelines.submitting();
        let queue = self.queue();
        // SAFETY: per this function's contract; the queue is locked.
        unsafe { self.device.queue_submit(*queue, &[], fence) }
            .map_err(|r| self.vk_error("vkQueueSubmit", r))
    }

    /// A failed Vulkan call as a [`ModelError`]; `VK_ERROR_DEVICE_LOST`
    /// marks the context lost for good.
    pub(crate) fn vk_error(&self, call: &'static str, r: vk::Result) -> ModelError {
        if r == vk::Result::ERROR_DEVICE_LOST {
            return self.health.mark_lost(call);
        }
        ModelError::vk(call, r)
    }

    /// Marks the context lost, first seen in `call`; returns the error to report.
    pub(crate) fn mark_lost(&self, call: &'static str) -> ModelError {
        self.health.mark_lost(call)
    }

    /// Whether a `VK_ERROR_DEVICE_LOST` (real or injected) was seen: every
    /// later submission, recording and allocation on this context fails
    /// with [`ModelError::DeviceLost`].
    pub fn is_lost(&self) -> bool {
        self.health.is_lost()
    }

    /// `Ok` while the device is not lost; called before recording,
    /// allocating and running host steps.
    ///
    /// # Errors
    /// [`ModelError::DeviceLost`].
    pub fn check_alive(&self) -> Result<()> {
        self.health.check()
    }

    /// Before a run of host steps (CPU devices), which stands in for a
    /// submission: fails when the device is lost, and counts toward an
    /// injected [`Fault::DeviceLostAfter`].
    pub(crate) fn before_host_submission(&self) -> Result<()> {
        self.health.before_submission()
    }

    /// Before a buffer allocation: fails when the device is lost, and counts
    /// toward an injected [`Fault::DeviceLostAtAllocation`].
    pub(crate) fn before_allocation(&self) -> Result<()> {
        self.health.before_allocation()
    }

    /// Arms a fake driver failure (see [`Fault`]); for tests. C programs
    /// reach it through the `COMBS_FAULT_DEVICE_LOST_AFTER` environment
    /// variable, read when a runtime is created.
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: Fault) {
        self.health.inject(fault);
    }

    /// Sets the device-memory budget in bytes (0: none): a device-local
    /// [`super::Buffer`] that would take [`Self::memory_in_use`] past it is
    /// refused with [`ModelError::MemoryBudget`] before the driver is asked.
    /// Lowering it below what is in use frees nothing; it refuses the next
    /// allocations. What counts is described in `src/gpu/budget.rs`:
    /// device-local buffers (weights, KV caches, scratch), not the
    /// host-visible upload, readback and staging buffers.
    pub fn set_memory_budget(&self, bytes: u64) {
        self.memory.set_budget(bytes);
    }

    /// The device-memory budget in bytes (0: none).
    pub fn memory_budget(&self) -> u64 {
        self.memory.budget()
    }

    /// Bytes held by this context's live device-local buffers (what the
    /// budget limits).
    pub fn memory_in_use(&self) -> u64 {
        self.memory.in_use()
    }

    /// The most device-local bytes this context's buffers have held at once.
    pub fn memory_peak(&self) -> u64 {
        self.memory.peak()
    }

    /// Bytes held by this context's live host-visible buffers (upload,
    /// readback, staging; not budgeted).
    pub fn memory_host_visible(&self) -> u64 {
        self.memory.host_visible()
    }

    /// The account buffers reserve their bytes in.
    pub(crate) fn memory(&self) -> &MemoryAccount {
        &self.memory
    }

    /// A command pool of the compute queue's family whose command buffers
    /// can be reset one by one.
    ///
    /// # Errors
    /// A failing `vkCreateCommandPool`.
    pub(crate) fn create_command_pool(&self) -> Result<vk::CommandPool> {
        let info = vk::CommandPoolCreateInfo::default()
            .queue_family_index(self.queue_family)
            .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER);
        // SAFETY: valid device and create info.
        unsafe { self.device.create_command_pool(&info, None) }
            .map_err(|r| self.vk_error("vkCreateCommandPool", r))
    }

    /// Locks the compute queue for a submission.
    pub(crate) fn queue(&self) -> MutexGuard<'_, vk::Queue> {
        lock(&self.queue)
    }

    /// Locks the memory allocator.
    pub(crate) fn allocator(&self) -> MutexGuard<'_, Allocator> {
        lock(&self.allocator)
    }
}

impl Drop for GpuContext {
    fn drop(&mut self) {
        // SAFETY: every object created from this device holds an Arc to the context,
        // so none is alive now; wait for the queue before tearing down.
        unsafe {
            let _ = self.device.device_wait_idle();
            self.spare_kits.destroy_all(&self.device);
            self.pipelines.destroy(&self.device);
            ManuallyDrop::drop(&mut self.allocator);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}
