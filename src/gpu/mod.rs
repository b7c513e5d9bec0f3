//! Vulkan through ash: device choice, memory, pipelines from embedded SPIR-V,
//! replayable command recordings, staging transfers and timestamps. All
//! `unsafe` Vulkan calls of the crate live here.

pub mod binding;
mod budget;
pub mod buffer;
pub mod caps;
pub mod command;
pub mod context;
pub mod coopmat2;
pub mod exec_stats;
pub mod fault;
pub mod host;
pub mod kernels;
pub mod lent;
pub mod mapped;
pub mod phases;
pub mod pipeline;
mod spare;
pub mod transfer;
pub mod wait;

pub use binding::{Access, Binding, groups_1d};
pub use buffer::{Buffer, MemoryKind};
pub use caps::{DeviceCaps, DeviceClass};
pub use command::{ELEMENTWISE_WG, Recording, run_once};
pub use context::{DeviceInfo, GpuContext, list_devices, parse_device};
pub use fault::FAULT_ENV;
#[doc(hidden)]
pub use fault::Fault;
pub use host::{HostMem, HostMut, HostRef, HostStep};
pub use kernels::Kernel;
pub use lent::{HostRows, LentBuffer};
pub use transfer::{Uploader, download_vec, upload_new};
pub use wait::{POLL_LIMIT, WaitMode, set_wait_mode, wait_mode};
