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
use crate::ops::glu::{Activation, record_glu, record_glu_interleaved};
use crate::ops::linear::{
    CoopEpilogue, CoopNorm, Linear, LinearVariant, MatvecOptions, MatvecRope, NormInput,
    SquareSums, f16_activations, record_linear_coop_folded, record_linear_with,
    record_matvec_tokens,
};
use crate::ops::rms_norm::{record_rms_norm, record_rms_norm_heads};
use crate::ops::rope::{RopeScaling, RopeShape, RopeStyle, inv_freq, record_rope};
use crate::quant::QuantWeight;

/// The attention projections of one block: separate Q/K/V or one fused tensor.
enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// The FFN input projections: separate gate/up, one fused tensor (gate rows
/// then up rows), or gate and up rows interleaved (`ops::linear::MatvecOptions::glu`).
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Fused(Linear),
    Interleaved(Linear),
}

/// The input of the linear layers after a norm: the normalized rows, or the
/// raw residual with the norm for their matvecs, or for the skinny products
/// of batched decode, to fold in.
#[derive(Clone, Copy)]
struct NormedInput<'a> {
    x: View<'a>,
    norm: Option<NormInput<'a>>,
    coop: Option<CoopNorm<'a>>,
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

/// Several linear layers over the same input loaded as one weight (see
/// `TensorLoader::matrix_stack`), so one dispatch computes them all; their
/// biases, where any has one, stacked the same way (zeros for the others).
/// `None` when their weights are stored in different types.
fn stacked_linear(
    ld: &mut TensorLoader<'_>,
    name: &str,
    parts: &[(&str, usize)],
    cols: usize,
    bias: bool,
    interleave: bool,
) -> Result<Option<Linear>> {
    let names: Vec<String> = parts.iter().map(|(p, _)| format!("{p}.weight")).collect();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let rows: Vec<usize> = parts.iter().map(|&(_, r)| r).collect();
    let Some(weight) = ld.matrix_stack(name, &name_refs, &rows, cols, interleave)? else {
        return Ok(None);
    };
    let mut biases = Vec::with_capacity(parts.len());
    for &(p, r) in parts {
        let bname = format!("{p}.bias");
        biases.push(if bias || ld.has(&bname) {
            Some(ld.vector_host(&bname, r)?)
        } else {
            None
        });
    }
    let bias = if biases.iter().any(Option::is_some) {
        let parts: Vec<Vec<f32>> = biases
            .into_iter()
            .zip(&rows)
            .map(|(b, &r)| b.unwrap_or_else(|| vec![0.0; r]))
            .collect();
        let v: Vec<f32> = if interleave {
            (0..rows[0])
                .flat_map(|i| parts.iter().map(move |p| p[i]))
                .collect()
        } else {
            parts.concat()
        };
        Some(upload_new(ld.context(), bytemuck::cast_slice(&v), name)?)
    } else {
        None
    };
    Ok(Some(Linear { weight, bias }))
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
                // One weight for the three when they share a storage type: one
                // dispatch instead of three, and one rope dispatch for q and k.
                let (pq, pk, pv) = (
                    format!("{p}.attn_q"),
                    format!("{p}.attn_k"),
                    format!("{p}.attn_v"),
                );
                match stacked_linear(
                    &mut ld,
                    &format!("{p}.attn_qkv (stacked)"),
                    &[(&pq, q), (&pk, kv), (&pv, kv)],
                    e,
                    spec.qkv_bias,
                    false,
                )? {
                    Some(w) => Qkv::Fused(w),
                    None => Qkv::Separate {
                        q: linear(&mut ld, &pq, q, e, spec.qkv_bias)?,
                        k: linear(&mut ld, &pk, kv, e, spec.qkv_bias)?,
                        v: linear(&mut ld, &pv, kv, e, spec.qkv_bias)?,
                    },
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
                // Gate and up rows interleaved: one dispatch, and in decode the
                // activation applied by the same kernel.
                let (pg, pu) = (format!("{p}.ffn_gate"), format!("{p}.ffn_up"));
                match stacked_linear(
                    &mut ld,
                    &format!("{p}.ffn_gate_up (interleaved)"),
                    &[(&pg, ff), (&pu, ff)],
                    e,
                    false,
                    true,
                )? {
                    Some(w) => GateUp::Interleaved(w),
                    None => GateUp::Separate {
                        gate: linear(&mut ld, &pg, ff, e, false)?,
                        up: linear(&mut ld, &pu, ff, e, false)?,
                    },
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
        let hd = sp.head_dim;

        // The attention norm runs inside the projections' matvecs in decode,
        // and past the first block inside the products of batched decode.
        let fold = self.norms_in_products(rec, cache, n);
        let xa = self.norm_input(rec, s, &b.attn_norm, n, il > 0 && fold)?;
        let mut roped = false;
        let (q, k, v) = match &b.qkv {
            Qkv::Separate { q, k, v } => {
                let (qv, kv_, vv) = (
                    View::new(&s.q, s.ld_q),
                    View::new(&s.k, sp.n_kv()),
                    View::new(&s.v, sp.n_kv()),
                );
                self.project(rec, s, q, xa, n, qv, None)?;
                self.project(rec, s, k, xa, n, kv_, None)?;
                self.project(rec, s, v, xa, n, vv, None)?;
                (qv, kv_, vv)
            }
            Qkv::Fused(w) => {
                let qkv = View::new(&s.q, s.ld_q);
                // Adjacent-pair rope of q and k inside the matvec, where no
                // per-head norm must come between.
                let rope = (sp.rope_style == RopeStyle::Normal
                    && b.q_norm.is_none()
                    && self.folds_after(rec, n, xa.x))
                .then(|| MatvecRope {
                    rows: sp.n_q() + sp.n_kv(),
                    head_dim: hd,
                    n_rot: sp.n_rot,
                    positions: &s.positions,
                    inv_freq: b.rope.for_context(cache.n_ctx()),
                    attn_factor: sp.rope_attn_factor,
                });
                self.project_with(rec, s, w, xa, n, qkv, None, rope)?;
                roped = rope.is_some();
                (qkv, qkv.shift(sp.n_q()), qkv.shift(sp.n_q() + sp.n_kv()))
            }
        };
        if let (Some(qn), Some(kn)) = (&b.q_norm, &b.k_norm) {
            // Per-head norms: each head is a row of head_dim floats.
            for (view, norm, heads) in [(q, qn, sp.n_head), (k, kn, sp.n_head_kv)] {
                record_rms_norm_heads(
                    rec,
                    view,
                    Some(norm),
                    sp.norm_flavor,
                    n,
                    heads,
                    hd,
                    sp.norm_eps,
                )?;
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
        if roped {
            // done by the projection
        } else if Arc::ptr_eq(q.buf, k.buf) && k.offset == q.offset + sp.n_head * hd && k.ld == q.ld
        {
            // k's heads follow q's in each token's row: one dispatch rotates both.
            rope(rec, q, sp.n_head + sp.n_head_kv)?;
        } else {
            rope(rec, q, sp.n_head)?;
            rope(rec, k, sp.n_head_kv)?;
        }

        // f16 where the decode kernel writes the output projection's input.
        let attn = if self.f16_inputs(rec, n) && cache.one_per_sequence(n) {
            View::new_f16(&s.attn, sp.n_q())
        } else {
            View::new(&s.attn, sp.n_q())
        };
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
        self.residual(rec, &b.wo, attn, b.post_attn_norm.as_ref(), s, n, fold)?;

        let xf = self.norm_input(rec, s, &b.ffn_norm, n, fold)?;
        let mut hidden = View::new(&s.hidden, sp.n_ff);
        match &b.gate_up {
            GateUp::Separate { gate, up } => {
                let (g, u) = (View::new(&s.gate, sp.n_ff), View::new(&s.up, s.ld_up));
                self.project(rec, s, gate, xf, n, g, None)?;
                self.project(rec, s, up, xf, n, u, None)?;
                record_glu(rec, sp.activation, g, u, hidden, n, sp.n_ff)?;
            }
            GateUp::Fused(w) => {
                let gu = View::new(&s.up, s.ld_up);
                self.project(rec, s, w, xf, n, gu, None)?;
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
            GateUp::Interleaved(w) if self.f16_inputs(rec, n) => {
                // The folded gate writes the down projection's f16 input.
                hidden = View::new_f16(&s.hidden, sp.n_ff);
                if !self.project(rec, s, w, xf, n, hidden, Some(sp.activation))? {
                    return Err(ModelError::Internal(
                        "gated f16 output not folded into its product".into(),
                    ));
                }
            }
            GateUp::Interleaved(w) => {
                let gu = View::new(&s.up, s.ld_up);
                if !self.project(rec, s, w, xf, n, hidden, Some(sp.activation))? {
                    self.project(rec, s, w, xf, n, gu, None)?;
                    record_glu_interleaved(rec, sp.activation, gu, hidden, n, sp.n_ff)?;
                }
            }
        }
        self.residual(rec, &b.down, hidden, b.post_ffn_norm.as_ref(), s, n, fold)
    }

    /// Whether the linear layers reading `x` for `n` tokens run as matvecs
    /// that can fold steps into themselves: an RMS norm of their input (not
    /// under llama.cpp numerics, which round the normalized input) or a gated
    /// activation of their output.
    fn folds(&self, rec: &Recording, n: usize, x: View<'_>, norm: bool) -> bool {
        // The matvec folds them for each token (batched decode of a few
        // sequences); the tiled kernels of longer batches do not.
        self.linear_variant(rec, n, x) == LinearVariant::Matvec
            && (!norm || self.numerics == Numerics::Exact)
    }

    /// Whether the linear layers reading `x` for `n` tokens can fold a rope
    /// or a gated activation into their stores: the matvec, and the
    /// cooperative-matrix kernel of longer batches.
    fn folds_after(&self, rec: &Recording, n: usize, x: View<'_>) -> bool {
        self.folds(rec, n, x, false) || self.linear_variant(rec, n, x) == LinearVariant::Coop
    }

    /// Whether the products of `n` tokens take f16 activations
    /// ([`f16_activations`]; exact numerics only, llama.cpp's round their
    /// inputs their own way).
    fn f16_inputs(&self, rec: &Recording, n: usize) -> bool {
        self.numerics == Numerics::Exact && f16_activations(rec.context(), n)
    }

    /// Whether the products of `n` tokens that add into the residual stream
    /// write its sums of squares, and the next ones fold the RMS norm of it
    /// into their input ([`SquareSums`], [`CoopNorm`]): in batched decode
    /// steps (one token per sequence: a prompt's tokens may differ in scale
    /// by orders of magnitude, and the kernel stages a workgroup's tokens
    /// with one scale), where the products take f16 activations (the
    /// skinny kernel), with no post-norms between, on weights whose chunks
    /// start at multiples of 16 rows.
    fn norms_in_products(&self, rec: &Recording, cache: &dyn KvAttention, n: usize) -> bool {
        let rows16 = |w: &Linear| {
            w.weight
                .chunks()
                .iter()
                .all(|c| c.row_start.is_multiple_of(16))
        };
        self.f16_inputs(rec, n)
            && cache.one_per_sequence(n)
            && self.spec.n_q().is_multiple_of(4)
            && self.spec.n_ff.is_multiple_of(4)
            && self.blocks.iter().all(|b| {
                b.post_attn_norm.is_none()
                    && b.post_ffn_norm.is_none()
                    && rows16(&b.wo)
                    && rows16(&b.down)
            })
    }

    /// The residual's sums of squares in `s`.
    fn x_squares<'a>(&self, s: &'a Scratch) -> SquareSums<'a> {
        SquareSums {
            buf: &s.x_squares,
            offset: 0,
            groups: self.spec.n_embd.div_ceil(16),
        }
    }

    /// Where a recorded norm of `n` tokens goes: `s.xn`, as f16 where the
    /// products take it so.
    fn norm_output<'a>(&self, rec: &Recording, s: &'a Scratch, n: usize) -> View<'a> {
        if self.f16_inputs(rec, n) {
            View::new_f16(&s.xn, self.spec.n_embd)
        } else {
            View::new(&s.xn, self.spec.n_embd)
        }
    }

    /// The input of the linear layers after an RMS norm with `weight` of the
    /// residual stream: the stream itself with the norm to fold into their
    /// matvecs, or into their skinny products where a product wrote the
    /// stream (`after_product`) with its sums of squares, or the norm
    /// recorded into `s.xn`.
    fn norm_input<'a>(
        &'a self,
        rec: &mut Recording,
        s: &'a Scratch,
        weight: &'a Arc<Buffer>,
        n: usize,
        after_product: bool,
    ) -> Result<NormedInput<'a>> {
        let sp = &self.spec;
        let x = View::new(&s.x, sp.n_embd);
        let norm = NormInput {
            weight,
            flavor: sp.norm_flavor,
            eps: sp.norm_eps,
        };
        if self.folds(rec, n, x, true) {
            return Ok(NormedInput {
                x,
                norm: Some(norm),
                coop: None,
            });
        }
        if after_product {
            return Ok(NormedInput {
                x,
                norm: None,
                coop: Some(CoopNorm {
                    norm,
                    squares: self.x_squares(s),
                }),
            });
        }
        let xn = self.norm_output(rec, s, n);
        record_rms_norm(
            rec,
            x,
            Some(weight),
            sp.norm_flavor,
            xn,
            n,
            sp.n_embd,
            sp.norm_eps,
            false,
        )?;
        Ok(NormedInput {
            x: xn,
            norm: None,
            coop: None,
        })
    }

    /// Records `out = W·input` for a normed input. With `glu`, `w`'s rows
    /// alternate gate and up and `out` receives the gated activation — only
    /// where the matvec can fold it in; returns whether it did (without
    /// `glu`, always true).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        w: &Linear,
        input: NormedInput<'_>,
        n: usize,
        out: View<'_>,
        glu: Option<Activation>,
    ) -> Result<bool> {
        self.project_with(rec, s, w, input, n, out, glu, None)
    }

    /// [`Self::project`] with a rope folded into the matvec (the caller
    /// checked [`Self::folds`]).
    #[allow(clippy::too_many_arguments)]
    fn project_with(
        &self,
        rec: &mut Recording,
        s: &Scratch,
        w: &Linear,
        input: NormedInput<'_>,
        n: usize,
        out: View<'_>,
        glu: Option<Activation>,
        rope: Option<MatvecRope<'_>>,
    ) -> Result<bool> {
        let coop = self.linear_variant(rec, n, input.x) == LinearVariant::Coop;
        if input.coop.is_some()
            || (input.norm.is_none() && coop && (rope.is_some() || glu.is_some()))
        {
            record_linear_coop_folded(
                rec,
                None,
                &w.weight,
                w.bias.as_ref(),
                input.x,
                n,
                out,
                false,
                CoopEpilogue {
                    glu,
                    rope,
                    norm: input.coop,
                    squares: None,
                },
            )?;
            return Ok(true);
        }
        if input.norm.is_some()
            || rope.is_some()
            || (glu.is_some() && self.folds(rec, n, input.x, false))
        {
            let x = self.linear_input(rec, s, w.weight.qtype(), input.x, n, w.n_in())?;
            record_matvec_tokens(
                rec,
                &w.weight,
                w.bias.as_ref(),
                x,
                n,
                out,
                false,
                MatvecOptions {
                    norm: input.norm,
                    glu,
                    rope,
                    ..Default::default()
                },
            )?;
            return Ok(true);
        }
        if glu.is_some() {
            return Ok(false);
        }
        self.linear(rec, s, w, input.x, n, out, false)?;
        Ok(true)
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

    /// `x += W·input`, or `x += norm(W·input)` where a post-norm follows
    /// the projection; with `squares` (where [`Self::norms_in_products`]
    /// holds), the product also writes the sums of squares of `x`.
    #[allow(clippy::too_many_arguments)]
    fn residual(
        &self,
        rec: &mut Recording,
        w: &Linear,
        input: View<'_>,
        post_norm: Option<&Arc<Buffer>>,
        s: &Scratch,
        n: usize,
        squares: bool,
    ) -> Result<()> {
        let sp = &self.spec;
        let x = View::new(&s.x, sp.n_embd);
        match post_norm {
            None if squares => record_linear_coop_folded(
                rec,
                None,
                &w.weight,
                w.bias.as_ref(),
                input,
                n,
                x,
                true,
                CoopEpilogue {
                    squares: Some(self.x_squares(s)),
                    ..Default::default()
                },
            ),
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
        let head = self.output.as_ref().unwrap_or(&self.token_embd);
        let logits = View::new(&s.logits_dev, self.spec.n_vocab).shift(out_row * self.spec.n_vocab);
        if self.folds(rec, n, x, true) {
            // The output norm inside the head's matvec.
            let norm = NormInput {
                weight: &self.output_norm,
                flavor: self.spec.norm_flavor,
                eps: self.spec.norm_eps,
            };
            record_matvec_tokens(
                rec,
                head,
                None,
                x,
                n,
                logits,
                false,
                MatvecOptions {
                    norm: Some(norm),
                    ..Default::default()
                },
            )?;
        } else {
            let xn = self.norm_output(rec, s, n);
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
            let xn = self.linear_input(rec, s, head.qtype(), xn, n, e)?;
            record_linear_with(
                rec,
                self.linear_variant(rec, n, xn),
                head,
                None,
                xn,
                n,
                logits,
                false,
            )?;
        }
        let row = (self.spec.n_vocab * 4) as u64;
        let at = out_row as u64 * row;
        rec.copy(&s.logits_dev, at, &s.logits, at, n as u64 * row)
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
                GateUp::Fused(w) | GateUp::Interleaved(w) => lin(w),
            };
            total += lin(&b.wo) + lin(&b.down);
        }
        total
    }
}
