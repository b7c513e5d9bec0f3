//! The vision encoder's own steps on [`Forward`] (SigLIP with the Idefics3
//! connector; its blocks are the speech encoder's): the patch embedding as
//! a product over patch rows plus the learned positions, the connector's
//! projection of groups of merged rows, and rows of the residual given by
//! the caller in place of token embeddings (image embeddings in a prompt).

use std::sync::Arc;

use super::Forward;
use crate::error::{ModelError, Result};
use crate::gpu::Buffer;
use crate::ops::Mat;
use crate::ops::backend::CopyCall;
use crate::ops::linear::{Input, Linear, Output};
use crate::ops::unary::{UnaryCall, UnaryOp};

impl Forward<'_, '_> {
    /// Records `x = patches · Wᵀ + b + positions` into the residual: the
    /// patch embedding (a convolution of stride = kernel is a product over
    /// the non-overlapping patches' rows) with the learned positional
    /// embedding, `positions` holding `n_pos` rows of `n_embd`, those of
    /// one image; the call's tokens are whole images of `n_pos` patches.
    ///
    /// # Errors
    /// Patch rows not of the call's tokens or the weight's width, tokens
    /// not whole images, shapes the kernels do not support.
    pub fn patch_embed(
        &mut self,
        patches: Mat<'_>,
        w: &Linear,
        positions: &Arc<Buffer>,
        n_pos: usize,
    ) -> Result<()> {
        let (n, d) = (self.n, self.ws.shape.n_embd);
        let bad_shape = patches.rows != n || patches.cols != w.n_in() || w.n_out() != d;
        if bad_shape || n_pos == 0 || !n.is_multiple_of(n_pos) {
            return Err(ModelError::Internal(format!(
                "patch rows {patches:?} for {n} tokens of images of {n_pos} \
                 through [{}, {}] into width {d}",
                w.n_out(),
                w.n_in()
            )));
        }
        let x = self.x();
        for image in 0..n / n_pos {
            let call = UnaryCall {
                op: UnaryOp::Copy,
                x: Mat::new(positions, n_pos, d),
                out: x.rows_at(image * n_pos, n_pos),
                add: false,
            };
            self.kernels().unary(self.rec, &call)?;
        }
        self.product(w, Input::F32(patches), Output::Accumulate(x))?;
        self.squares = false;
        Ok(())
    }

    /// Records `out = merged(x) · Wᵀ`, where `merged(x)` views the packed
    /// rows `x` as rows of `merge` consecutive rows each (the Idefics3
    /// connector after its pixel shuffle, the encoder's rows stored in the
    /// shuffled order).
    ///
    /// # Errors
    /// Rows not packed or not a multiple of `merge`, shapes the kernels do
    /// not support.
    pub fn project_merged(
        &mut self,
        x: Mat<'_>,
        merge: usize,
        w: &Linear,
        out: Mat<'_>,
    ) -> Result<()> {
        if merge == 0 || !x.rows.is_multiple_of(merge) || (x.rows > 1 && x.ld != x.cols) {
            return Err(ModelError::Internal(format!(
                "merge of {merge} rows of {x:?}"
            )));
        }
        let width = x.cols * merge;
        let merged = Mat::new(x.buf, x.rows / merge, width).cols_at(x.offset, width);
        self.product(w, Input::F32(merged), Output::Store(out))
    }

    /// Records a copy of `rows` packed f32 rows of `n_embd` from `src`
    /// (starting at row `src_row`) over rows `dst_row..` of the residual,
    /// after the embedding step: input vectors the caller computed (an
    /// image's embeddings) in place of those of the tokens there.
    ///
    /// # Errors
    /// Rows outside the call or outside `src`.
    pub fn put_rows(
        &mut self,
        src: &Arc<Buffer>,
        src_row: usize,
        dst_row: usize,
        rows: usize,
    ) -> Result<()> {
        let d = self.ws.shape.n_embd;
        if dst_row + rows > self.n {
            return Err(ModelError::Internal(format!(
                "rows {dst_row}..{} of a call of {}",
                dst_row + rows,
                self.n
            )));
        }
        let row_bytes = (4 * d) as u64;
        let call = CopyCall {
            src,
            src_offset: src_row as u64 * row_bytes,
            dst: &self.ws.x,
            dst_offset: dst_row as u64 * row_bytes,
            bytes: rows as u64 * row_bytes,
        };
        self.kernels().copy(self.rec, &call)?;
        self.squares = false;
        Ok(())
    }
}
