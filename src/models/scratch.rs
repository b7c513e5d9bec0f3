//! `Scratch`: what one session's (or one batch's) forward calls record
//! over — the planner's activation buffers and device-side inputs
//! ([`Workspace`]) — and the host-visible logits the CPU reads.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::Buffer;
use crate::ops::plan::Workspace;

/// Activation buffers and host-visible inputs/outputs of forward calls.
/// Clones share the buffers.
#[derive(Clone)]
pub struct Scratch {
    /// The activations, and the token ids and positions the caller writes.
    pub work: Workspace,
    /// Logits `[max_logit_rows, n_vocab]`, host-visible.
    pub logits: Arc<Buffer>,
}

impl Scratch {
    /// The scratch of `work`, with host-visible room for its logit rows.
    ///
    /// # Errors
    /// Out of host-visible memory.
    pub fn new(work: Workspace) -> Result<Self> {
        let logits = work.host_logits("logits")?;
        Ok(Scratch { work, logits })
    }

    /// Most tokens one call may carry.
    pub fn max_tokens(&self) -> usize {
        self.work.max_tokens
    }

    /// Most logit rows one call may produce.
    pub fn max_logit_rows(&self) -> usize {
        self.work.max_logit_rows
    }

    /// Token ids, i32, host-visible: written before each submission.
    pub fn ids(&self) -> &Arc<Buffer> {
        &self.work.ids
    }

    /// Positions, i32, host-visible: written before each submission.
    pub fn positions(&self) -> &Arc<Buffer> {
        &self.work.positions
    }
}
