//! Model architectures behind one contract. `GenerativeModel` is the set of
//! functions the runtime drives (the analog of MLC's embed / prefill / decode /
//! create_kv_cache): it records GPU work into a caller's `Recording` over a
//! caller's `Scratch` and `KVCache`, so the runtime decides when to submit,
//! and can record a decode step once and replay it.

pub mod llama;
pub mod loader;
pub mod reference;
pub mod registry;
pub mod scratch;
pub mod spec;
pub mod synth;

use std::sync::Arc;

pub use registry::{LoadOptions, ModelRegistry};
pub use scratch::Scratch;
pub use spec::{ArchSpec, Family, LayerKind};

use crate::error::Result;
use crate::gpu::{GpuContext, Recording};
use crate::kv::{CacheConfig, KVCache, KvAttention};

/// A text-generating model resident on the GPU.
pub trait GenerativeModel: Send + Sync {
    /// The resolved architecture.
    fn spec(&self) -> &ArchSpec;

    /// The device the weights live on.
    fn context(&self) -> &Arc<GpuContext>;

    /// A KV cache for one sequence of this model.
    ///
    /// # Errors
    /// Out of device memory.
    fn create_kv_cache(&self, cfg: &CacheConfig) -> Result<Box<dyn KVCache>>;

    /// Activation buffers for forward calls of up to `max_tokens` tokens, with
    /// room for `max_logit_rows` rows of logits.
    ///
    /// # Errors
    /// Out of device memory.
    fn create_scratch(&self, max_tokens: usize, max_logit_rows: usize) -> Result<Scratch>;

    /// Records the embedding of the `n` token ids in `s.ids` into `s.x`.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn record_embed(&self, rec: &mut Recording, s: &Scratch, n: usize) -> Result<()>;

    /// Records every transformer block over the `n` rows of `s.x` at the
    /// positions in `s.positions`, storing their K/V in `cache`.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn record_blocks(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        n: usize,
    ) -> Result<()>;

    /// Records the final norm and output head for rows `first..first + n` of
    /// `s.x` into rows `out_row..out_row + n` of `s.logits`.
    ///
    /// # Errors
    /// More rows than `s.logits` holds.
    fn record_logits(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        first: usize,
        n: usize,
        out_row: usize,
    ) -> Result<()>;

    /// Bytes of weights on the device.
    fn device_bytes(&self) -> u64;

    /// Whether sequences of context sizes `a` and `b` encode positions the
    /// same way, so they can share a forward pass (LongRoPE models pick
    /// their rope factors by the context size).
    fn same_rope(&self, a: usize, b: usize) -> bool {
        let _ = (a, b);
        true
    }
}
