//! Model architectures behind one contract. `GenerativeModel` is the set of
//! functions the runtime drives: it records GPU work into a caller's
//! `Recording` over a caller's `Scratch` and `KVCache`, so the runtime
//! decides when to submit, and can record a decode step once and replay it.
//! Over those it also offers MLC's step-by-step set — `embed`, `prefill`,
//! `decode`, `create_kv_cache` — which submit and return host vectors
//! ([`steps`]).
//!
//! An architecture file (`llama.rs`) implements [`Architecture`]: its
//! weights, and *what* each call computes, stated to the planner
//! (`ops::plan`) that picks the kernels. [`Loaded`] puts an architecture
//! together with what the runtime needs beside it — the planner's settings,
//! the activation buffers' shape and the KV caches (`kv::KvCaches`, which
//! owns the page pools) — and is the `GenerativeModel` the registry returns.

pub mod clip;
pub mod hf;
pub mod llama;
pub mod loader;
pub mod reference;
pub mod registry;
pub mod rotary;
pub mod scratch;
pub mod smolvlm;
pub mod smolvlm_reference;
pub mod spec;
pub mod speech;
pub mod speech_loader;
pub mod split;
pub mod steps;
pub mod synth;
pub mod whisper;
pub mod whisper_reference;

use std::ops::Range;
use std::sync::Arc;

pub use registry::{LoadOptions, ModelRegistry};
pub use rotary::RotaryEmbedding;
pub use scratch::Scratch;
pub use spec::{ArchSpec, Family, LayerKind};
pub use speech_loader::load_speech_model;
pub use split::{Placement, SplitMode, SplitModel};

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, Recording};
use crate::kv::{CacheConfig, KVCache, KvAttention, KvCaches, LayerGeometry};
use crate::ops::act_round::Numerics;
use crate::ops::plan::{Forward, OutputHead, Planner, Workspace, WorkspaceShape};
use crate::quant::QuantWeight;

/// Input vectors a caller gives in place of the token embeddings of
/// `data.len() / n_embd` consecutive positions of a prompt, from `pos` on
/// (an image's embeddings at its `<image>` tokens).
#[derive(Clone, Copy, Debug)]
pub struct EmbedRows<'a> {
    /// Index in the prompt of the first row.
    pub pos: usize,
    /// The rows, `n_embd` floats each.
    pub data: &'a [f32],
}

/// A copy of `rows` rows of `n_embd` floats from row `src_row` of a
/// caller's buffer over row `dst_row` of a call's residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowCopy {
    /// First row in the source buffer.
    pub src_row: usize,
    /// First row of the call.
    pub dst_row: usize,
    /// Rows.
    pub rows: usize,
}

/// Where one stage of a model split by layers reads the stream the
/// previous stage handed on, and where it writes its own for the next
/// (host-visible buffers on its device; the host moves the rows between).
#[derive(Clone, Copy, Default)]
pub struct StageIo<'a> {
    /// The previous stage's stream, and whether it carries the sums of
    /// squares; `None` on the first stage.
    pub from: Option<(&'a Arc<Buffer>, bool)>,
    /// Where the stream for the next stage goes; `None` on the last stage.
    pub to: Option<&'a Arc<Buffer>>,
}

/// A text-generating model resident on the GPU, of any architecture the
/// [`ModelRegistry`] loads: the recording interface the runtime drives,
/// and MLC's step-by-step set over it ([`GenerativeModel::embed`],
/// [`GenerativeModel::prefill`], [`GenerativeModel::decode`],
/// [`GenerativeModel::create_kv_cache`]).
///
/// ```
/// # use combs::formats::gguf::GgufFile;
/// # use combs::models::synth::{SynthConfig, synth_gguf};
/// # use combs::quant::QuantType;
/// use combs::gpu::GpuContext;
/// use combs::runtime::{Session, SessionOptions};
/// use combs::{CacheConfig, GenerativeModel, LoadOptions, ModelRegistry};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
///     // Step by step...
///     let mut cache = model.create_kv_cache(&CacheConfig::contiguous(64))?;
///     let steps = model.prefill(&model.embed(&[5, 6, 7])?, cache.as_mut())?;
///     // ...computes what a session does.
///     let opts = SessionOptions { n_ctx: 64, ..Default::default() };
///     let mut session = Session::new(model, &opts)?;
///     session.prefill(&[5, 6, 7])?;
///     assert!(steps.iter().zip(session.logits()).all(|(a, b)| (a - b).abs() < 1e-4));
///     Ok(())
/// }
/// ```
pub trait GenerativeModel: Send + Sync {
    /// The resolved architecture.
    fn spec(&self) -> &ArchSpec;

    /// The device the weights live on.
    fn context(&self) -> &Arc<GpuContext>;

    /// A KV cache for one sequence of this model (MLC's `create_kv_cache`):
    /// contiguous, or paged from a pool the model's paged caches share.
    ///
    /// ```
    /// # use combs::formats::gguf::GgufFile;
    /// # use combs::models::synth::{SynthConfig, synth_gguf};
    /// # use combs::quant::QuantType;
    /// use combs::gpu::GpuContext;
    /// use combs::{CacheConfig, CacheKind, GenerativeModel, LoadOptions, ModelRegistry};
    ///
    /// fn main() -> combs::Result<()> {
    ///     let ctx = GpuContext::new(None)?;
    ///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
    ///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
    ///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
    ///     let cache = model.create_kv_cache(&CacheConfig::paged(64, 16))?;
    ///     assert_eq!((cache.kind(), cache.len()), (CacheKind::Paged, 0));
    ///     Ok(())
    /// }
    /// ```
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

    /// Records the embedding of the `n` token ids in `s`'s ids into its
    /// residual stream.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn record_embed(&self, rec: &mut Recording, s: &Scratch, n: usize) -> Result<()>;

    /// Records, after [`GenerativeModel::record_embed`] of a call of `n`
    /// tokens, the copies `copies` of f32 rows of `src` over rows of its
    /// residual stream: input vectors the caller computed (image
    /// embeddings) in place of those of the tokens there. The embedding
    /// scale of the model (Gemma's `√n_embd`) applies to token rows only,
    /// as in llama.cpp, where it scales only embeddings looked up from ids.
    ///
    /// # Errors
    /// Rows outside the call or outside `src`.
    fn record_put_rows(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        src: &Arc<Buffer>,
        copies: &[RowCopy],
    ) -> Result<()>;

    /// Records a copy of the `n` rows of the residual stream into rows
    /// `0..n` of `dst` (f32, `n_embd` each): after
    /// [`GenerativeModel::record_embed`], the input vectors of the call's
    /// tokens.
    ///
    /// # Errors
    /// `dst` too small for the rows.
    fn record_read_rows(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        dst: &Arc<Buffer>,
    ) -> Result<()>;

    /// Records every transformer block over the `n` rows of the residual
    /// stream at the positions in `s`, storing their K/V in `cache`.
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
    /// the residual stream into rows `out_row..out_row + n` of `s.logits`.
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
    ) -> Result<()> {
        self.record_logits_to(rec, s, first, n, &s.logits, out_row)
    }

    /// [`GenerativeModel::record_logits`] into rows `dst_row..dst_row + n`
    /// of the host-visible `dst` instead of `s.logits` (the device rows
    /// used are `0..n`).
    ///
    /// # Errors
    /// More rows than the workspace or `dst` holds.
    fn record_logits_to(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        first: usize,
        n: usize,
        dst: &Arc<Buffer>,
        dst_row: usize,
    ) -> Result<()>;

    /// Records the final norm and output head for rows `0..n` of the
    /// residual stream, and the `k` best logits of each row with their
    /// indices into `out` (`ops::topk`, the first pass's lists in
    /// `scratch`): a decode step whose sampler reads candidates, not rows.
    ///
    /// # Errors
    /// Models that do not produce logits this way (the default), more rows
    /// than the workspace holds, k out of range.
    fn record_logits_top_k(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        k: usize,
        scratch: &Arc<Buffer>,
        out: &Arc<Buffer>,
    ) -> Result<()> {
        let _ = (rec, s, n, k, scratch, out);
        Err(ModelError::invalid(
            "model",
            format!("{} does not select logits on the device", self.spec().arch),
        ))
    }

    /// Whether [`GenerativeModel::record_logits_top_k`] is implemented.
    fn selects_logits(&self) -> bool {
        false
    }

    /// Records, as one device's share of a model split by layers, the
    /// copy of the previous stage's stream in `io.from` over the residual
    /// (none on the first stage, which embeds instead), this model's blocks
    /// over the `n` rows, and the copy of the stream for the next stage
    /// into `io.to` (none on the last, which records the logits instead).
    /// Returns whether the stream written carries the sums of squares of
    /// the residual (what the next stage passes back in `io.from`).
    ///
    /// # Errors
    /// Buffers too small for the rows, shapes the kernels do not support;
    /// a model that is not a stage of a split.
    fn record_stage(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        n: usize,
        io: StageIo<'_>,
    ) -> Result<bool> {
        let _ = (rec, s, cache, n, io);
        Err(ModelError::invalid(
            "model",
            format!("{} does not run as a stage of a split", self.spec().arch),
        ))
    }

    /// Floats per row of the stream [`GenerativeModel::record_stage`]
    /// hands from one device to the next.
    fn stream_row_floats(&self) -> usize {
        self.spec().n_embd
    }

    /// The blocks this model holds: all of them, or one device's share of
    /// a model split by layers.
    fn layers(&self) -> Range<usize> {
        0..self.spec().n_layer
    }

    /// The stages of a model split by layers over several devices, in
    /// order (`None`: the model is on one device). A
    /// [`Session`](crate::runtime::Session) runs them one after the other.
    fn stages(&self) -> Option<&[Arc<dyn GenerativeModel>]> {
        None
    }

    /// Bytes of weights on the device.
    fn device_bytes(&self) -> u64;

    /// Bytes of weights one decode step reads: all of them but the token
    /// embedding table (one row per token), unless the output head is that
    /// table. Over the device's copy bandwidth, the fastest decode can be.
    fn decode_bytes_per_token(&self) -> u64 {
        self.device_bytes()
    }

    /// Whether sequences of context sizes `a` and `b` encode positions the
    /// same way, so they can share a forward pass (LongRoPE models pick
    /// their rope factors by the context size).
    fn same_rope(&self, a: usize, b: usize) -> bool {
        let _ = (a, b);
        true
    }

    /// MLC's `embed`: the input vectors of `tokens` (`tokens.len() * n_embd`
    /// floats, row-major), the embedding scale applied — what
    /// [`GenerativeModel::prefill`] takes, alone or with rows of the
    /// caller's own (an image's embeddings) spliced in.
    ///
    /// ```
    /// # use combs::formats::gguf::GgufFile;
    /// # use combs::models::synth::{SynthConfig, synth_gguf};
    /// # use combs::quant::QuantType;
    /// use combs::gpu::GpuContext;
    /// use combs::{GenerativeModel, LoadOptions, ModelRegistry};
    ///
    /// fn main() -> combs::Result<()> {
    ///     let ctx = GpuContext::new(None)?;
    ///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
    ///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
    ///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
    ///     let x = model.embed(&[1, 2, 3])?;
    ///     assert_eq!(x.len(), 3 * model.spec().n_embd);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// No tokens, a token out of range, or a device error.
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        steps::embed(self, tokens)
    }

    /// MLC's `prefill`: evaluates the input vectors `embeddings` (whole
    /// rows of `n_embd`) at the positions after what `cache` holds (a cache
    /// of this model's [`GenerativeModel::create_kv_cache`]), stores their
    /// K/V there and returns the logits of the last row (`n_vocab` floats).
    /// Each call records, submits and waits; a
    /// [`Session`](crate::runtime::Session) is the faster way to run one
    /// sequence (it replays one recorded decode step).
    ///
    /// ```
    /// # use combs::formats::gguf::GgufFile;
    /// # use combs::models::synth::{SynthConfig, synth_gguf};
    /// # use combs::quant::QuantType;
    /// use combs::gpu::GpuContext;
    /// use combs::{CacheConfig, GenerativeModel, LoadOptions, ModelRegistry};
    ///
    /// fn main() -> combs::Result<()> {
    ///     let ctx = GpuContext::new(None)?;
    ///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
    ///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
    ///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
    ///     let mut cache = model.create_kv_cache(&CacheConfig::contiguous(64))?;
    ///     let logits = model.prefill(&model.embed(&[1, 2, 3])?, cache.as_mut())?;
    ///     assert_eq!((logits.len(), cache.len()), (model.spec().n_vocab, 3));
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// Rows not whole or not finite, the cache's context full (nothing is
    /// evaluated then), or a device error (the cache forgets the positions
    /// the call added).
    fn prefill(&self, embeddings: &[f32], cache: &mut dyn KVCache) -> Result<Vec<f32>> {
        steps::prefill(self, embeddings, cache)
    }

    /// MLC's `decode`: [`GenerativeModel::prefill`] of one row, the next
    /// position's input vector; returns its logits.
    ///
    /// ```
    /// # use combs::formats::gguf::GgufFile;
    /// # use combs::models::synth::{SynthConfig, synth_gguf};
    /// # use combs::quant::QuantType;
    /// use combs::gpu::GpuContext;
    /// use combs::{CacheConfig, GenerativeModel, LoadOptions, ModelRegistry};
    ///
    /// fn main() -> combs::Result<()> {
    ///     let ctx = GpuContext::new(None)?;
    ///     # let tiny = SynthConfig::preset("tiny", QuantType::F32)?;
    ///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
    ///     let model = ModelRegistry::new().load(&ctx, &gguf, &LoadOptions::default())?;
    ///     let mut cache = model.create_kv_cache(&CacheConfig::contiguous(64))?;
    ///     let mut logits = model.prefill(&model.embed(&[1, 2, 3])?, cache.as_mut())?;
    ///     for _ in 0..2 {
    ///         let next = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b]));
    ///         let next = next.unwrap_or(0) as u32; // greedy
    ///         logits = model.decode(&model.embed(&[next])?, cache.as_mut())?;
    ///     }
    ///     assert_eq!(cache.len(), 5);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// `embedding` not one row, and the errors of [`GenerativeModel::prefill`].
    fn decode(&self, embedding: &[f32], cache: &mut dyn KVCache) -> Result<Vec<f32>> {
        steps::decode(self, embedding, cache)
    }
}

/// What an architecture file implements: its weights on the device and
/// what each call computes, stated to the planner through a [`Forward`].
pub trait Architecture: Send + Sync {
    /// The resolved architecture.
    fn spec(&self) -> &ArchSpec;

    /// The device the weights live on.
    fn context(&self) -> &Arc<GpuContext>;

    /// The geometry of each layer's KV cache rows.
    fn kv_layers(&self) -> Vec<LayerGeometry>;

    /// The widths of the activations.
    fn workspace_shape(&self) -> WorkspaceShape;

    /// The token embedding table and its scale (`None` on a device that
    /// holds a later share of a model split by layers).
    fn embedding(&self) -> Option<(&QuantWeight, f32)>;

    /// States every block of a call.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    fn blocks(&self, f: &mut Forward<'_, '_>) -> Result<()>;

    /// The output head (`None` on a device that holds an earlier share of
    /// a model split by layers).
    fn head(&self) -> Option<OutputHead<'_>>;

    /// Bytes of weights on the device.
    fn device_bytes(&self) -> u64;

    /// As [`GenerativeModel::same_rope`].
    fn same_rope(&self, a: usize, b: usize) -> bool {
        let _ = (a, b);
        true
    }

    /// As [`GenerativeModel::layers`].
    fn layers(&self) -> Range<usize> {
        0..self.spec().n_layer
    }
}

/// An architecture ready for the runtime: the planner's settings and the
/// model's KV caches beside its weights.
pub struct Loaded<A> {
    arch: A,
    planner: Planner,
    caches: KvCaches,
}

impl<A: Architecture> Loaded<A> {
    /// `arch` with the planner's settings `planner`.
    pub fn new(arch: A, planner: Planner) -> Self {
        let caches = KvCaches::new(arch.context(), arch.kv_layers());
        Loaded {
            arch,
            planner,
            caches,
        }
    }

    /// The architecture.
    pub fn arch(&self) -> &A {
        &self.arch
    }

    /// The head over rows `first..first + n` into device rows `out_row..`,
    /// copied to rows `dst_row..` of `dst`.
    fn record_head(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        (first, n): (usize, usize),
        out_row: usize,
        dst: &Arc<Buffer>,
        dst_row: usize,
    ) -> Result<()> {
        let head = self
            .arch
            .head()
            .ok_or_else(|| ModelError::Internal("logits on an earlier stage of a split".into()))?;
        Forward::new(rec, self.planner, &s.work, n)?.logits(&head, first, out_row, dst, dst_row)
    }
}

impl<A: Architecture> GenerativeModel for Loaded<A> {
    fn spec(&self) -> &ArchSpec {
        self.arch.spec()
    }

    fn context(&self) -> &Arc<GpuContext> {
        self.arch.context()
    }

    fn create_kv_cache(&self, cfg: &CacheConfig) -> Result<Box<dyn KVCache>> {
        self.caches.create(cfg)
    }

    fn create_scratch(&self, max_tokens: usize, max_logit_rows: usize) -> Result<Scratch> {
        let round_inputs = self.planner.numerics != Numerics::Exact;
        let shape = self.arch.workspace_shape();
        let ctx = self.context();
        Scratch::new(Workspace::new(
            ctx,
            shape,
            max_tokens,
            max_logit_rows,
            round_inputs,
        )?)
    }

    fn record_embed(&self, rec: &mut Recording, s: &Scratch, n: usize) -> Result<()> {
        let (table, scale) = self
            .arch
            .embedding()
            .ok_or_else(|| ModelError::Internal("embedding on a later stage of a split".into()))?;
        Forward::new(rec, self.planner, &s.work, n)?.embed(table, scale)
    }

    fn record_put_rows(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        src: &Arc<Buffer>,
        copies: &[RowCopy],
    ) -> Result<()> {
        let mut f = Forward::new(rec, self.planner, &s.work, n)?;
        for c in copies {
            f.put_rows(src, c.src_row, c.dst_row, c.rows)?;
        }
        Ok(())
    }

    fn record_read_rows(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        dst: &Arc<Buffer>,
    ) -> Result<()> {
        Forward::new(rec, self.planner, &s.work, n)?.read_rows(dst)
    }

    fn record_blocks(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        n: usize,
    ) -> Result<()> {
        let mut f = Forward::new(rec, self.planner, &s.work, n)?.with_cache(cache);
        self.arch.blocks(&mut f)
    }

    fn record_logits(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        first: usize,
        n: usize,
        out_row: usize,
    ) -> Result<()> {
        self.record_head(rec, s, (first, n), out_row, &s.logits, out_row)
    }

    fn record_logits_to(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        first: usize,
        n: usize,
        dst: &Arc<Buffer>,
        dst_row: usize,
    ) -> Result<()> {
        self.record_head(rec, s, (first, n), 0, dst, dst_row)
    }

    fn record_logits_top_k(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        n: usize,
        k: usize,
        scratch: &Arc<Buffer>,
        out: &Arc<Buffer>,
    ) -> Result<()> {
        let head = self
            .arch
            .head()
            .ok_or_else(|| ModelError::Internal("logits on an earlier stage of a split".into()))?;
        Forward::new(rec, self.planner, &s.work, n)?.logits_top_k(&head, k, scratch, out)
    }

    fn selects_logits(&self) -> bool {
        self.arch.head().is_some()
    }

    fn record_stage(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        n: usize,
        io: StageIo<'_>,
    ) -> Result<bool> {
        let mut f = Forward::new(rec, self.planner, &s.work, n)?.with_cache(cache);
        if let Some((src, squares)) = io.from {
            f.put_stream(src, squares)?;
        }
        self.arch.blocks(&mut f)?;
        match io.to {
            Some(dst) => f.read_stream(dst),
            None => Ok(false),
        }
    }

    fn stream_row_floats(&self) -> usize {
        let n_embd = self.arch.spec().n_embd;
        n_embd + n_embd.div_ceil(16)
    }

    fn device_bytes(&self) -> u64 {
        self.arch.device_bytes()
    }

    fn decode_bytes_per_token(&self) -> u64 {
        let total = self.arch.device_bytes();
        match self.arch.embedding() {
            Some((table, _)) if !self.arch.spec().tied_embeddings => {
                total.saturating_sub(table.device_bytes())
            }
            _ => total,
        }
    }

    fn same_rope(&self, a: usize, b: usize) -> bool {
        self.arch.same_rope(a, b)
    }

    fn layers(&self) -> Range<usize> {
        self.arch.layers()
    }
}
