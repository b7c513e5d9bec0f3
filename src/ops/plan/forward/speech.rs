//! The speech model's steps on [`Forward`]: the convolution stem, encoder
//! blocks (full attention over the call's positions), the cross-attention
//! keys of a window, decoder blocks with cross-attention, and the logits of
//! chosen rows after a final layer norm.

use std::sync::Arc;

use super::{Forward, input_of};
use crate::error::{ModelError, Result};
use crate::gpu::Buffer;
use crate::ops::attention::{AttentionCall, AttentionOptions, AttentionShape, NewKv, NewRows};
use crate::ops::backend::{CopyCall, GetRowsCall};
use crate::ops::im2col::{ConvInput, Im2colCall};
use crate::ops::kv_store::{KvStoreCall, LayerCall, LayerKv};
use crate::ops::layer_norm::{LayerNorm, LayerNormCall};
use crate::ops::linear::{Input, Linear, Output};
use crate::ops::plan::full_kv::{FullKv, FullKvAddressing};
use crate::ops::plan::speech_block::{
    ConvStem, CrossDecoderBlock, EncoderBlock, Heads, LnMlp, LnSelfAttention,
};
use crate::ops::unary::{UnaryCall, UnaryOp};
use crate::ops::{AnyMat, Mat};
use crate::quant::QuantWeight;

impl<'a> Forward<'_, 'a> {
    fn n_embd(&self) -> usize {
        self.ws.shape.n_embd
    }

    /// A workspace buffer as `rows` packed rows of `cols`, if it holds them.
    fn scratch(&self, buf: &'a Arc<Buffer>, rows: usize, cols: usize) -> Result<Mat<'a>> {
        let m = Mat::new(buf, rows, cols);
        m.check("workspace scratch")
            .map_err(|e| ModelError::Internal(format!("workspace too small: {e}")))?;
        Ok(m)
    }

    /// Records the convolution stem over log-mel features (`n_mels` rows of
    /// frames) into the residual: the call's tokens are the stem's output
    /// positions.
    ///
    /// # Errors
    /// Features that do not give the call's positions, a workspace too
    /// small for the patches, shapes the kernels do not support.
    pub fn conv_stem(&mut self, stem: &ConvStem<'_>, mel: Mat<'_>) -> Result<()> {
        let (n, d, ws) = (self.n, self.n_embd(), self.ws);
        let n1 = stem.conv1.n_out(mel.cols);
        if stem.conv2.n_out(n1) != n {
            return Err(ModelError::invalid(
                "features",
                format!(
                    "{} frames give {} positions, not {n}",
                    mel.cols,
                    stem.conv2.n_out(n1)
                ),
            ));
        }
        let k = self.kernels();
        let p1 = self.scratch(&ws.up, n1, stem.conv1.width())?;
        let call = Im2colCall {
            conv: stem.conv1,
            input: ConvInput::ChannelRows(mel),
            out: p1,
        };
        k.im2col(self.rec, &call)?;
        let h1 = self.scratch(&ws.hidden, n1, d)?;
        self.product(stem.conv1_w, Input::F32(p1), Output::Store(h1))?;
        self.gelu(h1, h1, false)?;
        let p2 = self.scratch(&ws.up, n, stem.conv2.width())?;
        let call = Im2colCall {
            conv: stem.conv2,
            input: ConvInput::PositionRows(h1),
            out: p2,
        };
        k.im2col(self.rec, &call)?;
        let h2 = self.scratch(&ws.tmp, n, d)?;
        self.product(stem.conv2_w, Input::F32(p2), Output::Store(h2))?;
        let x = self.x();
        let pos = Mat::new(stem.positions, n, d);
        let call = UnaryCall {
            op: UnaryOp::Copy,
            x: pos,
            out: x,
            add: false,
        };
        k.unary(self.rec, &call)?;
        self.gelu(h2, x, true)?;
        self.squares = false;
        Ok(())
    }

    fn gelu(&mut self, x: Mat<'_>, out: Mat<'_>, add: bool) -> Result<()> {
        self.unary(UnaryOp::GeluErf, x, out, add)
    }

    fn unary(&mut self, op: UnaryOp, x: Mat<'_>, out: Mat<'_>, add: bool) -> Result<()> {
        let call = UnaryCall { op, x, out, add };
        self.kernels().unary(self.rec, &call)
    }

    /// `ln(x)` into `ws.xn`, as the products read it.
    fn layer_normed(&mut self, norm: LayerNorm<'_>) -> Result<Mat<'a>> {
        let (x, xn) = (self.x(), Mat::new(&self.ws.xn, self.n, self.n_embd()));
        let call = LayerNormCall { x, norm, out: xn };
        self.kernels().layer_norm(self.rec, &call)?;
        Ok(xn)
    }

    /// Q, K and V of `ln(x)` into `ws.q`, `ws.k`, `ws.v`.
    fn qkv(&mut self, a: &LnSelfAttention<'_>) -> Result<(Mat<'a>, Mat<'a>, Mat<'a>)> {
        let (n, ws) = (self.n, self.ws);
        let w = a.heads.n_head * a.heads.head_dim;
        let xn = Input::F32(self.layer_normed(a.norm)?);
        let (q, k, v) = (
            self.scratch(&ws.q, n, w)?,
            self.scratch(&ws.k, n, w)?,
            self.scratch(&ws.v, n, w)?,
        );
        self.product(a.q, xn, Output::Store(q))?;
        self.product(a.k, xn, Output::Store(k))?;
        self.product(a.v, xn, Output::Store(v))?;
        Ok((q, k, v))
    }

    /// The attention of `q` over `kv` into `ws.attn`, then `x += out(..)`.
    fn attend_and_project(
        &mut self,
        q: Mat<'_>,
        kv: LayerKv<'_>,
        new: NewKv<'_>,
        heads: Heads,
        out_w: &Linear,
    ) -> Result<()> {
        let attn = self.scratch(&self.ws.attn, self.n, heads.n_head * heads.head_dim)?;
        let call = AttentionCall {
            q,
            out: AnyMat::F32(attn),
            kv,
            new,
            shape: AttentionShape {
                n_head: heads.n_head,
                n_head_kv: heads.n_head,
                head_dim: heads.head_dim,
            },
            opts: AttentionOptions {
                scale: heads.scale,
                softcap: 0.0,
                window: 0,
            },
            variant: None,
            split: None,
        };
        self.kernels().attention(self.rec, &call)?;
        let x = self.x();
        self.product(out_w, Input::F32(attn), Output::Accumulate(x))
    }

    fn mlp(&mut self, m: &LnMlp<'_>) -> Result<()> {
        let xn = self.layer_normed(m.norm)?;
        let h = self.scratch(&self.ws.hidden, self.n, m.up.n_out())?;
        self.product(m.up, Input::F32(xn), Output::Store(h))?;
        self.unary(m.act, h, h, false)?;
        let x = self.x();
        self.product(m.down, Input::F32(h), Output::Accumulate(x))
    }

    /// Records an encoder block: every position attends to every position
    /// of its key set — all of the call's, or with a batched addressing
    /// each consecutive `at.n_keys` of them (one image of several) —
    /// through `scratch` (keys and values of this block, at least as many
    /// rows as the call has tokens) and its addressing.
    ///
    /// # Errors
    /// Key sets not of the call's tokens, shapes the kernels do not support.
    pub fn encoder_block(
        &mut self,
        b: &EncoderBlock<'_>,
        scratch: &FullKv,
        at: &FullKvAddressing,
    ) -> Result<()> {
        let n = self.n;
        if scratch.n_keys < n || !n.is_multiple_of(at.n_keys) || n > at.n_keys * at.n_seqs {
            return Err(ModelError::Internal(format!(
                "encoder keys of {} rows, {} sets of {}, call of {n}",
                scratch.n_keys, at.n_seqs, at.n_keys
            )));
        }
        let (q, k, v) = self.qkv(&b.attn)?;
        self.store_full(scratch, at, k, v)?;
        let kv = scratch.layer(at.attend());
        self.attend_and_project(q, kv, NewKv::Stored, b.attn.heads, b.attn.out)?;
        self.mlp(&b.mlp)?;
        self.squares = false;
        Ok(())
    }

    fn store_full(
        &mut self,
        dst: &FullKv,
        at: &FullKvAddressing,
        k: Mat<'_>,
        v: Mat<'_>,
    ) -> Result<()> {
        for (src, cache) in [(k, &dst.k), (v, &dst.v)] {
            let call = KvStoreCall {
                src,
                cache,
                at: at.store(),
            };
            self.kernels().kv_store(self.rec, &call)?;
        }
        Ok(())
    }

    /// Records the keys and values of a cross-attention over the call's
    /// rows of `enc` (the encoder output, `n_embd` wide) into `dst`.
    ///
    /// # Errors
    /// Key sets not of the call's tokens, shapes the kernels do not support.
    pub fn cross_kv(
        &mut self,
        enc: Mat<'_>,
        k_w: &Linear,
        v_w: &Linear,
        dst: &FullKv,
        at: &FullKvAddressing,
    ) -> Result<()> {
        let n = self.n;
        if dst.n_keys != n || at.n_keys != n || enc.rows != n {
            return Err(ModelError::Internal(format!(
                "cross keys for {} positions from {} rows, call of {n}",
                dst.n_keys, enc.rows
            )));
        }
        let (k, v) = (
            self.scratch(&self.ws.k, n, dst.width)?,
            self.scratch(&self.ws.v, n, dst.width)?,
        );
        self.product(k_w, Input::F32(enc), Output::Store(k))?;
        self.product(v_w, Input::F32(enc), Output::Store(v))?;
        self.store_full(dst, at, k, v)
    }

    /// The residual after the final layer norm of the encoder, into `ws.xn`
    /// (the encoder output the cross-attention keys are computed from).
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    pub fn final_norm(&mut self, norm: LayerNorm<'_>) -> Result<Mat<'a>> {
        self.layer_normed(norm)
    }

    /// Records a copy of the packed rows `src` to the start of `dst` (an
    /// output the caller reads).
    ///
    /// # Errors
    /// Rows not packed, a range outside a buffer.
    pub fn copy_rows(&mut self, src: Mat<'_>, dst: &Arc<Buffer>) -> Result<()> {
        if src.rows > 1 && src.ld != src.cols {
            return Err(ModelError::Internal(format!(
                "copy of unpacked rows {src:?}"
            )));
        }
        let copy = CopyCall {
            src: src.buf,
            src_offset: (4 * src.offset) as u64,
            dst,
            dst_offset: 0,
            bytes: (4 * src.rows * src.cols) as u64,
        };
        self.kernels().copy(self.rec, &copy)
    }

    /// Records the token embedding of `ws.ids` plus the learned positional
    /// embedding of `ws.positions` into the residual.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    pub fn embed_with_positions(
        &mut self,
        tokens: &QuantWeight,
        positions: &QuantWeight,
    ) -> Result<()> {
        let (x, ws) = (self.x(), self.ws);
        let k = self.kernels();
        let call = GetRowsCall {
            table: tokens,
            ids: &ws.ids,
            out: x,
            scale: 1.0,
        };
        k.get_rows(self.rec, &call)?;
        let tmp = self.scratch(&ws.tmp, self.n, self.n_embd())?;
        let call = GetRowsCall {
            table: positions,
            ids: &ws.positions,
            out: tmp,
            scale: 1.0,
        };
        k.get_rows(self.rec, &call)?;
        let call = UnaryCall {
            op: UnaryOp::Copy,
            x: tmp,
            out: x,
            add: true,
        };
        k.unary(self.rec, &call)?;
        self.squares = false;
        Ok(())
    }

    /// Records decoder block `il`: self-attention over the recorder's cache
    /// (the call's new K/V stored into it), cross-attention over `cross`
    /// (all queries see every key), the MLP.
    ///
    /// # Errors
    /// Shapes the kernels do not support, more queries than `at` addresses.
    pub fn cross_decoder_block(
        &mut self,
        il: usize,
        b: &CrossDecoderBlock<'_>,
        cross: &FullKv,
        at: &FullKvAddressing,
    ) -> Result<()> {
        let n = self.n;
        if n > at.max_queries {
            return Err(ModelError::Internal(format!(
                "{n} queries, cross-attention addresses {}",
                at.max_queries
            )));
        }
        let (q, k, v) = self.qkv(&b.attn)?;
        let kv = self.cache()?.layer_kv(LayerCall {
            il,
            n_tokens: n,
            positions: &self.ws.positions,
        })?;
        let rows = NewRows { k, v };
        let new = if self.plan.store_in_attention {
            NewKv::StoreInKernel(rows)
        } else {
            NewKv::Store(rows)
        };
        self.attend_and_project(q, kv, new, b.attn.heads, b.attn.out)?;

        let c = &b.cross;
        let xn = Input::F32(self.layer_normed(c.norm)?);
        let q = self.scratch(&self.ws.q, n, c.heads.n_head * c.heads.head_dim)?;
        self.product(c.q, xn, Output::Store(q))?;
        self.attend_and_project(q, cross.layer(at.attend()), NewKv::Stored, c.heads, c.out)?;

        self.mlp(&b.mlp)?;
        self.squares = false;
        Ok(())
    }

    /// Records `ln(x)` of the call's rows `every - 1, 2 every - 1, ...`
    /// (each sequence's last token, with `every` tokens per sequence)
    /// projected by `head` (the tied token embedding) into rows `0..` of
    /// `ws.logits`, then copied to `host`.
    ///
    /// # Errors
    /// `every` not dividing the call's tokens, more rows than the workspace
    /// holds logits of, shapes the kernels do not support.
    pub fn last_logits(
        &mut self,
        norm: LayerNorm<'_>,
        head: &Linear,
        every: usize,
        host: &Arc<Buffer>,
    ) -> Result<()> {
        let (n, d, ws) = (self.n, self.n_embd(), self.ws);
        let n_vocab = ws.shape.n_vocab;
        if every == 0 || !n.is_multiple_of(every) || n / every > ws.max_logit_rows {
            return Err(ModelError::Internal(format!(
                "logits of every {every}th of {n} rows ({} logit rows)",
                ws.max_logit_rows
            )));
        }
        let rows = n / every;
        let x = Mat::new(&ws.x, rows, every * d).cols_at((every - 1) * d, d);
        let xn = Mat::new(&ws.xn, rows, d);
        let call = LayerNormCall { x, norm, out: xn };
        self.kernels().layer_norm(self.rec, &call)?;
        let logits = Mat::new(&ws.logits, rows, n_vocab);
        self.product(head, input_of(AnyMat::F32(xn)), Output::Store(logits))?;
        let copy = CopyCall {
            src: &ws.logits,
            src_offset: 0,
            dst: host,
            dst_offset: 0,
            bytes: (rows * n_vocab * 4) as u64,
        };
        self.kernels().copy(self.rec, &copy)
    }
}
