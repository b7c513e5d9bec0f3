//! `Workspace`: the activation buffers the planner records a model's calls
//! over, sized once for the largest call of a session or a batch, plus the
//! device-side inputs (token ids, positions) the caller writes before each
//! submission.

use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind};
use crate::ops::attention::{AttentionScratch, MAX_HEAD_DIM};

/// The widths a model's activations take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceShape {
    /// Residual stream width.
    pub n_embd: usize,
    /// Query width (`n_head * head_dim`).
    pub n_q: usize,
    /// Key and value width (`n_head_kv * head_dim`).
    pub n_kv: usize,
    /// FFN hidden width.
    pub n_ff: usize,
    /// Logits per row.
    pub n_vocab: usize,
}

/// The activation buffers of forward calls. Clones share the buffers.
#[derive(Clone)]
pub struct Workspace {
    pub(super) shape: WorkspaceShape,
    /// Most tokens one call may carry.
    pub max_tokens: usize,
    /// Most logit rows one call may produce.
    pub max_logit_rows: usize,
    /// Token ids, i32, host-visible.
    pub ids: Arc<Buffer>,
    /// Positions, i32, host-visible.
    pub positions: Arc<Buffer>,
    /// Logits as the output head writes them, in device memory (kernels
    /// storing floats one by one straight into host memory cross the bus in
    /// tiny writes): one copy moves them where the caller reads them.
    pub logits: Arc<Buffer>,
    /// Residual stream `[max_tokens, n_embd]`.
    pub(super) x: Arc<Buffer>,
    /// Normalized residual.
    pub(super) xn: Arc<Buffer>,
    /// Sums of squares of the residual, 16 features at a time.
    pub(super) x_squares: Arc<Buffer>,
    /// Staging for post-norms.
    pub(super) tmp: Arc<Buffer>,
    /// Queries, or Q/K/V of a stacked projection, `[max_tokens, ld_q]`.
    pub(super) q: Arc<Buffer>,
    /// Keys of separate projections.
    pub(super) k: Arc<Buffer>,
    /// Values of separate projections.
    pub(super) v: Arc<Buffer>,
    /// Attention output.
    pub(super) attn: Arc<Buffer>,
    /// FFN gate of separate projections.
    pub(super) gate: Arc<Buffer>,
    /// FFN up, or gate and up of a stacked projection, `[max_tokens, 2 n_ff]`.
    pub(super) up: Arc<Buffer>,
    /// FFN activation.
    pub(super) hidden: Arc<Buffer>,
    /// Rounded product inputs under llama.cpp numerics (one float otherwise).
    pub(super) xq: Arc<Buffer>,
    /// Partials of decode attention split over several workgroups per head.
    pub(super) attn_split: AttentionScratch,
}

impl Workspace {
    /// Allocates the buffers for calls of up to `max_tokens` tokens and
    /// `max_logit_rows` rows of logits; `round_inputs` adds the buffer of
    /// rounded product inputs.
    ///
    /// # Errors
    /// Out of device memory, or a logits row beyond one descriptor's range.
    pub fn new(
        ctx: &Arc<GpuContext>,
        shape: WorkspaceShape,
        max_tokens: usize,
        max_logit_rows: usize,
        round_inputs: bool,
    ) -> Result<Self> {
        let max_tokens = max_tokens.max(1);
        let row_bytes = shape.n_vocab * 4;
        let max_logit_rows = Self::logit_rows_cap(ctx, shape.n_vocab)?.min(max_logit_rows.max(1));
        let dev = |floats: usize, name: &str| {
            Buffer::new(
                ctx,
                (4 * floats * max_tokens) as u64,
                MemoryKind::Device,
                name,
            )
        };
        let upload = |name: &str| Buffer::new(ctx, 4 * max_tokens as u64, MemoryKind::Upload, name);
        Ok(Workspace {
            shape,
            max_tokens,
            max_logit_rows,
            ids: upload("ids")?,
            positions: upload("positions")?,
            logits: Buffer::new(
                ctx,
                (row_bytes * max_logit_rows) as u64,
                MemoryKind::Device,
                "logits (device)",
            )?,
            x: dev(shape.n_embd, "x")?,
            xn: dev(shape.n_embd, "xn")?,
            x_squares: dev(shape.n_embd.div_ceil(16), "x squares")?,
            tmp: dev(shape.n_embd, "tmp")?,
            q: dev(Self::ld_q(shape), "q")?,
            k: dev(shape.n_kv, "k")?,
            v: dev(shape.n_kv, "v")?,
            attn: dev(shape.n_q, "attn")?,
            gate: dev(shape.n_ff, "gate")?,
            up: dev(2 * shape.n_ff, "up")?,
            hidden: dev(shape.n_ff, "hidden")?,
            xq: if round_inputs {
                dev(shape.n_embd.max(shape.n_q).max(shape.n_ff), "xq")?
            } else {
                Buffer::new(ctx, 4, MemoryKind::Device, "xq")?
            },
            // A head holds at most the query width (and what the kernels take).
            attn_split: AttentionScratch::for_decode(ctx, shape.n_q.min(MAX_HEAD_DIM))?,
        })
    }

    /// Most rows of `n_vocab` logits one descriptor covers.
    ///
    /// # Errors
    /// Not even one row fits.
    pub fn logit_rows_cap(ctx: &GpuContext, n_vocab: usize) -> Result<usize> {
        let max_binding = ctx.caps().max_binding_bytes(4) as usize;
        let row_bytes = (n_vocab * 4).max(1);
        if row_bytes > max_binding {
            return Err(ModelError::MissingFeature {
                device: ctx.caps().name.clone(),
                feature: format!(
                    "a storage buffer range of {row_bytes} bytes for one row of logits"
                ),
            });
        }
        Ok(max_binding / row_bytes)
    }

    /// A host-visible buffer for this workspace's rows of logits, which
    /// the logits step copies into.
    ///
    /// # Errors
    /// Out of host-visible memory.
    pub fn host_logits(&self, name: &str) -> Result<Arc<Buffer>> {
        let ctx = self.logits.context();
        Buffer::new(ctx, self.logits.size(), MemoryKind::Readback, name)
    }

    /// Floats per token of `q`: room for stacked Q/K/V, whether the file
    /// stores them fused or the model stacks separate tensors at load time.
    fn ld_q(shape: WorkspaceShape) -> usize {
        shape.n_q + 2 * shape.n_kv
    }

    /// The widths.
    pub fn shape(&self) -> WorkspaceShape {
        self.shape
    }
}
