//! `ReferenceModel`: a plain CPU forward pass of the Llama family in f64
//! accumulation over dequantized weights, driven by the same `ArchSpec`. It
//! defines "correct" for the GPU model in tests on small files; it is slow
//! and keeps every weight as f32 in RAM.

use super::rotary::RotaryEmbedding;
use super::spec::ArchSpec;
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::ops::act_round::{ActRounding, Numerics, act_round_ref};
use crate::ops::glu::act_ref;
use crate::ops::rms_norm::rms_norm_ref;
use crate::quant::dequantize_vec;
use rayon::prelude::*;

struct Mat {
    rows: usize,
    cols: usize,
    w: Vec<f32>,
    /// How inputs are rounded before the product (see `ops::act_round`).
    round: ActRounding,
}

impl Mat {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let x = act_round_ref(self.round, x);
        // Rows in parallel: each row's sum is still taken in order, so the
        // result does not depend on the thread count.
        (0..self.rows)
            .into_par_iter()
            .map(|r| {
                self.w[r * self.cols..(r + 1) * self.cols]
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32
            })
            .collect()
    }
}

struct RefBlock {
    attn_norm: Vec<f32>,
    wq: Mat,
    wk: Mat,
    wv: Mat,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    wo: Mat,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Mat,
    up: Mat,
    down: Mat,
    post_ffn_norm: Option<Vec<f32>>,
}

/// A CPU reference forward pass with its own KV history.
pub struct ReferenceModel {
    spec: ArchSpec,
    token_embd: Mat,
    output_norm: Vec<f32>,
    output: Option<Mat>,
    blocks: Vec<RefBlock>,
    /// Per layer, per position: (k, v) after rope.
    cache: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    /// The context length rope scaling assumes (LongRoPE picks its factors by it).
    n_ctx: usize,
    /// K/V rounded to f16 as the GPU cache stores them (the default), or kept in f32.
    f16_kv: bool,
}

fn tensor_type(g: &GgufFile, name: &str) -> Option<crate::quant::QuantType> {
    g.tensor(name).and_then(|t| t.qtype)
}

fn tensor(g: &GgufFile, name: &str) -> Result<(Vec<f32>, Vec<u64>)> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
    let qt = t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
        tensor: name.into(),
        ggml_type: t.ggml_type.to_string(),
    })?;
    let v = dequantize_vec(qt, g.tensor_data(t), t.n_elements as usize)?;
    Ok((v, t.dims.clone()))
}

fn mat(g: &GgufFile, name: &str, numerics: Numerics) -> Result<Mat> {
    let (w, dims) = tensor(g, name)?;
    let cols = dims.first().copied().unwrap_or(1) as usize;
    let rows = dims.get(1).copied().unwrap_or(1) as usize;
    let round = tensor_type(g, name).map_or(ActRounding::None, |t| numerics.rounding_for(t));
    Ok(Mat {
        rows,
        cols,
        w,
        round,
    })
}

fn vector(g: &GgufFile, name: &str) -> Result<Vec<f32>> {
    tensor(g, name).map(|(v, _)| v)
}

fn opt_vector(g: &GgufFile, name: &str) -> Result<Option<Vec<f32>>> {
    if g.tensor(name).is_some() {
        vector(g, name).map(Some)
    } else {
        Ok(None)
    }
}

/// Splits rows `[a, b)` of a matrix off as its own matrix.
fn rows_of(m: &Mat, a: usize, b: usize) -> Mat {
    Mat {
        rows: b - a,
        cols: m.cols,
        w: m.w[a * m.cols..b * m.cols].to_vec(),
        round: m.round,
    }
}

impl ReferenceModel {
    /// Loads every weight of the file as f32.
    ///
    /// # Errors
    /// Missing tensors or unsupported types.
    pub fn load(g: &GgufFile, spec: ArchSpec) -> Result<Self> {
        Self::load_with(g, spec, Numerics::Exact)
    }

    /// Loads every weight of the file as f32, rounding linear-layer inputs
    /// as `numerics` says.
    ///
    /// # Errors
    /// Missing tensors or unsupported types.
    pub fn load_with(g: &GgufFile, spec: ArchSpec, numerics: Numerics) -> Result<Self> {
        let mut blocks = Vec::new();
        let (q, kv, ff) = (spec.n_q(), spec.n_kv(), spec.n_ff);
        for il in 0..spec.n_layer {
            let p = format!("blk.{il}");
            let (wq, wk, wv) = if spec.fused_qkv {
                let m = mat(g, &format!("{p}.attn_qkv.weight"), numerics)?;
                (
                    rows_of(&m, 0, q),
                    rows_of(&m, q, q + kv),
                    rows_of(&m, q + kv, q + 2 * kv),
                )
            } else {
                (
                    mat(g, &format!("{p}.attn_q.weight"), numerics)?,
                    mat(g, &format!("{p}.attn_k.weight"), numerics)?,
                    mat(g, &format!("{p}.attn_v.weight"), numerics)?,
                )
            };
            let (gate, up) = if spec.fused_gate_up {
                let m = mat(g, &format!("{p}.ffn_up.weight"), numerics)?;
                (rows_of(&m, 0, ff), rows_of(&m, ff, 2 * ff))
            } else {
                (
                    mat(g, &format!("{p}.ffn_gate.weight"), numerics)?,
                    mat(g, &format!("{p}.ffn_up.weight"), numerics)?,
                )
            };
            blocks.push(RefBlock {
                attn_norm: vector(g, &format!("{p}.attn_norm.weight"))?,
                wq,
                wk,
                wv,
                bq: opt_vector(g, &format!("{p}.attn_q.bias"))?,
                bk: opt_vector(g, &format!("{p}.attn_k.bias"))?,
                bv: opt_vector(g, &format!("{p}.attn_v.bias"))?,
                q_norm: opt_vector(g, &format!("{p}.attn_q_norm.weight"))?,
                k_norm: opt_vector(g, &format!("{p}.attn_k_norm.weight"))?,
                wo: mat(g, &format!("{p}.attn_output.weight"), numerics)?,
                post_attn_norm: opt_vector(g, &format!("{p}.post_attention_norm.weight"))?,
                ffn_norm: vector(g, &format!("{p}.ffn_norm.weight"))?,
                gate,
                up,
                down: mat(g, &format!("{p}.ffn_down.weight"), numerics)?,
                post_ffn_norm: opt_vector(g, &format!("{p}.post_ffw_norm.weight"))?,
            });
        }
        Ok(ReferenceModel {
            token_embd: mat(g, "token_embd.weight", numerics)?,
            output_norm: vector(g, "output_norm.weight")?,
            output: if g.tensor("output.weight").is_some() {
                Some(mat(g, "output.weight", numerics)?)
            } else {
                None
            },
            cache: vec![Vec::new(); spec.n_layer],
            n_ctx: spec.n_ctx_train,
            f16_kv: true,
            blocks,
            spec,
        })
    }

    /// Sets the context length rope scaling assumes, as a session's `n_ctx`
    /// does on the GPU (the default is the training context).
    pub fn with_n_ctx(mut self, n_ctx: usize) -> Self {
        self.n_ctx = n_ctx;
        self
    }

    /// Keeps K/V in f32 instead of rounding them to f16 as the GPU cache
    /// does: the forward pass with no rounding beyond f32 weights and
    /// activations, to compare with other implementations' f32 caches.
    pub fn with_f32_kv(mut self) -> Self {
        self.f16_kv = false;
        self
    }

    /// The architecture this forward pass follows.
    pub fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    /// Forgets every position: the next token is evaluated at position 0.
    pub fn clear(&mut self) {
        self.cache.iter_mut().for_each(Vec::clear);
    }

    /// Runs one token at the next position and returns its logits.
    ///
    /// # Errors
    /// Token id out of range.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        let x = self.hidden(token)?;
        Ok(self.logits_of(&x))
    }

    /// Runs one position whose input vector is `x` (instead of a token's
    /// embedding, unscaled) and returns its logits.
    ///
    /// # Errors
    /// `x` not `n_embd` wide.
    pub fn step_embedding(&mut self, x: &[f32]) -> Result<Vec<f32>> {
        if x.len() != self.spec.n_embd {
            return Err(ModelError::invalid(
                "embedding",
                format!("{} floats, n_embd is {}", x.len(), self.spec.n_embd),
            ));
        }
        let x = self.hidden_from(x.to_vec())?;
        Ok(self.logits_of(&x))
    }

    fn logits_of(&self, x: &[f32]) -> Vec<f32> {
        let sp = &self.spec;
        let xn = rms_norm_ref(x, Some(&self.output_norm), sp.norm_flavor, sp.norm_eps);
        let head = self.output.as_ref().unwrap_or(&self.token_embd);
        let mut logits = head.apply(&xn);
        if sp.final_softcap > 0.0 {
            let c = sp.final_softcap;
            logits.iter_mut().for_each(|l| *l = c * (*l / c).tanh());
        }
        logits
    }

    /// Runs one token at the next position without the output head (its
    /// K/V join the history; no logits are computed).
    ///
    /// # Errors
    /// Token id out of range.
    pub fn advance(&mut self, token: u32) -> Result<()> {
        self.hidden(token).map(|_| ())
    }

    /// The residual stream after the last block for `token` at the next position.
    fn hidden(&mut self, token: u32) -> Result<Vec<f32>> {
        let sp = self.spec.clone();
        let e = sp.n_embd;
        let t = token as usize;
        if t >= sp.n_vocab {
            return Err(ModelError::TokenOutOfRange {
                token: i64::from(token),
                n_vocab: sp.n_vocab,
            });
        }
        let x: Vec<f32> = self.token_embd.w[t * e..(t + 1) * e]
            .iter()
            .map(|v| v * sp.embed_scale)
            .collect();
        self.hidden_from(x)
    }

    /// The residual stream after the last block for input vector `x` at
    /// the next position.
    fn hidden_from(&mut self, mut x: Vec<f32>) -> Result<Vec<f32>> {
        let sp = self.spec.clone();
        let hd = sp.head_dim;
        let pos = self.cache[0].len();
        let norm = |v: &[f32], w: &[f32]| rms_norm_ref(v, Some(w), sp.norm_flavor, sp.norm_eps);
        let add_bias = |mut v: Vec<f32>, b: &Option<Vec<f32>>| {
            if let Some(b) = b {
                v.iter_mut().zip(b).for_each(|(a, b)| *a += b);
            }
            v
        };
        // A sub-layer's output joins the residual stream, post-normed first
        // where the architecture has such a norm.
        let add_residual = |x: &mut [f32], o: Vec<f32>, post_norm: &Option<Vec<f32>>| {
            let o = match post_norm {
                Some(pn) => norm(&o, pn),
                None => o,
            };
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        };
        for (il, b) in self.blocks.iter().enumerate() {
            let xn = norm(&x, &b.attn_norm);
            let mut q = add_bias(b.wq.apply(&xn), &b.bq);
            let mut k = add_bias(b.wk.apply(&xn), &b.bk);
            let v = add_bias(b.wv.apply(&xn), &b.bv);
            if let (Some(qn), Some(kn)) = (&b.q_norm, &b.k_norm) {
                for (v, w) in [(&mut q, qn), (&mut k, kn)] {
                    for h in v.chunks_mut(hd) {
                        let n = norm(h, w);
                        h.copy_from_slice(&n);
                    }
                }
            }
            let rope = RotaryEmbedding::for_layer(&sp, il, self.n_ctx);
            rope.apply_heads(&mut q, hd, pos as i32)?;
            rope.apply_heads(&mut k, hd, pos as i32)?;
            // the KV cache holds f16, on the GPU as in llama.cpp
            let f16_kv = self.f16_kv;
            let half = |v: Vec<f32>| -> Vec<f32> {
                if !f16_kv {
                    return v;
                }
                v.into_iter()
                    .map(|x| half::f16::from_f32(x).to_f32())
                    .collect()
            };
            self.cache[il].push((half(k), half(v)));
            let hist = &self.cache[il];
            let window = sp.window_of(il);
            let lo = if window > 0 {
                (pos + 1).saturating_sub(window)
            } else {
                0
            };
            let group = sp.n_head / sp.n_head_kv;
            let mut attn = vec![0.0f32; sp.n_q()];
            for h in 0..sp.n_head {
                let kvh = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let kj = &hist[j].0[kvh * hd..(kvh + 1) * hd];
                        let mut s = qh
                            .iter()
                            .zip(kj)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum::<f64>()
                            * f64::from(sp.attn_scale);
                        if sp.attn_softcap > 0.0 {
                            let c = f64::from(sp.attn_softcap);
                            s = c * (s / c).tanh();
                        }
                        s
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = w.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (lo..=pos)
                        .zip(&w)
                        .map(|(j, wj)| wj * f64::from(hist[j].1[kvh * hd + d]))
                        .sum();
                    attn[h * hd + d] = (acc / sum) as f32;
                }
            }
            add_residual(&mut x, b.wo.apply(&attn), &b.post_attn_norm);
            let xn = norm(&x, &b.ffn_norm);
            let gt = b.gate.apply(&xn);
            let up = b.up.apply(&xn);
            let hidden: Vec<f32> = gt
                .iter()
                .zip(&up)
                .map(|(&g, &u)| act_ref(sp.activation, g) * u)
                .collect();
            add_residual(&mut x, b.down.apply(&hidden), &b.post_ffn_norm);
        }
        Ok(x)
    }
}
