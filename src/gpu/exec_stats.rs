//! `COMBS_PIPELINE_STATS=1`: what the driver's compiler made of each
//! pipeline (registers, spills, shared memory: whatever the driver reports
//! through `VK_KHR_pipeline_executable_properties`), printed to stderr as
//! each pipeline is created. The figures decide how many workgroups of a
//! kernel share a multiprocessor, which timings alone do not show. Off by
//! default: capturing statistics may cost compile time.

use std::ffi::CStr;
use std::sync::OnceLock;

use ash::vk;

/// The extension that reports the statistics.
pub const NAME: &CStr = ash::khr::pipeline_executable_properties::NAME;

/// Whether the environment asks for statistics (`COMBS_PIPELINE_STATS` set
/// to anything but `0`).
pub fn requested() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("COMBS_PIPELINE_STATS").is_some_and(|v| v != "0"))
}

/// One statistic's value as text.
fn value_text(s: &vk::PipelineExecutableStatisticKHR<'_>) -> String {
    // SAFETY: the driver fills the union member that `format` names.
    unsafe {
        match s.format {
            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
            vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
            _ => "?".into(),
        }
    }
}

/// Prints every executable's statistics of `pipeline`, created with
/// `CAPTURE_STATISTICS_KHR` on a device with the extension enabled, as one
/// line: `  stats <label>: <name>=<value>, …`. Failures print instead of
/// failing the caller: this is a diagnostic.
pub fn report(instance: &ash::Instance, device: &ash::Device, pipeline: vk::Pipeline, label: &str) {
    let ext = ash::khr::pipeline_executable_properties::Device::new(instance, device);
    let info = vk::PipelineInfoKHR::default().pipeline(pipeline);
    // SAFETY: the pipeline is valid and was created with statistics capture.
    let executables = match unsafe { ext.get_pipeline_executable_properties(&info) } {
        Ok(e) => e,
        Err(r) => {
            eprintln!("  stats {label}: vkGetPipelineExecutablePropertiesKHR: {r}");
            return;
        }
    };
    for index in 0..executables.len() as u32 {
        let exec = vk::PipelineExecutableInfoKHR::default()
            .pipeline(pipeline)
            .executable_index(index);
        // SAFETY: as above; the index is within the executables reported.
        match unsafe { ext.get_pipeline_executable_statistics(&exec) } {
            Ok(stats) => {
                let text: Vec<String> = stats
                    .iter()
                    .map(|s| {
                        let name = s.name_as_c_str().map_or("?".into(), CStr::to_string_lossy);
                        format!("{name}={}", value_text(s))
                    })
                    .collect();
                eprintln!("  stats {label}: {}", text.join(", "));
            }
            Err(r) => eprintln!("  stats {label}: vkGetPipelineExecutableStatisticsKHR: {r}"),
        }
    }
}
