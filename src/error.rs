//! The one error type of the crate, [`ModelError`], grouped by the layer that
//! raises it. Each variant maps to exactly one C status code (see `src/ffi`),
//! so the fields carry what a C caller needs in `combs_last_error()`.

use std::path::PathBuf;

/// Everything that can go wrong between opening a file and reading logits.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    // ---- input / arguments ----
    /// A caller passed a value outside what the call accepts.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The argument's name as the API spells it.
        name: &'static str,
        /// Why the value is refused.
        reason: String,
    },
    /// A token id outside `0..n_vocab`.
    #[error("token id {token} is out of range (vocabulary has {n_vocab} tokens)")]
    TokenOutOfRange {
        /// The offending id.
        token: i64,
        /// Size of the vocabulary.
        n_vocab: usize,
    },
    /// A caller-supplied buffer cannot hold the result; `needed` is the size it must have.
    #[error("buffer too small: {needed} needed, {got} given")]
    BufferTooSmall {
        /// Size that would have been enough.
        needed: usize,
        /// Size the caller offered.
        got: usize,
    },

    // ---- files ----
    /// An operating-system error while reading a file.
    #[error("{path}: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// What the OS reported.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a well-formed GGUF (or other) container.
    #[error("malformed {format} file: {reason} (at byte offset {offset})")]
    Format {
        /// Container format name, e.g. `"GGUF"`.
        format: &'static str,
        /// Byte offset where the problem was found.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A required metadata key is absent or has the wrong type.
    #[error("metadata key `{key}`: {reason}")]
    Metadata {
        /// The GGUF key.
        key: String,
        /// Missing, wrong type, or out of range.
        reason: String,
    },
    /// A tensor the architecture needs is not in the file.
    #[error("tensor `{name}` is missing from the model file")]
    MissingTensor {
        /// GGUF tensor name.
        name: String,
    },
    /// A tensor's shape differs from what the metadata implies.
    #[error("tensor `{tensor}` has shape {got:?}, expected {expected:?}")]
    Shape {
        /// GGUF tensor name (or an op name for runtime shape checks).
        tensor: String,
        /// Shape implied by metadata.
        expected: Vec<u64>,
        /// Shape found.
        got: Vec<u64>,
    },
    /// A tensor type this build cannot run.
    #[error("tensor `{tensor}`: type {ggml_type} is not supported")]
    UnsupportedTensorType {
        /// GGUF tensor name.
        tensor: String,
        /// GGML type id or name.
        ggml_type: String,
    },
    /// `general.architecture` names a family with no loader.
    #[error("unsupported model architecture `{0}`")]
    UnsupportedArchitecture(String),

    // ---- runtime ----
    /// A session's context is full.
    #[error("context is full: {n_ctx} positions, {requested} requested")]
    ContextFull {
        /// Context size of the session.
        n_ctx: usize,
        /// Positions the call would need.
        requested: usize,
    },
    /// A pool of fixed-size resources (e.g. KV pages) is exhausted.
    #[error("out of memory in pool `{pool}`: {reason}")]
    PoolExhausted {
        /// Name of the pool.
        pool: &'static str,
        /// What was asked for and what is left.
        reason: String,
    },

    // ---- device ----
    /// No Vulkan loader or no usable device.
    #[error("no usable Vulkan device: {0}")]
    NoDevice(String),
    /// The chosen device lacks something combs needs.
    #[error("device `{device}` lacks required feature: {feature}")]
    MissingFeature {
        /// Device name.
        device: String,
        /// The feature, limit or extension that is missing.
        feature: String,
    },
    /// A Vulkan call failed.
    #[error("Vulkan call {call} failed: {result}")]
    Vulkan {
        /// The entry point (e.g. `vkCreateDevice`).
        call: &'static str,
        /// The `VkResult` returned.
        result: ash::vk::Result,
    },
    /// Device (or host-visible) memory ran out: the driver refused the
    /// allocation, or it is larger than the device allows at once.
    #[error(
        "out of device memory allocating {bytes} bytes for {what} \
         ({in_use} bytes already allocated on this runtime)"
    )]
    OutOfDeviceMemory {
        /// What the allocation was for (a tensor, cache or buffer name).
        what: String,
        /// Requested size.
        bytes: u64,
        /// Bytes this runtime's buffers held before the request.
        in_use: u64,
    },
    /// An allocation would take the runtime past its memory budget
    /// (`combs_runtime_options.memory_budget`, `GpuContext::set_memory_budget`).
    #[error(
        "out of memory: {what} needs {bytes} bytes, and {in_use} bytes of the \
         runtime's {budget} byte memory budget are in use"
    )]
    MemoryBudget {
        /// What the allocation was for (a tensor, cache or buffer name).
        what: String,
        /// Requested size.
        bytes: u64,
        /// Bytes this runtime's buffers held before the request.
        in_use: u64,
        /// The budget in bytes.
        budget: u64,
    },
    /// The Vulkan device was lost; the runtime cannot run anything again.
    #[error(
        "the Vulkan device was lost ({call} returned VK_ERROR_DEVICE_LOST); \
         nothing more can run on this runtime: free it and create a new runtime"
    )]
    DeviceLost {
        /// Where the loss was first seen (e.g. `vkQueueSubmit`).
        call: &'static str,
    },
    /// The memory allocator failed for a reason other than exhaustion.
    #[error("device memory allocation for {what} failed: {reason}")]
    Allocation {
        /// What the allocation was for.
        what: String,
        /// The allocator's message.
        reason: String,
    },

    // ---- kernels ----
    /// A kernel family asked to do something it does not implement (a call
    /// forcing a kernel that cannot take its operands, or a layout the
    /// device cannot run); the planner never picks such a kernel.
    #[error("kernel `{kernel}` cannot run this call: {reason}")]
    KernelUnsupported {
        /// The kernel family.
        kernel: &'static str,
        /// What it cannot do.
        reason: String,
    },

    // ---- wrapping ----
    /// Another error, with where it happened (e.g. which session of a batch).
    #[error("{what}: {source}")]
    Context {
        /// Where the error happened.
        what: String,
        /// The error itself.
        #[source]
        source: Box<ModelError>,
    },

    // ---- internal ----
    /// An invariant the code relies on did not hold; always a bug in combs.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ModelError {
    /// Shorthand for [`ModelError::KernelUnsupported`].
    pub fn kernel(kernel: &'static str, reason: impl Into<String>) -> Self {
        ModelError::KernelUnsupported {
            kernel,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`ModelError::InvalidArgument`].
    pub fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        ModelError::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }

    /// Wraps the error in [`ModelError::Context`] naming where it happened.
    pub fn context(self, what: impl Into<String>) -> Self {
        ModelError::Context {
            what: what.into(),
            source: Box::new(self),
        }
    }

    /// The error under any [`ModelError::Context`] wrappers.
    pub fn root(&self) -> &ModelError {
        match self {
            ModelError::Context { source, .. } => source.root(),
            e => e,
        }
    }

    /// Shorthand for a GGUF [`ModelError::Format`] error.
    pub fn gguf(offset: u64, reason: impl Into<String>) -> Self {
        ModelError::Format {
            format: "GGUF",
            offset,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`ModelError::Vulkan`].
    pub fn vk(call: &'static str, result: ash::vk::Result) -> Self {
        ModelError::Vulkan { call, result }
    }
}

/// Result alias used throughout the crate: every fallible call returns one,
/// its error a [`ModelError`] that names what went wrong.
///
/// ```
/// use combs::{ModelError, Result};
/// use combs::quant::{QuantType, quantize};
///
/// fn blocks(n: usize) -> Result<usize> {
///     Ok(quantize(QuantType::Q4_0, &vec![0.5; n])?.len())
/// }
///
/// assert_eq!(blocks(64).ok(), Some(36)); // two blocks of 18 bytes
/// assert!(matches!(blocks(60), Err(ModelError::InvalidArgument { .. }))); // not whole blocks
/// ```
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
