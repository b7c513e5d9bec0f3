//! `WhisperReference`: openai-whisper's forward pass in plain Rust loops
//! on the host (f32 weights as the file stores them after dequantization,
//! dot products summed in f64, attention keys and values rounded to the f16
//! the device stores them in), implementing the same
//! [`SpeechToTextModel`] as the device model, so that the device model's
//! encoder output and logits — and the decoding strategies above the
//! contract — are tested against something that shares no kernel with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::speech::{AudioStates, LogMel, SpeechDecoder, SpeechToTextModel, WhisperHparams};
use super::whisper::{WhisperSource, check_mel, require};
use crate::error::{ModelError, Result};
use crate::ops::unary::gelu_erf;
use crate::tokenizer::whisper::WhisperVocab;

struct Lin {
    w: Vec<f32>,
    b: Option<Vec<f32>>,
    rows: usize,
    cols: usize,
}

impl Lin {
    /// `x W^T + b` for `x` of rows of `cols`.
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let (rows, cols) = (self.rows, self.cols);
        let mut out = vec![0.0f32; x.len() / cols * rows];
        out.par_chunks_mut(rows)
            .zip(x.par_chunks(cols))
            .for_each(|(o, xt)| {
                for (r, y) in o.iter_mut().enumerate() {
                    let wr = &self.w[r * cols..(r + 1) * cols];
                    let mut s: f64 = self.b.as_ref().map_or(0.0, |b| f64::from(b[r]));
                    for (&a, &b) in wr.iter().zip(xt) {
                        s += f64::from(a) * f64::from(b);
                    }
                    *y = s as f32;
                }
            });
        out
    }
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        let d = self.w.len();
        let mut out = vec![0.0f32; x.len()];
        out.par_chunks_mut(d)
            .zip(x.par_chunks(d))
            .for_each(|(o, r)| {
                let mean = r.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64;
                let var = r
                    .iter()
                    .map(|&v| (f64::from(v) - mean).powi(2))
                    .sum::<f64>()
                    / d as f64;
                let inv = 1.0 / (var + 1e-5).sqrt();
                for i in 0..d {
                    o[i] = ((f64::from(r[i]) - mean) * inv * f64::from(self.w[i])
                        + f64::from(self.b[i])) as f32;
                }
            });
        out
    }
}

struct Attn {
    norm: Norm,
    q: Lin,
    k: Lin,
    v: Lin,
    out: Lin,
}

struct Mlp {
    norm: Norm,
    up: Lin,
    down: Lin,
}

impl Mlp {
    fn add_into(&self, x: &mut [f32]) {
        let mut h = self.up.apply(&self.norm.apply(x));
        h.par_iter_mut()
            .for_each(|v| *v = gelu_erf(f64::from(*v)) as f32);
        add(x, &self.down.apply(&h));
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}

/// Multi-head attention of `q` (rows of `w`) over `k`/`v` (rows of `w`):
/// query `i` sees keys `0..=limit(i)`.
/// Keys and values as every attention of the device model stores them:
/// f16 (as whisper.cpp does, and as the text reference models the KV
/// cache), so that what remains between the two is arithmetic. Unrounded,
/// the encoder output of speech differs by up to ~2e-2 relative (sample.wav's
/// first window); the transcripts do not change (equal to faster-whisper's
/// fp32 ones).
fn f16_stored(v: Vec<f32>) -> Vec<f32> {
    v.into_iter()
        .map(|x| half::f16::from_f32(x).to_f32())
        .collect()
}

fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    w: usize,
    n_head: usize,
    limit: impl Fn(usize) -> usize + Sync,
) -> Vec<f32> {
    let hd = w / n_head;
    let scale = 1.0 / (hd as f64).sqrt();
    let n_k = k.len() / w;
    let mut out = vec![0.0f32; q.len()];
    out.par_chunks_mut(hd).enumerate().for_each(|(i, o)| {
        let (t, h) = (i / n_head, i % n_head);
        let qh = &q[t * w + h * hd..t * w + (h + 1) * hd];
        let last = limit(t).min(n_k.saturating_sub(1));
        let scores: Vec<f64> = (0..=last)
            .map(|j| {
                let kh = &k[j * w + h * hd..j * w + (h + 1) * hd];
                qh.iter()
                    .zip(kh)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let sum: f64 = e.iter().sum();
        for (c, oc) in o.iter_mut().enumerate() {
            let s: f64 = e
                .iter()
                .enumerate()
                .map(|(j, p)| p * f64::from(v[j * w + h * hd + c]))
                .sum();
            *oc = (s / sum) as f32;
        }
    });
    out
}

/// A 1-D convolution of kernel 3 and padding 1: `x(c, s)` read by `at`,
/// `n_in` input positions; rows of `d` outputs per position.
fn conv1d(
    x: impl Fn(usize, usize) -> f32 + Sync,
    channels: usize,
    n_in: usize,
    w: &[f32],
    b: &[f32],
    stride: usize,
) -> Vec<f32> {
    let d = b.len();
    let n_out = (n_in + 2 - 3) / stride + 1;
    let mut out = vec![0.0f32; n_out * d];
    out.par_chunks_mut(d).enumerate().for_each(|(t, o)| {
        let mut patch = vec![0.0f32; channels * 3];
        for c in 0..channels {
            for j in 0..3 {
                let s = (t * stride + j) as isize - 1;
                if s >= 0 && (s as usize) < n_in {
                    patch[c * 3 + j] = x(c, s as usize);
                }
            }
        }
        for (r, y) in o.iter_mut().enumerate() {
            let wr = &w[r * channels * 3..(r + 1) * channels * 3];
            let s: f64 = wr
                .iter()
                .zip(&patch)
                .map(|(&a, &p)| f64::from(a) * f64::from(p))
                .sum();
            *y = (s + f64::from(b[r])) as f32;
        }
    });
    out
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// openai-whisper's forward pass on the host.
pub struct WhisperReference {
    id: u64,
    hp: WhisperHparams,
    mel_filters: Vec<f32>,
    vocab: WhisperVocab,
    conv: [(Vec<f32>, Vec<f32>); 2],
    enc_pos: Vec<f32>,
    enc: Vec<(Attn, Mlp)>,
    ln_post: Norm,
    tok_emb: Vec<f32>,
    dec_pos: Vec<f32>,
    dec: Vec<(Attn, Attn, Mlp)>,
    ln: Norm,
}

struct RefAudio {
    owner: u64,
    enc_out: Vec<f32>,
    /// Each decoder layer's cross-attention keys and values.
    cross: Vec<(Vec<f32>, Vec<f32>)>,
}

impl WhisperReference {
    /// The model in `src`, dequantized to f32.
    ///
    /// # Errors
    /// Missing tensors or tensors of other shapes.
    pub fn load(src: &dyn WhisperSource) -> Result<Self> {
        let hp = src.hparams();
        let f = |name: &str, ne: &[usize]| require(src, name, ne)?.to_f32();
        let lin = |p: &str, rows: usize, cols: usize, bias: bool| -> Result<Lin> {
            Ok(Lin {
                w: f(&format!("{p}.weight"), &[cols, rows])?,
                b: if bias {
                    Some(f(&format!("{p}.bias"), &[rows])?)
                } else {
                    None
                },
                rows,
                cols,
            })
        };
        let norm = |p: &str, d: usize| -> Result<Norm> {
            Ok(Norm {
                w: f(&format!("{p}.weight"), &[d])?,
                b: f(&format!("{p}.bias"), &[d])?,
            })
        };
        let attn = |p: &str, d: usize| -> Result<Attn> {
            Ok(Attn {
                norm: norm(&format!("{p}_ln"), d)?,
                q: lin(&format!("{p}.query"), d, d, true)?,
                k: lin(&format!("{p}.key"), d, d, false)?,
                v: lin(&format!("{p}.value"), d, d, true)?,
                out: lin(&format!("{p}.out"), d, d, true)?,
            })
        };
        let mlp = |p: &str, d: usize| -> Result<Mlp> {
            Ok(Mlp {
                norm: norm(&format!("{p}.mlp_ln"), d)?,
                up: lin(&format!("{p}.mlp.0"), 4 * d, d, true)?,
                down: lin(&format!("{p}.mlp.2"), d, 4 * d, true)?,
            })
        };
        let (d, dt, m) = (hp.n_audio_state, hp.n_text_state, hp.n_mels);
        let conv = [
            (
                f("encoder.conv1.weight", &[3, m, d])?,
                f("encoder.conv1.bias", &[d])?,
            ),
            (
                f("encoder.conv2.weight", &[3, d, d])?,
                f("encoder.conv2.bias", &[d])?,
            ),
        ];
        let enc = (0..hp.n_audio_layer)
            .map(|i| {
                let p = format!("encoder.blocks.{i}");
                Ok((attn(&format!("{p}.attn"), d)?, mlp(&p, d)?))
            })
            .collect::<Result<Vec<_>>>()?;
        let dec = (0..hp.n_text_layer)
            .map(|i| {
                let p = format!("decoder.blocks.{i}");
                Ok((
                    attn(&format!("{p}.attn"), dt)?,
                    attn(&format!("{p}.cross_attn"), dt)?,
                    mlp(&p, dt)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(WhisperReference {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            hp,
            mel_filters: src.mel_filters().to_vec(),
            vocab: src.vocab().clone(),
            conv,
            enc_pos: f("encoder.positional_embedding", &[d, hp.n_audio_ctx])?,
            enc,
            ln_post: norm("encoder.ln_post", d)?,
            tok_emb: f("decoder.token_embedding.weight", &[dt, hp.n_vocab])?,
            dec_pos: f("decoder.positional_embedding", &[dt, hp.n_text_ctx])?,
            dec,
            ln: norm("decoder.ln", dt)?,
        })
    }

    fn audio<'s>(&self, audio: &'s AudioStates) -> Result<&'s Arc<RefAudio>> {
        audio
            .inner
            .downcast_ref::<Arc<RefAudio>>()
            .filter(|a| a.owner == self.id)
            .ok_or_else(|| ModelError::invalid("audio states", "not encoded by this model"))
    }
}

impl SpeechToTextModel for WhisperReference {
    fn hparams(&self) -> &WhisperHparams {
        &self.hp
    }

    fn mel_filters(&self) -> &[f32] {
        &self.mel_filters
    }

    fn vocab(&self) -> &WhisperVocab {
        &self.vocab
    }

    fn encode(&self, mel: &LogMel) -> Result<AudioStates> {
        let hp = self.hp;
        check_mel(&hp, mel)?;
        let (d, m, nf) = (hp.n_audio_state, hp.n_mels, mel.n_frames);
        let data = &mel.data;
        let mut h1 = conv1d(
            |c, s| data[c * nf + s],
            m,
            nf,
            &self.conv[0].0,
            &self.conv[0].1,
            1,
        );
        h1.par_iter_mut()
            .for_each(|v| *v = gelu_erf(f64::from(*v)) as f32);
        let mut x = conv1d(
            |c, s| h1[s * d + c],
            d,
            nf,
            &self.conv[1].0,
            &self.conv[1].1,
            2,
        );
        x.par_iter_mut()
            .for_each(|v| *v = gelu_erf(f64::from(*v)) as f32);
        add(&mut x, &self.enc_pos);
        let n = x.len() / d;
        for (a, mlp) in &self.enc {
            let h = a.norm.apply(&x);
            let (q, k, v) = (a.q.apply(&h), a.k.apply(&h), a.v.apply(&h));
            let (k, v) = (f16_stored(k), f16_stored(v));
            let o = attention(&q, &k, &v, d, hp.n_audio_head, |_| n - 1);
            add(&mut x, &a.out.apply(&o));
            mlp.add_into(&mut x);
        }
        let enc_out = self.ln_post.apply(&x);
        let cross = self
            .dec
            .iter()
            .map(|(_, c, _)| {
                (
                    f16_stored(c.k.apply(&enc_out)),
                    f16_stored(c.v.apply(&enc_out)),
                )
            })
            .collect();
        Ok(AudioStates {
            inner: Box::new(Arc::new(RefAudio {
                owner: self.id,
                enc_out,
                cross,
            })),
        })
    }

    fn decoder(&self, audio: &AudioStates, n_seqs: usize) -> Result<Box<dyn SpeechDecoder + '_>> {
        let audio = self.audio(audio)?.clone();
        if n_seqs == 0 {
            return Err(ModelError::invalid("n_seqs", "a decoder of no sequences"));
        }
        let n_layer = self.hp.n_text_layer;
        Ok(Box::new(RefDecoder {
            model: self,
            audio,
            seqs: vec![vec![(Vec::new(), Vec::new()); n_layer]; n_seqs],
            n_past: 0,
        }))
    }

    fn device_bytes(&self) -> u64 {
        0
    }

    fn encoder_output(&self, audio: &AudioStates) -> Result<Vec<f32>> {
        Ok(self.audio(audio)?.enc_out.clone())
    }
}

/// Each sequence's self-attention keys and values, per layer.
type SeqCache = Vec<(Vec<f32>, Vec<f32>)>;

struct RefDecoder<'m> {
    model: &'m WhisperReference,
    audio: Arc<RefAudio>,
    seqs: Vec<SeqCache>,
    n_past: usize,
}

impl SpeechDecoder for RefDecoder<'_> {
    fn n_seqs(&self) -> usize {
        self.seqs.len()
    }

    fn n_past(&self) -> usize {
        self.n_past
    }

    fn step(&mut self, tokens: &[&[u32]]) -> Result<Vec<f32>> {
        let md = self.model;
        let hp = md.hp;
        let m = tokens.first().map_or(0, |t| t.len());
        if tokens.len() != self.seqs.len() || m == 0 || tokens.iter().any(|t| t.len() != m) {
            return Err(ModelError::invalid(
                "tokens",
                "ragged, empty or of another count",
            ));
        }
        if self.n_past + m > hp.n_text_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: hp.n_text_ctx,
                requested: self.n_past + m,
            });
        }
        if tokens
            .iter()
            .flat_map(|t| t.iter())
            .any(|&t| t as usize >= hp.n_vocab)
        {
            return Err(ModelError::invalid("token id", "out of the vocabulary"));
        }
        let d = hp.n_text_state;
        let n_past = self.n_past;
        let mut logits = Vec::with_capacity(self.seqs.len() * hp.n_vocab);
        for (seq, toks) in self.seqs.iter_mut().zip(tokens) {
            let mut x: Vec<f32> = toks
                .iter()
                .enumerate()
                .flat_map(|(i, &t)| {
                    let (t, p) = (t as usize, n_past + i);
                    (0..d).map(move |c| md.tok_emb[t * d + c] + md.dec_pos[p * d + c])
                })
                .collect();
            for (((a, c, mlp), (kc, vc)), (ck, cv)) in
                md.dec.iter().zip(seq.iter_mut()).zip(&self.audio.cross)
            {
                let h = a.norm.apply(&x);
                let q = a.q.apply(&h);
                kc.extend(f16_stored(a.k.apply(&h)));
                vc.extend(f16_stored(a.v.apply(&h)));
                let o = attention(&q, kc, vc, d, hp.n_text_head, |i| n_past + i);
                add(&mut x, &a.out.apply(&o));
                let q = c.q.apply(&c.norm.apply(&x));
                let n_audio = ck.len() / d;
                let o = attention(&q, ck, cv, d, hp.n_text_head, |_| n_audio - 1);
                add(&mut x, &c.out.apply(&o));
                mlp.add_into(&mut x);
            }
            let last = md.ln.apply(&x[(m - 1) * d..]);
            let mut row = vec![0.0f32; hp.n_vocab];
            row.par_iter_mut().enumerate().for_each(|(t, y)| {
                let e = &md.tok_emb[t * d..(t + 1) * d];
                *y = e
                    .iter()
                    .zip(&last)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32;
            });
            logits.extend(row);
        }
        self.n_past += m;
        Ok(logits)
    }

    fn reorder(&mut self, source: &[usize]) -> Result<()> {
        if source.is_empty() || source.iter().any(|&s| s >= self.seqs.len()) {
            return Err(ModelError::invalid(
                "reorder",
                "index out of range or no sequences",
            ));
        }
        self.seqs = source.iter().map(|&s| self.seqs[s].clone()).collect();
        Ok(())
    }

    fn reset(&mut self) {
        self.n_past = 0;
        for s in &mut self.seqs {
            for (k, v) in s {
                k.clear();
                v.clear();
            }
        }
    }
}
