//! `Session`: one sequence on one model — its KV cache, its activation
//! scratch, the tokens it holds and the logits of its last position. Prompts
//! run in batches of up to `n_batch` tokens; a decode step is recorded once
//! and replayed for every token (only the token id and position change, and
//! the kernels read those from host-visible buffers).

use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, HostRows, MemoryKind, Recording};
use crate::kv::{CacheConfig, CacheKind, KVCache, PageStats};
use crate::models::{EmbedRows, GenerativeModel, RowCopy, Scratch};

use super::sampler::Sampler;
use super::stages::Stages;
use crate::ops::topk::{decode_top_k, top_k_bucket, top_k_scratch_bytes};

/// Options of a session (the C API's `combs_session_options`).
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Context size; 0 means the model's training context.
    pub n_ctx: usize,
    /// Cache implementation.
    pub kv_kind: CacheKind,
    /// Rows per page of a paged cache.
    pub page_size: usize,
    /// Pages of the model's pool for `page_size` when this session creates
    /// it (0: derived, see [`CacheConfig::pool_pages`]).
    pub pool_pages: usize,
    /// Most prompt tokens per forward call.
    pub n_batch: usize,
    /// Logit rows one forward call can return at once: 1 for generation; up
    /// to `n_batch` for perplexity (host-visible memory of rows × n_vocab floats).
    pub n_logit_rows: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            n_ctx: 0,
            kv_kind: CacheKind::Contiguous,
            page_size: 256,
            pool_pages: 0,
            n_batch: 512,
            n_logit_rows: 1,
        }
    }
}

/// A recorded decode step that ends in the top-k of its logits.
struct SampleStep {
    k: usize,
    rec: Recording,
    out: Arc<Buffer>,
}

/// Where a session finds the logits of its last position: each kind of
/// step leaves them somewhere else, and only one place is right at a time.
#[derive(Clone)]
enum LastLogits {
    /// In the session's own vector (prompts, split models, nothing yet).
    Own,
    /// In a row of a batched runner's readback buffer, read in place (while
    /// the session holds it, the runner writes its next steps elsewhere).
    Lent(HostRows<f32>),
    /// Still on the device: the step drew its token from its best logits
    /// only ([`Session::decode_sample`],
    /// [`crate::runtime::Model::decode_batch_sample`]), and these are how
    /// many it selected and those (`(token, logit)`, best first).
    Kept(usize, Vec<(u32, f32)>),
    /// In this row of the session's `step_logits` (the buffer, held here
    /// so that a row is never named without it), written by a decode step.
    InPlace(Arc<Buffer>, usize),
}

/// One sequence being evaluated on a model.
pub struct Session {
    model: Arc<dyn GenerativeModel>,
    cache: Box<dyn KVCache>,
    scratch: Scratch,
    /// The decode step, one recording per row of `step_logits` it ends in.
    decode_steps: [Option<Recording>; 2],
    /// Host-visible room for two rows of logits that decode steps write
    /// in turn (made at the first decode): each step's row is read in place
    /// ([`Self::logits`]) while the next step writes the other, so no row
    /// is copied out and a failed step leaves the last logits as they were.
    step_logits: Option<Arc<Buffer>>,
    /// The decode step ending in the top-k of its logits (`decode_sample`),
    /// with the k it selects and its buffers (lists, candidates).
    sample_step: Option<SampleStep>,
    tokens: Vec<u32>,
    /// The last position's logits where [`LastLogits::Own`] says so.
    logits: Vec<f32>,
    /// Where the last position's logits are.
    last: LastLogits,
    n_batch: usize,
    /// Staging of caller-given input rows of one forward call (made on
    /// first use, `n_batch` rows of `n_embd`).
    embed_rows: Option<Arc<Buffer>>,
    /// The devices after the first of a model split by layers (`cache`,
    /// `scratch` and `decode_steps` above are the first device's then).
    split: Option<Stages>,
}

impl Session {
    /// Creates a session with its own KV cache.
    ///
    /// # Errors
    /// Out of device memory, or invalid options.
    pub fn new(model: Arc<dyn GenerativeModel>, opts: &SessionOptions) -> Result<Self> {
        let spec = model.spec();
        let n_ctx = if opts.n_ctx == 0 {
            spec.n_ctx_train
        } else {
            opts.n_ctx
        };
        if n_ctx == 0 || n_ctx > (1 << 24) {
            return Err(ModelError::invalid(
                "n_ctx",
                format!("{n_ctx} is out of range"),
            ));
        }
        if opts.page_size == 0 {
            return Err(ModelError::invalid("page_size", "must be positive"));
        }
        let n_batch = opts.n_batch.clamp(1, 4096).min(n_ctx);
        let cfg = CacheConfig {
            n_ctx,
            kind: opts.kv_kind,
            page_size: opts.page_size,
            pool_pages: opts.pool_pages,
            max_batch: n_batch,
        };
        let logit_rows = opts.n_logit_rows.clamp(1, n_batch);
        let split = match model.stages() {
            Some(stages) => Some(
                Stages::new(stages, &cfg, n_batch, logit_rows)
                    .map_err(|e| name_memory(e, "later devices of a new session".into()))?,
            ),
            None => None,
        };
        let first = split.as_ref().map_or(&model, |s| s.first());
        let cache = first.create_kv_cache(&cfg).map_err(|e| {
            name_memory(
                e,
                format!(
                    "KV cache of a new session ({n_ctx} positions, {:?})",
                    opts.kv_kind
                ),
            )
        })?;
        // Logits come from the last device of a split.
        let first_rows = if split.is_some() { 1 } else { logit_rows };
        let scratch = first
            .create_scratch(n_batch, first_rows)
            .map_err(|e| name_memory(e, format!("scratch of a new session (batch {n_batch})")))?;
        Ok(Session {
            logits: vec![0.0; spec.n_vocab],
            last: LastLogits::Own,
            model,
            cache,
            scratch,
            decode_steps: [None, None],
            step_logits: None,
            sample_step: None,
            tokens: Vec::new(),
            n_batch,
            embed_rows: None,
            split,
        })
    }

    /// The model that records the first device's share of each call: the
    /// model itself on one device.
    fn first_model(&self) -> &Arc<dyn GenerativeModel> {
        self.split.as_ref().map_or(&self.model, |s| s.first())
    }

    /// The model.
    pub fn model(&self) -> &Arc<dyn GenerativeModel> {
        &self.model
    }

    /// Context size.
    pub fn n_ctx(&self) -> usize {
        self.cache.n_ctx()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens held, in order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Logits of the last position evaluated (`n_vocab` floats); empty
    /// after a batched step that sampled on the device
    /// ([`crate::runtime::Model::decode_batch_sample`]), whose logits were
    /// never read back.
    pub fn logits(&self) -> &[f32] {
        match &self.last {
            LastLogits::Own => &self.logits,
            LastLogits::Kept(..) => &[],
            LastLogits::Lent(rows) => rows.as_slice().unwrap_or(&[]),
            LastLogits::InPlace(buf, row) => {
                let n_vocab = self.logits.len();
                // SAFETY: only `Self::decode` (through `&mut self`, so not
                // while this borrow lives) submits work writing `buf`, and
                // it writes the other row.
                unsafe { buf.host_slice::<f32>((row * n_vocab * 4) as u64, n_vocab) }.unwrap_or(&[])
            }
        }
    }

    /// Bytes of device memory of the KV cache.
    pub fn cache_bytes(&self) -> u64 {
        self.cache.device_bytes() + self.split.as_ref().map_or(0, Stages::cache_bytes)
    }

    /// Most tokens one forward call evaluates.
    fn chunk_len(&self) -> usize {
        self.n_batch.min(self.cache.max_call_tokens()).max(1)
    }

    /// Usage of the page pool of a paged session (`None` for a contiguous one).
    pub fn page_stats(&self) -> Option<PageStats> {
        self.cache.page_stats()
    }

    /// A new session holding the same tokens and logits. A paged session's
    /// fork shares its pages (each is copied only when one of the two writes
    /// into it); a contiguous one copies its cache.
    ///
    /// # Errors
    /// Out of device memory.
    pub fn fork(&self) -> Result<Session> {
        let scratch = self
            .first_model()
            .create_scratch(self.n_batch, self.scratch.max_logit_rows())?;
        let split = match &self.split {
            Some(s) => Some(s.fork()?),
            None => None,
        };
        // The fork has no step rows of its own yet: logits read in place
        // become its own.
        let (logits, last) = match &self.last {
            LastLogits::InPlace(..) => (self.logits().to_vec(), LastLogits::Own),
            other => (self.logits.clone(), other.clone()),
        };
        Ok(Session {
            model: self.model.clone(),
            cache: self.cache.fork()?,
            scratch,
            decode_steps: [None, None],
            step_logits: None,
            sample_step: None,
            tokens: self.tokens.clone(),
            logits,
            last,
            n_batch: self.n_batch,
            embed_rows: None,
            split,
        })
    }

    /// The KV cache.
    pub(crate) fn cache(&self) -> &dyn KVCache {
        self.cache.as_ref()
    }

    /// The KV cache, to reserve and commit positions in a batched call.
    pub(crate) fn cache_mut(&mut self) -> &mut dyn KVCache {
        self.cache.as_mut()
    }

    /// Takes the outcome of a batched forward call: `tokens` were evaluated
    /// (their positions already committed to the cache) and `logits` are
    /// those of the last one.
    pub(crate) fn accept_batch(&mut self, tokens: &[u32], s: &Scratch, row: usize) -> Result<()> {
        // Straight from the batch's readback buffer into this session's
        // logits: one copy of the row.
        read_logit_row(self.model.as_ref(), s, row, &mut self.logits)?;
        self.last = LastLogits::Own;
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// [`Self::accept_batch`] with the logits left where the step wrote
    /// them, read in place until this session's next evaluation.
    pub(crate) fn accept_batch_lent(&mut self, tokens: &[u32], logits: HostRows<f32>) {
        self.last = LastLogits::Lent(logits);
        self.tokens.extend_from_slice(tokens);
    }

    /// Takes the outcome of a batched decode step that sampled on the
    /// device: `tokens` were evaluated, their logits not read back.
    pub(crate) fn accept_batch_sampled(
        &mut self,
        tokens: &[u32],
        k: usize,
        candidates: Vec<(u32, f32)>,
    ) {
        self.last = LastLogits::Kept(k, candidates);
        self.tokens.extend_from_slice(tokens);
    }

    /// Draws a token with `sampler` from the last step's logits, or, after
    /// a step that sampled on the device, from the candidates it selected
    /// (the same draw, when they are as many as the sampler needs).
    ///
    /// # Errors
    /// After a device-sampled step, a sampler needing more of the row than
    /// that step selected (a chain without top-k, a larger top-k).
    pub fn sample(&self, sampler: &mut Sampler) -> Result<u32> {
        let LastLogits::Kept(k, list) = &self.last else {
            return Ok(sampler.sample(self.logits()));
        };
        match sampler.candidates_needed() {
            Some(need) if need <= *k => Ok(sampler.sample_candidates(list)),
            _ => Err(ModelError::invalid(
                "sampler",
                format!(
                    "the session's last step sampled on the device and kept its {k} best \
                     logits only; this sampler needs more (evaluate a token first)"
                ),
            )),
        }
    }

    pub(crate) fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let n_vocab = self.model.spec().n_vocab;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::TokenOutOfRange {
                token: i64::from(t),
                n_vocab,
            });
        }
        if self.tokens.len() + tokens.len() > self.cache.n_ctx() {
            return Err(ModelError::ContextFull {
                n_ctx: self.cache.n_ctx(),
                requested: self.tokens.len() + tokens.len(),
            });
        }
        Ok(())
    }

    fn write_inputs(&self, tokens: &[u32], pos0: usize) -> Result<()> {
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (0..tokens.len()).map(|i| (pos0 + i) as i32).collect();
        self.scratch.ids().write_slice(0, &ids)?;
        self.scratch.positions().write_slice(0, &pos)?;
        match &self.split {
            Some(s) => s.write_positions(&pos),
            None => Ok(()),
        }
    }

    /// Reserves room for `n` more positions on every device.
    fn reserve(&mut self, n: usize) -> Result<()> {
        self.cache.reserve(n)?;
        match &mut self.split {
            Some(s) => s.reserve(n),
            None => Ok(()),
        }
    }

    /// Commits `n` positions on every device.
    fn commit(&mut self, n: usize) {
        self.cache.commit(n);
        if let Some(s) = &mut self.split {
            s.commit(n);
        }
    }

    /// Evaluates `tokens` after what the session holds; afterwards
    /// [`Session::logits`] are those of the last token.
    ///
    /// # Errors
    /// Token out of range or context full (nothing is evaluated then), or a device error.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<()> {
        self.prefill_with_embeddings(tokens, &[])
    }

    /// Evaluates `tokens` as [`Session::prefill`], with the input vectors
    /// of the positions each of `rows` covers (`rows[i].pos` counted from
    /// the start of `tokens`) taken from it instead of the token embedding
    /// table — an image's embeddings at its `<image>` tokens. The tokens
    /// there are still what the session holds. A span may cross the
    /// boundary between two forward calls of a long prompt.
    ///
    /// A rewind that re-evaluates positions (a sliding-window cache rewound
    /// past its ring) evaluates them from their tokens alone.
    ///
    /// # Errors
    /// Spans outside `tokens`, overlapping, empty or not whole rows of
    /// `n_embd`, non-finite values, and the errors of [`Session::prefill`].
    pub fn prefill_with_embeddings(
        &mut self,
        tokens: &[u32],
        rows: &[EmbedRows<'_>],
    ) -> Result<()> {
        self.check_tokens(tokens)?;
        let spans = self.check_spans(tokens.len(), rows)?;
        let start = self.tokens.len();
        let multi = tokens.len() > self.chunk_len();
        // What a failed prompt restores: where the logits were, and the
        // session's own vector when they were there (the chunks between
        // overwrite only that; a lent or in-place row stays held by the
        // saved place, and only decode steps write the step rows).
        let saved = multi.then(|| {
            let own = match self.last {
                LastLogits::Own => self.logits.clone(),
                _ => Vec::new(),
            };
            (self.last.clone(), own)
        });
        let chunk_len = self.chunk_len();
        for (ic, chunk) in tokens.chunks(chunk_len).enumerate() {
            let first = ic * chunk_len;
            let result = self.forward_chunk_with(chunk, None, &spans, first);
            if let Err(e) = result {
                // A prompt is evaluated whole or not at all (e.g. when the
                // page pool runs out part way through a long one).
                if let Some((last, own)) = saved {
                    let _ = self.rewind(start);
                    if matches!(last, LastLogits::Own) {
                        self.logits = own;
                    }
                    self.last = last;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Evaluates `tokens` and returns the logits of every one of them
    /// (`tokens.len() × n_vocab`, row-major) — what perplexity needs.
    ///
    /// # Errors
    /// As [`Session::prefill`].
    pub fn prefill_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let n_vocab = self.model.spec().n_vocab;
        let mut out = vec![0.0f32; tokens.len() * n_vocab];
        let mut done = 0;
        for chunk in tokens.chunks(self.chunk_len()) {
            let dst = &mut out[done * n_vocab..(done + chunk.len()) * n_vocab];
            self.forward_chunk(chunk, Some(dst))?;
            done += chunk.len();
        }
        Ok(out)
    }

    /// `rows` sorted by position, each checked.
    fn check_spans<'r>(
        &self,
        n_tokens: usize,
        rows: &[EmbedRows<'r>],
    ) -> Result<Vec<EmbedRows<'r>>> {
        let d = self.model.spec().n_embd;
        let mut spans = rows.to_vec();
        spans.sort_by_key(|r| r.pos);
        let mut end = 0;
        for r in &spans {
            let n = r.data.len() / d.max(1);
            if r.data.is_empty() || r.data.len() % d != 0 {
                return Err(ModelError::invalid(
                    "embedding rows",
                    format!("{} floats are not whole rows of {d}", r.data.len()),
                ));
            }
            if r.pos < end || r.pos + n > n_tokens {
                return Err(ModelError::invalid(
                    "embedding rows",
                    format!(
                        "rows {}..{} overlap others or pass the {n_tokens} tokens",
                        r.pos,
                        r.pos + n
                    ),
                ));
            }
            if r.data.iter().any(|v| !v.is_finite()) {
                return Err(ModelError::invalid("embedding rows", "non-finite values"));
            }
            end = r.pos + n;
        }
        Ok(spans)
    }

    /// Writes the parts of `spans` inside the call of tokens
    /// `first..first + n` to the staging buffer and returns their copies.
    fn stage_rows(
        &mut self,
        spans: &[EmbedRows<'_>],
        first: usize,
        n: usize,
    ) -> Result<Vec<RowCopy>> {
        let d = self.model.spec().n_embd;
        let mut copies = Vec::new();
        let mut staged = 0;
        for r in spans {
            let (a, b) = (r.pos.max(first), (r.pos + r.data.len() / d).min(first + n));
            if a >= b {
                continue;
            }
            if self.embed_rows.is_none() {
                let bytes = (4 * self.n_batch * d) as u64;
                let ctx = self.model.context();
                self.embed_rows = Some(Buffer::new(
                    ctx,
                    bytes,
                    MemoryKind::Upload,
                    "embedding rows",
                )?);
            }
            let buf = self
                .embed_rows
                .as_ref()
                .ok_or_else(|| ModelError::Internal("embedding rows missing".into()))?;
            let src = &r.data[(a - r.pos) * d..(b - r.pos) * d];
            buf.write_slice((4 * staged * d) as u64, src)?;
            copies.push(RowCopy {
                src_row: staged,
                dst_row: a - first,
                rows: b - a,
            });
            staged += b - a;
        }
        Ok(copies)
    }

    fn forward_chunk(&mut self, chunk: &[u32], all_logits: Option<&mut [f32]>) -> Result<()> {
        self.forward_chunk_with(chunk, all_logits, &[], 0)
    }

    fn forward_chunk_with(
        &mut self,
        chunk: &[u32],
        all_logits: Option<&mut [f32]>,
        spans: &[EmbedRows<'_>],
        first: usize,
    ) -> Result<()> {
        let n = chunk.len();
        let pos0 = self.tokens.len();
        let inputs = crate::gpu::phases::time(crate::gpu::phases::Phase::Inputs);
        let copies = self.stage_rows(spans, first, n)?;
        self.reserve(n)?;
        self.write_inputs(chunk, pos0)?;
        drop(inputs);
        self.prepare_pipelines(n);
        let model = self.first_model().clone();
        let ctx = model.context().clone();
        let recording = crate::gpu::phases::time(crate::gpu::phases::Phase::Record);
        // One device: the GPU starts on the call while the rest is recorded
        // (a split hands the recording from stage to stage instead).
        let mut rec = if self.split.is_none() {
            Recording::streaming(&ctx)?
        } else {
            Recording::new(&ctx, false)?
        };
        model.record_embed(&mut rec, &self.scratch, n)?;
        if let (false, Some(src)) = (copies.is_empty(), self.embed_rows.as_ref()) {
            model.record_put_rows(&mut rec, &self.scratch, n, src, &copies)?;
        }
        let mut logits = std::mem::take(&mut self.logits);
        let done = match &mut self.split {
            None => {
                model.record_blocks(&mut rec, &self.scratch, self.cache.as_ref(), n)?;
                let call = (model.as_ref(), &self.scratch, n);
                finish_call(rec, recording, call, all_logits, &mut logits)
            }
            Some(split) => {
                let rec = split.run_call(rec, self.cache.as_ref(), &self.scratch, n)?;
                let scratch = split
                    .head_scratch()
                    .ok_or_else(|| ModelError::Internal("split without a last stage".into()))?;
                let call = (split.head().as_ref(), scratch, n);
                finish_call(rec, recording, call, all_logits, &mut logits)
            }
        };
        self.logits = logits;
        done?;
        self.last = LastLogits::Own;
        self.commit(n);
        self.tokens.extend_from_slice(chunk);
        Ok(())
    }

    /// Before the first call of `n` tokens on a GPU (of any session of this
    /// model with such a cache): records it once as a survey ([`Recording::survey`]) and creates the pipelines it uses on
    /// several threads at once — with the first prompt, those of a decode
    /// step too — instead of one after another as recording meets them.
    /// On a cold driver cache that is most of the time to first token (an
    /// 8B: 2.4 s of 3.5). Best effort: a survey that fails leaves the real
    /// recording to report the error.
    fn prepare_pipelines(&mut self, n: usize) {
        let ctx = self.model.context().clone();
        if self.split.is_some() || ctx.caps().class() != crate::gpu::DeviceClass::Gpu {
            return;
        }
        // Another session on this model with a cache like this one's
        // surveyed the same call already (the key only saves work: a
        // collision costs pipelines created one after another, as before).
        let key = |m: usize| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (Arc::as_ptr(&self.model) as *const () as usize).hash(&mut h);
            self.cache.kind().hash(&mut h);
            self.cache.device_bytes().hash(&mut h);
            m.hash(&mut h);
            h.finish()
        };
        if !ctx.claim_survey(key(n)) {
            return;
        }
        let _t = crate::gpu::phases::time(crate::gpu::phases::Phase::Survey);
        let Ok(mut survey) = Recording::survey(&ctx) else {
            return;
        };
        let model = self.model.clone();
        let mut calls = vec![n];
        if n > 1 && self.decode_steps[0].is_none() && ctx.claim_survey(key(1)) {
            calls.push(1);
        }
        for &m in &calls {
            // Errors here are the real recording's to report.
            let _ = model.record_embed(&mut survey, &self.scratch, m);
            let _ = model.record_blocks(&mut survey, &self.scratch, self.cache.as_ref(), m);
            let _ = model.record_logits(&mut survey, &self.scratch, m - 1, 1, 0);
        }
        let _ = survey.create_surveyed_pipelines();
    }

    /// Evaluates one token and draws the next with `sampler` (which
    /// remembers it). Where the sampler's draw depends only on the best few
    /// logits ([`Sampler::candidates_needed`]), the device selects them and
    /// only those are read: [`Self::logits`] is then empty until the next
    /// evaluation. Otherwise the row is read and sampled as
    /// [`Sampler::sample`] does; the token is the same either way.
    ///
    /// # Errors
    /// As [`Self::decode`].
    pub fn decode_sample(&mut self, token: u32, sampler: &mut Sampler) -> Result<u32> {
        let k = sampler.candidates_needed().and_then(top_k_bucket);
        let Some(k) = k.filter(|_| self.split.is_none() && self.model.selects_logits()) else {
            self.decode(token)?;
            return Ok(sampler.sample(self.logits()));
        };
        self.begin_token(token)?;
        if self.sample_step.as_ref().is_none_or(|st| st.k != k) {
            self.sample_step = None;
            let ctx = self.model.context().clone();
            let n_vocab = self.model.spec().n_vocab;
            let lists = Buffer::new(
                &ctx,
                top_k_scratch_bytes(&ctx, 1, n_vocab, k),
                MemoryKind::Device,
                "top-k lists",
            )?;
            let out = Buffer::new(
                &ctx,
                (k * 8) as u64,
                MemoryKind::Readback,
                "top-k candidates",
            )?;
            let rec = self
                .record_token_step(|m, rec, s| m.record_logits_top_k(rec, s, 1, k, &lists, &out))?;
            self.sample_step = Some(SampleStep { k, rec, out });
        }
        let step = self
            .sample_step
            .as_mut()
            .ok_or_else(|| ModelError::Internal("sample step missing".into()))?;
        step.rec.submit_and_wait()?;
        let mut words = vec![0u32; k * 2];
        step.out.read_slice(0, &mut words)?;
        let list = decode_top_k(&words);
        let t = sampler.sample_candidates(&list);
        self.last = LastLogits::Kept(k, list);
        self.cache.commit(1);
        self.tokens.push(token);
        Ok(t)
    }

    /// Checks `token`, reserves its position and writes the step's inputs.
    fn begin_token(&mut self, token: u32) -> Result<()> {
        self.check_tokens(&[token])?;
        let pos = self.tokens.len();
        self.reserve(1)?;
        self.write_inputs(&[token], pos)
    }

    /// Records a one-token step on the first device: the embedding, the
    /// blocks, and `head` (how the step ends: the logits, or their top-k).
    fn record_token_step(
        &mut self,
        head: impl FnOnce(&dyn GenerativeModel, &mut Recording, &Scratch) -> Result<()>,
    ) -> Result<Recording> {
        self.prepare_pipelines(1);
        let mut rec = Recording::new(self.model.context(), false)?;
        self.model.record_embed(&mut rec, &self.scratch, 1)?;
        self.model
            .record_blocks(&mut rec, &self.scratch, self.cache.as_ref(), 1)?;
        head(self.model.as_ref(), &mut rec, &self.scratch)?;
        rec.finish()?;
        Ok(rec)
    }

    /// Evaluates one token (a replay of the recorded decode step).
    ///
    /// # Errors
    /// Token out of range, context full, or a device error.
    pub fn decode(&mut self, token: u32) -> Result<()> {
        self.begin_token(token)?;
        if let Some(split) = &mut self.split {
            split.decode(self.cache.as_ref(), &self.scratch)?;
            let scratch = split
                .head_scratch()
                .ok_or_else(|| ModelError::Internal("split without a last stage".into()))?;
            read_logit_row(self.model.as_ref(), scratch, 0, &mut self.logits)?;
            self.last = LastLogits::Own;
            self.commit(1);
            self.tokens.push(token);
            return Ok(());
        }
        // The row the last decode step left alone.
        let row = match self.last {
            LastLogits::InPlace(_, r) => 1 - r,
            _ => 0,
        };
        let dst = match &self.step_logits {
            Some(b) => b.clone(),
            None => {
                let bytes = 2 * 4 * self.model.spec().n_vocab as u64;
                let b = Buffer::new(
                    self.model.context(),
                    bytes,
                    MemoryKind::Readback,
                    "step logits",
                )?;
                self.step_logits = Some(b.clone());
                b
            }
        };
        if self.decode_steps[row].is_none() {
            let rec =
                self.record_token_step(|m, rec, s| m.record_logits_to(rec, s, 0, 1, &dst, row))?;
            self.decode_steps[row] = Some(rec);
        }
        let step = self.decode_steps[row]
            .as_mut()
            .ok_or_else(|| ModelError::Internal("decode step missing".into()))?;
        step.submit_and_wait()?;
        self.last = LastLogits::InPlace(dst, row);
        self.cache.commit(1);
        self.tokens.push(token);
        Ok(())
    }

    /// Keeps the first `n_keep` positions and forgets the rest. Where a
    /// sliding-window layer's ring already overwrote rows the kept positions
    /// need (a rewind further back than one batch on a windowed cache), the
    /// kept tokens are evaluated again; the logits are then those of the last
    /// kept token.
    ///
    /// # Errors
    /// `n_keep` past the current length; device errors while re-evaluating.
    pub fn rewind(&mut self, n_keep: usize) -> Result<()> {
        if n_keep > self.tokens.len() {
            return Err(ModelError::invalid(
                "n_keep",
                format!("{n_keep} is past the {} positions held", self.tokens.len()),
            ));
        }
        let mut intact = self.cache.truncate(n_keep)?;
        if let Some(s) = &mut self.split {
            let later = s.truncate(n_keep)?;
            if later < intact {
                intact = self.cache.truncate(later)?;
            }
            // Every device holds the same positions again.
            if intact < later {
                s.truncate(intact)?;
            }
        }
        let redo = self.tokens[intact..n_keep].to_vec();
        self.tokens.truncate(intact);
        if !redo.is_empty() {
            self.prefill(&redo)?;
        }
        Ok(())
    }

    /// Forgets everything (same as `rewind(0)`).
    pub fn clear(&mut self) {
        let _ = self.rewind(0);
    }
}

/// Records the logits of a call of `n` tokens whose blocks `rec` holds
/// (on `model`'s device, over `s`: `call`), runs it and reads them: the
/// last row into `logits`, and every row into `all_logits` where given.
/// `recording` (the phase timer of the recording) ends when `rec` is
/// finished.
fn finish_call<T>(
    mut rec: Recording,
    recording: T,
    call: (&dyn GenerativeModel, &Scratch, usize),
    all_logits: Option<&mut [f32]>,
    logits: &mut [f32],
) -> Result<()> {
    let (model, s, n) = call;
    match all_logits {
        None => {
            model.record_logits(&mut rec, s, n - 1, 1, 0)?;
            rec.finish()?;
            drop(recording);
            rec.submit_and_wait()?;
            let _t = crate::gpu::phases::time(crate::gpu::phases::Phase::Readout);
            read_logit_row(model, s, 0, logits)
        }
        Some(dst) => {
            rec.finish()?;
            drop(recording);
            rec.submit_and_wait()?;
            let n_vocab = model.spec().n_vocab;
            let per = s.max_logit_rows().max(1);
            let rows_per_call = per.min(n);
            let mut first = 0;
            while first < n {
                let rows = rows_per_call.min(n - first);
                let mut r = Recording::new(model.context(), false)?;
                model.record_logits(&mut r, s, first, rows, 0)?;
                r.finish()?;
                r.submit_and_wait()?;
                for i in 0..rows {
                    let row = &mut dst[(first + i) * n_vocab..(first + i + 1) * n_vocab];
                    read_logit_row(model, s, i, row)?;
                }
                first += rows;
            }
            logits.copy_from_slice(&dst[(n - 1) * n_vocab..n * n_vocab]);
            Ok(())
        }
    }
}

/// Reads row `row` of `s.logits` into `out`.
///
/// # Errors
/// A row outside the buffer.
pub(crate) fn read_logit_row(
    model: &dyn GenerativeModel,
    s: &Scratch,
    row: usize,
    out: &mut [f32],
) -> Result<()> {
    let n_vocab = model.spec().n_vocab;
    s.logits.read_slice((row * n_vocab * 4) as u64, out)
}

/// Wraps an out-of-memory error in what was being built, so that the message
/// names the cache or scratch and not only one of its buffers; other errors
/// pass unchanged.
fn name_memory(e: ModelError, what: String) -> ModelError {
    match e.root() {
        ModelError::OutOfDeviceMemory { .. } | ModelError::MemoryBudget { .. } => e.context(what),
        _ => e,
    }
}
