//! What a physical device can do, read once from Vulkan and never assumed:
//! subgroup size, buffer-range and shared-memory limits, and the optional
//! features (fp16 arithmetic, int8 dot product, cooperative matrix) that pick
//! kernel variants. Required features are checked in [`DeviceCaps::check_required`].

use ash::vk;

use crate::error::{ModelError, Result};

/// One cooperative-matrix shape the device reports for f16 inputs and f32 accumulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopMatShape {
    /// Rows of A and of the result.
    pub m: u32,
    /// Columns of B and of the result.
    pub n: u32,
    /// Inner dimension.
    pub k: u32,
}

/// What kind of processor runs the kernels: the planner picks other
/// kernels for a CPU device (lavapipe) than for a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceClass {
    /// A GPU: discrete, integrated or virtual.
    Gpu,
    /// The host's CPU behind a Vulkan driver (Mesa's lavapipe).
    Cpu,
}

/// The limits and optional features of one device, as Vulkan reports them.
#[derive(Clone, Debug)]
pub struct DeviceCaps {
    /// Device name from `VkPhysicalDeviceProperties`.
    pub name: String,
    /// Physical device type (discrete, integrated, CPU, ...).
    pub device_type: vk::PhysicalDeviceType,
    /// Vendor id (0x10de NVIDIA, 0x1002 AMD, 0x8086 Intel, 0x10005 Mesa).
    pub vendor_id: u32,
    /// Vulkan API version the device supports.
    pub api_version: u32,
    /// Default subgroup size for compute shaders.
    pub subgroup_size: u32,
    /// Smallest subgroup size selectable with subgroup size control.
    pub min_subgroup_size: u32,
    /// Largest subgroup size selectable with subgroup size control.
    pub max_subgroup_size: u32,
    /// Whether a pipeline may require a subgroup size (`subgroupSizeControl` +
    /// `computeFullSubgroups`).
    pub subgroup_size_control: bool,
    /// `maintenance4` (Vulkan 1.3): the kernels take their workgroup size
    /// from a specialization constant (`LocalSizeId`), which needs it enabled.
    pub maintenance4: bool,
    /// Whether compute shaders support basic, arithmetic and shuffle subgroup operations.
    pub subgroup_arithmetic: bool,
    /// Largest range one storage-buffer descriptor may cover.
    pub max_storage_buffer_range: u64,
    /// Largest single memory allocation.
    pub max_memory_allocation_size: u64,
    /// Shared memory per workgroup, bytes.
    pub max_shared_memory: u32,
    /// Maximum invocations in one workgroup.
    pub max_workgroup_invocations: u32,
    /// Maximum workgroup count per dimension.
    pub max_workgroup_count: [u32; 3],
    /// Push-constant bytes available.
    pub max_push_constants: u32,
    /// `minStorageBufferOffsetAlignment`: descriptor offsets must be multiples of it.
    pub storage_offset_alignment: u64,
    /// fp16 arithmetic in shaders (`shaderFloat16`).
    pub shader_float16: bool,
    /// 16-bit storage buffer access (`storageBuffer16BitAccess`).
    pub storage_16bit: bool,
    /// int8 arithmetic in shaders (`shaderInt8`).
    pub shader_int8: bool,
    /// The Vulkan memory model with device scope (`vulkanMemoryModel` and
    /// `vulkanMemoryModelDeviceScope`), enabled where the device has both:
    /// the cooperative-matrix kernels are written for it (their SPIR-V
    /// declares the capability), so they run only there. Never the model
    /// alone: with it enabled, the device-scope barriers of the other
    /// kernels (`memoryBarrierBuffer()`) would need the device scope too.
    pub vulkan_memory_model: bool,
    /// Integer dot products in shaders (`shaderIntegerDotProduct`, Vulkan 1.3):
    /// the integer matvec (`matvec_q8.comp`) can run, fast or not.
    pub int_dot: bool,
    /// Accelerated packed 4x8-bit signed dot product (`VK_KHR_shader_integer_dot_product`).
    pub int_dot_accelerated: bool,
    /// f16×f16→f32 cooperative matrix shapes (subgroup scope); empty without the extension.
    pub coop_mat_f16: Vec<CoopMatShape>,
    /// Workgroup-scope cooperative matrices (`VK_NV_cooperative_matrix2`)
    /// with what `glsl/matmul_cm2.comp` needs, and buffer device addresses
    /// for its decode callbacks; `None` without them, and unless
    /// `COMBS_COOPMAT2=1` is in the environment (the kernel is not yet
    /// faster than `matmul_coop.comp` on the devices measured).
    pub coop_mat2: Option<super::coopmat2::CoopMat2>,
    /// Nanoseconds per timestamp tick; `None` where the compute queue has no timestamps.
    pub timestamp_period_ns: Option<f32>,
    /// Bytes of device-local memory in the largest device-local heap.
    pub device_local_bytes: u64,
    /// Streaming multiprocessors (`VK_NV_shader_sm_builtins`); `None` where
    /// the driver does not say.
    pub sm_count: Option<u32>,
    /// Pipelines are created with statistics capture and their statistics
    /// printed (`COMBS_PIPELINE_STATS=1` on a device with
    /// `VK_KHR_pipeline_executable_properties`; see [`super::exec_stats`]).
    pub pipeline_stats: bool,
}

impl DeviceCaps {
    /// Fails with [`ModelError::MissingFeature`] naming the first thing combs cannot run without.
    ///
    /// # Errors
    /// Vulkan older than 1.2, compute shaders without subgroup arithmetic and
    /// shuffles, workgroups smaller than 256 invocations, or subgroups that
    /// may have fewer than 4 invocations.
    pub fn check_required(&self) -> Result<()> {
        let missing = |feature: &str| {
            Err(ModelError::MissingFeature {
                device: self.name.clone(),
                feature: feature.to_string(),
            })
        };
        if self.api_version < vk::API_VERSION_1_2 {
            return missing(&format!(
                "Vulkan 1.2 (device reports {}.{})",
                vk::api_version_major(self.api_version),
                vk::api_version_minor(self.api_version)
            ));
        }
        if !self.subgroup_arithmetic {
            return missing("subgroup basic, arithmetic and shuffle operations in compute shaders");
        }
        if self.max_workgroup_invocations < 256 {
            return missing("workgroups of 256 invocations");
        }
        // The kernels' reductions keep a shared slot per subgroup for
        // subgroups of 4+ invocations (lavapipe on 128-bit vectors, the
        // narrowest seen, has 4).
        if self.min_subgroup_size < 4 {
            return missing(&format!(
                "subgroups of at least 4 invocations (device allows {})",
                self.min_subgroup_size
            ));
        }
        Ok(())
    }

    /// Whether the kernels run on a GPU or on the host's CPU.
    pub fn class(&self) -> DeviceClass {
        if self.device_type == vk::PhysicalDeviceType::CPU {
            DeviceClass::Cpu
        } else {
            DeviceClass::Gpu
        }
    }

    /// Whether cooperative-matrix kernels of the 16×16×16 f16 shape can run here.
    pub fn has_coop_mat_16x16x16(&self) -> bool {
        self.coop_mat_f16
            .iter()
            .any(|s| s.m == 16 && s.n == 16 && s.k == 16)
    }

    /// The largest multiple of `align` that a descriptor may cover.
    pub fn max_binding_bytes(&self, align: u64) -> u64 {
        let align = align.max(self.storage_offset_alignment).max(4);
        (self.max_storage_buffer_range / align) * align
    }
}
