//! Several devices in one process, as llama.cpp's `--split-mode layer` and
//! `--tensor-split`: [`SplitModel`] is a model whose blocks are shared out
//! in contiguous ranges, one range per device (the first device also holds
//! the token embedding, the last the output head), and each device's KV
//! cache holds its own blocks. A [`Session`](crate::runtime::Session)
//! runs the stages one after the other; the residual stream crosses from
//! one device to the next once per range boundary per call, through
//! host-visible buffers. [`SplitMode::Replica`] instead puts a whole model
//! on every device ([`crate::runtime::Model`] assigns sessions to them).

use std::ops::Range;
use std::sync::Arc;

use super::registry::{LoadOptions, ModelRegistry};
use super::{ArchSpec, GenerativeModel, RowCopy, Scratch};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::{Buffer, GpuContext, Recording};
use crate::kv::{CacheConfig, KVCache, KvAttention};

/// How a model uses several devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Contiguous ranges of blocks per device (a model too big for one).
    #[default]
    Layer,
    /// A whole model on every device, sessions spread over them (throughput).
    Replica,
}

impl SplitMode {
    /// Parses `layer` or `replica` (`row` is llama.cpp's other mode, which
    /// combs does not have).
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "layer" => Ok(SplitMode::Layer),
            "replica" | "replicas" => Ok(SplitMode::Replica),
            _ => Err(ModelError::invalid(
                "split mode",
                format!("`{s}`: expected `layer` or `replica`"),
            )),
        }
    }
}

/// Which replica a new session of a model replicated over several
/// devices goes to ([`SplitMode::Replica`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Each device in turn.
    #[default]
    RoundRobin,
    /// The device with the most free memory (under its budget, if set).
    MostFreeMemory,
}

/// Device memory free for weights on `ctx`: under its budget where one is
/// set, else its largest device-local heap, less what it already holds.
pub fn free_device_bytes(ctx: &GpuContext) -> u64 {
    let cap = match ctx.memory_budget() {
        0 => ctx.caps().device_local_bytes,
        b => b,
    };
    cap.saturating_sub(ctx.memory_in_use())
}

/// The contiguous ranges of `n_layer` blocks that devices of relative
/// shares `shares` take, in order, as llama.cpp's `--tensor-split`: block
/// `il` goes to the first device whose cumulative share passes
/// `il / n_layer`, rounded to the nearest block; every device gets at
/// least one block.
///
/// ```
/// use combs::models::split::layer_ranges;
///
/// assert_eq!(layer_ranges(8, &[1.0, 1.0]).unwrap(), vec![0..4, 4..8]);
/// assert_eq!(layer_ranges(8, &[3.0, 1.0]).unwrap(), vec![0..6, 6..8]);
/// ```
///
/// # Errors
/// No shares, a negative or non-finite one, all zero, or more devices
/// than blocks.
pub fn layer_ranges(n_layer: usize, shares: &[f32]) -> Result<Vec<Range<usize>>> {
    let n = shares.len();
    if n == 0 || shares.iter().any(|s| !s.is_finite() || *s < 0.0) {
        return Err(ModelError::invalid(
            "split",
            format!("{shares:?}: expected one finite share ≥ 0 per device"),
        ));
    }
    let total: f64 = shares.iter().map(|&s| f64::from(s)).sum();
    if total <= 0.0 {
        return Err(ModelError::invalid("split", "the shares add up to 0"));
    }
    if n > n_layer {
        return Err(ModelError::invalid(
            "devices",
            format!("{n} devices for a model of {n_layer} blocks"),
        ));
    }
    let mut ranges = Vec::with_capacity(n);
    let (mut start, mut cum) = (0usize, 0.0f64);
    for (i, &s) in shares.iter().enumerate() {
        cum += f64::from(s);
        let left = n - i - 1;
        // Each later device keeps at least one block; this one takes at least one.
        let end =
            ((cum / total * n_layer as f64).round() as usize).clamp(start + 1, n_layer - left);
        ranges.push(start..end);
        start = end;
    }
    Ok(ranges)
}

/// A model split by layers over several devices: one stage per device, in
/// order, each a model of its range of blocks on its own context.
pub struct SplitModel {
    stages: Vec<Arc<dyn GenerativeModel>>,
    layers: Vec<Range<usize>>,
    device_bytes: u64,
    decode_bytes: u64,
}

impl SplitModel {
    /// Loads `g` over `ctxs` (one stage each, in order), block ranges by
    /// `opts.tensor_split` (empty: by each device's free memory).
    ///
    /// # Errors
    /// A split that does not match the devices, and the errors of
    /// [`ModelRegistry::load`] on each device.
    pub fn load(
        registry: &ModelRegistry,
        ctxs: &[Arc<GpuContext>],
        g: &GgufFile,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let spec = registry.resolve(g)?;
        let shares = device_shares(ctxs, &opts.tensor_split)?;
        let layers = layer_ranges(spec.n_layer, &shares)?;
        let mut stages = Vec::with_capacity(ctxs.len());
        for (ctx, range) in ctxs.iter().zip(&layers) {
            let stage_opts = LoadOptions {
                layers: Some(range.clone()),
                ..opts.clone()
            };
            stages.push(registry.load(ctx, g, &stage_opts)?);
        }
        Self::new(stages, layers)
    }

    /// The model of `stages`, which hold blocks `layers` each.
    ///
    /// # Errors
    /// Fewer than two stages, or ranges that are not consecutive from 0.
    pub fn new(stages: Vec<Arc<dyn GenerativeModel>>, layers: Vec<Range<usize>>) -> Result<Self> {
        let n_layer = stages.first().map_or(0, |s| s.spec().n_layer);
        let consecutive = layers.windows(2).all(|w| w[0].end == w[1].start);
        if stages.len() < 2
            || stages.len() != layers.len()
            || !consecutive
            || layers.first().map(|r| r.start) != Some(0)
            || layers.last().map(|r| r.end) != Some(n_layer)
        {
            return Err(ModelError::invalid(
                "split",
                format!(
                    "{} stages over blocks {layers:?} of {n_layer}",
                    stages.len()
                ),
            ));
        }
        let device_bytes = stages.iter().map(|s| s.device_bytes()).sum();
        let decode_bytes = stages.iter().map(|s| s.decode_bytes_per_token()).sum();
        Ok(SplitModel {
            stages,
            layers,
            device_bytes,
            decode_bytes,
        })
    }

    /// The blocks each stage holds, in order.
    pub fn layers(&self) -> &[Range<usize>] {
        &self.layers
    }
}

/// Each device's share of the blocks: `given` (one per device) or, empty,
/// its free memory.
fn device_shares(ctxs: &[Arc<GpuContext>], given: &[f32]) -> Result<Vec<f32>> {
    if given.is_empty() {
        return Ok(ctxs
            .iter()
            .map(|c| free_device_bytes(c).max(1) as f32)
            .collect());
    }
    if given.len() != ctxs.len() {
        return Err(ModelError::invalid(
            "split",
            format!("{} shares for {} devices", given.len(), ctxs.len()),
        ));
    }
    Ok(given.to_vec())
}

fn not_one_device() -> ModelError {
    ModelError::invalid(
        "model",
        "a model split over devices runs through a Session (one cache and scratch per device)",
    )
}

impl GenerativeModel for SplitModel {
    fn spec(&self) -> &ArchSpec {
        self.stages[0].spec()
    }

    fn context(&self) -> &Arc<GpuContext> {
        self.stages[0].context()
    }

    fn create_kv_cache(&self, _cfg: &CacheConfig) -> Result<Box<dyn KVCache>> {
        Err(not_one_device())
    }

    fn create_scratch(&self, _max_tokens: usize, _max_logit_rows: usize) -> Result<Scratch> {
        Err(not_one_device())
    }

    fn record_embed(&self, _rec: &mut Recording, _s: &Scratch, _n: usize) -> Result<()> {
        Err(not_one_device())
    }

    fn record_put_rows(
        &self,
        _rec: &mut Recording,
        _s: &Scratch,
        _n: usize,
        _src: &Arc<Buffer>,
        _copies: &[RowCopy],
    ) -> Result<()> {
        Err(not_one_device())
    }

    fn record_read_rows(
        &self,
        _rec: &mut Recording,
        _s: &Scratch,
        _n: usize,
        _dst: &Arc<Buffer>,
    ) -> Result<()> {
        Err(not_one_device())
    }

    fn record_blocks(
        &self,
        _rec: &mut Recording,
        _s: &Scratch,
        _cache: &dyn KvAttention,
        _n: usize,
    ) -> Result<()> {
        Err(not_one_device())
    }

    fn record_logits_to(
        &self,
        _rec: &mut Recording,
        _s: &Scratch,
        _first: usize,
        _n: usize,
        _dst: &Arc<Buffer>,
        _dst_row: usize,
    ) -> Result<()> {
        Err(not_one_device())
    }

    fn device_bytes(&self) -> u64 {
        self.device_bytes
    }

    fn decode_bytes_per_token(&self) -> u64 {
        self.decode_bytes
    }

    fn same_rope(&self, a: usize, b: usize) -> bool {
        self.stages.iter().all(|s| s.same_rope(a, b))
    }

    fn stages(&self) -> Option<&[Arc<dyn GenerativeModel>]> {
        Some(&self.stages)
    }
}
