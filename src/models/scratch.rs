//! `Scratch`: the activation buffers of forward calls for one session, sized
//! once for the largest call, plus the host-visible inputs (token ids,
//! positions) and the host-visible logits the CPU reads.

use std::sync::Arc;

use super::spec::ArchSpec;
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind};

/// Activation buffers and host-visible inputs/outputs of forward calls.
/// Clones share the buffers.
#[derive(Clone)]
pub struct Scratch {
    /// Most tokens one call may carry.
    pub max_tokens: usize,
    /// Most logit rows one call may produce.
    pub max_logit_rows: usize,
    /// Vocabulary size (floats per logit row).
    pub n_vocab: usize,
    /// Token ids, i32, host-visible.
    pub ids: Arc<Buffer>,
    /// Positions, i32, host-visible.
    pub positions: Arc<Buffer>,
    /// Residual stream `[max_tokens, n_embd]`.
    pub x: Arc<Buffer>,
    /// Normalized residual `[max_tokens, n_embd]`.
    pub xn: Arc<Buffer>,
    /// Sums of squares of the residual, 16 features at a time
    /// `[max_tokens, ceil(n_embd / 16)]`, written by the products that add
    /// into it where the next RMS norm folds into the products reading it
    /// (`ops::linear::SquareSums`).
    pub x_squares: Arc<Buffer>,
    /// Staging for post-norms `[max_tokens, n_embd]`.
    pub tmp: Arc<Buffer>,
    /// Queries (or fused QKV) `[max_tokens, ld_q]`.
    pub q: Arc<Buffer>,
    /// Keys `[max_tokens, n_kv]`.
    pub k: Arc<Buffer>,
    /// Values `[max_tokens, n_kv]`.
    pub v: Arc<Buffer>,
    /// Attention output `[max_tokens, n_q]`.
    pub attn: Arc<Buffer>,
    /// FFN gate `[max_tokens, n_ff]`.
    pub gate: Arc<Buffer>,
    /// FFN up (or fused gate/up) `[max_tokens, ld_up]`.
    pub up: Arc<Buffer>,
    /// FFN activation `[max_tokens, n_ff]`.
    pub hidden: Arc<Buffer>,
    /// Rounded linear-layer inputs `[max_tokens, widest input]` under
    /// llama.cpp numerics (one float otherwise).
    pub xq: Arc<Buffer>,
    /// Logits `[max_logit_rows, n_vocab]`, host-visible.
    pub logits: Arc<Buffer>,
    /// Logits as the output head writes them, in device memory: kernels
    /// storing floats one by one straight into host memory cross the bus in
    /// tiny writes, so they land here and one copy moves them to `logits`.
    pub logits_dev: Arc<Buffer>,
    /// Floats per token of `q` (`n_q + 2 n_kv`: room for fused QKV).
    pub ld_q: usize,
    /// Floats per token of `up` (`2 n_ff`: room for fused gate/up).
    pub ld_up: usize,
}

impl Scratch {
    /// Allocates scratch for `spec`; `round_inputs` adds the buffer of
    /// rounded linear inputs.
    ///
    /// # Errors
    /// Out of device memory, or a logits buffer beyond one descriptor's range.
    pub fn new(
        ctx: &Arc<GpuContext>,
        spec: &ArchSpec,
        max_tokens: usize,
        max_logit_rows: usize,
        round_inputs: bool,
    ) -> Result<Self> {
        let max_tokens = max_tokens.max(1);
        let max_binding = ctx.caps().max_binding_bytes(4) as usize;
        let row_bytes = spec.n_vocab * 4;
        let max_logit_rows = max_logit_rows.clamp(1, (max_binding / row_bytes).max(1));
        if row_bytes > max_binding {
            return Err(ModelError::MissingFeature {
                device: ctx.caps().name.clone(),
                feature: format!(
                    "a storage buffer range of {row_bytes} bytes for one row of logits"
                ),
            });
        }
        // Room for stacked projections whether the file stores them fused or
        // the model stacks separate tensors at load time.
        let ld_q = spec.n_q() + 2 * spec.n_kv();
        let ld_up = 2 * spec.n_ff;
        let dev = |floats: usize, name: &str| {
            Buffer::new(
                ctx,
                (4 * floats * max_tokens) as u64,
                MemoryKind::Device,
                name,
            )
        };
        Ok(Scratch {
            max_tokens,
            max_logit_rows,
            n_vocab: spec.n_vocab,
            ids: Buffer::new(ctx, 4 * max_tokens as u64, MemoryKind::Upload, "ids")?,
            positions: Buffer::new(ctx, 4 * max_tokens as u64, MemoryKind::Upload, "positions")?,
            x: dev(spec.n_embd, "x")?,
            xn: dev(spec.n_embd, "xn")?,
            x_squares: dev(spec.n_embd.div_ceil(16), "x squares")?,
            tmp: dev(spec.n_embd, "tmp")?,
            q: dev(ld_q, "q")?,
            k: dev(spec.n_kv(), "k")?,
            v: dev(spec.n_kv(), "v")?,
            attn: dev(spec.n_q(), "attn")?,
            gate: dev(spec.n_ff, "gate")?,
            up: dev(ld_up, "up")?,
            hidden: dev(spec.n_ff, "hidden")?,
            xq: if round_inputs {
                dev(spec.n_embd.max(spec.n_q()).max(spec.n_ff), "xq")?
            } else {
                Buffer::new(ctx, 4, MemoryKind::Device, "xq")?
            },
            logits: Buffer::new(
                ctx,
                (row_bytes * max_logit_rows) as u64,
                MemoryKind::Readback,
                "logits",
            )?,
            logits_dev: Buffer::new(
                ctx,
                (row_bytes * max_logit_rows) as u64,
                MemoryKind::Device,
                "logits (device)",
            )?,
            ld_q,
            ld_up,
        })
    }
}
