//! `combs_status`, the mapping from [`ModelError`] variants to it, and
//! `combs_status_str`.

use std::ffi::{c_char, c_int};

use crate::error::ModelError;

/// Result of every fallible C call. `COMBS_OK` is 0; on any other value
/// `combs_last_error()` describes what failed on this thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_status {
    /// Success.
    COMBS_OK = 0,
    /// A NULL handle or pointer, or a value outside what the call accepts.
    COMBS_ERR_INVALID_ARGUMENT,
    /// The file could not be read.
    COMBS_ERR_IO,
    /// The file is malformed or inconsistent.
    COMBS_ERR_FORMAT,
    /// The architecture, tensor type or device feature is not supported.
    COMBS_ERR_UNSUPPORTED,
    /// Device memory (or a page pool) ran out.
    COMBS_ERR_OUT_OF_MEMORY,
    /// The Vulkan device failed or is missing.
    COMBS_ERR_DEVICE,
    /// The session's context is full.
    COMBS_ERR_CONTEXT_FULL,
    /// A bug in combs (including a caught panic).
    COMBS_ERR_INTERNAL,
    /// The output buffer is too small; the needed size was written to the length out-parameter.
    COMBS_ERR_BUFFER_TOO_SMALL,
}

impl From<&ModelError> for combs_status {
    fn from(e: &ModelError) -> Self {
        use combs_status::*;
        match e {
            ModelError::InvalidArgument { .. } | ModelError::TokenOutOfRange { .. } => {
                COMBS_ERR_INVALID_ARGUMENT
            }
            ModelError::BufferTooSmall { .. } => COMBS_ERR_BUFFER_TOO_SMALL,
            ModelError::Io { .. } => COMBS_ERR_IO,
            ModelError::Format { .. }
            | ModelError::Metadata { .. }
            | ModelError::MissingTensor { .. }
            | ModelError::Shape { .. } => COMBS_ERR_FORMAT,
            ModelError::UnsupportedTensorType { .. }
            | ModelError::UnsupportedArchitecture(_)
            | ModelError::MissingFeature { .. } => COMBS_ERR_UNSUPPORTED,
            ModelError::ContextFull { .. } => COMBS_ERR_CONTEXT_FULL,
            ModelError::PoolExhausted { .. }
            | ModelError::OutOfDeviceMemory { .. }
            | ModelError::MemoryBudget { .. } => COMBS_ERR_OUT_OF_MEMORY,
            ModelError::Vulkan {
                result:
                    ash::vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
                    | ash::vk::Result::ERROR_OUT_OF_HOST_MEMORY,
                ..
            } => COMBS_ERR_OUT_OF_MEMORY,
            ModelError::NoDevice(_)
            | ModelError::Vulkan { .. }
            | ModelError::Allocation { .. }
            | ModelError::DeviceLost { .. } => COMBS_ERR_DEVICE,
            ModelError::Internal(_) | ModelError::KernelUnsupported { .. } => COMBS_ERR_INTERNAL,
            ModelError::Context { source, .. } => combs_status::from(source.as_ref()),
        }
    }
}

impl combs_status {
    /// Every status, in value order.
    pub const ALL: [combs_status; 10] = [
        combs_status::COMBS_OK,
        combs_status::COMBS_ERR_INVALID_ARGUMENT,
        combs_status::COMBS_ERR_IO,
        combs_status::COMBS_ERR_FORMAT,
        combs_status::COMBS_ERR_UNSUPPORTED,
        combs_status::COMBS_ERR_OUT_OF_MEMORY,
        combs_status::COMBS_ERR_DEVICE,
        combs_status::COMBS_ERR_CONTEXT_FULL,
        combs_status::COMBS_ERR_INTERNAL,
        combs_status::COMBS_ERR_BUFFER_TOO_SMALL,
    ];

    /// The status's name as a NUL-terminated static string.
    fn name(self) -> &'static str {
        use combs_status::*;
        match self {
            COMBS_OK => "COMBS_OK\0",
            COMBS_ERR_INVALID_ARGUMENT => "COMBS_ERR_INVALID_ARGUMENT\0",
            COMBS_ERR_IO => "COMBS_ERR_IO\0",
            COMBS_ERR_FORMAT => "COMBS_ERR_FORMAT\0",
            COMBS_ERR_UNSUPPORTED => "COMBS_ERR_UNSUPPORTED\0",
            COMBS_ERR_OUT_OF_MEMORY => "COMBS_ERR_OUT_OF_MEMORY\0",
            COMBS_ERR_DEVICE => "COMBS_ERR_DEVICE\0",
            COMBS_ERR_CONTEXT_FULL => "COMBS_ERR_CONTEXT_FULL\0",
            COMBS_ERR_INTERNAL => "COMBS_ERR_INTERNAL\0",
            COMBS_ERR_BUFFER_TOO_SMALL => "COMBS_ERR_BUFFER_TOO_SMALL\0",
        }
    }
}

/// A `combs_status` as C passes it: any `int`, so that a value outside the
/// enum (a cast, a newer header) is not undefined behaviour on the Rust side.
/// The header spells it `combs_status` (see `cbindgen.toml`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusArg(pub c_int);

impl From<combs_status> for StatusArg {
    fn from(s: combs_status) -> Self {
        StatusArg(s as c_int)
    }
}

/// The name of a status as a static NUL-terminated string, e.g.
/// `"COMBS_ERR_IO"`; `"COMBS_ERR_UNKNOWN"` for a value outside the enum.
/// Never NULL; the string must not be freed.
#[unsafe(no_mangle)]
pub extern "C" fn combs_status_str(s: StatusArg) -> *const c_char {
    let unknown: *const c_char = c"COMBS_ERR_UNKNOWN".as_ptr();
    super::guard::guard_value(
        "combs_status_str",
        unknown,
        |_| unknown,
        || {
            let name = combs_status::ALL
                .iter()
                .find(|v| **v as c_int == s.0)
                .map_or("COMBS_ERR_UNKNOWN\0", |v| v.name());
            Ok(name.as_ptr().cast())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk;

    #[test]
    fn status_of_memory_and_device_failures() {
        use combs_status::*;
        // A real exhaustion reported by a submission is out of memory too.
        for r in [
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
            vk::Result::ERROR_OUT_OF_HOST_MEMORY,
        ] {
            let e = ModelError::vk("vkQueueSubmit", r);
            assert_eq!(combs_status::from(&e), COMBS_ERR_OUT_OF_MEMORY);
        }
        let budget = ModelError::MemoryBudget {
            what: "blk.0.ffn_up.weight".into(),
            bytes: 10,
            in_use: 95,
            budget: 100,
        };
        assert_eq!(combs_status::from(&budget), COMBS_ERR_OUT_OF_MEMORY);
        let driver = ModelError::OutOfDeviceMemory {
            what: "cache_k.0".into(),
            bytes: 10,
            in_use: 0,
        };
        assert_eq!(
            combs_status::from(&driver.context("KV cache")),
            COMBS_ERR_OUT_OF_MEMORY
        );
        let lost = ModelError::DeviceLost {
            call: "vkQueueSubmit",
        };
        assert_eq!(combs_status::from(&lost), COMBS_ERR_DEVICE);
        assert!(lost.to_string().contains("create a new runtime"));
    }
}
