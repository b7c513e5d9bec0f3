//! `LlamaModel`: the decoder-only transformer of the Llama family,
//! parameterized by `ArchSpec` so Llama, SmolLM2, Mistral, Qwen2/3, Gemma 3
//! and Phi-3 share one forward pass (llama.cpp `llm_build_llama` and its
//! relatives). Tensor names are GGUF's (`blk.{i}.attn_q.weight`, ...). This
//! file holds the weights and states what each block computes
//! ([`DecoderBlock`]); the planner (`ops::plan`) picks the kernels.

use std::ops::Range;
use std::sync::Arc;

use super::Architecture;
use super::loader::TensorLoader;
use super::registry::LoadOptions;
use super::spec::{ArchSpec, Family};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::{Buffer, GpuContext, upload_new};
use crate::kv::LayerGeometry;
use crate::ops::linear::Linear;
use crate::ops::plan::{
    AttentionSpec, DecoderBlock, Ffn, Forward, OutputHead, QkNorm, Qkv, RopeSpec, WorkspaceShape,
};
use crate::ops::rms_norm::NormWeight;
use crate::ops::rope::{RopeScaling, inv_freq};
use crate::quant::QuantWeight;

/// The attention projections of one block: separate Q/K/V or one weight.
enum QkvWeights {
    Separate { q: Linear, k: Linear, v: Linear },
    Stacked(Linear),
}

/// The FFN input projections: separate gate/up, one weight of gate rows
/// then up rows (the file's fused tensor), or gate and up rows interleaved
/// (stacked at load time, so a product can fold the gated activation).
enum GateUp {
    Separate { gate: Linear, up: Linear },
    Stacked(Linear),
    Interleaved(Linear),
}

struct Block {
    attn_norm: Arc<Buffer>,
    qkv: QkvWeights,
    /// Per-head norms of queries and keys.
    qk_norm: Option<(Arc<Buffer>, Arc<Buffer>)>,
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

    fn upload(ctx: &Arc<GpuContext>, spec: &ArchSpec, base: f32, s: &RopeScaling) -> Result<Self> {
        let upload = |s: &RopeScaling| {
            let f = inv_freq(spec.n_rot, base, s);
            upload_new(ctx, bytemuck::cast_slice(&f), "rope inv_freq")
        };
        let long = match s {
            RopeScaling::LongRope { n_ctx_orig, .. } => Some((
                *n_ctx_orig,
                upload(&s.for_context(n_ctx_orig.saturating_add(1)))?,
            )),
            _ => None,
        };
        Ok(RopeFreqs {
            table: upload(&s.for_context(0))?,
            long,
        })
    }
}

/// A Llama-family model on the GPU: its weights and what each block
/// computes. [`ModelRegistry`](crate::ModelRegistry) loads one for every
/// family it runs; loaded by hand, [`Loaded`](crate::models::Loaded) makes it
/// a [`GenerativeModel`](crate::GenerativeModel).
///
/// ```
/// # use combs::formats::gguf::GgufFile;
/// # use combs::models::synth::{SynthConfig, synth_gguf};
/// # use combs::quant::QuantType;
/// use combs::gpu::GpuContext;
/// use combs::models::Loaded;
/// use combs::{GenerativeModel, LlamaModel, LoadOptions, ModelRegistry};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     # let tiny = SynthConfig::preset("tiny", QuantType::Q4_0)?;
///     # let gguf = GgufFile::from_bytes(synth_gguf(&tiny)?.to_bytes())?;
///     let spec = ModelRegistry::new().resolve(&gguf)?;
///     let opts = LoadOptions::default();
///     let llama = LlamaModel::load(&ctx, &gguf, spec, &opts)?;
///     let model = Loaded::new(llama, opts.planner_for(&ctx)?);
///     assert_eq!(model.embed(&[7])?.len(), model.spec().n_embd);
///     Ok(())
/// }
/// ```
pub struct LlamaModel {
    ctx: Arc<GpuContext>,
    spec: ArchSpec,
    /// The blocks this model holds: all of them, or one device's share of
    /// a model split over several.
    layers: Range<usize>,
    /// On the device of the first block, and on that of the last where the
    /// output head is the embedding table.
    token_embd: Option<Linear>,
    /// On the device of the last block only.
    output_norm: Option<Arc<Buffer>>,
    /// `None` when the output head is the token embedding (or is on
    /// another device).
    output: Option<Linear>,
    blocks: Vec<Block>,
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
        let all = 0..spec.n_layer;
        Self::load_layers(ctx, g, spec, opts, all)
    }

    /// Uploads blocks `layers` only, with the token embedding where they
    /// start at block 0 and the output head where they end at the last
    /// block: one device's share of a model split by layers.
    ///
    /// # Errors
    /// An empty range or one past the model's blocks, and the errors of
    /// [`LlamaModel::load`].
    pub fn load_layers(
        ctx: &Arc<GpuContext>,
        g: &GgufFile,
        spec: ArchSpec,
        opts: &LoadOptions,
        layers: Range<usize>,
    ) -> Result<Self> {
        if layers.is_empty() || layers.end > spec.n_layer {
            return Err(ModelError::invalid(
                "layers",
                format!(
                    "blocks {}..{} of a model of {}",
                    layers.start, layers.end, spec.n_layer
                ),
            ));
        }
        let (first, last) = (layers.start == 0, layers.end == spec.n_layer);
        let mut ld = TensorLoader::new(ctx, g, opts.show_progress)?;
        let (e, v) = (spec.n_embd, spec.n_vocab);
        let token_embd = if first || (last && spec.tied_embeddings) {
            Some(ld.linear("token_embd", v, e, false)?)
        } else {
            None
        };
        let output_norm = if last {
            Some(ld.vector("output_norm.weight", e)?)
        } else {
            None
        };
        let output = if spec.tied_embeddings || !last {
            None
        } else {
            Some(ld.linear("output", v, e, false)?)
        };
        let global = RopeFreqs::upload(ctx, &spec, spec.rope_base, &spec.rope_scaling)?;
        // Gemma 3's sliding layers use their own base and no scaling.
        let local = if spec.rope_base_local != spec.rope_base || spec.family == Family::Gemma3 {
            RopeFreqs::upload(ctx, &spec, spec.rope_base_local, &RopeScaling::None)?
        } else {
            global.clone()
        };
        let mut blocks = Vec::with_capacity(layers.len());
        for il in layers.clone() {
            let rope = if spec.window_of(il) > 0 {
                local.clone()
            } else {
                global.clone()
            };
            blocks.push(Self::load_block(&mut ld, &spec, il, rope)?);
        }
        ld.finish()?;
        Ok(LlamaModel {
            ctx: ctx.clone(),
            spec,
            layers,
            token_embd,
            output_norm,
            output,
            blocks,
        })
    }

    fn load_block(
        ld: &mut TensorLoader<'_>,
        spec: &ArchSpec,
        il: usize,
        rope: RopeFreqs,
    ) -> Result<Block> {
        let (e, q, kv, ff) = (spec.n_embd, spec.n_q(), spec.n_kv(), spec.n_ff);
        let p = format!("blk.{il}");
        let qkv = if spec.fused_qkv {
            QkvWeights::Stacked(ld.linear(&format!("{p}.attn_qkv"), q + 2 * kv, e, false)?)
        } else {
            // One weight for the three where they share a storage type: one
            // product instead of three, and one rope for q and k.
            let (pq, pk, pv) = (
                format!("{p}.attn_q"),
                format!("{p}.attn_k"),
                format!("{p}.attn_v"),
            );
            let parts = [(pq.as_str(), q), (pk.as_str(), kv), (pv.as_str(), kv)];
            let name = format!("{p}.attn_qkv (stacked)");
            match ld.stacked_linear(&name, &parts, e, spec.qkv_bias, false)? {
                Some(w) => QkvWeights::Stacked(w),
                None => QkvWeights::Separate {
                    q: ld.linear(&pq, q, e, spec.qkv_bias)?,
                    k: ld.linear(&pk, kv, e, spec.qkv_bias)?,
                    v: ld.linear(&pv, kv, e, spec.qkv_bias)?,
                },
            }
        };
        let qk_norm = if spec.qk_norm {
            let hd = spec.head_dim;
            Some((
                ld.vector(&format!("{p}.attn_q_norm.weight"), hd)?,
                ld.vector(&format!("{p}.attn_k_norm.weight"), hd)?,
            ))
        } else {
            None
        };
        let gate_up = if spec.fused_gate_up {
            GateUp::Stacked(ld.linear(&format!("{p}.ffn_up"), 2 * ff, e, false)?)
        } else {
            let (pg, pu) = (format!("{p}.ffn_gate"), format!("{p}.ffn_up"));
            let parts = [(pg.as_str(), ff), (pu.as_str(), ff)];
            let name = format!("{p}.ffn_gate_up (interleaved)");
            match ld.stacked_linear(&name, &parts, e, false, true)? {
                Some(w) => GateUp::Interleaved(w),
                None => GateUp::Separate {
                    gate: ld.linear(&pg, ff, e, false)?,
                    up: ld.linear(&pu, ff, e, false)?,
                },
            }
        };
        let mut post = |name: &str| -> Result<Option<Arc<Buffer>>> {
            if spec.post_norms {
                ld.vector(&format!("{p}.{name}.weight"), e).map(Some)
            } else {
                Ok(None)
            }
        };
        let (post_attn_norm, post_ffn_norm) =
            (post("post_attention_norm")?, post("post_ffw_norm")?);
        Ok(Block {
            attn_norm: ld.vector(&format!("{p}.attn_norm.weight"), e)?,
            qkv,
            qk_norm,
            wo: ld.linear(&format!("{p}.attn_output"), e, q, false)?,
            post_attn_norm,
            ffn_norm: ld.vector(&format!("{p}.ffn_norm.weight"), e)?,
            gate_up,
            down: ld.linear(&format!("{p}.ffn_down"), e, ff, false)?,
            post_ffn_norm,
            rope,
        })
    }

    /// The per-layer cache geometry of the blocks this model holds.
    pub fn layer_geometry(&self) -> Vec<LayerGeometry> {
        self.layers
            .clone()
            .map(|il| LayerGeometry {
                n_head_kv: self.spec.n_head_kv,
                head_dim: self.spec.head_dim,
                window: self.spec.window_of(il),
            })
            .collect()
    }

    fn norm<'a>(&self, weight: &'a Arc<Buffer>) -> NormWeight<'a> {
        NormWeight {
            weight,
            flavor: self.spec.norm_flavor,
            eps: self.spec.norm_eps,
        }
    }

    /// What block `il` computes, for sequences of `n_ctx` positions.
    fn block(&self, il: usize, n_ctx: usize) -> DecoderBlock<'_> {
        let (sp, b) = (&self.spec, &self.blocks[il - self.layers.start]);
        DecoderBlock {
            attn_norm: self.norm(&b.attn_norm),
            qkv: match &b.qkv {
                QkvWeights::Separate { q, k, v } => Qkv::Separate { q, k, v },
                QkvWeights::Stacked(w) => Qkv::Stacked(w),
            },
            qk_norm: b.qk_norm.as_ref().map(|(q, k)| QkNorm {
                q: self.norm(q),
                k: self.norm(k),
            }),
            rope: RopeSpec {
                style: sp.rope_style,
                n_rot: sp.n_rot,
                inv_freq: b.rope.for_context(n_ctx),
                attn_factor: sp.rope_attn_factor,
            },
            attention: AttentionSpec {
                n_head: sp.n_head,
                n_head_kv: sp.n_head_kv,
                head_dim: sp.head_dim,
                scale: sp.attn_scale,
                softcap: sp.attn_softcap,
                window: sp.window_of(il),
            },
            attn_out: &b.wo,
            post_attn_norm: b.post_attn_norm.as_ref().map(|w| self.norm(w)),
            ffn_norm: self.norm(&b.ffn_norm),
            ffn: match &b.gate_up {
                GateUp::Separate { gate, up } => Ffn::Separate {
                    gate,
                    up,
                    act: sp.activation,
                },
                GateUp::Stacked(gate_up) => Ffn::Stacked {
                    gate_up,
                    act: sp.activation,
                },
                GateUp::Interleaved(gate_up) => Ffn::Interleaved {
                    gate_up,
                    act: sp.activation,
                },
            },
            ffn_out: &b.down,
            post_ffn_norm: b.post_ffn_norm.as_ref().map(|w| self.norm(w)),
        }
    }
}

impl Architecture for LlamaModel {
    fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn kv_layers(&self) -> Vec<LayerGeometry> {
        self.layer_geometry()
    }

    fn workspace_shape(&self) -> WorkspaceShape {
        WorkspaceShape {
            n_embd: self.spec.n_embd,
            n_q: self.spec.n_q(),
            n_kv: self.spec.n_kv(),
            n_ff: self.spec.n_ff,
            n_vocab: self.spec.n_vocab,
        }
    }

    fn embedding(&self) -> Option<(&QuantWeight, f32)> {
        if self.layers.start != 0 {
            return None;
        }
        let table = self.token_embd.as_ref()?;
        Some((&table.weight, self.spec.embed_scale))
    }

    fn blocks(&self, f: &mut Forward<'_, '_>) -> Result<()> {
        let n_ctx = f.n_ctx();
        // The cache holds this model's blocks only: its layer 0 is the first of them.
        for il in self.layers.clone() {
            f.decoder_block(il - self.layers.start, &self.block(il, n_ctx))?;
        }
        Ok(())
    }

    fn head(&self) -> Option<OutputHead<'_>> {
        Some(OutputHead {
            norm: self.norm(self.output_norm.as_ref()?),
            weight: self.output.as_ref().or(self.token_embd.as_ref())?,
            softcap: self.spec.final_softcap,
        })
    }

    fn device_bytes(&self) -> u64 {
        let mut total = self.token_embd.as_ref().map_or(0, Linear::device_bytes)
            + self.output.as_ref().map_or(0, Linear::device_bytes);
        for b in &self.blocks {
            total += match &b.qkv {
                QkvWeights::Separate { q, k, v } => {
                    q.device_bytes() + k.device_bytes() + v.device_bytes()
                }
                QkvWeights::Stacked(w) => w.device_bytes(),
            };
            total += match &b.gate_up {
                GateUp::Separate { gate, up } => gate.device_bytes() + up.device_bytes(),
                GateUp::Stacked(w) | GateUp::Interleaved(w) => w.device_bytes(),
            };
            total += b.wo.device_bytes() + b.down.device_bytes();
        }
        total
    }

    fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    fn same_rope(&self, a: usize, b: usize) -> bool {
        self.blocks
            .iter()
            .all(|bl| Arc::ptr_eq(bl.rope.for_context(a), bl.rope.for_context(b)))
    }
}
