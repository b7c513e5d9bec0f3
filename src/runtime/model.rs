//! `Model`: what a user loads — the GPU weights of one architecture plus the
//! tokenizer and chat template read from the same GGUF file. Sessions are
//! created from it; several may share one model. Loaded over several
//! devices it is one model split by layers, or one replica per device:
//! then each new session goes to one replica (round-robin, or the device
//! with the most free memory) and a batched call runs each device's
//! sessions on a thread of its own, the devices working at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::batch::{BatchRunner, sample_rows};
use super::sampler::Sampler;
use super::session::{Session, SessionOptions};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::gpu::phases::{self, Phase};
use crate::models::split::{Placement, free_device_bytes};
use crate::models::{ArchSpec, GenerativeModel, LoadOptions, ModelRegistry};
use crate::tokenizer::Tokenizer;

/// The file name of the default model in the model cache.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model cache: `$COMBS_MODELS`, else `~/.cache/combs/models` (what
/// `scripts/fetch-models.sh` fills).
pub fn model_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("COMBS_MODELS").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("combs").join("models")
}

/// The default model's path in the cache.
pub fn default_model_path() -> PathBuf {
    model_cache_dir().join(DEFAULT_MODEL_FILE)
}

/// Weights on the device plus the tokenizer of one GGUF file.
pub struct Model {
    weights: Arc<dyn GenerativeModel>,
    /// Whole models, one per device, sessions spread over them (just
    /// `weights` on one device or a split).
    replicas: Vec<Arc<dyn GenerativeModel>>,
    tokenizer: Arc<Tokenizer>,
    path: PathBuf,
    /// Buffers and recorded steps of batched calls (one batch at a time
    /// per replica).
    batch: Vec<Mutex<Option<BatchRunner>>>,
    placement: Placement,
    /// The replica of the next session under [`Placement::RoundRobin`].
    next: AtomicUsize,
}

impl Model {
    /// Opens `path` (a GGUF file or a Hugging Face model directory),
    /// resolves its architecture, uploads the weights (converted as
    /// `opts.quant` asks) and reads the tokenizer.
    ///
    /// # Errors
    /// I/O and format errors naming the file, an unsupported architecture,
    /// missing tensors, device errors.
    pub fn load(ctx: &Arc<GpuContext>, path: &Path, opts: &LoadOptions) -> Result<Self> {
        Self::load_on(std::slice::from_ref(ctx), path, opts)
    }

    /// [`Model::load`] over the devices `ctxs`, as `opts.split_mode` says
    /// (see [`ModelRegistry::load_on`]).
    ///
    /// # Errors
    /// As [`Model::load`], and a split that does not match the devices.
    pub fn load_on(ctxs: &[Arc<GpuContext>], path: &Path, opts: &LoadOptions) -> Result<Self> {
        let g = if path.is_dir() {
            ModelRegistry::new().open(path, opts)?
        } else {
            let _t = phases::time(Phase::Open);
            let g = GgufFile::open(path)
                .map_err(|e| crate::models::speech_loader::speech_file_hint(path, e))?;
            match opts.quant {
                Some(q) => q.apply(&g)?,
                None => g,
            }
        };
        // The tokenizer (a large vocabulary takes a while to index) is built
        // on a thread of its own while the weights upload; its error, if
        // any, still comes first.
        let (tokenizer, weights) = std::thread::scope(|s| {
            let tok = s.spawn(|| {
                let _t = phases::time(Phase::Tokenizer);
                Tokenizer::from_gguf(&g)
            });
            let weights = ModelRegistry::new().load_on(ctxs, &g, opts);
            let tok = tok.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (tok, weights)
        });
        let (tokenizer, replicas) = (tokenizer?, weights?);
        let weights = replicas
            .first()
            .cloned()
            .ok_or_else(|| ModelError::invalid("devices", "no device to load on"))?;
        if tokenizer.n_vocab() > weights.spec().n_vocab {
            return Err(ModelError::Shape {
                tensor: "token_embd.weight".into(),
                expected: vec![weights.spec().n_embd as u64, tokenizer.n_vocab() as u64],
                got: vec![weights.spec().n_embd as u64, weights.spec().n_vocab as u64],
            });
        }
        Ok(Model {
            weights,
            batch: replicas.iter().map(|_| Mutex::new(None)).collect(),
            replicas,
            tokenizer: Arc::new(tokenizer),
            path: path.to_path_buf(),
            placement: opts.placement,
            next: AtomicUsize::new(0),
        })
    }

    /// The whole models sessions run on: one per device for replicas, else
    /// the one model.
    pub fn replicas(&self) -> &[Arc<dyn GenerativeModel>] {
        &self.replicas
    }

    /// The replica the next session goes to.
    fn place(&self) -> usize {
        let n = self.replicas.len();
        match self.placement {
            _ if n <= 1 => 0,
            Placement::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            Placement::MostFreeMemory => (0..n)
                .max_by_key(|&i| (free_device_bytes(self.replicas[i].context()), n - i))
                .unwrap_or(0),
        }
    }

    /// The GPU model.
    pub fn weights(&self) -> &Arc<dyn GenerativeModel> {
        &self.weights
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The resolved architecture.
    pub fn spec(&self) -> &ArchSpec {
        self.weights.spec()
    }

    /// The file the model came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new session (sequence) on this model.
    ///
    /// # Errors
    /// Out of device memory or invalid options.
    pub fn new_session(&self, opts: &SessionOptions) -> Result<Session> {
        let model = self.replicas.get(self.place()).unwrap_or(&self.weights);
        Session::new(model.clone(), opts)
    }

    /// Evaluates `tokens[i]` after what `sessions[i]` holds for every session
    /// in one forward pass (see [`BatchRunner::decode`]). The sessions must be
    /// paged sessions of this model with one page size. Over replicas,
    /// each device's sessions run as one batch on a thread of their own;
    /// on a model split by layers, the sessions step one after another.
    ///
    /// # Errors
    /// As [`BatchRunner::decode`]; over replicas, where one device's batch
    /// fails the others' may still have been evaluated.
    pub fn decode_batch(&self, sessions: &mut [&mut Session], tokens: &[u32]) -> Result<()> {
        if sessions.len() != tokens.len() {
            return Err(ModelError::invalid(
                "tokens",
                format!("{} tokens for {} sessions", tokens.len(), sessions.len()),
            ));
        }
        if self.weights.stages().is_some() {
            // No batched pass over a split yet: one session after another.
            return sessions
                .iter_mut()
                .zip(tokens)
                .try_for_each(|(s, &t)| s.decode(t));
        }
        self.per_replica(sessions, tokens, |b, ss, ts| b.decode(ss, ts))
    }

    /// Evaluates `tokens[i]` after what `sessions[i]` holds for every
    /// session, as [`Self::decode_batch`], and draws each one's next token
    /// with `samplers[i]` (see [`BatchRunner::decode_sample`]): where the
    /// samplers' chains need only the best few logits of each row, the
    /// device selects them and the rows never cross the bus (then
    /// [`Session::logits`] is empty until the session's next evaluation).
    /// The tokens are those [`Sampler::sample`] draws from the whole rows.
    ///
    /// # Errors
    /// As [`Self::decode_batch`]; a sampler count other than the session count.
    pub fn decode_batch_sample(
        &self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
        samplers: &mut [&mut Sampler],
    ) -> Result<Vec<u32>> {
        if sessions.len() != tokens.len() || samplers.len() != sessions.len() {
            return Err(ModelError::invalid(
                "tokens",
                format!(
                    "{} tokens and {} samplers for {} sessions",
                    tokens.len(),
                    samplers.len(),
                    sessions.len()
                ),
            ));
        }
        if self.weights.stages().is_none() && self.replicas.len() <= 1 {
            return self.with_batch(0, |b| b.decode_sample(sessions, tokens, samplers));
        }
        self.decode_batch(sessions, tokens)?;
        Ok(sample_rows(sessions, samplers))
    }

    /// Evaluates `prompts[i]` after what `sessions[i]` holds, the prompts
    /// packed into shared forward passes (see [`BatchRunner::prefill`]).
    ///
    /// # Errors
    /// As [`BatchRunner::decode`].
    pub fn prefill_batch(&self, sessions: &mut [&mut Session], prompts: &[&[u32]]) -> Result<()> {
        if sessions.len() != prompts.len() {
            return Err(ModelError::invalid(
                "prompts",
                format!("{} prompts for {} sessions", prompts.len(), sessions.len()),
            ));
        }
        if self.weights.stages().is_some() {
            return sessions
                .iter_mut()
                .zip(prompts)
                .try_for_each(|(s, p)| s.prefill(p));
        }
        self.per_replica(sessions, prompts, |b, ss, ps| b.prefill(ss, ps))
    }

    /// Runs `f` over the runner of replica `i` (made on first use).
    fn with_batch<T>(&self, i: usize, f: impl FnOnce(&mut BatchRunner) -> Result<T>) -> Result<T> {
        let (slot, model) = self
            .batch
            .get(i)
            .zip(self.replicas.get(i))
            .ok_or_else(|| ModelError::Internal(format!("no replica {i}")))?;
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        let runner = guard.get_or_insert_with(|| BatchRunner::new(model.clone()));
        f(runner)
    }

    /// Runs `f` over each replica's sessions (and their items) as one
    /// batch, the replicas' batches on threads of their own at once; on
    /// one device, `f` over all of them here.
    fn per_replica<T: Copy + Send + Sync>(
        &self,
        sessions: &mut [&mut Session],
        items: &[T],
        f: impl Fn(&mut BatchRunner, &mut [&mut Session], &[T]) -> Result<()> + Sync,
    ) -> Result<()> {
        if self.replicas.len() <= 1 {
            return self.with_batch(0, |b| f(b, sessions, items));
        }
        let mut groups: Vec<(Vec<&mut Session>, Vec<&T>)> = self
            .replicas
            .iter()
            .map(|_| (Vec::new(), Vec::new()))
            .collect();
        for (s, item) in sessions.iter_mut().zip(items) {
            let i = self
                .replicas
                .iter()
                .position(|r| Arc::ptr_eq(r, s.model()))
                .ok_or_else(|| ModelError::invalid("sessions", "a session of another model"))?;
            groups[i].0.push(&mut **s);
            groups[i].1.push(item);
        }
        let f = &f;
        let results: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = groups
                .into_iter()
                .enumerate()
                .filter(|(_, (ss, _))| !ss.is_empty())
                .map(|(i, (mut ss, its))| {
                    scope.spawn(move || {
                        let its: Vec<T> = its.into_iter().copied().collect();
                        self.with_batch(i, |b| f(b, &mut ss, &its))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        results.into_iter().collect()
    }
}
