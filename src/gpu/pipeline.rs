//! Compute pipelines built from the SPIR-V that `build.rs` embeds, one per
//! (kernel, specialization constants, binding count, subgroup size), cached on
//! the context. Every pipeline uses descriptor set 0 with `n` storage buffers
//! at bindings `0..n` and up to 128 bytes of push constants.
//!
//! Specialization constant convention: id 0 is the workgroup size in x (GLSL
//! `local_size_x_id = 0`), id 1 the subgroup size the kernel was built for;
//! later ids are the kernel's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ash::vk;

use super::context::{GpuContext, lock};
use super::kernels::Kernel;
use super::phases::{self, Phase};
use crate::error::{ModelError, Result};

/// Push-constant bytes every pipeline layout declares.
pub const PUSH_CONSTANT_BYTES: u32 = 128;

/// A compute pipeline and the layouts it was created with.
pub struct Pipeline {
    pub(crate) raw: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    pub(crate) set_layout: vk::DescriptorSetLayout,
    kernel: Kernel,
}

impl Pipeline {
    /// The kernel this pipeline runs.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PipelineKey {
    kernel: Kernel,
    spec: Vec<u32>,
    n_bindings: u32,
    subgroup: Option<u32>,
}

/// Layouts keyed by binding count, pipelines keyed by [`PipelineKey`].
#[derive(Default)]
pub(crate) struct PipelineCache {
    layouts: Mutex<HashMap<u32, (vk::DescriptorSetLayout, vk::PipelineLayout)>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Pipeline>>>,
    /// Held shared while the driver creates a pipeline and exclusively while
    /// a command buffer is submitted: the two never overlap.
    ///
    /// Vulkan allows them to, but NVIDIA's driver (H200) then sometimes
    /// never runs the submission or anything queued after it: `ops_q8`'s
    /// tests, which create pipelines on some threads while others submit,
    /// stalled in 13 of 37 runs (every fence unsignaled, not even the
    /// first dispatch's end timestamp written, the GPU idle at 100%
    /// "utilization"); with this gate in none of 16, and `tests/gpu_threads.rs`
    /// in none of 8 (1 of 8 without it). Serializing the submissions with
    /// their waits instead, so that no two submissions' work overlapped on
    /// the GPU, still stalled 2 of 5. Pipelines are created while a model
    /// loads or at a prompt's first shape, so a submission rarely waits on one.
    gate: RwLock<()>,
}

impl PipelineCache {
    /// Shared hold on the gate, for creating a pipeline.
    fn creating(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Exclusive hold on the gate, for a queue submission: waits for the
    /// pipelines being created to be done.
    pub(crate) fn submitting(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Pipelines held.
    pub(crate) fn len(&self) -> usize {
        lock(&self.pipelines).len()
    }

    /// Destroys every pipeline and layout.
    ///
    /// # Safety
    /// No command buffer using them may be pending; `device` is the one they were made on.
    pub(crate) unsafe fn destroy(&self, device: &ash::Device) {
        let mut p = lock(&self.pipelines);
        for (_, pl) in p.drain() {
            // SAFETY: per the function's contract.
            unsafe { device.destroy_pipeline(pl.raw, None) };
        }
        let mut l = lock(&self.layouts);
        for (_, (set, layout)) in l.drain() {
            // SAFETY: per the function's contract.
            unsafe {
                device.destroy_pipeline_layout(layout, None);
                device.destroy_descriptor_set_layout(set, None);
            }
        }
    }
}

fn layouts(ctx: &GpuContext, n: u32) -> Result<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
    let mut map = lock(&ctx.pipelines.layouts);
    if let Some(l) = map.get(&n) {
        return Ok(*l);
    }
    let bindings: Vec<vk::DescriptorSetLayoutBinding> = (0..n)
        .map(|i| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(i)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let dev = ctx.device();
    let info = vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings);
    // SAFETY: valid device and create info.
    let set = unsafe { dev.create_descriptor_set_layout(&info, None) }
        .map_err(|r| ModelError::vk("vkCreateDescriptorSetLayout", r))?;
    let push = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .offset(0)
        .size(PUSH_CONSTANT_BYTES.min(ctx.caps().max_push_constants))];
    let sets = [set];
    let info = vk::PipelineLayoutCreateInfo::default()
        .set_layouts(&sets)
        .push_constant_ranges(&push);
    // SAFETY: valid device and create info.
    let layout = match unsafe { dev.create_pipeline_layout(&info, None) } {
        Ok(l) => l,
        Err(r) => {
            // SAFETY: set is unused.
            unsafe { dev.destroy_descriptor_set_layout(set, None) };
            return Err(ModelError::vk("vkCreatePipelineLayout", r));
        }
    };
    map.insert(n, (set, layout));
    Ok((set, layout))
}

/// Returns the cached pipeline for `kernel` with specialization constants `spec`
/// (ids 0, 1, 2, ...) and `n_bindings` storage buffers, creating it on first use.
/// `subgroup` asks the driver for that exact subgroup size where the device
/// supports subgroup size control.
///
/// # Errors
/// Pipeline creation failed (a driver or SPIR-V problem).
pub fn get_pipeline(
    ctx: &GpuContext,
    kernel: Kernel,
    spec: &[u32],
    n_bindings: u32,
    subgroup: Option<u32>,
) -> Result<Arc<Pipeline>> {
    let caps = ctx.caps();
    let subgroup = subgroup.filter(|&s| {
        caps.subgroup_size_control && s >= caps.min_subgroup_size && s <= caps.max_subgroup_size
    });
    let key = PipelineKey {
        kernel,
        spec: spec.to_vec(),
        n_bindings,
        subgroup,
    };
    if let Some(p) = lock(&ctx.pipelines.pipelines).get(&key) {
        return Ok(p.clone());
    }
    let _t = phases::time(Phase::Pipeline);
    let started = phases::enabled().then(std::time::Instant::now);
    let (set_layout, layout) = layouts(ctx, n_bindings)?;
    let words = spirv_words(kernel.spirv());
    let dev = ctx.device();
    let module_info = vk::ShaderModuleCreateInfo::default().code(&words);
    // SAFETY: the SPIR-V was produced and validated by shaderc at build time.
    let module = unsafe { dev.create_shader_module(&module_info, None) }
        .map_err(|r| ModelError::vk("vkCreateShaderModule", r))?;
    let entries: Vec<vk::SpecializationMapEntry> = (0..spec.len() as u32)
        .map(|i| {
            vk::SpecializationMapEntry::default()
                .constant_id(i)
                .offset(i * 4)
                .size(4)
        })
        .collect();
    let spec_bytes: Vec<u8> = spec.iter().flat_map(|v| v.to_le_bytes()).collect();
    let spec_info = vk::SpecializationInfo::default()
        .map_entries(&entries)
        .data(&spec_bytes);
    let mut required = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
        .required_subgroup_size(subgroup.unwrap_or(0));
    let mut stage = vk::PipelineShaderStageCreateInfo::default()
        .stage(vk::ShaderStageFlags::COMPUTE)
        .module(module)
        .name(c"main")
        .specialization_info(&spec_info);
    if subgroup.is_some() {
        stage = stage
            .flags(vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS)
            .push_next(&mut required);
    }
    let flags = if caps.pipeline_stats {
        vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
    } else {
        vk::PipelineCreateFlags::empty()
    };
    let info = [vk::ComputePipelineCreateInfo::default()
        .flags(flags)
        .stage(stage)
        .layout(layout)];
    let dump = std::env::var_os("COMBS_PIPELINE_DUMP");
    // SAFETY: an empty cache, destroyed below.
    let cache = match &dump {
        Some(_) => {
            unsafe { dev.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default(), None) }
                .unwrap_or(vk::PipelineCache::null())
        }
        None => vk::PipelineCache::null(),
    };
    let result = {
        let _gate = ctx.pipelines.creating();
        // SAFETY: module, layout and the create info are valid for this call.
        unsafe { dev.create_compute_pipelines(cache, &info, None) }
    };
    if let (Some(dir), false) = (&dump, cache == vk::PipelineCache::null()) {
        // The driver's own form of this one pipeline (NVIDIA's holds the
        // machine code, for offline disassembly): diagnostics only.
        // SAFETY: the cache is live and used by no other thread.
        if let Ok(data) = unsafe { dev.get_pipeline_cache_data(cache) } {
            let name: String = format!("{}-{spec:?}", kernel.name())
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            let path = std::path::Path::new(dir).join(format!("{name}.bin"));
            let _ = std::fs::write(path, data);
        }
        // SAFETY: nothing else holds the cache.
        unsafe { dev.destroy_pipeline_cache(cache, None) };
    }
    // SAFETY: the module is no longer needed once the pipeline exists (or failed).
    unsafe { dev.destroy_shader_module(module, None) };
    let raw = result.map_err(|(_, r)| ModelError::vk("vkCreateComputePipelines", r))?[0];
    if caps.pipeline_stats {
        let label = format!("{} {spec:?}", kernel.name());
        super::exec_stats::report(ctx.instance(), dev, raw, &label);
    }
    if let Some(t) = started {
        // Which kernels a cold driver cache spends the first call on.
        eprintln!(
            "  pipeline {} {spec:?}: {:.1} ms",
            kernel.name(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let pipeline = Arc::new(Pipeline {
        raw,
        layout,
        set_layout,
        kernel,
    });
    let mut map = lock(&ctx.pipelines.pipelines);
    // Another thread may have built the same pipeline meanwhile; keep the first.
    if let Some(existing) = map.get(&key) {
        // SAFETY: the new pipeline was never used.
        unsafe { dev.destroy_pipeline(raw, None) };
        return Ok(existing.clone());
    }
    map.insert(key, pipeline.clone());
    Ok(pipeline)
}

fn spirv_words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
