//! combs: an LLM inference engine on raw Vulkan compute, embeddable from C and
//! C++ through `libcombs.so` and `include/combs.h`.
//!
//! Layers, top to bottom: `ffi` (C API), `runtime`, `models`, `kv`, `ops`,
//! `quant`, `formats`, `tokenizer`, `gpu`. See `DESIGN.md` for the map.

pub mod audio;
pub mod error;
pub mod ffi;
pub mod formats;
pub mod gpu;
pub mod kv;
pub mod models;
pub mod ops;
pub mod quant;
pub mod runtime;
pub mod tokenizer;
pub mod vision;

pub use error::{ModelError, Result};
