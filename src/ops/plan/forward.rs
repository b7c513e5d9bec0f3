//! `Forward`: records one call of a model — its embedding, its blocks, its
//! logits — over a [`Workspace`], with the kernels and fusions the
//! [`Plan`] of the call's shape class allows.

mod speech;
mod vision;

use std::sync::Arc;

use half::f16;

use super::block::{DecoderBlock, Ffn, OutputHead, Qkv};
use super::{Plan, Planner, Workspace};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, Recording};
use crate::ops::act_round::ActRounding;
use crate::ops::attention::{
    AttentionCall, AttentionOptions, AttentionShape, KeySplit, NewKv, NewRows,
};
use crate::ops::backend::{CopyCall, GetRowsCall, Kernels};
use crate::ops::glu::{GluCall, GluInput};
use crate::ops::kv_store::{KvAttention, LayerCall};
use crate::ops::linear::{FoldedRope, Input, Linear, LinearCall, Output, SquareSums, matvec_q8};
use crate::ops::rms_norm::{NormOut, NormWeight, RmsNormCall};
use crate::ops::rope::{Rope, RopeCall};
use crate::ops::topk::TopKCall;
use crate::ops::{AnyMat, Mat, room};
use crate::quant::QuantWeight;

/// The recorder of one forward call of `n` tokens.
pub struct Forward<'r, 'a> {
    rec: &'r mut Recording,
    planner: Planner,
    plan: Plan,
    ws: &'a Workspace,
    kv: Option<&'a dyn KvAttention>,
    n: usize,
    /// Whether `ws.x_squares` holds the sums of squares of the residual as
    /// the last product wrote it.
    squares: bool,
}

impl<'r, 'a> Forward<'r, 'a> {
    /// A recorder of `n` tokens (rows of the workspace), one sequence's.
    ///
    /// # Errors
    /// No tokens, or more than the workspace holds.
    pub fn new(
        rec: &'r mut Recording,
        planner: Planner,
        ws: &'a Workspace,
        n: usize,
    ) -> Result<Self> {
        if n == 0 || n > ws.max_tokens {
            return Err(ModelError::Internal(format!(
                "{n} tokens, workspace holds {}",
                ws.max_tokens
            )));
        }
        let plan = planner.plan(rec.context(), n, false);
        Ok(Forward {
            rec,
            planner,
            plan,
            ws,
            kv: None,
            n,
            squares: false,
        })
    }

    /// The same recorder with its blocks' attention going through `kv`
    /// (which says whether each token is alone in its sequence).
    pub fn with_cache(self, kv: &'a dyn KvAttention) -> Self {
        let plan = self
            .planner
            .plan(self.rec.context(), self.n, kv.one_per_sequence(self.n));
        Forward {
            plan,
            kv: Some(kv),
            ..self
        }
    }

    fn cache(&self) -> Result<&'a dyn KvAttention> {
        self.kv
            .ok_or_else(|| ModelError::Internal("blocks recorded without a KV cache".into()))
    }

    /// The plan of this call.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The kernels the plan records with.
    fn kernels(&self) -> &'static dyn Kernels {
        self.plan.kernels()
    }

    /// Positions the call's sequences may hold (0 without a cache).
    pub fn n_ctx(&self) -> usize {
        self.kv.map_or(0, |kv| kv.n_ctx())
    }

    fn x(&self) -> Mat<'a> {
        Mat::new(&self.ws.x, self.n, self.ws.shape.n_embd)
    }

    /// `cols`-wide rows of `buf` for this call, f16 where `f16`.
    fn act(&self, buf: &'a Arc<Buffer>, cols: usize, f16: bool) -> AnyMat<'a> {
        if f16 {
            AnyMat::F16(Mat::<f16>::new(buf, self.n, cols))
        } else {
            AnyMat::F32(Mat::new(buf, self.n, cols))
        }
    }

    /// Records the embedding of the ids in `ws.ids` into the residual.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    pub fn embed(&mut self, table: &QuantWeight, scale: f32) -> Result<()> {
        let x = self.x();
        let call = GetRowsCall {
            table,
            ids: &self.ws.ids,
            out: x,
            scale,
        };
        self.kernels().get_rows(self.rec, &call)?;
        self.squares = false;
        Ok(())
    }

    /// Records a copy of the call's rows of the residual stream into rows
    /// `0..n` of `dst` (f32, `n_embd` each): after [`Forward::embed`], the
    /// input vectors of the call's tokens, for a caller to read.
    ///
    /// # Errors
    /// `dst` smaller than the call's rows.
    pub fn read_rows(&mut self, dst: &Arc<Buffer>) -> Result<()> {
        let bytes = (4 * self.n * self.ws.shape.n_embd) as u64;
        room(dst, bytes)?;
        let call = CopyCall {
            src: &self.ws.x,
            src_offset: 0,
            dst,
            dst_offset: 0,
            bytes,
        };
        self.kernels().copy(self.rec, &call)
    }

    /// Floats per row that [`Forward::read_stream`] hands on: the residual
    /// row, then its sums of squares (16 features to a sum).
    pub fn stream_row_floats(&self) -> usize {
        let n_embd = self.ws.shape.n_embd;
        n_embd + n_embd.div_ceil(16)
    }

    /// Records a copy of what the next stage of a model split over devices
    /// needs to carry on as one device would: the call's rows of the
    /// residual stream, then the sums of squares the last product wrote
    /// (without them the next block would take its norm another way, and
    /// round differently). Returns whether the sums are valid. Plans write
    /// them only in batched decode steps on devices with cooperative
    /// matrices, so a session's calls hand on none today; the copy keeps a
    /// split bit-identical where a plan starts writing them.
    ///
    /// # Errors
    /// `dst` smaller than [`Forward::stream_row_floats`] × the call's rows.
    pub fn read_stream(&mut self, dst: &Arc<Buffer>) -> Result<bool> {
        let (x_bytes, sq_bytes) = self.stream_bytes();
        room(dst, x_bytes + sq_bytes)?;
        let k = self.kernels();
        let x = CopyCall {
            src: &self.ws.x,
            src_offset: 0,
            dst,
            dst_offset: 0,
            bytes: x_bytes,
        };
        k.copy(self.rec, &x)?;
        if self.squares {
            let sq = CopyCall {
                src: &self.ws.x_squares,
                src_offset: 0,
                dst,
                dst_offset: x_bytes,
                bytes: sq_bytes,
            };
            k.copy(self.rec, &sq)?;
        }
        Ok(self.squares)
    }

    /// Records the copy of what [`Forward::read_stream`] of the previous
    /// stage wrote (moved by the host into `src`, on this device) over the
    /// call's residual stream; `squares` is what that call returned.
    ///
    /// # Errors
    /// `src` smaller than the call's rows.
    pub fn put_stream(&mut self, src: &Arc<Buffer>, squares: bool) -> Result<()> {
        let (x_bytes, sq_bytes) = self.stream_bytes();
        room(src, x_bytes + sq_bytes)?;
        let k = self.kernels();
        let x = CopyCall {
            src,
            src_offset: 0,
            dst: &self.ws.x,
            dst_offset: 0,
            bytes: x_bytes,
        };
        k.copy(self.rec, &x)?;
        if squares {
            let sq = CopyCall {
                src,
                src_offset: x_bytes,
                dst: &self.ws.x_squares,
                dst_offset: 0,
                bytes: sq_bytes,
            };
            k.copy(self.rec, &sq)?;
        }
        self.squares = squares;
        Ok(())
    }

    /// Bytes of the call's residual rows and of their sums of squares.
    fn stream_bytes(&self) -> (u64, u64) {
        let n_embd = self.ws.shape.n_embd;
        (
            (4 * self.n * n_embd) as u64,
            (4 * self.n * n_embd.div_ceil(16)) as u64,
        )
    }

    /// Records block `il` (its KV cache layer) over the residual.
    ///
    /// # Errors
    /// Shapes the kernels do not support.
    pub fn decoder_block(&mut self, il: usize, b: &DecoderBlock<'_>) -> Result<()> {
        let (n, a) = (self.n, b.attention);
        let (n_q, n_kv) = (a.n_head * a.head_dim, a.n_head_kv * a.head_dim);
        let rope = Rope {
            style: b.rope.style,
            head_dim: a.head_dim,
            n_rot: b.rope.n_rot,
            positions: &self.ws.positions,
            inv_freq: b.rope.inv_freq,
            attn_factor: b.rope.attn_factor,
        };
        let xa = self.normed(b.attn_norm, &b.qkv.weights())?;
        let (q, k, v, roped) = match b.qkv {
            Qkv::Separate { q, k, v } => {
                let ws = self.ws;
                let views = [
                    Mat::new(&ws.q, n, n_q),
                    Mat::new(&ws.k, n, n_kv),
                    Mat::new(&ws.v, n, n_kv),
                ];
                for (w, out) in [q, k, v].into_iter().zip(views) {
                    self.product(w, xa, Output::Store(out))?;
                }
                (views[0], views[1], views[2], false)
            }
            Qkv::Stacked(w) => {
                let all = Mat::new(&self.ws.q, n, n_q + 2 * n_kv);
                // The rope of q and k in the product's stores, where no
                // per-head norm must come between.
                let fold = (b.qk_norm.is_none() && self.plan.folds_epilogue(&xa))
                    .then(|| FoldedRope::adjacent(rope, n_q + n_kv))
                    .flatten();
                let out = match fold {
                    Some(rope) => Output::Roped { out: all, rope },
                    None => Output::Store(all),
                };
                self.product(w, xa, out)?;
                (
                    all.cols_at(0, n_q),
                    all.cols_at(n_q, n_kv),
                    all.cols_at(n_q + n_kv, n_kv),
                    fold.is_some(),
                )
            }
        };
        if let Some(qk) = b.qk_norm {
            for (x, norm) in [(q, qk.q), (k, qk.k)] {
                let call = RmsNormCall {
                    x,
                    norm: norm.norm(),
                    out: NormOut::Store(AnyMat::F32(x)),
                    head_dim: Some(a.head_dim),
                };
                self.kernels().rms_norm(self.rec, &call)?;
            }
        }
        if !roped {
            if Arc::ptr_eq(q.buf, k.buf) && k.offset == q.offset + n_q && k.ld == q.ld {
                // k's heads follow q's in each token's row: one dispatch rotates both.
                let x = q.cols_at(0, n_q + n_kv);
                self.kernels().rope(self.rec, &RopeCall { x, rope })?;
            } else {
                for x in [q, k] {
                    self.kernels().rope(self.rec, &RopeCall { x, rope })?;
                }
            }
        }
        let shape = AttentionShape {
            n_head: a.n_head,
            n_head_kv: a.n_head_kv,
            head_dim: a.head_dim,
        };
        let variant = self.plan.attention_variant(self.rec.context(), shape);
        let f16_out = self.plan.attention_out_f16(shape, variant);
        let out = self.act(&self.ws.attn, n_q, f16_out);
        let new = NewRows { k, v };
        // Keys a token may see: the window, the cache's positions, or both.
        let max_keys = match (a.window, self.n_ctx()) {
            (0, 0) => None,
            (w, 0) | (0, w) => Some(w),
            (w, n) => Some(w.min(n)),
        };
        let call = AttentionCall {
            q,
            out,
            kv: self.cache()?.layer_kv(LayerCall {
                il,
                n_tokens: n,
                positions: &self.ws.positions,
            })?,
            new: if self.plan.store_in_attention {
                NewKv::StoreInKernel(new)
            } else {
                NewKv::Store(new)
            },
            shape,
            opts: AttentionOptions {
                scale: a.scale,
                softcap: a.softcap,
                window: a.window,
            },
            variant: Some(variant),
            split: Some(KeySplit {
                scratch: &self.ws.attn_split,
                n: None,
                max_keys,
                wg: None,
            }),
        };
        self.kernels().attention(self.rec, &call)?;
        self.residual(b.attn_out, input_of(out), b.post_attn_norm)?;

        let xf = self.normed(b.ffn_norm, &b.ffn.weights())?;
        let hidden = self.ffn(b.ffn, xf)?;
        self.residual(b.ffn_out, hidden, b.post_ffn_norm)
    }

    /// Records the FFN's input projections and gated activation; returns
    /// the activation as the output projection reads it.
    fn ffn<'b>(&mut self, ffn: Ffn<'_>, xf: Input<'b>) -> Result<Input<'b>>
    where
        'a: 'b,
    {
        let (n, ws) = (self.n, self.ws);
        let n_ff = ws.shape.n_ff;
        let hidden = Mat::new(&ws.hidden, n, n_ff);
        let k = self.kernels();
        let glu = |rec: &mut Recording, act, input| {
            let call = GluCall {
                act,
                input,
                out: hidden,
            };
            k.glu(rec, &call)
        };
        match ffn {
            Ffn::Separate { gate, up, act } => {
                let (g, u) = (Mat::new(&ws.gate, n, n_ff), Mat::new(&ws.up, n, n_ff));
                self.product(gate, xf, Output::Store(g))?;
                self.product(up, xf, Output::Store(u))?;
                glu(self.rec, act, GluInput::Separate { gate: g, up: u })?;
            }
            Ffn::Stacked { gate_up, act } => {
                let gu = Mat::new(&ws.up, n, 2 * n_ff);
                self.product(gate_up, xf, Output::Store(gu))?;
                let (gate, up) = (gu.cols_at(0, n_ff), gu.cols_at(n_ff, n_ff));
                glu(self.rec, act, GluInput::Separate { gate, up })?;
            }
            Ffn::Interleaved { gate_up, act } if self.plan.folds_epilogue(&xf) => {
                // The gate in the product's stores, as f16 where the down
                // projection reads f16.
                let out = self.act(&ws.hidden, n_ff, self.plan.f16_for(n_ff));
                self.product(gate_up, xf, Output::Gated { out, act })?;
                return Ok(input_of(out));
            }
            Ffn::Interleaved { gate_up, act } => {
                let gu = Mat::new(&ws.up, n, 2 * n_ff);
                self.product(gate_up, xf, Output::Store(gu))?;
                glu(self.rec, act, GluInput::Interleaved(gu))?;
            }
        }
        Ok(Input::F32(hidden))
    }

    /// The input of the products after the RMS norm `norm` of the residual:
    /// the residual with the norm folded into their matvecs, or into their
    /// skinny products from the sums of squares the last product wrote, or
    /// the norm recorded into `ws.xn` (f16 where the products read f16),
    /// or folded into the quantizer of the integer path where every one of
    /// `consumers` takes it.
    fn normed<'b>(&mut self, norm: NormWeight<'b>, consumers: &[&Linear]) -> Result<Input<'b>>
    where
        'a: 'b,
    {
        let x = self.x();
        if self.plan.folds_norm(AnyMat::F32(x)) || self.int_dot_folds_norm(consumers) {
            return Ok(Input::Normed { x, norm });
        }
        let rows = consumers.iter().map(|w| w.weight.rows()).max().unwrap_or(0);
        if self.squares && self.plan.folds_norm_from_squares(rows) {
            return Ok(Input::NormedBySquares {
                x,
                norm,
                squares: self.square_sums(),
            });
        }
        let n_embd = self.ws.shape.n_embd;
        let out = self.act(&self.ws.xn, n_embd, self.plan.f16_for(n_embd));
        let call = RmsNormCall {
            x,
            norm: norm.norm(),
            out: NormOut::Store(out),
            head_dim: None,
        };
        self.kernels().rms_norm(self.rec, &call)?;
        Ok(input_of(out))
    }

    /// Whether the integer path's quantizer folds the norm read by
    /// `consumers`: all of them take that path (the others would need the
    /// norm on its own).
    fn int_dot_folds_norm(&self, consumers: &[&Linear]) -> bool {
        self.plan.quantizer_folds_norm() && consumers.iter().all(|w| self.int_dot_takes(w))
    }

    /// Whether `w`'s decode products take the integer path.
    fn int_dot_takes(&self, w: &Linear) -> bool {
        self.plan.int_dot_for(w.weight.qtype()) && matvec_q8::takes(self.rec.context(), &w.weight)
    }

    fn square_sums(&self) -> SquareSums<'a> {
        SquareSums {
            buf: &self.ws.x_squares,
            offset: 0,
            groups: self.ws.shape.n_embd.div_ceil(16),
        }
    }

    /// `x += W·input`, or `x += norm(W·input)` with a post-norm; the
    /// product also writes the sums of squares of `x` where the next
    /// product can fold its norm from them.
    fn residual(
        &mut self,
        w: &Linear,
        input: Input<'_>,
        post_norm: Option<NormWeight<'_>>,
    ) -> Result<()> {
        let x = self.x();
        match post_norm {
            None => {
                let squares = self.plan.norm_in_products
                    && w.weight
                        .chunks()
                        .iter()
                        .all(|c| c.row_start.is_multiple_of(16));
                let out = if squares {
                    Output::AccumulateSquares {
                        out: x,
                        squares: self.square_sums(),
                    }
                } else {
                    Output::Accumulate(x)
                };
                self.product(w, input, out)?;
                self.squares = squares;
            }
            Some(norm) => {
                let tmp = Mat::new(&self.ws.tmp, self.n, self.ws.shape.n_embd);
                self.product(w, input, Output::Store(tmp))?;
                let call = RmsNormCall {
                    x: tmp,
                    norm: norm.norm(),
                    out: NormOut::Add(x),
                    head_dim: None,
                };
                self.kernels().rms_norm(self.rec, &call)?;
                self.squares = false;
            }
        }
        Ok(())
    }

    /// Records one product on the kernel the plan picks for its input,
    /// rounding an f32 input first under llama.cpp numerics (or quantizing
    /// it for the integer matvec where the plan says so).
    fn product(&mut self, w: &Linear, input: Input<'_>, output: Output<'_>) -> Result<()> {
        // The quantizer reads x four floats at a time.
        let int_input = match input {
            Input::F32(x) => x.aligned4(),
            Input::Normed { .. } => true,
            Input::F16(_) | Input::NormedBySquares { .. } => false,
        };
        if int_input && self.int_dot_takes(w) {
            // The plan holds integer paths only for Vulkan recordings.
            let call = LinearCall::new(&w.weight, w.bias.as_ref(), input, output);
            return matvec_q8::record_quantized(self.rec, &call, &self.ws.xq);
        }
        let input = match input {
            Input::F32(x) => {
                let mode = self.plan.numerics().rounding_for(w.weight.qtype());
                if mode == ActRounding::None {
                    input
                } else {
                    let xq = Mat::new(&self.ws.xq, x.rows, x.cols);
                    self.kernels().act_round(self.rec, mode, x, xq)?;
                    Input::F32(xq)
                }
            }
            other => other,
        };
        let mut call = LinearCall::new(&w.weight, w.bias.as_ref(), input, output);
        if let Input::F32(x) = input {
            call = call.on(self.plan.variant(AnyMat::F32(x)));
        }
        self.kernels().linear(self.rec, &call)
    }

    /// Records the output head for this call's rows of the residual from
    /// row `first` on into rows `out_row..` of `ws.logits`, then copies them
    /// to rows `host_row..` of `host`.
    ///
    /// # Errors
    /// Rows beyond the workspace, shapes the kernels do not support.
    pub fn logits(
        &mut self,
        head: &OutputHead<'_>,
        first: usize,
        out_row: usize,
        host: &Arc<Buffer>,
        host_row: usize,
    ) -> Result<()> {
        self.head_logits(head, first, out_row)?;
        let row = (self.ws.shape.n_vocab * 4) as u64;
        let copy = CopyCall {
            src: &self.ws.logits,
            src_offset: out_row as u64 * row,
            dst: host,
            dst_offset: host_row as u64 * row,
            bytes: self.n as u64 * row,
        };
        self.kernels().copy(self.rec, &copy)
    }

    /// Records the output head for this call's rows of the residual (from
    /// row 0) into `ws.logits`, and the `k` best logits of each row with
    /// their indices into `out` (`ops::topk`; `scratch` holds the first
    /// pass's lists): what a sampler needs, without the rows leaving the
    /// device.
    ///
    /// # Errors
    /// Rows beyond the workspace, k out of range, buffers too small, shapes
    /// the kernels do not support.
    pub fn logits_top_k(
        &mut self,
        head: &OutputHead<'_>,
        k: usize,
        scratch: &Arc<Buffer>,
        out: &Arc<Buffer>,
    ) -> Result<()> {
        self.head_logits(head, 0, 0)?;
        let logits = Mat::new(
            &self.ws.logits,
            self.ws.max_logit_rows,
            self.ws.shape.n_vocab,
        )
        .rows_at(0, self.n);
        let call = TopKCall {
            logits,
            k,
            scratch,
            out,
        };
        self.kernels().top_k(self.rec, &call)
    }

    /// The output head (and soft-cap) into rows `out_row..` of `ws.logits`.
    fn head_logits(&mut self, head: &OutputHead<'_>, first: usize, out_row: usize) -> Result<()> {
        let (ws, n) = (self.ws, self.n);
        let (n_embd, n_vocab) = (ws.shape.n_embd, ws.shape.n_vocab);
        if n == 0 || out_row + n > ws.max_logit_rows || first + n > ws.max_tokens {
            return Err(ModelError::Internal(format!(
                "logits for rows {first}..{} into {out_row}.. (workspace: {} tokens, {} logit rows)",
                first + n,
                ws.max_tokens,
                ws.max_logit_rows
            )));
        }
        let x = Mat::new(&ws.x, ws.max_tokens, n_embd).rows_at(first, n);
        let logits = Mat::new(&ws.logits, ws.max_logit_rows, n_vocab).rows_at(out_row, n);
        let input =
            if self.plan.folds_norm(AnyMat::F32(x)) || self.int_dot_folds_norm(&[head.weight]) {
                Input::Normed { x, norm: head.norm }
            } else {
                let f16 = self.plan.f16_for(n_embd);
                let out = self.act(&ws.xn, n_embd, f16);
                let call = RmsNormCall {
                    x,
                    norm: head.norm.norm(),
                    out: NormOut::Store(out),
                    head_dim: None,
                };
                self.kernels().rms_norm(self.rec, &call)?;
                input_of(out)
            };
        self.product(head.weight, input, Output::Store(logits))?;
        if head.softcap > 0.0 {
            self.kernels().softcap(self.rec, logits, head.softcap)?;
        }
        Ok(())
    }
}

/// The product input reading what a step wrote.
fn input_of(m: AnyMat<'_>) -> Input<'_> {
    match m {
        AnyMat::F32(m) => Input::F32(m),
        AnyMat::F16(m) => Input::F16(m),
    }
}
