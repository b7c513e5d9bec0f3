//! `WhisperModel`: openai-whisper's encoder-decoder on a device. The
//! encoder: two 1-D convolutions with GELU, sinusoidal positions (stored),
//! pre-LayerNorm blocks of full self-attention and GELU MLP, a final
//! LayerNorm; per window, each decoder layer's cross-attention keys and
//! values are computed from its output once and kept in the
//! [`AudioStates`]. The decoder: token plus learned positional embedding,
//! blocks of causal self-attention, cross-attention and MLP, a final
//! LayerNorm, logits through the tied token embedding. This file holds the
//! weights and states each step to the planner (`ops::plan`), which picks
//! the kernels.

mod decoder;
mod weights;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording, Uploader, upload_new};
use crate::ops::Mat;
use crate::ops::im2col::Conv1d;
use crate::ops::layer_norm::LayerNorm;
use crate::ops::linear::Linear;
use crate::ops::plan::{
    ConvStem, CrossDecoderBlock, EncoderBlock, Forward, FullKv, FullKvAddressing, Heads,
    LnCrossAttention, LnMlp, LnSelfAttention, Planner, Workspace, WorkspaceShape,
};
use crate::ops::unary::UnaryOp;
use crate::quant::{QuantType, QuantWeight, quantize};
use crate::tokenizer::whisper::WhisperVocab;

use super::registry::LoadOptions;
use super::speech::{
    AudioStates, LogMel, N_FRAMES, SpeechDecoder, SpeechToTextModel, WhisperHparams,
};
pub use weights::{HostWhisper, TensorView, WhisperSource, require};

/// A layer norm's weight and bias on the device.
struct NormW {
    w: Arc<Buffer>,
    b: Arc<Buffer>,
}

impl NormW {
    fn norm(&self) -> LayerNorm<'_> {
        LayerNorm {
            weight: &self.w,
            bias: &self.b,
            eps: 1e-5,
        }
    }
}

struct AttnW {
    norm: NormW,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
}

struct MlpW {
    norm: NormW,
    up: Linear,
    down: Linear,
}

struct EncBlockW {
    attn: AttnW,
    mlp: MlpW,
}

struct DecBlockW {
    attn: AttnW,
    cross: AttnW,
    mlp: MlpW,
}

/// The encoder's buffers, one window at a time.
struct EncoderScratch {
    ws: Workspace,
    mel: Arc<Buffer>,
    keys: FullKv,
    at: FullKvAddressing,
    /// Windows' output buffers with the encoder recorded into them, reused
    /// once no states of theirs are alive (the encoder then only replays).
    slots: Vec<EncoderSlot>,
}

/// One window's output buffers and the encoder recorded into them.
struct EncoderSlot {
    cross: Arc<Vec<FullKv>>,
    enc_out: Arc<Buffer>,
    /// Held by every [`WhisperAudio`] and decoder of this slot's window.
    lease: Arc<()>,
    rec: Recording,
}

/// Slots kept: a caller holding more windows' states at once gets buffers
/// recorded afresh.
const MAX_ENCODER_SLOTS: usize = 2;

/// One window's states on the device.
pub(crate) struct WhisperAudio {
    owner: u64,
    /// Each decoder layer's cross-attention keys and values.
    cross: Arc<Vec<FullKv>>,
    /// The encoder output, `n_audio_ctx` rows of `n_audio_state`.
    enc_out: Arc<Buffer>,
    /// Keeps the encoder from reusing these buffers while the states or a
    /// decoder over them live.
    lease: Arc<()>,
}

/// Time of each kind of step in nanoseconds, largest first.
pub type StepTimes = Vec<(String, f64)>;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A Whisper model resident on a device.
pub struct WhisperModel {
    id: u64,
    ctx: Arc<GpuContext>,
    planner: Planner,
    hparams: WhisperHparams,
    mel_filters: Vec<f32>,
    vocab: WhisperVocab,
    conv: [Conv1d; 2],
    conv_w: [Linear; 2],
    enc_pos: Arc<Buffer>,
    enc_blocks: Vec<EncBlockW>,
    ln_post: NormW,
    tok_emb: Linear,
    dec_pos: QuantWeight,
    dec_blocks: Vec<DecBlockW>,
    ln: NormW,
    encoder: Mutex<EncoderScratch>,
    /// Decoders' buffers and recorded steps, for the next window's decoder.
    decoder_pool: Mutex<Vec<decoder::DecoderParts>>,
}

/// Uploads tensors of one source, checking their shapes.
struct Up<'s> {
    ctx: Arc<GpuContext>,
    src: &'s dyn WhisperSource,
    up: Uploader,
    bytes: u64,
}

impl Up<'_> {
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QuantWeight> {
        let t = require(self.src, name, &[cols, rows])?;
        let w = QuantWeight::from_gguf_bytes(
            &self.ctx,
            &mut self.up,
            name,
            t.qtype,
            rows,
            cols,
            t.bytes,
        )?;
        self.bytes += w.device_bytes();
        Ok(w)
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Arc<Buffer>> {
        let v = require(self.src, name, &[len])?.to_f32()?;
        self.bytes += 4 * len as u64;
        upload_new(&self.ctx, bytemuck::cast_slice(&v), name)
    }

    fn linear(&mut self, p: &str, rows: usize, cols: usize, bias: bool) -> Result<Linear> {
        let weight = self.matrix(&format!("{p}.weight"), rows, cols)?;
        let bias = if bias {
            Some(self.vector(&format!("{p}.bias"), rows)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    fn norm(&mut self, p: &str, len: usize) -> Result<NormW> {
        Ok(NormW {
            w: self.vector(&format!("{p}.weight"), len)?,
            b: self.vector(&format!("{p}.bias"), len)?,
        })
    }

    fn attn(&mut self, p: &str, d: usize) -> Result<AttnW> {
        Ok(AttnW {
            norm: self.norm(&format!("{p}_ln"), d)?,
            q: self.linear(&format!("{p}.query"), d, d, true)?,
            k: self.linear(&format!("{p}.key"), d, d, false)?,
            v: self.linear(&format!("{p}.value"), d, d, true)?,
            out: self.linear(&format!("{p}.out"), d, d, true)?,
        })
    }

    fn mlp(&mut self, p: &str, d: usize) -> Result<MlpW> {
        Ok(MlpW {
            norm: self.norm(&format!("{p}.mlp_ln"), d)?,
            up: self.linear(&format!("{p}.mlp.0"), 4 * d, d, true)?,
            down: self.linear(&format!("{p}.mlp.2"), d, 4 * d, true)?,
        })
    }

    /// A convolution weight `[d, channels, kernel]` as the product over its
    /// patch rows takes it: `[d, conv.width()]`, zero columns appended, f16
    /// where stored as f16 (exact) and f32 otherwise.
    fn conv(&mut self, p: &str, d: usize, conv: Conv1d) -> Result<Linear> {
        let name = format!("{p}.weight");
        let t = require(self.src, &name, &[conv.kernel, conv.channels, d])?;
        let v = t.to_f32()?;
        let (k, width) = (conv.channels * conv.kernel, conv.width());
        let mut padded = vec![0.0f32; d * width];
        for (r, row) in v.chunks_exact(k).enumerate() {
            padded[r * width..r * width + k].copy_from_slice(row);
        }
        let qt = if t.qtype == QuantType::F16 {
            QuantType::F16
        } else {
            QuantType::F32
        };
        let bytes = quantize(qt, &padded)?;
        let weight =
            QuantWeight::from_gguf_bytes(&self.ctx, &mut self.up, &name, qt, d, width, &bytes)?;
        self.bytes += weight.device_bytes();
        let bias = Some(self.vector(&format!("{p}.bias"), d)?);
        Ok(Linear { weight, bias })
    }
}

/// The two convolutions of the stem over `n_mels` and `d` channels.
fn stem_convs(n_mels: usize, d: usize) -> [Conv1d; 2] {
    [
        Conv1d {
            channels: n_mels,
            kernel: 3,
            stride: 1,
            pad: 1,
        },
        Conv1d {
            channels: d,
            kernel: 3,
            stride: 2,
            pad: 1,
        },
    ]
}

fn check_hparams(hp: &WhisperHparams) -> Result<()> {
    let bad = |why: String| Err(ModelError::invalid("whisper hparams", why));
    let dims = [
        hp.n_audio_ctx,
        hp.n_audio_state,
        hp.n_audio_head,
        hp.n_audio_layer,
        hp.n_text_ctx,
        hp.n_text_state,
        hp.n_text_head,
        hp.n_text_layer,
        hp.n_mels,
    ];
    if dims.contains(&0) {
        return bad(format!("a zero dimension in {hp:?}"));
    }
    if hp.n_audio_state != hp.n_text_state {
        return bad("encoder and decoder widths differ".into());
    }
    for (w, h) in [
        (hp.n_audio_state, hp.n_audio_head),
        (hp.n_text_state, hp.n_text_head),
    ] {
        if !w.is_multiple_of(h)
            || !(w / h).is_multiple_of(2)
            || w / h > 256
            || !w.is_multiple_of(32)
        {
            return bad(format!("width {w} over {h} heads"));
        }
    }
    let [c1, c2] = stem_convs(hp.n_mels, hp.n_audio_state);
    if c2.n_out(c1.n_out(N_FRAMES)) != hp.n_audio_ctx {
        return bad(format!(
            "{} encoder positions for {N_FRAMES} frames",
            hp.n_audio_ctx
        ));
    }
    Ok(())
}

impl WhisperModel {
    /// Uploads the model in `src` to `ctx`.
    ///
    /// # Errors
    /// Dimensions no Whisper model has, missing tensors or tensors of other
    /// shapes, types the device kernels do not take, device errors.
    pub fn load(
        ctx: &Arc<GpuContext>,
        src: &dyn WhisperSource,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let hp = src.hparams();
        check_hparams(&hp)?;
        let (d, n_mels) = (hp.n_audio_state, hp.n_mels);
        if src.mel_filters().len() != n_mels * (super::speech::N_FFT / 2 + 1) {
            return Err(ModelError::invalid(
                "mel filters",
                format!("{} values for {n_mels} bins", src.mel_filters().len()),
            ));
        }
        let mut up = Up {
            ctx: ctx.clone(),
            src,
            // Every upload fills a new buffer: in place where the host sees device memory.
            up: Uploader::for_new_buffers(ctx, 16 << 20)?,
            bytes: 0,
        };
        let conv = stem_convs(n_mels, d);
        let conv_w = [
            up.conv("encoder.conv1", d, conv[0])?,
            up.conv("encoder.conv2", d, conv[1])?,
        ];
        let enc_pos = {
            let v = require(src, "encoder.positional_embedding", &[d, hp.n_audio_ctx])?.to_f32()?;
            up.bytes += 4 * v.len() as u64;
            upload_new(
                ctx,
                bytemuck::cast_slice(&v),
                "encoder.positional_embedding",
            )?
        };
        let enc_blocks = (0..hp.n_audio_layer)
            .map(|i| {
                let p = format!("encoder.blocks.{i}");
                Ok(EncBlockW {
                    attn: up.attn(&format!("{p}.attn"), d)?,
                    mlp: up.mlp(&p, d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_post = up.norm("encoder.ln_post", d)?;
        let dt = hp.n_text_state;
        let tok_emb = Linear {
            weight: up.matrix("decoder.token_embedding.weight", hp.n_vocab, dt)?,
            bias: None,
        };
        let pos = require(src, "decoder.positional_embedding", &[dt, hp.n_text_ctx])?.to_f32()?;
        let dec_pos = QuantWeight::from_gguf_bytes(
            ctx,
            &mut up.up,
            "decoder.positional_embedding",
            QuantType::F32,
            hp.n_text_ctx,
            dt,
            &quantize(QuantType::F32, &pos)?,
        )?;
        up.bytes += dec_pos.device_bytes();
        let dec_blocks = (0..hp.n_text_layer)
            .map(|i| {
                let p = format!("decoder.blocks.{i}");
                Ok(DecBlockW {
                    attn: up.attn(&format!("{p}.attn"), dt)?,
                    cross: up.attn(&format!("{p}.cross_attn"), dt)?,
                    mlp: up.mlp(&p, dt)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln = up.norm("decoder.ln", dt)?;
        up.up.flush()?;
        let shape = WorkspaceShape {
            n_embd: d,
            n_q: d,
            n_kv: d,
            n_ff: 4 * d,
            n_vocab: 1,
        };
        let encoder = EncoderScratch {
            ws: Workspace::new(ctx, shape, hp.n_audio_ctx, 1, false)?,
            mel: Buffer::new(
                ctx,
                (4 * n_mels * N_FRAMES) as u64,
                MemoryKind::Upload,
                "mel",
            )?,
            keys: FullKv::new(ctx, hp.n_audio_ctx, d, "encoder attention")?,
            at: FullKvAddressing::new(ctx, hp.n_audio_ctx, hp.n_audio_ctx)?,
            slots: Vec::new(),
        };
        let model = WhisperModel {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ctx: ctx.clone(),
            planner: opts.planner_for(ctx)?,
            hparams: hp,
            mel_filters: src.mel_filters().to_vec(),
            vocab: src.vocab().clone(),
            conv,
            conv_w,
            enc_pos,
            enc_blocks,
            ln_post,
            tok_emb,
            dec_pos,
            dec_blocks,
            ln,
            encoder: Mutex::new(encoder),
            decoder_pool: Mutex::new(Vec::new()),
        };
        model.record_first_slot()?;
        Ok(model)
    }

    /// A window's output buffers: each decoder layer's cross-attention keys
    /// and values, and the encoder output.
    fn window_buffers(&self) -> Result<(Arc<Vec<FullKv>>, Arc<Buffer>)> {
        let hp = self.hparams;
        let (n, d) = (hp.n_audio_ctx, hp.n_audio_state);
        let cross = (0..hp.n_text_layer)
            .map(|il| FullKv::new(&self.ctx, n, hp.n_text_state, &format!("cross {il}")))
            .collect::<Result<Vec<_>>>()?;
        let enc_out = Buffer::new(
            &self.ctx,
            (4 * n * d) as u64,
            MemoryKind::Readback,
            "encoder output",
        )?;
        Ok((Arc::new(cross), enc_out))
    }

    /// Records the encoder into a first window's buffers at load, so that
    /// every window of a transcription replays it (recording takes several
    /// milliseconds, about what the encoder itself runs on a large GPU).
    fn record_first_slot(&self) -> Result<()> {
        let mut scratch = self
            .encoder
            .lock()
            .map_err(|_| ModelError::Internal("encoder scratch poisoned".into()))?;
        let (cross, enc_out) = self.window_buffers()?;
        let rec = self.record_encoder(&scratch, &cross, &enc_out, false)?;
        scratch.slots.push(EncoderSlot {
            cross,
            enc_out,
            lease: Arc::new(()),
            rec,
        });
        Ok(())
    }

    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Encodes one window as [`SpeechToTextModel::encode`], and with
    /// `profile` the time of each kind of step in nanoseconds, largest first
    /// (device timestamps, host steps timed on the host).
    ///
    /// # Errors
    /// As [`SpeechToTextModel::encode`].
    pub fn encode_with(
        &self,
        mel: &LogMel,
        profile: bool,
    ) -> Result<(AudioStates, Option<StepTimes>)> {
        let hp = self.hparams;
        check_mel(&hp, mel)?;
        let mut scratch = self
            .encoder
            .lock()
            .map_err(|_| ModelError::Internal("encoder scratch poisoned".into()))?;
        scratch.mel.write_slice(0, &mel.data)?;
        let free = scratch
            .slots
            .iter()
            .position(|s| Arc::strong_count(&s.lease) == 1);
        let (cross, enc_out, lease, times) = match free {
            Some(i) if !profile => {
                let slot = &mut scratch.slots[i];
                slot.rec.submit_and_wait()?;
                (
                    slot.cross.clone(),
                    slot.enc_out.clone(),
                    slot.lease.clone(),
                    None,
                )
            }
            _ => {
                let (cross, enc_out) = self.window_buffers()?;
                let mut rec = self.record_encoder(&scratch, &cross, &enc_out, profile)?;
                rec.submit_and_wait()?;
                let lease = Arc::new(());
                if profile {
                    let times = rec.profile()?;
                    (cross, enc_out, lease, Some(times))
                } else {
                    if scratch.slots.len() < MAX_ENCODER_SLOTS {
                        scratch.slots.push(EncoderSlot {
                            cross: cross.clone(),
                            enc_out: enc_out.clone(),
                            lease: lease.clone(),
                            rec,
                        });
                    }
                    (cross, enc_out, lease, None)
                }
            }
        };
        let states = AudioStates {
            inner: Box::new(WhisperAudio {
                owner: self.id,
                cross,
                enc_out,
                lease,
            }),
        };
        Ok((states, times))
    }

    /// Records the encoder over the scratch's mel into `cross` (each
    /// decoder layer's cross-attention keys and values) and `enc_out`.
    fn record_encoder(
        &self,
        scratch: &EncoderScratch,
        cross: &[FullKv],
        enc_out: &Arc<Buffer>,
        profile: bool,
    ) -> Result<Recording> {
        let hp = self.hparams;
        let (n, d) = (hp.n_audio_ctx, hp.n_audio_state);
        let heads = self.heads(hp.n_audio_head, d);
        let stem = ConvStem {
            conv1: self.conv[0],
            conv1_w: &self.conv_w[0],
            conv2: self.conv[1],
            conv2_w: &self.conv_w[1],
            positions: &self.enc_pos,
        };
        let mut rec = Recording::new(&self.ctx, profile)?;
        {
            let mut f = Forward::new(&mut rec, self.planner, &scratch.ws, n)?;
            f.conv_stem(&stem, Mat::new(&scratch.mel, hp.n_mels, N_FRAMES))?;
            for b in &self.enc_blocks {
                let block = EncoderBlock {
                    attn: self.self_attention(&b.attn, heads),
                    mlp: Self::mlp(&b.mlp),
                };
                f.encoder_block(&block, &scratch.keys, &scratch.at)?;
            }
            let enc = f.final_norm(self.ln_post.norm())?;
            for (b, kv) in self.dec_blocks.iter().zip(cross) {
                f.cross_kv(enc, &b.cross.k, &b.cross.v, kv, &scratch.at)?;
            }
            f.copy_rows(enc, enc_out)?;
        }
        rec.finish()?;
        Ok(rec)
    }

    fn heads(&self, n_head: usize, width: usize) -> Heads {
        let head_dim = width / n_head;
        Heads {
            n_head,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        }
    }

    fn self_attention<'a>(&self, a: &'a AttnW, heads: Heads) -> LnSelfAttention<'a> {
        LnSelfAttention {
            norm: a.norm.norm(),
            q: &a.q,
            k: &a.k,
            v: &a.v,
            out: &a.out,
            heads,
        }
    }

    fn mlp<'a>(m: &'a MlpW) -> LnMlp<'a> {
        LnMlp {
            norm: m.norm.norm(),
            act: UnaryOp::GeluErf,
            up: &m.up,
            down: &m.down,
        }
    }

    /// Decoder block `il` as the planner takes it.
    fn text_block(&self, il: usize) -> Result<CrossDecoderBlock<'_>> {
        let b = self
            .dec_blocks
            .get(il)
            .ok_or_else(|| ModelError::Internal(format!("no decoder block {il}")))?;
        let heads = self.heads(self.hparams.n_text_head, self.hparams.n_text_state);
        Ok(CrossDecoderBlock {
            attn: self.self_attention(&b.attn, heads),
            cross: LnCrossAttention {
                norm: b.cross.norm.norm(),
                q: &b.cross.q,
                out: &b.cross.out,
                heads,
            },
            mlp: Self::mlp(&b.mlp),
        })
    }

    fn audio<'s>(&self, audio: &'s AudioStates) -> Result<&'s WhisperAudio> {
        audio
            .inner
            .downcast_ref::<WhisperAudio>()
            .filter(|a| a.owner == self.id)
            .ok_or_else(|| ModelError::invalid("audio states", "not encoded by this model"))
    }
}

/// Checks one window of features.
pub(crate) fn check_mel(hp: &WhisperHparams, mel: &LogMel) -> Result<()> {
    if mel.n_mels != hp.n_mels || mel.n_frames != N_FRAMES || mel.data.len() != hp.n_mels * N_FRAMES
    {
        return Err(ModelError::Shape {
            tensor: "log-mel features".into(),
            expected: vec![hp.n_mels as u64, N_FRAMES as u64],
            got: vec![
                mel.n_mels as u64,
                mel.n_frames as u64,
                mel.data.len() as u64,
            ],
        });
    }
    if mel.data.iter().any(|v| !v.is_finite()) {
        return Err(ModelError::invalid("log-mel features", "non-finite values"));
    }
    Ok(())
}

impl SpeechToTextModel for WhisperModel {
    fn hparams(&self) -> &WhisperHparams {
        &self.hparams
    }

    fn mel_filters(&self) -> &[f32] {
        &self.mel_filters
    }

    fn vocab(&self) -> &WhisperVocab {
        &self.vocab
    }

    fn encode(&self, mel: &LogMel) -> Result<AudioStates> {
        Ok(self.encode_with(mel, false)?.0)
    }

    fn encode_profiled(&self, mel: &LogMel) -> Result<(AudioStates, Vec<(String, f64)>)> {
        let (states, times) = self.encode_with(mel, true)?;
        Ok((states, times.unwrap_or_default()))
    }

    fn decoder(&self, audio: &AudioStates, n_seqs: usize) -> Result<Box<dyn SpeechDecoder + '_>> {
        let a = self.audio(audio)?;
        Ok(Box::new(decoder::WhisperDecoder::new(
            self,
            a.cross.clone(),
            a.lease.clone(),
            n_seqs,
        )?))
    }

    fn encoder_output(&self, audio: &AudioStates) -> Result<Vec<f32>> {
        let a = self.audio(audio)?;
        let mut v = vec![0.0f32; self.hparams.n_audio_ctx * self.hparams.n_audio_state];
        a.enc_out.read_slice(0, &mut v)?;
        Ok(v)
    }

    fn device_bytes(&self) -> u64 {
        let lin = |l: &Linear| l.device_bytes();
        let norm = |n: &NormW| n.w.size() + n.b.size();
        let attn = |a: &AttnW| norm(&a.norm) + lin(&a.q) + lin(&a.k) + lin(&a.v) + lin(&a.out);
        let mlp = |m: &MlpW| norm(&m.norm) + lin(&m.up) + lin(&m.down);
        self.conv_w.iter().map(lin).sum::<u64>()
            + self.enc_pos.size()
            + self
                .enc_blocks
                .iter()
                .map(|b| attn(&b.attn) + mlp(&b.mlp))
                .sum::<u64>()
            + norm(&self.ln_post)
            + lin(&self.tok_emb)
            + self.dec_pos.device_bytes()
            + self
                .dec_blocks
                .iter()
                .map(|b| attn(&b.attn) + attn(&b.cross) + mlp(&b.mlp))
                .sum::<u64>()
            + norm(&self.ln)
    }
}
