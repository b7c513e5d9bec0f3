//! `BatchRunner`: several sessions of one model evaluated in one forward pass.
//! Their tokens go through every linear layer together (one read of the
//! weights serves all sequences: matrix-vector products become skinny
//! matrix-matrix products), and attention reads each token's keys through its
//! own sequence's page table. Sessions must be paged and share one page pool.
//!
//! A decode step of N sequences is recorded once per N and replayed: token
//! ids, positions, page tables and table offsets are read from host-visible
//! buffers the runner rewrites before each submission.

use std::collections::HashMap;
use std::sync::Arc;

use super::sampler::Sampler;
use super::session::Session;
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, LentBuffer, MemoryKind, Recording};
use crate::kv::{PagePool, PagedBatchView};
use crate::models::{GenerativeModel, Scratch};
use crate::ops::topk::{decode_top_k, top_k_bucket, top_k_scratch_bytes};

/// Most tokens one batched forward pass carries (longer prompts are split).
const MAX_PASS_TOKENS: usize = 512;

/// One session's share of a forward pass: tokens `start..start + len` of its list.
#[derive(Clone, Copy)]
struct Segment {
    session: usize,
    start: usize,
    len: usize,
}

/// Most readback buffers a runner lends: two alternate while the same
/// sessions step together; a third covers a session that sat out a step.
/// Past that, logits are copied into the sessions.
const MAX_SLABS: usize = 3;

/// The buffers of sampling steps' top-k: the first pass's lists on the
/// device and the candidates the host reads, for up to `rows` sequences of
/// up to `k` candidates.
struct TopKBuffers {
    scratch: Arc<Buffer>,
    out: Arc<Buffer>,
    rows: usize,
    k: usize,
}

/// What a pass leaves for the host.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PassOutput {
    /// Each session's logits.
    Logits,
    /// The best `k` logits of each sequence (decode steps only).
    TopK(usize),
}

/// Each session's next token drawn by its sampler from its whole row of
/// logits (after a step that read them back).
pub(crate) fn sample_rows(sessions: &[&mut Session], samplers: &mut [&mut Sampler]) -> Vec<u32> {
    samplers
        .iter_mut()
        .zip(sessions)
        .map(|(sm, s)| sm.sample(s.logits()))
        .collect()
}

/// Buffers and recorded decode steps for batched calls on one model.
pub struct BatchRunner {
    model: Arc<dyn GenerativeModel>,
    scratch: Option<Scratch>,
    /// The page tables of a pass's sequences, one after the other (i32).
    page_table: Option<Arc<Buffer>>,
    /// Per token, the start of its sequence's table in `page_table` (i32).
    seq_base: Option<Arc<Buffer>>,
    /// The sliding-window ring tables of a pass's sequences (i32).
    ring_table: Option<Arc<Buffer>>,
    /// Per token, the start of its sequence's table in `ring_table` (i32).
    ring_base: Option<Arc<Buffer>>,
    /// Recorded decode steps by number of sequences and context size (which
    /// picks LongRoPE factors), valid for `pool` and the buffers above.
    steps: HashMap<(usize, usize, usize), Recording>,
    pool: Option<Arc<PagePool>>,
    /// Readback buffers of decode steps' logits, lent to the sessions (no
    /// copy of 16 × 128k floats per step): the runner writes only those no
    /// session holds rows of.
    slabs: Vec<LentBuffer>,
    /// The top-k buffers of sampling steps, once one ran.
    top_k: Option<TopKBuffers>,
    /// Record passes with GPU timestamps (not replayed), for profiling.
    timestamps: bool,
    /// The last pass's recording, when it had timestamps.
    last: Option<Recording>,
}

impl BatchRunner {
    /// A runner for sessions of `model`; buffers are made on first use.
    pub fn new(model: Arc<dyn GenerativeModel>) -> Self {
        BatchRunner {
            model,
            scratch: None,
            page_table: None,
            seq_base: None,
            ring_table: None,
            ring_base: None,
            steps: HashMap::new(),
            pool: None,
            slabs: Vec::new(),
            top_k: None,
            timestamps: false,
            last: None,
        }
    }

    /// Records each pass afresh with GPU timestamps around every dispatch
    /// (slower: for profiling), or goes back to replaying recorded steps.
    pub fn set_timestamps(&mut self, on: bool) {
        self.timestamps = on;
        self.last = None;
    }

    /// GPU milliseconds per kernel of the last pass, largest first, when
    /// [`Self::set_timestamps`] was on for it.
    ///
    /// # Errors
    /// No timed pass yet, or the timestamp queries failed.
    pub fn last_profile(&self) -> Result<Vec<(String, f64)>> {
        let rec = self
            .last
            .as_ref()
            .ok_or_else(|| ModelError::invalid("profile", "no pass ran with timestamps"))?;
        Ok(rec
            .profile()?
            .into_iter()
            .map(|(k, ns)| (k, ns / 1e6))
            .collect())
    }

    /// Evaluates `tokens[i]` after what `sessions[i]` holds, for all sessions
    /// in one forward pass (several when there are more sessions than one
    /// pass takes). Afterwards each session's logits are those of its token.
    ///
    /// # Errors
    /// Sessions of another model, not paged, or on different pools; a token
    /// out of range or a full context (nothing is evaluated then); an
    /// exhausted page pool (no session changes); device errors.
    pub fn decode(&mut self, sessions: &mut [&mut Session], tokens: &[u32]) -> Result<()> {
        if sessions.len() != tokens.len() {
            return Err(ModelError::invalid(
                "tokens",
                format!("{} tokens for {} sessions", tokens.len(), sessions.len()),
            ));
        }
        let lists: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
        if let ([s], [t]) = (&mut *sessions, tokens) {
            // One sequence: its own recorded step, whose single-token
            // kernels fold the norms, rope and gated activation.
            self.check(std::slice::from_ref(s), &lists)?;
            return s.decode(*t);
        }
        self.run(sessions, &lists, PassOutput::Logits).map(drop)
    }

    /// Evaluates `tokens[i]` after what `sessions[i]` holds, as
    /// [`Self::decode`], and draws each session's next token with
    /// `samplers[i]` (which remembers it). Where every sampler's draw
    /// depends only on the best few logits of its row (a top-k or greedy
    /// chain, [`Sampler::candidates_needed`]), the device selects them and
    /// only those cross to the host: each session's logits are then not
    /// available ([`Session::logits`] is empty until its next evaluation).
    /// Otherwise the whole rows are read and sampled as [`Sampler::sample`]
    /// does. Either way the tokens are the same. One session takes its own
    /// step ([`Session::decode_sample`]).
    ///
    /// # Errors
    /// As [`Self::decode`]; a sampler count other than the session count.
    pub fn decode_sample(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
        samplers: &mut [&mut Sampler],
    ) -> Result<Vec<u32>> {
        if samplers.len() != sessions.len() {
            return Err(ModelError::invalid(
                "samplers",
                format!(
                    "{} samplers for {} sessions",
                    samplers.len(),
                    sessions.len()
                ),
            ));
        }
        let k = samplers
            .iter()
            .map(|s| s.candidates_needed())
            .collect::<Option<Vec<usize>>>()
            .and_then(|v| v.into_iter().max())
            .and_then(top_k_bucket);
        if let ([s], [t], [sm]) = (&mut *sessions, tokens, &mut *samplers) {
            self.check(std::slice::from_ref(s), &[std::slice::from_ref(t)])?;
            return Ok(vec![s.decode_sample(*t, sm)?]);
        }
        match k {
            Some(k) if self.model.selects_logits() => {
                if sessions.len() != tokens.len() {
                    return Err(ModelError::invalid(
                        "tokens",
                        format!("{} tokens for {} sessions", tokens.len(), sessions.len()),
                    ));
                }
                let lists: Vec<&[u32]> = tokens.iter().map(std::slice::from_ref).collect();
                let cands = self.run(sessions, &lists, PassOutput::TopK(k))?;
                Ok(samplers
                    .iter_mut()
                    .zip(&cands)
                    .map(|(s, c)| s.sample_candidates(c))
                    .collect())
            }
            _ => {
                self.decode(sessions, tokens)?;
                Ok(sample_rows(sessions, samplers))
            }
        }
    }

    /// Evaluates `prompts[i]` after what `sessions[i]` holds, packing the
    /// prompts into as few forward passes as fit. Afterwards each session's
    /// logits are those of its prompt's last token. Empty prompts leave their
    /// session as it was.
    ///
    /// # Errors
    /// As [`BatchRunner::decode`].
    pub fn prefill(&mut self, sessions: &mut [&mut Session], prompts: &[&[u32]]) -> Result<()> {
        if sessions.len() != prompts.len() {
            return Err(ModelError::invalid(
                "prompts",
                format!("{} prompts for {} sessions", prompts.len(), sessions.len()),
            ));
        }
        self.run(sessions, prompts, PassOutput::Logits).map(drop)
    }

    fn check(&self, sessions: &[&mut Session], lists: &[&[u32]]) -> Result<Arc<PagePool>> {
        let mut pool: Option<Arc<PagePool>> = None;
        for (i, (s, list)) in sessions.iter().zip(lists).enumerate() {
            let at = |e: ModelError| e.context(format!("session {i} of the batch"));
            if !Arc::ptr_eq(s.model(), &self.model) {
                return Err(at(ModelError::invalid(
                    "sessions",
                    "belongs to another model",
                )));
            }
            let paged = s.cache().as_paged().ok_or_else(|| {
                at(ModelError::invalid(
                    "sessions",
                    "has a contiguous KV cache; batched calls need paged sessions",
                ))
            })?;
            match &pool {
                None => pool = Some(paged.pool().clone()),
                Some(p) if !Arc::ptr_eq(p, paged.pool()) => {
                    return Err(at(ModelError::invalid(
                        "sessions",
                        "uses another page pool (page size) than session 0",
                    )));
                }
                Some(_) => {}
            }
            if !self.model.same_rope(s.n_ctx(), sessions[0].n_ctx()) {
                return Err(at(ModelError::invalid(
                    "sessions",
                    format!(
                        "n_ctx {} selects other rope factors than session 0's {}",
                        s.n_ctx(),
                        sessions[0].n_ctx()
                    ),
                )));
            }
            s.check_tokens(list).map_err(at)?;
        }
        pool.ok_or_else(|| ModelError::invalid("sessions", "no sessions given"))
    }

    /// Evaluates the lists in passes; with [`PassOutput::TopK`], returns
    /// each session's candidates (empty lists otherwise).
    fn run(
        &mut self,
        sessions: &mut [&mut Session],
        lists: &[&[u32]],
        output: PassOutput,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        let mut cands = vec![Vec::new(); sessions.len()];
        if sessions.is_empty() {
            return Ok(cands);
        }
        let pool = self.check(sessions, lists)?;
        if !self.pool.as_ref().is_some_and(|p| Arc::ptr_eq(p, &pool)) {
            self.steps.clear();
            self.pool = Some(pool.clone());
        }
        let rows_cap = self.logit_rows_cap()?;
        let mut done = vec![0usize; lists.len()];
        loop {
            // Pack the next pass: sessions in order, each with as much of its
            // remaining list as still fits.
            let mut segs = Vec::new();
            let mut n_tok = 0;
            for (i, list) in lists.iter().enumerate() {
                let left = list.len() - done[i];
                if left == 0 || n_tok == MAX_PASS_TOKENS || segs.len() == rows_cap {
                    continue;
                }
                let len = left
                    .min(MAX_PASS_TOKENS - n_tok)
                    .min(sessions[i].cache().max_call_tokens());
                segs.push(Segment {
                    session: i,
                    start: done[i],
                    len,
                });
                n_tok += len;
            }
            if segs.is_empty() {
                return Ok(cands);
            }
            self.pass(sessions, lists, &segs, &pool, output, &mut cands)?;
            for sg in &segs {
                done[sg.session] += sg.len;
            }
        }
    }

    /// A slab no session reads from, made if there are fewer than
    /// [`MAX_SLABS`]; `None` when all are lent.
    fn free_slab(slabs: &mut Vec<LentBuffer>, scratch: &Scratch) -> Result<Option<usize>> {
        if let Some(i) = slabs.iter().position(LentBuffer::is_free) {
            return Ok(Some(i));
        }
        if slabs.len() >= MAX_SLABS {
            return Ok(None);
        }
        slabs.push(LentBuffer::new(scratch.work.host_logits("batch logits")?));
        Ok(Some(slabs.len() - 1))
    }

    /// Logit rows one pass may produce: bounded by a descriptor's range.
    fn logit_rows_cap(&self) -> Result<usize> {
        let ctx = self.model.context();
        let row = 4 * self.model.spec().n_vocab as u64;
        let cap = (ctx.caps().max_binding_bytes(4) / row) as usize;
        if cap == 0 {
            return Err(ModelError::Internal("a logit row exceeds a binding".into()));
        }
        Ok(cap.min(MAX_PASS_TOKENS))
    }

    /// Grows the scratch and tables to hold `n_tok` tokens, `n_rows` logit
    /// rows, `n_pages` page-table and `n_ring` ring-table entries; growth
    /// drops the recorded steps.
    fn ensure(&mut self, n_tok: usize, n_rows: usize, n_pages: usize, n_ring: usize) -> Result<()> {
        let ctx = self.model.context().clone();
        let fits = self
            .scratch
            .as_ref()
            .is_some_and(|s| s.max_tokens() >= n_tok && s.max_logit_rows() >= n_rows);
        if !fits {
            self.steps.clear();
            self.slabs.clear();
            self.scratch = None;
            let tok = n_tok.next_power_of_two().clamp(16, MAX_PASS_TOKENS);
            let rows = n_rows.next_power_of_two().clamp(16, self.logit_rows_cap()?);
            self.scratch = Some(
                self.model
                    .create_scratch(tok.max(n_tok), rows.max(n_rows))?,
            );
            let ints =
                |name| Buffer::new(&ctx, 4 * tok.max(n_tok) as u64, MemoryKind::Upload, name);
            self.seq_base = Some(ints("batch seq base")?);
            self.ring_base = Some(ints("batch ring base")?);
        }
        for (table, n, name) in [
            (&mut self.ring_table, n_ring, "batch ring table"),
            (&mut self.page_table, n_pages, "batch page table"),
        ] {
            if table.as_ref().is_none_or(|b| (b.size() / 4) < n as u64) {
                self.steps.clear();
                let cap = n.next_power_of_two().max(64);
                *table = Some(Buffer::new(&ctx, 4 * cap as u64, MemoryKind::Upload, name)?);
            }
        }
        Ok(())
    }

    /// The top-k buffers for `rows` sequences of `k` candidates, made (or
    /// grown, which drops the recorded steps) as needed.
    fn ensure_top_k(&mut self, rows: usize, k: usize) -> Result<()> {
        if self
            .top_k
            .as_ref()
            .is_some_and(|t| t.rows >= rows && t.k >= k)
        {
            return Ok(());
        }
        self.steps.clear();
        let old = self.top_k.take();
        let rows = rows
            .next_power_of_two()
            .max(16)
            .max(old.as_ref().map_or(0, |t| t.rows));
        let k = k.max(old.as_ref().map_or(0, |t| t.k));
        let ctx = self.model.context().clone();
        let n_vocab = self.model.spec().n_vocab;
        let bytes = top_k_scratch_bytes(&ctx, rows, n_vocab, k);
        self.top_k = Some(TopKBuffers {
            scratch: Buffer::new(&ctx, bytes, MemoryKind::Device, "top-k lists")?,
            out: Buffer::new(
                &ctx,
                (rows * k * 8) as u64,
                MemoryKind::Readback,
                "top-k candidates",
            )?,
            rows,
            k,
        });
        Ok(())
    }

    fn pass(
        &mut self,
        sessions: &mut [&mut Session],
        lists: &[&[u32]],
        segs: &[Segment],
        pool: &Arc<PagePool>,
        output: PassOutput,
        cands: &mut [Vec<(u32, f32)>],
    ) -> Result<()> {
        // Reserve every sequence's positions first, all or none.
        for (k, sg) in segs.iter().enumerate() {
            if let Err(e) = sessions[sg.session].cache_mut().reserve(sg.len) {
                for undo in &segs[..=k] {
                    let c = sessions[undo.session].cache_mut();
                    let len = c.len();
                    // Gives back the pages the reservation took.
                    c.truncate(len)?;
                }
                return Err(e.context(format!("session {} of the batch", sg.session)));
            }
        }
        let n_tok: usize = segs.iter().map(|s| s.len).sum();
        let mut ids = Vec::with_capacity(n_tok);
        let mut pos = Vec::with_capacity(n_tok);
        let mut base = Vec::with_capacity(n_tok);
        let mut rbase = Vec::with_capacity(n_tok);
        let mut table: Vec<u32> = Vec::new();
        let mut rtable: Vec<u32> = Vec::new();
        for sg in segs {
            let s = &sessions[sg.session];
            let paged = s
                .cache()
                .as_paged()
                .ok_or_else(|| ModelError::Internal("batched session lost its pages".into()))?;
            let too_long = |_| ModelError::Internal("page table too long".into());
            let b = i32::try_from(table.len()).map_err(too_long)?;
            let rb = i32::try_from(rtable.len()).map_err(too_long)?;
            table.extend_from_slice(paged.pages());
            rtable.extend_from_slice(paged.ring_pages());
            let p0 = s.len();
            for (j, &t) in lists[sg.session][sg.start..sg.start + sg.len]
                .iter()
                .enumerate()
            {
                ids.push(t as i32);
                pos.push((p0 + j) as i32);
                base.push(b);
                rbase.push(rb);
            }
        }
        self.ensure(n_tok, segs.len(), table.len(), rtable.len())?;
        let top_k = match output {
            PassOutput::TopK(k) if segs.iter().all(|s| s.len == 1) => {
                self.ensure_top_k(n_tok, k)?;
                Some(k)
            }
            PassOutput::TopK(_) => {
                return Err(ModelError::Internal(
                    "a sampling pass of more than one token per sequence".into(),
                ));
            }
            PassOutput::Logits => None,
        };
        let (Some(scratch), Some(page_table), Some(seq_base), Some(ring_table), Some(ring_base)) = (
            &self.scratch,
            &self.page_table,
            &self.seq_base,
            &self.ring_table,
            &self.ring_base,
        ) else {
            return Err(ModelError::Internal("batch buffers missing".into()));
        };
        scratch.ids().write_slice(0, &ids)?;
        scratch.positions().write_slice(0, &pos)?;
        seq_base.write_slice(0, &base)?;
        page_table.write_slice(0, &table)?;
        ring_base.write_slice(0, &rbase)?;
        ring_table.write_slice(0, &rtable)?;

        let n_ctx = sessions[segs[0].session].n_ctx();
        let view = PagedBatchView {
            pool,
            page_table,
            seq_base,
            ring_table,
            ring_base,
            n_ctx,
            one_per_sequence: segs.iter().all(|s| s.len == 1),
        };
        let decode = view.one_per_sequence;
        let model = self.model.clone();
        // Decode steps leave their logits in a slab the sessions read in place.
        let slab = if decode && top_k.is_none() {
            Self::free_slab(&mut self.slabs, scratch)?
        } else {
            None
        };
        let top_bufs = self
            .top_k
            .as_ref()
            .map(|t| (t.scratch.clone(), t.out.clone()));
        let step_scratch = match slab {
            Some(i) => Scratch {
                logits: self.slabs[i].buffer().clone(),
                ..scratch.clone()
            },
            None => scratch.clone(),
        };
        let record = |rec: &mut Recording| -> Result<()> {
            let scratch = &step_scratch;
            model.record_embed(rec, scratch, n_tok)?;
            model.record_blocks(rec, scratch, &view, n_tok)?;
            if let (Some(k), Some((lists, out))) = (top_k, &top_bufs) {
                model.record_logits_top_k(rec, scratch, n_tok, k, lists, out)
            } else if decode {
                model.record_logits(rec, scratch, 0, n_tok, 0)
            } else {
                let mut last = 0;
                for (k, sg) in segs.iter().enumerate() {
                    last += sg.len;
                    model.record_logits(rec, scratch, last - 1, 1, k)?;
                }
                Ok(())
            }
        };
        if self.timestamps {
            let mut rec = Recording::new(model.context(), true)?;
            record(&mut rec)?;
            rec.finish()?;
            rec.submit_and_wait()?;
            self.last = Some(rec);
        } else if decode {
            // Steps by their logits' destination: a slab, the session
            // copies (MAX_SLABS), or top-k candidates (past that, by k).
            let dest = match (top_k, slab) {
                (Some(k), _) => MAX_SLABS + k,
                (None, Some(i)) => i,
                (None, None) => MAX_SLABS,
            };
            let key = (n_tok, n_ctx, dest);
            let step = match self.steps.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut rec = Recording::new(model.context(), false)?;
                    record(&mut rec)?;
                    rec.finish()?;
                    e.insert(rec)
                }
            };
            step.submit_and_wait()?;
        } else {
            // A prompt's call, recorded once: the GPU starts on it while
            // the rest is recorded.
            let mut rec = Recording::streaming(model.context())?;
            record(&mut rec)?;
            rec.finish()?;
            rec.submit_and_wait()?;
        }
        let scratch = self
            .scratch
            .as_ref()
            .ok_or_else(|| ModelError::Internal("batch scratch missing".into()))?;
        let n_vocab = model.spec().n_vocab;
        if let (Some(k), Some((_, out))) = (top_k, &top_bufs) {
            let mut words = vec![0u32; n_tok * k * 2];
            out.read_slice(0, &mut words)?;
            for (row, sg) in segs.iter().enumerate() {
                let tokens = &lists[sg.session][sg.start..sg.start + sg.len];
                let list = decode_top_k(&words[row * k * 2..(row + 1) * k * 2]);
                cands[sg.session] = list.clone();
                let s = &mut sessions[sg.session];
                s.accept_batch_sampled(tokens, k, list);
                s.cache_mut().commit(sg.len);
            }
            return Ok(());
        }
        for (k, sg) in segs.iter().enumerate() {
            let s = &mut sessions[sg.session];
            let tokens = &lists[sg.session][sg.start..sg.start + sg.len];
            match slab {
                Some(i) => s.accept_batch_lent(
                    tokens,
                    self.slabs[i].lend((k * n_vocab * 4) as u64, n_vocab),
                ),
                None => s.accept_batch(tokens, scratch, k)?,
            }
            s.cache_mut().commit(sg.len);
        }
        Ok(())
    }
}
