//! The CPU reference of SmolVLM's vision side, in f64 from f32 weights,
//! written from transformers' `modeling_idefics3.py` (SigLIP embeddings,
//! encoder layers, post-layernorm; `Idefics3Connector`'s pixel shuffle as
//! its literal sequence of views and permutes, then the projection), not
//! from the GPU path: patches in the grid's own order, attention per head
//! with an explicit softmax. Also a random projector at any geometry, as a
//! GGUF the device model loads, for the tests.

use std::collections::HashMap;

use super::clip::{ClipVisionHparams, IDEFICS3};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::formats::gguf_writer::GgufWriter;
use crate::ops::glu::{Activation, act_ref};
use crate::quant::{QuantType, dequantize_vec, quantize};

/// A projector's tensors on the host, f32, by GGUF name (dims `ne0` first).
pub struct HostProjector {
    /// The hyperparameters.
    pub hp: ClipVisionHparams,
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
    /// The storage type of the matrices when written.
    matrix_type: QuantType,
}

/// A small deterministic generator (SplitMix64) for random weights.
struct Mix(u64);

impl Mix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A standard normal value (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u = self.next_f64().max(1e-300);
        let v = self.next_f64();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

impl HostProjector {
    /// Random weights at geometry `hp`; matrices rounded through
    /// `matrix_type` (F32 or F16), so the file holds exactly these values.
    ///
    /// # Errors
    /// A matrix type other than F32 and F16.
    pub fn random(hp: ClipVisionHparams, matrix_type: QuantType, seed: u64) -> Result<Self> {
        if !matches!(matrix_type, QuantType::F32 | QuantType::F16) {
            return Err(ModelError::invalid("matrix type", "F32 or F16"));
        }
        let mut rng = Mix(seed);
        let mut p = HostProjector {
            hp,
            tensors: HashMap::new(),
            matrix_type,
        };
        let (d, ff, ps, n) = (hp.n_embd, hp.n_ff, hp.patch_size, hp.n_patches());
        let mut put = |name: String, dims: Vec<usize>, scale: f64, offset: f64, matrix: bool| {
            let len = dims.iter().product();
            let v: Vec<f32> = (0..len)
                .map(|_| (offset + scale * rng.normal()) as f32)
                .collect();
            let v = if matrix {
                let bytes = quantize(matrix_type, &v)?;
                dequantize_vec(matrix_type, &bytes, len)?
            } else {
                v
            };
            p.tensors.insert(name, (dims, v));
            Ok::<(), ModelError>(())
        };
        let lin = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
        put(
            "v.patch_embd.weight".into(),
            vec![ps, ps, 3, d],
            lin(3 * ps * ps),
            0.0,
            true,
        )?;
        put("v.patch_embd.bias".into(), vec![d], 0.1, 0.0, false)?;
        put("v.position_embd.weight".into(), vec![d, n], 0.5, 0.0, false)?;
        for il in 0..hp.n_layer {
            let b = format!("v.blk.{il}");
            for t in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                put(format!("{b}.{t}.weight"), vec![d, d], lin(d), 0.0, true)?;
                put(format!("{b}.{t}.bias"), vec![d], 0.1, 0.0, false)?;
            }
            for t in ["ln1", "ln2"] {
                put(format!("{b}.{t}.weight"), vec![d], 0.1, 1.0, false)?;
                put(format!("{b}.{t}.bias"), vec![d], 0.1, 0.0, false)?;
            }
            put(format!("{b}.ffn_up.weight"), vec![d, ff], lin(d), 0.0, true)?;
            put(format!("{b}.ffn_up.bias"), vec![ff], 0.1, 0.0, false)?;
            put(
                format!("{b}.ffn_down.weight"),
                vec![ff, d],
                lin(ff),
                0.0,
                true,
            )?;
            put(format!("{b}.ffn_down.bias"), vec![d], 0.1, 0.0, false)?;
        }
        put("v.post_ln.weight".into(), vec![d], 0.1, 1.0, false)?;
        put("v.post_ln.bias".into(), vec![d], 0.1, 0.0, false)?;
        let merged = d * hp.scale_factor * hp.scale_factor;
        put(
            "mm.model.fc.weight".into(),
            vec![merged, hp.projection_dim],
            lin(merged),
            0.0,
            true,
        )?;
        Ok(p)
    }

    /// Every tensor of a projector file, dequantized.
    ///
    /// # Errors
    /// Not an Idefics3 projector, a tensor type combs does not read.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let hp = ClipVisionHparams::from_gguf(g)?;
        let mut tensors = HashMap::new();
        for t in g.tensors() {
            let qt = t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
                tensor: t.name.clone(),
                ggml_type: t.type_name(),
            })?;
            let v = dequantize_vec(qt, g.tensor_data(t), t.n_elements as usize)?;
            let dims = t.dims.iter().map(|&d| d as usize).collect();
            tensors.insert(t.name.clone(), (dims, v));
        }
        Ok(HostProjector {
            hp,
            tensors,
            matrix_type: QuantType::F32,
        })
    }

    /// The tensor `name`.
    ///
    /// # Errors
    /// No such tensor.
    pub fn tensor(&self, name: &str) -> Result<&[f32]> {
        self.tensors
            .get(name)
            .map(|(_, v)| v.as_slice())
            .ok_or_else(|| ModelError::MissingTensor { name: name.into() })
    }

    /// Replaces or removes (`None`) tensor `name`, for tests of malformed files.
    pub fn set_tensor(&mut self, name: &str, t: Option<(Vec<usize>, Vec<f32>)>) {
        match t {
            Some(t) => self.tensors.insert(name.into(), t),
            None => self.tensors.remove(name),
        };
    }

    /// The projector as llama.cpp's converter writes it (`--mmproj`): the
    /// `clip` architecture, `clip.vision.*` keys, vectors and positions
    /// f32, matrices in the matrix type.
    ///
    /// # Errors
    /// Writer errors (none for well-formed tensors).
    pub fn to_gguf(&self) -> Result<GgufWriter> {
        let hp = &self.hp;
        let mut w = GgufWriter::new();
        let u = |v: usize| v as u32;
        w.add("general.architecture", "clip")?;
        w.add("clip.has_vision_encoder", true)?;
        w.add("clip.projector_type", IDEFICS3)?;
        w.add("clip.use_gelu", true)?;
        w.add("clip.vision.image_size", u(hp.image_size))?;
        w.add("clip.vision.patch_size", u(hp.patch_size))?;
        w.add("clip.vision.embedding_length", u(hp.n_embd))?;
        w.add("clip.vision.feed_forward_length", u(hp.n_ff))?;
        w.add("clip.vision.block_count", u(hp.n_layer))?;
        w.add("clip.vision.attention.head_count", u(hp.n_head))?;
        w.add("clip.vision.attention.layer_norm_epsilon", hp.eps)?;
        w.add("clip.vision.projection_dim", u(hp.projection_dim))?;
        w.add("clip.vision.projector.scale_factor", u(hp.scale_factor))?;
        w.add("clip.vision.preproc_image_size", u(hp.preproc_image_size))?;
        w.add("clip.vision.image_mean", hp.mean.to_vec())?;
        w.add("clip.vision.image_std", hp.std.to_vec())?;
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        for name in names {
            let (dims, v) = &self.tensors[name];
            let matrix = name.ends_with(".weight") && dims.len() >= 2 && !name.contains("position");
            let t = if matrix {
                self.matrix_type
            } else {
                QuantType::F32
            };
            let d: Vec<u64> = dims.iter().map(|&x| x as u64).collect();
            w.add_tensor(name.as_str(), t as u32, &d, quantize(t, v)?)?;
        }
        Ok(w)
    }

    /// One tile (planar RGB, normalized) through SigLIP and the connector:
    /// `[image_seq_len, projection_dim]` row-major.
    ///
    /// # Errors
    /// A tile of another length, a missing tensor.
    pub fn encode_tile(&self, tile: &[f32]) -> Result<Vec<f32>> {
        let hp = &self.hp;
        let (t, p, g, d) = (hp.image_size, hp.patch_size, hp.grid(), hp.n_embd);
        let n = g * g;
        if tile.len() != 3 * t * t {
            return Err(ModelError::invalid("image tile", "wrong length"));
        }
        // Patch embedding: Conv2d(3, d, kernel p, stride p) over the tile,
        // flattened row-major over the grid, plus the positions.
        let w = self.tensor("v.patch_embd.weight")?;
        let b = self.tensor("v.patch_embd.bias")?;
        let pos = self.tensor("v.position_embd.weight")?;
        let mut x = vec![0.0f64; n * d];
        for gy in 0..g {
            for gx in 0..g {
                let r = gy * g + gx;
                for o in 0..d {
                    let mut acc = f64::from(b[o]) + f64::from(pos[r * d + o]);
                    for c in 0..3 {
                        for y in 0..p {
                            for xx in 0..p {
                                let px = tile[c * t * t + (gy * p + y) * t + gx * p + xx];
                                let wi = ((o * 3 + c) * p + y) * p + xx;
                                acc += f64::from(w[wi]) * f64::from(px);
                            }
                        }
                    }
                    x[r * d + o] = acc;
                }
            }
        }
        for il in 0..hp.n_layer {
            self.layer(il, &mut x)?;
        }
        let post = self.layer_norm("v.post_ln", &x)?;
        let s = hp.scale_factor;
        let shuffled = pixel_shuffle_ref(&post, g, d, s);
        let fc = self.tensor("mm.model.fc.weight")?;
        let out = linear_ref(&shuffled, fc, None, d * s * s, hp.projection_dim);
        Ok(out.iter().map(|&v| v as f32).collect())
    }

    fn layer_norm(&self, p: &str, x: &[f64]) -> Result<Vec<f64>> {
        let d = self.hp.n_embd;
        let w = self.tensor(&format!("{p}.weight"))?;
        let b = self.tensor(&format!("{p}.bias"))?;
        let eps = f64::from(self.hp.eps);
        let mut out = vec![0.0; x.len()];
        for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps).sqrt();
            for i in 0..d {
                o[i] = (row[i] - mean) * inv * f64::from(w[i]) + f64::from(b[i]);
            }
        }
        Ok(out)
    }

    fn lin(&self, p: &str, x: &[f64], n_in: usize, n_out: usize) -> Result<Vec<f64>> {
        let w = self.tensor(&format!("{p}.weight"))?;
        let b = self.tensor(&format!("{p}.bias"))?;
        Ok(linear_ref(x, w, Some(b), n_in, n_out))
    }

    /// One encoder layer in place: `x += attn(ln1 x)`, `x += mlp(ln2 x)`.
    fn layer(&self, il: usize, x: &mut [f64]) -> Result<()> {
        let hp = &self.hp;
        let (d, ff, nh) = (hp.n_embd, hp.n_ff, hp.n_head);
        let (n, hd) = (x.len() / d, d / nh);
        let p = format!("v.blk.{il}");
        let h = self.layer_norm(&format!("{p}.ln1"), x)?;
        let q = self.lin(&format!("{p}.attn_q"), &h, d, d)?;
        let k = self.lin(&format!("{p}.attn_k"), &h, d, d)?;
        let v = self.lin(&format!("{p}.attn_v"), &h, d, d)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut attn = vec![0.0f64; n * d];
        let mut scores = vec![0.0f64; n];
        for head in 0..nh {
            let c = head * hd;
            for i in 0..n {
                let qi = &q[i * d + c..i * d + c + hd];
                for (j, sc) in scores.iter_mut().enumerate() {
                    let kj = &k[j * d + c..j * d + c + hd];
                    *sc = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale;
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                let out = &mut attn[i * d + c..i * d + c + hd];
                for (j, sc) in scores.iter().enumerate() {
                    let a = (sc - m).exp() / z;
                    for (o, vv) in out.iter_mut().zip(&v[j * d + c..j * d + c + hd]) {
                        *o += a * vv;
                    }
                }
            }
        }
        let o = self.lin(&format!("{p}.attn_out"), &attn, d, d)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        let h = self.layer_norm(&format!("{p}.ln2"), x)?;
        let mut up = self.lin(&format!("{p}.ffn_up"), &h, d, ff)?;
        for u in &mut up {
            *u = f64::from(act_ref(Activation::GeluTanh, *u as f32));
        }
        let down = self.lin(&format!("{p}.ffn_down"), &up, ff, d)?;
        x.iter_mut().zip(&down).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// `y = x Wᵀ (+ b)` over rows of `n_in`, `W` `[n_out, n_in]` row-major.
fn linear_ref(x: &[f64], w: &[f32], b: Option<&[f32]>, n_in: usize, n_out: usize) -> Vec<f64> {
    let rows = x.len() / n_in;
    let mut y = vec![0.0f64; rows * n_out];
    for r in 0..rows {
        let xr = &x[r * n_in..(r + 1) * n_in];
        for o in 0..n_out {
            let wr = &w[o * n_in..(o + 1) * n_in];
            let mut acc = b.map_or(0.0, |b| f64::from(b[o]));
            for (a, &wv) in xr.iter().zip(wr) {
                acc += a * f64::from(wv);
            }
            y[r * n_out + o] = acc;
        }
    }
    y
}

/// `[a, b, c]` row-major → `[b, a, c]` (`permute(1, 0, 2)` made contiguous).
fn swap01(x: &[f64], a: usize, b: usize, c: usize) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for i in 0..a {
        for j in 0..b {
            let src = (i * b + j) * c;
            let dst = (j * a + i) * c;
            y[dst..dst + c].copy_from_slice(&x[src..src + c]);
        }
    }
    y
}

/// `Idefics3Connector.pixel_shuffle` of `g·g` rows of `d` by `s`, step by
/// step: view `[g, g/s, d·s]`, permute, reshape `[g/s, g/s, d·s²]`,
/// permute, reshape `[(g/s)², d·s²]` (reshapes of contiguous data are free).
pub fn pixel_shuffle_ref(x: &[f64], g: usize, d: usize, s: usize) -> Vec<f64> {
    let gs = g / s;
    let a = swap01(x, g, gs, d * s); // [g/s (w), g (h), d s]
    swap01(&a, gs, gs, d * s * s) // [g/s (h), g/s (w), d s²]
}
