//! The decoder of one window: `n_seqs` token sequences (beams) stepped
//! together, each with its own self-attention cache ([`BeamKv`]: one page
//! of `n_text_ctx` rows per sequence and layer), all sharing the window's
//! cross-attention keys.

use std::sync::Arc;

use super::WhisperModel;
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording};
use crate::models::speech::SpeechDecoder;
use crate::ops::backend::CopyCall;
use crate::ops::kv_store::{CacheAddressing, KvAttention, LayerCall, LayerKv};
use crate::ops::plan::{Forward, FullKv, FullKvAddressing, Workspace, WorkspaceShape};

/// One cache set: K and V buffers of every layer, `cap` sequences of
/// `n_ctx` f16 rows each.
struct CacheSet {
    layers: Vec<(Arc<Buffer>, Arc<Buffer>)>,
    cap: usize,
}

impl CacheSet {
    fn new(
        ctx: &Arc<GpuContext>,
        n_layer: usize,
        cap: usize,
        n_ctx: usize,
        width: usize,
    ) -> Result<Self> {
        let bytes = (2 * cap * n_ctx * width) as u64;
        let layers = (0..n_layer)
            .map(|il| {
                Ok((
                    Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("self k {il}"))?,
                    Buffer::zeroed(ctx, bytes, MemoryKind::Device, &format!("self v {il}"))?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CacheSet { layers, cap })
    }
}

fn int_buffer(ctx: &Arc<GpuContext>, v: &[i32], name: &str) -> Result<Arc<Buffer>> {
    let b = Buffer::new(ctx, (4 * v.len().max(1)) as u64, MemoryKind::Upload, name)?;
    b.write_slice(0, v)?;
    Ok(b)
}

/// The self-attention caches of a decoder's sequences: sequence `s` owns
/// page `s` (`n_ctx` rows) of every layer's cache; reordering copies pages
/// into a second set and swaps the two.
pub(super) struct BeamKv {
    n_ctx: usize,
    width: usize,
    cur: CacheSet,
    spare: Option<CacheSet>,
    page_table: Arc<Buffer>,
    /// Per token of a call, its sequence (the index of its page).
    seq_base: Arc<Buffer>,
    n_seqs: usize,
    /// Bumped whenever a buffer a recorded step binds is replaced.
    epoch: u64,
}

impl BeamKv {
    fn new(
        ctx: &Arc<GpuContext>,
        n_layer: usize,
        n_seqs: usize,
        n_ctx: usize,
        width: usize,
    ) -> Result<Self> {
        let cap = n_seqs.max(1);
        let table: Vec<i32> = (0..cap as i32).collect();
        Ok(BeamKv {
            n_ctx,
            width,
            cur: CacheSet::new(ctx, n_layer, cap, n_ctx, width)?,
            spare: None,
            page_table: int_buffer(ctx, &table, "beam page table")?,
            seq_base: int_buffer(ctx, &vec![0; cap * n_ctx], "beam sequence of token")?,
            n_seqs,
            epoch: 0,
        })
    }

    /// Sequence `i` becomes a copy of the first `n_past` rows of sequence
    /// `source[i]`.
    fn reorder(
        &mut self,
        ctx: &Arc<GpuContext>,
        model: &WhisperModel,
        source: &[usize],
        n_past: usize,
    ) -> Result<()> {
        let n_layer = self.cur.layers.len();
        let need = source.len().max(1);
        if self.spare.as_ref().is_none_or(|s| s.cap < need) {
            self.epoch += 1;
            self.spare = Some(CacheSet::new(
                ctx,
                n_layer,
                need.max(self.cur.cap),
                self.n_ctx,
                self.width,
            )?);
        }
        let Some(spare) = self.spare.take() else {
            return Err(ModelError::Internal("no spare cache".into()));
        };
        if n_past > 0 {
            let page = (2 * self.n_ctx * self.width) as u64;
            let bytes = (2 * n_past * self.width) as u64;
            let kernels = model.planner.plan(ctx, 1, true).kernels();
            let mut rec = Recording::new(ctx, false)?;
            for ((k, v), (sk, sv)) in self.cur.layers.iter().zip(&spare.layers) {
                for (i, &s) in source.iter().enumerate() {
                    for (src, dst) in [(k, sk), (v, sv)] {
                        let call = CopyCall {
                            src,
                            src_offset: s as u64 * page,
                            dst,
                            dst_offset: i as u64 * page,
                            bytes,
                        };
                        kernels.copy(&mut rec, &call)?;
                    }
                }
            }
            rec.finish()?;
            rec.submit_and_wait()?;
        }
        let old = std::mem::replace(&mut self.cur, spare);
        self.spare = Some(old);
        if self.cur.cap > self.page_capacity() {
            self.epoch += 1;
            let table: Vec<i32> = (0..self.cur.cap as i32).collect();
            self.page_table = int_buffer(ctx, &table, "beam page table")?;
            self.seq_base = int_buffer(
                ctx,
                &vec![0; self.cur.cap * self.n_ctx],
                "beam sequence of token",
            )?;
        }
        self.n_seqs = source.len();
        Ok(())
    }

    /// The current cache set, as an identity for recorded steps.
    fn cache_set(&self) -> usize {
        self.cur
            .layers
            .first()
            .map_or(0, |(k, _)| Arc::as_ptr(k) as usize)
    }

    fn page_capacity(&self) -> usize {
        (self.page_table.size() / 4) as usize
    }
}

impl KvAttention for BeamKv {
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn layer_kv<'a>(&'a self, call: LayerCall<'a>) -> Result<LayerKv<'a>> {
        let (k, v) =
            self.cur.layers.get(call.il).ok_or_else(|| {
                ModelError::Internal(format!("no self-attention layer {}", call.il))
            })?;
        if call.n_tokens > (self.seq_base.size() / 4) as usize {
            return Err(ModelError::Internal(format!(
                "{} tokens in one call",
                call.n_tokens
            )));
        }
        Ok(LayerKv {
            k,
            v,
            at: CacheAddressing {
                positions: call.positions,
                page_table: &self.page_table,
                seq_base: &self.seq_base,
                page_size: self.n_ctx,
                ring: 0,
            },
        })
    }

    fn one_per_sequence(&self, n_tokens: usize) -> bool {
        n_tokens == self.n_seqs
    }
}

/// A [`SpeechDecoder`] of a [`WhisperModel`].
pub(super) struct WhisperDecoder<'m> {
    model: &'m WhisperModel,
    /// Keeps the encoder from reusing the window's buffers meanwhile.
    _lease: Arc<()>,
    n_past: usize,
    /// Taken from the model's pool and given back on drop, so the next
    /// window's decoder replays the steps recorded here.
    parts: Option<DecoderParts>,
}

/// What a decoder allocates and records: kept by the model between windows
/// (the encoder reuses its output buffers too, so the recorded steps stay
/// valid across windows).
pub(super) struct DecoderParts {
    cross: Arc<Vec<FullKv>>,
    cross_at: FullKvAddressing,
    kv: BeamKv,
    ws: Option<Workspace>,
    host_logits: Option<Arc<Buffer>>,
    /// Recorded steps, replayed while the buffers they bind stay (the
    /// design's rule: a decode step is recorded once). Positions and
    /// sequence bases live in buffers, so one recording serves every
    /// `n_past`; beams alternate between two cache sets, hence a few.
    steps: Vec<(StepKey, Recording)>,
}

/// What a recorded step depends on beyond its buffers' contents.
#[derive(Clone, Copy, PartialEq, Eq)]
struct StepKey {
    n_seqs: usize,
    /// Tokens per sequence.
    m: usize,
    /// The current self-attention cache set (reorders swap two).
    cache_set: usize,
}

/// Recorded steps kept: the prompt's and the one-token step, for two cache
/// sets and a couple of beam counts.
const MAX_STEPS: usize = 8;

/// Decoders' parts a model keeps for reuse.
pub(super) const MAX_POOLED: usize = 2;

impl DecoderParts {
    fn new(model: &WhisperModel, cross: Arc<Vec<FullKv>>, n_seqs: usize) -> Result<Self> {
        let hp = model.hparams;
        let ctx = model.context();
        Ok(DecoderParts {
            cross,
            cross_at: FullKvAddressing::new(ctx, hp.n_audio_ctx, n_seqs * hp.n_text_ctx)?,
            kv: BeamKv::new(ctx, hp.n_text_layer, n_seqs, hp.n_text_ctx, hp.n_text_state)?,
            ws: None,
            host_logits: None,
            steps: Vec::new(),
        })
    }

    /// Fits these parts to a new window's `cross` and `n_seqs` sequences.
    fn rebind(
        &mut self,
        model: &WhisperModel,
        cross: Arc<Vec<FullKv>>,
        n_seqs: usize,
    ) -> Result<()> {
        let hp = model.hparams;
        if !Arc::ptr_eq(&self.cross, &cross) {
            self.steps.clear();
            self.cross = cross;
        }
        self.address_queries(model, n_seqs * hp.n_text_ctx)?;
        if n_seqs > self.kv.cur.cap || n_seqs > self.kv.page_capacity() {
            self.steps.clear();
            self.kv = BeamKv::new(
                model.context(),
                hp.n_text_layer,
                n_seqs,
                hp.n_text_ctx,
                hp.n_text_state,
            )?;
        }
        self.kv.n_seqs = n_seqs;
        Ok(())
    }

    /// Cross-attention addressing for at least `max_queries` queries (the
    /// recorded steps bind the old one, so they go with it).
    fn address_queries(&mut self, model: &WhisperModel, max_queries: usize) -> Result<()> {
        if max_queries > self.cross_at.max_queries {
            self.steps.clear();
            self.cross_at =
                FullKvAddressing::new(model.context(), model.hparams.n_audio_ctx, max_queries)?;
        }
        Ok(())
    }

    /// A workspace for calls of `n` tokens and `rows` logit rows.
    fn workspace(
        &mut self,
        model: &WhisperModel,
        n: usize,
        rows: usize,
    ) -> Result<(Workspace, Arc<Buffer>)> {
        let fits = self
            .ws
            .as_ref()
            .is_some_and(|ws| ws.max_tokens >= n && ws.max_logit_rows >= rows);
        if !fits {
            let hp = model.hparams;
            let d = hp.n_text_state;
            let shape = WorkspaceShape {
                n_embd: d,
                n_q: d,
                n_kv: d,
                n_ff: 4 * d,
                n_vocab: hp.n_vocab,
            };
            let ws = Workspace::new(model.context(), shape, n, rows, false)?;
            if ws.max_logit_rows < rows {
                return Err(ModelError::invalid(
                    "n_seqs",
                    format!("{rows} rows of logits"),
                ));
            }
            self.host_logits = Some(ws.host_logits("whisper logits")?);
            self.ws = Some(ws);
            self.steps.clear();
        }
        match (&self.ws, &self.host_logits) {
            (Some(ws), Some(h)) => Ok((ws.clone(), h.clone())),
            _ => Err(ModelError::Internal("no decoder workspace".into())),
        }
    }

    /// Records a step of `n` tokens, `m` per sequence, into `host`.
    fn record(
        &self,
        model: &WhisperModel,
        ws: &Workspace,
        host: &Arc<Buffer>,
        n: usize,
        m: usize,
    ) -> Result<Recording> {
        let mut rec = Recording::new(model.context(), false)?;
        {
            let mut f = Forward::new(&mut rec, model.planner, ws, n)?.with_cache(&self.kv);
            f.embed_with_positions(&model.tok_emb.weight, &model.dec_pos)?;
            for (il, cross) in self.cross.iter().enumerate() {
                f.cross_decoder_block(il, &model.text_block(il)?, cross, &self.cross_at)?;
            }
            f.last_logits(model.ln.norm(), &model.tok_emb, m, host)?;
        }
        rec.finish()?;
        Ok(rec)
    }

    /// Runs a step of `n` tokens, `m` per sequence, replaying its
    /// recording when one exists.
    fn run(
        &mut self,
        model: &WhisperModel,
        ws: &Workspace,
        host: &Arc<Buffer>,
        n: usize,
        m: usize,
    ) -> Result<()> {
        let key = StepKey {
            n_seqs: self.kv.n_seqs,
            m,
            cache_set: self.kv.cache_set(),
        };
        let i = match self.steps.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let rec = self.record(model, ws, host, n, m)?;
                if self.steps.len() == MAX_STEPS {
                    self.steps.remove(0);
                }
                self.steps.push((key, rec));
                self.steps.len() - 1
            }
        };
        self.steps[i].1.submit_and_wait()
    }
}

impl<'m> WhisperDecoder<'m> {
    pub(super) fn new(
        model: &'m WhisperModel,
        cross: Arc<Vec<FullKv>>,
        lease: Arc<()>,
        n_seqs: usize,
    ) -> Result<Self> {
        if n_seqs == 0 {
            return Err(ModelError::invalid("n_seqs", "a decoder of no sequences"));
        }
        let pooled = model
            .decoder_pool
            .lock()
            .map_err(|_| ModelError::Internal("decoder pool poisoned".into()))?
            .pop();
        let parts = match pooled {
            Some(mut p) => {
                p.rebind(model, cross, n_seqs)?;
                p
            }
            None => DecoderParts::new(model, cross, n_seqs)?,
        };
        Ok(WhisperDecoder {
            model,
            _lease: lease,
            n_past: 0,
            parts: Some(parts),
        })
    }

    fn parts(&mut self) -> Result<&mut DecoderParts> {
        self.parts
            .as_mut()
            .ok_or_else(|| ModelError::Internal("decoder parts missing".into()))
    }
}

impl Drop for WhisperDecoder<'_> {
    fn drop(&mut self) {
        if let (Some(parts), Ok(mut pool)) = (self.parts.take(), self.model.decoder_pool.lock())
            && pool.len() < MAX_POOLED
        {
            pool.push(parts);
        }
    }
}

impl SpeechDecoder for WhisperDecoder<'_> {
    fn n_seqs(&self) -> usize {
        self.parts.as_ref().map_or(0, |p| p.kv.n_seqs)
    }

    fn n_past(&self) -> usize {
        self.n_past
    }

    fn step(&mut self, tokens: &[&[u32]]) -> Result<Vec<f32>> {
        let model = self.model;
        let hp = model.hparams;
        let n_past = self.n_past;
        let parts = self.parts()?;
        let n_seqs = parts.kv.n_seqs;
        let m = tokens.first().map_or(0, |t| t.len());
        if tokens.len() != n_seqs || m == 0 || tokens.iter().any(|t| t.len() != m) {
            return Err(ModelError::invalid(
                "tokens",
                format!(
                    "{} sequences of {:?} tokens for {n_seqs} sequences",
                    tokens.len(),
                    tokens.iter().map(|t| t.len()).collect::<Vec<_>>()
                ),
            ));
        }
        if n_past + m > hp.n_text_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: hp.n_text_ctx,
                requested: n_past + m,
            });
        }
        if let Some(&bad) = tokens
            .iter()
            .flat_map(|t| t.iter())
            .find(|&&t| t as usize >= hp.n_vocab)
        {
            return Err(ModelError::invalid(
                "token id",
                format!("{bad} of a vocabulary of {}", hp.n_vocab),
            ));
        }
        let n = n_seqs * m;
        let (ws, host) = parts.workspace(model, n, n_seqs)?;
        let ids: Vec<i32> = tokens
            .iter()
            .flat_map(|t| t.iter().map(|&v| v as i32))
            .collect();
        let pos: Vec<i32> = (0..n).map(|t| (n_past + t % m) as i32).collect();
        let base: Vec<i32> = (0..n).map(|t| (t / m) as i32).collect();
        ws.ids.write_slice(0, &ids)?;
        ws.positions.write_slice(0, &pos)?;
        parts.kv.seq_base.write_slice(0, &base)?;
        parts.run(model, &ws, &host, n, m)?;
        let mut out = vec![0.0f32; n_seqs * hp.n_vocab];
        host.read_slice(0, &mut out)?;
        self.n_past += m;
        Ok(out)
    }

    fn reorder(&mut self, source: &[usize]) -> Result<()> {
        let model = self.model;
        let n_past = self.n_past;
        let parts = self.parts()?;
        if let Some(&bad) = source.iter().find(|&&s| s >= parts.kv.n_seqs) {
            return Err(ModelError::invalid(
                "reorder",
                format!("sequence {bad} of {}", parts.kv.n_seqs),
            ));
        }
        if source.is_empty() {
            return Err(ModelError::invalid("reorder", "no sequences"));
        }
        let epoch = parts.kv.epoch;
        parts.address_queries(model, source.len() * model.hparams.n_text_ctx)?;
        let ctx = model.context().clone();
        parts.kv.reorder(&ctx, model, source, n_past)?;
        if parts.kv.epoch != epoch {
            parts.steps.clear();
        }
        Ok(())
    }

    fn reset(&mut self) {
        self.n_past = 0;
    }
}
