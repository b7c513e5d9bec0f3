//! `Kernels`: the steps the planner records a call with, by kernel family —
//! Vulkan dispatches ([`VULKAN`]) or native steps on the host
//! ([`crate::ops::host::HOST`], for CPU devices). Both take the same call
//! structs and check them the same way, so a model states its blocks once
//! and the plan picks where they run.

use std::sync::Arc;

use super::Mat;
use super::act_round::ActRounding;
use super::attention::AttentionCall;
use super::glu::GluCall;
use super::im2col::Im2colCall;
use super::kv_store::KvStoreCall;
use super::layer_norm::LayerNormCall;
use super::linear::LinearCall;
use super::rms_norm::RmsNormCall;
use super::rope::RopeCall;
use super::topk::TopKCall;
use super::unary::UnaryCall;
use crate::error::Result;
use crate::gpu::{Buffer, Recording};
use crate::quant::QuantWeight;

/// A copy of `bytes` bytes from `src` at `src_offset` to `dst` at `dst_offset`.
#[derive(Clone, Copy, Debug)]
pub struct CopyCall<'a> {
    /// The source buffer.
    pub src: &'a Arc<Buffer>,
    /// Byte offset in the source.
    pub src_offset: u64,
    /// The destination buffer.
    pub dst: &'a Arc<Buffer>,
    /// Byte offset in the destination.
    pub dst_offset: u64,
    /// Bytes to copy.
    pub bytes: u64,
}

/// The rows of an embedding table picked by token ids.
#[derive(Clone, Copy, Debug)]
pub struct GetRowsCall<'a> {
    /// The table, `[n_vocab, cols]`.
    pub table: &'a QuantWeight,
    /// One i32 id per output row.
    pub ids: &'a Arc<Buffer>,
    /// The rows, f32.
    pub out: Mat<'a>,
    /// Multiplier of every value.
    pub scale: f32,
}

/// One implementation of every kernel family the planner uses.
pub trait Kernels: Send + Sync {
    /// An RMS norm ([`super::rms_norm::record_rms_norm`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn rms_norm(&self, rec: &mut Recording, call: &RmsNormCall<'_>) -> Result<()>;
    /// A rope in place ([`super::rope::record_rope`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn rope(&self, rec: &mut Recording, call: &RopeCall<'_>) -> Result<()>;
    /// A product ([`super::linear::record_linear`]).
    ///
    /// # Errors
    /// Shapes the family does not take, or steps it cannot fold.
    fn linear(&self, rec: &mut Recording, call: &LinearCall<'_>) -> Result<()>;
    /// Attention and the store of its new K/V rows ([`super::attention::record_attention`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn attention(&self, rec: &mut Recording, call: &AttentionCall<'_>) -> Result<()>;
    /// A gated activation ([`super::glu::record_glu`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn glu(&self, rec: &mut Recording, call: &GluCall<'_>) -> Result<()>;
    /// Embedding rows ([`super::get_rows::record_get_rows`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn get_rows(&self, rec: &mut Recording, call: &GetRowsCall<'_>) -> Result<()>;
    /// The soft-cap of `x` in place ([`super::softcap::record_softcap`]).
    ///
    /// # Errors
    /// A cap that is not positive.
    fn softcap(&self, rec: &mut Recording, x: Mat<'_>, cap: f32) -> Result<()>;
    /// llama.cpp's rounding of product inputs ([`super::act_round::record_act_round`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn act_round(
        &self,
        rec: &mut Recording,
        mode: ActRounding,
        x: Mat<'_>,
        out: Mat<'_>,
    ) -> Result<()>;
    /// A copy between buffers.
    ///
    /// # Errors
    /// A range outside a buffer.
    fn copy(&self, rec: &mut Recording, call: &CopyCall<'_>) -> Result<()>;
    /// A layer norm with weight and bias ([`super::layer_norm::record_layer_norm`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn layer_norm(&self, rec: &mut Recording, call: &LayerNormCall<'_>) -> Result<()>;
    /// An elementwise function ([`super::unary::record_unary`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn unary(&self, rec: &mut Recording, call: &UnaryCall<'_>) -> Result<()>;
    /// A convolution's patch rows ([`super::im2col::record_im2col`]).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn im2col(&self, rec: &mut Recording, call: &Im2colCall<'_>) -> Result<()>;
    /// New K or V rows into a cache ([`super::kv_store::record_kv_store`]),
    /// where no attention call stores them (keys computed once and kept).
    ///
    /// # Errors
    /// Shapes the family does not take.
    fn kv_store(&self, rec: &mut Recording, call: &KvStoreCall<'_>) -> Result<()>;
    /// The k best logits of each row with their indices ([`super::topk::record_top_k`]).
    ///
    /// # Errors
    /// As [`super::topk::TopKCall::check`].
    fn top_k(&self, rec: &mut Recording, call: &TopKCall<'_>) -> Result<()>;
}

/// The Vulkan kernels (`glsl/`).
pub struct Vulkan;

/// The Vulkan kernels.
pub static VULKAN: Vulkan = Vulkan;

impl Kernels for Vulkan {
    fn rms_norm(&self, rec: &mut Recording, call: &RmsNormCall<'_>) -> Result<()> {
        super::rms_norm::record_rms_norm(rec, call)
    }

    fn rope(&self, rec: &mut Recording, call: &RopeCall<'_>) -> Result<()> {
        super::rope::record_rope(rec, call)
    }

    fn linear(&self, rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
        super::linear::record_linear(rec, call)
    }

    fn attention(&self, rec: &mut Recording, call: &AttentionCall<'_>) -> Result<()> {
        super::attention::record_attention(rec, call)
    }

    fn glu(&self, rec: &mut Recording, call: &GluCall<'_>) -> Result<()> {
        super::glu::record_glu(rec, call)
    }

    fn get_rows(&self, rec: &mut Recording, call: &GetRowsCall<'_>) -> Result<()> {
        super::get_rows::record_get_rows(rec, call.table, call.ids, call.out, call.scale)
    }

    fn softcap(&self, rec: &mut Recording, x: Mat<'_>, cap: f32) -> Result<()> {
        super::softcap::record_softcap(rec, x, cap)
    }

    fn act_round(
        &self,
        rec: &mut Recording,
        mode: ActRounding,
        x: Mat<'_>,
        out: Mat<'_>,
    ) -> Result<()> {
        super::act_round::record_act_round(rec, mode, x, out)
    }

    fn copy(&self, rec: &mut Recording, call: &CopyCall<'_>) -> Result<()> {
        rec.copy(
            call.src,
            call.src_offset,
            call.dst,
            call.dst_offset,
            call.bytes,
        )
    }

    fn layer_norm(&self, rec: &mut Recording, call: &LayerNormCall<'_>) -> Result<()> {
        super::layer_norm::record_layer_norm(rec, call)
    }

    fn unary(&self, rec: &mut Recording, call: &UnaryCall<'_>) -> Result<()> {
        super::unary::record_unary(rec, call)
    }

    fn im2col(&self, rec: &mut Recording, call: &Im2colCall<'_>) -> Result<()> {
        super::im2col::record_im2col(rec, call)
    }

    fn kv_store(&self, rec: &mut Recording, call: &KvStoreCall<'_>) -> Result<()> {
        super::kv_store::record_kv_store(rec, call)
    }

    fn top_k(&self, rec: &mut Recording, call: &TopKCall<'_>) -> Result<()> {
        super::topk::record_top_k(rec, call)
    }
}
