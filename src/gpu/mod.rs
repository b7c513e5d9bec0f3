//! Vulkan through ash: device choice, memory, pipelines from embedded SPIR-V,
//! replayable command recordings, staging transfers and timestamps. All
//! `unsafe` Vulkan calls of the crate live here.

pub mod buffer;
pub mod caps;
pub mod command;
pub mod context;
pub mod kernels;
pub mod lent;
pub mod pipeline;
pub mod transfer;

pub use buffer::{Buffer, MemoryKind};
pub use caps::{DeviceCaps, DeviceClass};
pub use command::{
    Access, Binding, POLL_LIMIT, Recording, WaitMode, groups_1d, run_once, set_wait_mode, wait_mode,
};
pub use context::{DeviceInfo, GpuContext, list_devices};
pub use kernels::Kernel;
pub use lent::{HostRows, LentBuffer};
pub use transfer::{Uploader, download_vec, upload_new};
