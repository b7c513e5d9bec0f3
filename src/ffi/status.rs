//! `combs_status` and the mapping from [`ModelError`] variants to it.

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
            ModelError::PoolExhausted { .. } | ModelError::OutOfDeviceMemory { .. } => {
                COMBS_ERR_OUT_OF_MEMORY
            }
            ModelError::NoDevice(_) | ModelError::Vulkan { .. } | ModelError::Allocation { .. } => {
                COMBS_ERR_DEVICE
            }
            ModelError::Internal(_) => COMBS_ERR_INTERNAL,
        }
    }
}
