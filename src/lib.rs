//! combs: an LLM inference engine on raw Vulkan compute, embeddable from C and
//! C++ through `libcombs.so` and `include/combs.h`.
//!
//! Layers, top to bottom: `ffi` (C API), `runtime`, `models`, `kv`, `ops`,
//! `quant`, `formats`, `tokenizer`, `gpu`. See `DESIGN.md` for the map.
//!
//! The names the specification gives the Rust API are re-exported here, so
//! that `use combs::{LlamaModel, ModelRegistry, Q4KWeight, GenerativeModel,
//! Linear, rms_norm, RotaryEmbedding};` works: the weights of one format
//! ([`Q4KWeight`], ...), their layout step ([`repack_q4_k`], ...) and
//! validation dequantizers ([`dequantize_q4_k_gpu`], ...), the layer
//! [`Linear`] and its builder [`try_quant_linear`], the ops [`rms_norm`] and
//! [`RotaryEmbedding`], the models ([`ModelRegistry`], [`LlamaModel`],
//! [`GenerativeModel`]) and the caches ([`CacheConfig`], [`CacheKind`],
//! [`PageStats`]).

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

// The names the specification gives the public Rust API, each thin over the
// engine item it re-exports or wraps (see the item's own documentation).
pub use kv::{CacheConfig, CacheKind, KVCache, PageStats};
pub use models::llama::LlamaModel;
pub use models::{
    ArchSpec, GenerativeModel, LayerKind, LoadOptions, ModelRegistry, RotaryEmbedding,
};
pub use ops::dequant::{
    dequantize_q4_0_gpu, dequantize_q4_k_gpu, dequantize_q5_0_gpu, dequantize_q5_k_gpu,
    dequantize_q6_k_gpu, dequantize_q8_0_gpu,
};
pub use ops::linear::api::{Linear, QuantLinearOp, try_quant_linear};
pub use ops::rms_norm::{NormFlavor, rms_norm};
pub use quant::{
    Q4KWeight, Q5KWeight, Q6KWeight, Q40Weight, Q50Weight, Q80Weight, repack_q4_0, repack_q4_k,
    repack_q5_0, repack_q5_k, repack_q6_k, repack_q8_0,
};
