//! `LlamaModel`: the decoder-only transformer of the Llama family on the GPU,
//! parameterized by `ArchSpec` so Llama, SmolLM2, Mistral, Qwen2/3, Gemma 3
//! and Phi-3 share one forward pass (llama.cpp `llm_build_llama` and its
//! relatives). Tensor names are GGUF's (`blk.{i}.attn_q.weight`, ...).

use std::sync::Arc;

use super::GenerativeModel;
use super::loader::TensorLoader;
use super::registry::LoadOptions;
use super::scratch::Scratch;
use super::spec::ArchSpec;
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::{Buffer, GpuContext, Recording, upload_new};
use crate::kv::{
    AttentionIo, CacheConfig, ContiguousKVCache, KVCache, KvAttention, LayerGeometry, PagePool,
    PagedKVCache, PoolRegistry,
};
use crate::ops::View;
use crate::ops::act_round::{ActRounding, Numerics, record_act_round};
use crate::ops::attention::{AttentionOptions, AttentionShape};
use crate::ops::get_rows::record_get_rows;
use crate::ops::glu::record_glu;
use crate::ops::linear::{Linear, LinearVariant, record_linear_with};
use crate::ops::rms_norm::record_rms_norm;
use crate::ops::rope::{RopeScaling, RopeShape, inv_freq, record_rope};
use crate::quant::QuantWeight;

/// The attention projections of one block: separate Q/K/V or one fused tensor.
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// The FFN input projections: separate gate/up or one fused tensor.
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
}

struct Block {
    attn_norm: Arc<Buffer>,
    qkv: Qkv,
    q_norm: Option<Arc<Buffer>>,
    k_norm: Option<Arc<Buffer>>,
    wo: Linear,
    post_attn_norm: Option<Arc<Buffer>>,
    ffn_norm: Arc<Buffer>,
    gate_up: GateUp,
    down: Linear,
    post_ffn_norm: Option<Arc<Buffer>>,
    /// Inverse rope frequencies of this block (local or global).
    rope: RopeFreqs,
}

/// Inverse rope frequencies on the device: one table, or LongRoPE's two,
/// of which a cache's context length picks one.
#[derive(Clone)]
struct RopeFreqs {
    table: Arc<Buffer>,
    /// LongRoPE: the original context and the table for longer contexts.
    long: Option<(usize, Arc<Buffer>)>,
}

impl RopeFreqs {
    /// The table a cache of `n_ctx` positions uses ([`RopeScaling::for_context`]).
    fn for_context(&self, n_ctx: usize) -> &Arc<Buffer> {
        match &self.long {
            Some((n_ctx_orig, long)) if n_ctx > *n_ctx_orig => long,
            _ => &self.table,
        }
    }
}

/// A Llama-family model on the GPU.
pub struct LlamaModel {
    ctx: Arc<GpuContext>,
    spec: ArchSpec,
    token_embd: QuantWeight,
    output_norm: Arc<Buffer>,
    /// `None` when the output head is the token embedding.
    output: Option<QuantWeight>,
    blocks: Vec<Block>,
    numerics: Numerics,
    /// The KV page pools of paged sessions, one per page size.
    pools: PoolRegistry,
}

fn linear(
    ld: &mut TensorLoader<'_>,
    prefix: &str,
    rows: usize,
    cols: usize,
    bias: bool,
) -> Result<Linear> {
    let weight = ld.matrix(&format!("{prefix}.weight"), rows, cols)?;
    let bias = if bias {
        Some(ld.vector(&format!("{prefix}.bias"), rows)?)
    } else {
        ld.optional_vector(&format!("{prefix}.bias"), rows)?
    };
    Ok(Linear { weight, bias })
}

impl LlamaModel {
    /// Uploads every tensor the spec needs, checking shapes against it.
    ///
    /// # Errors
    /// Missing or mis-shaped tensors, unsupported types, device errors.
    pub fn load(
        ctx: &Arc<GpuContext>,
        g: &GgufFile,
        spec: ArchSpec,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let mut ld = TensorLoader::new(ctx, g, opts.show_progress)?;
        let (e, q, kv, ff) = (spec.n_embd, spec.n_q(), spec.n_kv(), spec.n_ff);
        let token_embd = ld.matrix("token_embd.weight", spec.n_vocab, e)?;
        let output_norm = ld.vector("output_norm.weight", e)?;
        let output = if spec.tied_embeddings {
            None
        } else {
            Some(ld.matrix("output.weight", spec.n_vocab, e)?)
        };

        let global = Self::rope_freqs(ctx, &spec, spec.rope_base, &spec.rope_scaling)?;
        // Gemma 3's sliding layers use their own base and no scaling.
        let local =
            if spec.rope_base_local != spec.rope_base || spec.family == super::Family::Gemma3 {
                Self::rope_freqs(ctx, &spec, spec.rope_base_local, &RopeScaling::None)?
            } else {
                global.clone()
            };

        let mut blocks = Vec::with_capacity(spec.n_layer);
        for il in 0..spec.n_layer {
            let p = format!("blk.{il}");
            let qkv = if spec.fused_qkv {
                Qkv::Fused(linear(
                    &mut ld,
                    &format!("{p}.attn_qkv"),
                    q + 2 * kv,
                    e,
                    false,
                )?)
            } else {
                Qkv::Separate {
                    q: linear(&mut ld, &format!("{p}.attn_q"), q, e, spec.qkv_bias)?,
                    k: linear(&mut ld, &format!("{p}.attn_k"), kv, e, spec.qkv_bias)?,
                    v: linear(&mut ld, &format!("{p}.attn_v"), kv, e, spec.qkv_bias)?,
                }
            };
            let (q_norm, k_norm) = if spec.qk_norm {
                (
                    Some(ld.vector(&format!("{p}.attn_q_norm.weight"), spec.head_dim)?),
                    Some(ld.vector(&format!("{p}.attn_k_norm.weight"), spec.head_dim)?),
                )
            } else {
                (None, None)
            };
            let gate_up = if spec.fused_gate_up {
                GateUp::Fused(linear(&mut ld, &format!("{p}.ffn_up"), 2 * ff, e, false)?)
            } else {
                GateUp::Separate {
                    gate: linear(&mut ld, &format!("{p}.ffn_gate"), ff, e, false)?,
                    up: linear(&mut ld, &format!("{p}.ffn_up"), ff, e, false)?,
                }
            };
            let post = |ld: &mut TensorLoader<'_>, name: &str| -> Result<Option<Arc<Buffer>>> {
                if spec.post_norms {
                    ld.vector(&format!("{p}.{name}.weight"), e).map(Some)
                } else {
                    Ok(None)
                }
            };
            let is_local = spec.window_of(il) > 0;
            blocks.push(Block {
                attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), e)?,
                qkv,
                q_norm,
                k_norm,
                wo: linear(&mut ld, &format!("{p}.attn_output"), e, q, false)?,
                post_attn_norm: post(&mut ld, "post_attention_norm")?,
                ffn_norm: ld.vector(&format!("{p}.ffn_norm.weight"), e)?,
                gate_up,
                down: linear(&mut ld, &format!("{p}.ffn_down"), e, ff, false)?,
                post_ffn_norm: post(&mut ld, "post_ffw_norm")?,
                rope: if is_local {
                    local.clone()
                } else {
                    global.clone()
                },
            });
        }
        ld.finish()?;
        Ok(LlamaModel {
            ctx: ctx.clone(),
            spec,
            token_embd,
            output_norm,
            output,
            blocks,
            numerics: opts.numerics,
            pools: PoolRegistry::default(),
        })
    }

    fn rope_freqs(
        ctx: &Arc<GpuContext>,
        spec: &ArchSpec,
        base: f32,
        scaling: &RopeScaling,
    ) -> Result<RopeFreqs> {
        let upload = |s: &RopeScaling| {
            let f = inv_freq(spec.n_rot, base, s);
            upload_new(ctx, bytemuck::cast_slice(&f), "rope inv_freq")
        };
        let long = match scaling {
            RopeScaling::LongRope { n_ctx_orig, .. } => Some((
                *n_ctx_orig,
                upload(&scaling.for_context(n_ctx_orig.saturating_add(1)))?,
            )),
            _ => None,
        };
        Ok(RopeFreqs {
            table: upload(&scaling.for_context(0))?,
            long,
        })
    }

    /// The per-layer cache geometry.
    pub fn layer_geometry(&self) -> Vec<LayerGeometry> {
        (0..self.spec.n_layer)
            .map(|il| LayerGeometry {
                n_head_kv: self.spec.n_head_kv,
                head_dim: self.spec.head_dim,
                window: self.spec.window_of(il),
            })
            .collect()
    }

    fn record_block(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        il: usize,
        n: usize,
    ) -> Result<()> {
        let sp = &self.spec;
        let b = &self.blocks[il];
        let (e, hd) = (sp.n_embd, sp.head_dim);
        let x = View::new(&s.x, e);
        let xn = View::new(&s.xn, e);

        record_rms_norm(
            rec,
            x,
            Some(&b.attn_norm),
            sp.norm_flavor,
            xn,
            n,
            e,
            sp.norm_eps,
            false,
        )?;
        let (q, k, v) = match &b.qkv {
            Qkv::Separate { q, k, v } => {
                let (qv, kv_, vv) = (
                    View::new(&s.q, s.ld_q),
                    View::new(&s.k, sp.n_kv()),
                    View::new(&s.v, sp.n_kv()),
                );
                self.linear(rec, s, q, xn, n, qv, false)?;
                self.linear(rec, s, k, xn, n, kv_, false)?;
                self.linear(rec, s, v, xn, n, vv, false)?;
                (qv, kv_, vv)
            }
            Qkv::Fused(w) => {
                let qkv = View::new(&s.q, s.ld_q);
                self.linear(rec, s, w, xn, n, qkv, false)?;
                (qkv, qkv.shift(sp.n_q()), qkv.shift(sp.n_q() + sp.n_kv()))
            }
        };
        if let (Some(qn), Some(kn)) = (&b.q_norm, &b.k_norm) {
            // Per-head norms: each head is a row of head_dim floats.
            for (view, norm, heads) in [(q, qn, sp.n_head), (k, kn, sp.n_head_kv)] {
                if view.ld == heads * hd {
                    let rows = View::new(view.buf, hd).shift(view.offset);
                    record_rms_norm(
                        rec,
                        rows,
                        Some(norm),
                        sp.norm_flavor,
                        rows,
                        n * heads,
                        hd,
                        sp.norm_eps,
                        false,
                    )?;
                } else {
                    for t in 0..n {
                        let rows = View::new(view.buf, hd).shift(view.offset + t * view.ld);
                        record_rms_norm(
                            rec,
                            rows,
                            Some(norm),
                            sp.norm_flavor,
                            rows,
                            heads,
                            hd,
                            sp.norm_eps,
                            false,
                        )?;
                    }
                }
            }
        }
        let rope = |rec: &mut Recording, view: View<'_>, heads: usize| {
            record_rope(
                rec,
                view,
                RopeShape {
                    n_tokens: n,
                    n_heads: heads,
                    head_dim: hd,
                    n_rot: sp.n_rot,
                },
                sp.rope_style,
                &s.positions,
                b.rope.for_context(cache.n_ctx()),
                sp.rope_attn_factor,
            )
        };
        rope(rec, q, sp.n_head)?;
        rope(rec, k, sp.n_head_kv)?;

        let attn = View::new(&s.attn, sp.n_q());
        cache.record_attention(
            rec,
            il,
            &AttentionIo {
                q,
                k,
                v,
                o: attn,
                n_tokens: n,
                positions: &s.positions,
                shape: AttentionShape {
                    n_head: sp.n_head,
                    n_head_kv: sp.n_head_kv,
                    head_dim: hd,
                },
                opts: AttentionOptions {
                    scale: sp.attn_scale,
                    softcap: sp.attn_softcap,
                    window: sp.window_of(il),
                },
            },
        )?;
        self.residual(rec, &b.wo, attn, b.post_attn_norm.as_ref(), s, n)?;

        record_rms_norm(
            rec,
            x,
            Some(&b.ffn_norm),
            sp.norm_flavor,
            xn,
            n,
            e,
            sp.norm_eps,
            false,
        )?;
        let hidden = View::new(&s.hidden, sp.n_ff);
        match &b.gate_up {
            GateUp::Separate { gate, up } => {
                let (g, u) = (View::new(&s.gate, sp.n_ff), View::new(&s.up, s.ld_up));
                self.linear(rec, s, gate, xn, n, g, false)?;
                self.linear(rec, s, up, xn, n, u, false)?;
                record_glu(rec, sp.activation, g, u, hidden, n, sp.n_ff)?;
            }
            GateUp::Fused(w) => {
                let gu = View::new(&s.up, s.ld_up);
                self.linear(rec, s, w, xn, n, gu, false)?;
                record_glu(
                    rec,
                    sp.activation,
                    gu,
                    gu.shift(sp.n_ff),
                    hidden,
                    n,
                    sp.n_ff,
                )?;
            }
        }
        self.residual(rec, &b.down, hidden, b.post_ffn_norm.as_ref(), s, n)
    }

    /// The input a linear layer with weight type `t` reads: `x` itself, or
    /// `x` rounded into `s.xq` under [`Numerics::LlamaCppCpu`].
    fn linear_input<'a>(
        &self,
        rec: &mut Recording,
        s: &'a Scratch,
        t: crate::quant::QuantType,
        x: View<'a>,
        n: usize,
        width: usize,
    ) -> Result<View<'a>> {
        let mode = self.numerics.rounding_for(t);
        if mode == ActRounding::None {
            return Ok(x);
        }
        let xq = View::new(&s.xq, width);
        record_act_round(rec, mode, x, xq, n, width)?;
        Ok(xq)
    }

    /// Records `out (+)= W·x` through [`Self::linear_input`].
    #[allow(clippy::too_many_arguments)]
    fn linear(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        w: &Linear,
        x: View<'_>,
        n: usize,
        out: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        let x = self.linear_input(rec, s, w.weight.qtype(), x, n, w.n_in())?;
        record_linear_with(
            rec,
            self.linear_variant(rec, n, x),
            &w.weight,
            w.bias.as_ref(),
            x,
            n,
            out,
            accumulate,
        )
    }

    /// The kernel for `n` tokens of `x`: f32 kernels only under llama.cpp
    /// numerics, since f16 matrix units would add their own rounding.
    fn linear_variant(&self, rec: &Recording, n: usize, x: View<'_>) -> LinearVariant {
        match self.numerics {
            Numerics::Exact => LinearVariant::choose(rec.context(), n, x),
            Numerics::LlamaCppCpu => LinearVariant::choose_f32(rec.context(), n, x),
        }
    }

    /// `x += W·input`, or `x += norm(W·input)` where a post-norm follows the projection.
    fn residual(
        &self,
        rec: &mut Recording,
        w: &Linear,
        input: View<'_>,
        post_norm: Option<&Arc<Buffer>>,
        s: &Scratch,
        n: usize,
    ) -> Result<()> {
        let sp = &self.spec;
        let x = View::new(&s.x, sp.n_embd);
        match post_norm {
            None => self.linear(rec, s, w, input, n, x, true),
            Some(norm) => {
                let tmp = View::new(&s.tmp, sp.n_embd);
                self.linear(rec, s, w, input, n, tmp, false)?;
                record_rms_norm(
                    rec,
                    tmp,
                    Some(norm),
                    sp.norm_flavor,
                    x,
                    n,
                    sp.n_embd,
                    sp.norm_eps,
                    true,
                )
            }
        }
    }
}

impl GenerativeModel for LlamaModel {
    fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn create_kv_cache(&self, cfg: &CacheConfig) -> Result<Box<dyn KVCache>> {
        match cfg.kind {
            crate::kv::CacheKind::Contiguous => Ok(Box::new(ContiguousKVCache::new(
                &self.ctx,
                &self.layer_geometry(),
                cfg.n_ctx,
                cfg.max_batch,
            )?)),
            crate::kv::CacheKind::Paged => {
                let geometry = self.layer_geometry();
                let pool = self.pools.get_or_create(cfg.page_size, || {
                    let n_pages = if cfg.pool_pages > 0 {
                        cfg.pool_pages
                    } else {
                        let budget = self.ctx.caps().device_local_bytes / 4;
                        PagePool::pages_for(
                            &self.ctx,
                            &geometry,
                            cfg.page_size,
                            cfg.n_ctx.max(16384),
                            budget,
                        )
                    };
                    // Sliding-window rings for as many sequences as the full
                    // pages hold contexts of this size, and at least 8.
                    let n_rings = (n_pages * cfg.page_size / cfg.n_ctx.max(1)).max(8);
                    PagePool::new(&self.ctx, &geometry, cfg.page_size, n_pages, n_rings)
                })?;
                Ok(Box::new(PagedKVCache::new(
                    &pool,
                    cfg.n_ctx,
                    cfg.max_batch,
                )?))
            }
        }
    }

    fn create_scratch(&self, max_tokens: usize, max_logit_rows: usize) -> Result<Scratch> {
        Scratch::new(
            &self.ctx,
            &self.spec,
            max_tokens,
            max_logit_rows,
            self.numerics != Numerics::Exact,
        )
    }

    fn record_embed(&self, rec: &mut Recording, s: &Scratch, n: usize) -> Result<()> {
        if n > s.max_tokens {
            return Err(ModelError::Internal(format!(
                "{n} tokens, scratch holds {}",
                s.max_tokens
            )));
        }
        record_get_rows(
            rec,
            &self.token_embd,
            &s.ids,
            n,
            View::new(&s.x, self.spec.n_embd),
            self.spec.embed_scale,
        )
    }

    fn record_blocks(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        cache: &dyn KvAttention,
        n: usize,
    ) -> Result<()> {
        for il in 0..self.spec.n_layer {
            self.record_block(rec, s, cache, il, n)?;
        }
        Ok(())
    }

    fn record_logits(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        first: usize,
        n: usize,
        out_row: usize,
    ) -> Result<()> {
        if out_row + n > s.max_logit_rows || first + n > s.max_tokens {
            return Err(ModelError::Internal(format!(
                "logits for rows {first}..{} into {out_row}.. (scratch: {} tokens, {} logit rows)",
                first + n,
                s.max_tokens,
                s.max_logit_rows
            )));
        }
        let e = self.spec.n_embd;
        let x = View::new(&s.x, e).shift(first * e);
        let xn = View::new(&s.xn, e);
        record_rms_norm(
            rec,
            x,
            Some(&self.output_norm),
            self.spec.norm_flavor,
            xn,
            n,
            e,
            self.spec.norm_eps,
            false,
        )?;
        let head = self.output.as_ref().unwrap_or(&self.token_embd);
        let xn = self.linear_input(rec, s, head.qtype(), xn, n, e)?;
        record_linear_with(
            rec,
            self.linear_variant(rec, n, xn),
            head,
            None,
            xn,
            n,
            View::new(&s.logits, self.spec.n_vocab).shift(out_row * self.spec.n_vocab),
            false,
        )
    }

    fn same_rope(&self, a: usize, b: usize) -> bool {
        self.blocks
            .iter()
            .all(|bl| Arc::ptr_eq(bl.rope.for_context(a), bl.rope.for_context(b)))
    }

    fn device_bytes(&self) -> u64 {
        let lin = |l: &Linear| l.weight.device_bytes() + l.bias.as_ref().map_or(0, |b| b.size());
        let mut total =
            self.token_embd.device_bytes() + self.output.as_ref().map_or(0, |o| o.device_bytes());
        for b in &self.blocks {
            total += match &b.qkv {
                Qkv::Separate { q, k, v } => lin(q) + lin(k) + lin(v),
                Qkv::Fused(w) => lin(w),
            };
            total += match &b.gate_up {
                GateUp::Separate { gate, up } => lin(gate) + lin(up),
                GateUp::Fused(w) => lin(w),
            };
            total += lin(&b.wo) + lin(&b.down);
        }
        total
    }
}
