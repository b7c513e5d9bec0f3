//! `Stages`: what a [`Session`](super::Session) on a model split by layers
//! ([`crate::models::SplitModel`]) holds beyond its first device — a KV
//! cache of its own blocks, a scratch and a recorded decode step per later
//! device — and the hand-off of the residual stream between devices: the
//! previous device copies its rows into a host-visible buffer, the host
//! copies them into a host-visible buffer of the next device, whose call
//! copies them over its residual. Each device's work is one submission;
//! the next starts when it is done (the stages of one call depend on each
//! other, as in llama.cpp's layer split without pipelining).

use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, MemoryKind, Recording};
use crate::kv::{CacheConfig, KVCache};
use crate::models::{GenerativeModel, Scratch, StageIo};

/// One later device's share of a session.
struct Stage {
    model: Arc<dyn GenerativeModel>,
    cache: Box<dyn KVCache>,
    scratch: Scratch,
    /// The previous device's stream, written by the host.
    input: Arc<Buffer>,
    /// This device's stream for the next one; `None` on the last device.
    output: Option<Arc<Buffer>>,
    /// The recorded decode step, and whether the stream it hands on
    /// carries the sums of squares.
    step: Option<(Recording, bool)>,
}

/// The devices after the first of a session on a split model.
pub(crate) struct Stages {
    /// The first device's model (the session's own cache and scratch are its).
    first: Arc<dyn GenerativeModel>,
    /// The first device's stream for the second.
    first_out: Arc<Buffer>,
    /// The first device's recorded decode step, and whether its stream
    /// carries the sums of squares.
    first_step: Option<(Recording, bool)>,
    later: Vec<Stage>,
    /// One stream on its way between devices.
    host: Vec<f32>,
    max_tokens: usize,
}

/// A host-visible buffer for `rows` rows of `model`'s stream.
fn stream_buffer(
    model: &dyn GenerativeModel,
    rows: usize,
    kind: MemoryKind,
    name: &str,
) -> Result<Arc<Buffer>> {
    let bytes = (4 * rows * model.stream_row_floats()) as u64;
    Buffer::new(model.context(), bytes, kind, name)
}

impl Stages {
    /// The later devices' caches and scratch for a session over `stages`
    /// (all of a split model's, the first included), for calls of up to
    /// `max_tokens` tokens and `logit_rows` rows of logits.
    ///
    /// # Errors
    /// Fewer than two stages; out of device memory.
    pub(crate) fn new(
        stages: &[Arc<dyn GenerativeModel>],
        cfg: &CacheConfig,
        max_tokens: usize,
        logit_rows: usize,
    ) -> Result<Self> {
        let (first, rest) = match stages {
            [first, rest @ ..] if !rest.is_empty() => (first.clone(), rest),
            _ => {
                return Err(ModelError::Internal(
                    "a split model of fewer than two stages".into(),
                ));
            }
        };
        let first_out = stream_buffer(
            first.as_ref(),
            max_tokens,
            MemoryKind::Readback,
            "stream out",
        )?;
        let mut later = Vec::with_capacity(rest.len());
        for (i, model) in rest.iter().enumerate() {
            let last = i + 1 == rest.len();
            let m = model.as_ref();
            later.push(Stage {
                cache: model.create_kv_cache(cfg)?,
                scratch: model.create_scratch(max_tokens, if last { logit_rows } else { 1 })?,
                input: stream_buffer(m, max_tokens, MemoryKind::Upload, "stream in")?,
                output: if last {
                    None
                } else {
                    Some(stream_buffer(
                        m,
                        max_tokens,
                        MemoryKind::Readback,
                        "stream out",
                    )?)
                },
                step: None,
                model: model.clone(),
            });
        }
        Ok(Stages {
            first,
            first_out,
            first_step: None,
            later,
            host: Vec::new(),
            max_tokens,
        })
    }

    /// The first device's model.
    pub(crate) fn first(&self) -> &Arc<dyn GenerativeModel> {
        &self.first
    }

    /// The last device's model, which records the logits.
    pub(crate) fn head(&self) -> &Arc<dyn GenerativeModel> {
        self.later.last().map_or(&self.first, |s| &s.model)
    }

    /// The last device's scratch, whose logits the session reads.
    pub(crate) fn head_scratch(&self) -> Option<&Scratch> {
        self.later.last().map(|s| &s.scratch)
    }

    /// Reserves `n` more positions in every later device's cache.
    ///
    /// # Errors
    /// As [`KVCache::reserve`].
    pub(crate) fn reserve(&mut self, n: usize) -> Result<()> {
        self.later.iter_mut().try_for_each(|s| s.cache.reserve(n))
    }

    /// Commits `n` positions in every later device's cache.
    pub(crate) fn commit(&mut self, n: usize) {
        for s in &mut self.later {
            s.cache.commit(n);
        }
    }

    /// Truncates every later device's cache to `n_keep` positions and then
    /// all of them to the fewest any kept intact; returns that number.
    ///
    /// # Errors
    /// As [`KVCache::truncate`].
    pub(crate) fn truncate(&mut self, n_keep: usize) -> Result<usize> {
        let mut intact = n_keep;
        for s in &mut self.later {
            intact = intact.min(s.cache.truncate(n_keep)?);
        }
        if intact < n_keep {
            for s in &mut self.later {
                s.cache.truncate(intact)?;
            }
        }
        Ok(intact)
    }

    /// Bytes of device memory of the later devices' caches.
    pub(crate) fn cache_bytes(&self) -> u64 {
        self.later.iter().map(|s| s.cache.device_bytes()).sum()
    }

    /// Writes the call's token positions to every later device.
    ///
    /// # Errors
    /// More positions than a scratch holds.
    pub(crate) fn write_positions(&self, pos: &[i32]) -> Result<()> {
        self.later
            .iter()
            .try_for_each(|s| s.scratch.positions().write_slice(0, pos))
    }

    /// The same stages over forks of the caches (new scratch and buffers).
    ///
    /// # Errors
    /// Out of device memory.
    pub(crate) fn fork(&self) -> Result<Self> {
        let mut later = Vec::with_capacity(self.later.len());
        for s in &self.later {
            let m = s.model.as_ref();
            later.push(Stage {
                model: s.model.clone(),
                cache: s.cache.fork()?,
                scratch: m.create_scratch(self.max_tokens, s.scratch.max_logit_rows())?,
                input: stream_buffer(m, self.max_tokens, MemoryKind::Upload, "stream in")?,
                output: match &s.output {
                    Some(_) => Some(stream_buffer(
                        m,
                        self.max_tokens,
                        MemoryKind::Readback,
                        "stream out",
                    )?),
                    None => None,
                },
                step: None,
            });
        }
        Ok(Stages {
            first: self.first.clone(),
            first_out: stream_buffer(
                self.first.as_ref(),
                self.max_tokens,
                MemoryKind::Readback,
                "stream out",
            )?,
            first_step: None,
            later,
            host: Vec::new(),
            max_tokens: self.max_tokens,
        })
    }

    /// Records the first device's blocks of a call of `n` tokens into
    /// `rec` (its embedding already recorded there), runs it, and runs
    /// every later device but the last; returns the last device's
    /// recording with its blocks recorded, for the caller to add the
    /// logits to and submit.
    ///
    /// # Errors
    /// Device errors.
    pub(crate) fn run_call(
        &mut self,
        mut rec: Recording,
        cache: &dyn KVCache,
        scratch: &Scratch,
        n: usize,
    ) -> Result<Recording> {
        let io = StageIo {
            from: None,
            to: Some(&self.first_out),
        };
        let mut squares = self.first.record_stage(&mut rec, scratch, cache, n, io)?;
        rec.finish()?;
        rec.submit_and_wait()?;
        let mut src = self.first_out.clone();
        let count = self.later.len();
        for (i, s) in self.later.iter_mut().enumerate() {
            hand_over(
                &mut self.host,
                &src,
                &s.input,
                n * s.model.stream_row_floats(),
            )?;
            let mut rec = Recording::new(s.model.context(), false)?;
            let io = StageIo {
                from: Some((&s.input, squares)),
                to: s.output.as_ref(),
            };
            squares = s
                .model
                .record_stage(&mut rec, &s.scratch, s.cache.as_ref(), n, io)?;
            match (&s.output, i + 1 == count) {
                (None, true) => return Ok(rec),
                (Some(out), false) => {
                    rec.finish()?;
                    rec.submit_and_wait()?;
                    src = out.clone();
                }
                _ => return Err(ModelError::Internal("a stage's stream out of place".into())),
            }
        }
        Err(ModelError::Internal(
            "a split model without a last stage".into(),
        ))
    }

    /// Runs one decode step on every device (each device's step recorded
    /// on first use, then replayed), the first device's embedding and
    /// blocks over `cache` and `scratch`; the logits are then in the last
    /// device's scratch.
    ///
    /// # Errors
    /// Device errors.
    pub(crate) fn decode(&mut self, cache: &dyn KVCache, scratch: &Scratch) -> Result<()> {
        if self.first_step.is_none() {
            let mut rec = Recording::new(self.first.context(), false)?;
            self.first.record_embed(&mut rec, scratch, 1)?;
            let io = StageIo {
                from: None,
                to: Some(&self.first_out),
            };
            let squares = self.first.record_stage(&mut rec, scratch, cache, 1, io)?;
            rec.finish()?;
            self.first_step = Some((rec, squares));
        }
        let (step, mut squares) = self
            .first_step
            .as_mut()
            .map(|(r, sq)| (r, *sq))
            .ok_or_else(|| ModelError::Internal("decode step missing".into()))?;
        step.submit_and_wait()?;
        let mut src = self.first_out.clone();
        for s in &mut self.later {
            hand_over(&mut self.host, &src, &s.input, s.model.stream_row_floats())?;
            if s.step.is_none() {
                let mut rec = Recording::new(s.model.context(), false)?;
                let io = StageIo {
                    from: Some((&s.input, squares)),
                    to: s.output.as_ref(),
                };
                let out_squares =
                    s.model
                        .record_stage(&mut rec, &s.scratch, s.cache.as_ref(), 1, io)?;
                if s.output.is_none() {
                    s.model.record_logits(&mut rec, &s.scratch, 0, 1, 0)?;
                }
                rec.finish()?;
                s.step = Some((rec, out_squares));
            }
            let (step, out_squares) = s
                .step
                .as_mut()
                .map(|(r, sq)| (r, *sq))
                .ok_or_else(|| ModelError::Internal("decode step missing".into()))?;
            step.submit_and_wait()?;
            squares = out_squares;
            if let Some(out) = &s.output {
                src = out.clone();
            }
        }
        Ok(())
    }
}

/// Moves `floats` floats of a stream from `src` (host-visible on one
/// device) to `dst` (host-visible on the next) through `host`.
fn hand_over(host: &mut Vec<f32>, src: &Buffer, dst: &Buffer, floats: usize) -> Result<()> {
    host.resize(floats, 0.0);
    src.read_slice(0, &mut host[..floats])?;
    dst.write_slice(0, &host[..floats])
}
