//! `Model`: what a user loads — the GPU weights of one architecture plus the
//! tokenizer and chat template read from the same GGUF file. Sessions are
//! created from it; several may share one model.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::batch::BatchRunner;
use super::session::{Session, SessionOptions};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::GpuContext;
use crate::gpu::phases::{self, Phase};
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
    tokenizer: Arc<Tokenizer>,
    path: PathBuf,
    /// Buffers and recorded steps of batched calls (one batch at a time).
    batch: Mutex<Option<BatchRunner>>,
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
            let weights = ModelRegistry::new().load(ctx, &g, opts);
            let tok = tok.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            (tok, weights)
        });
        let (tokenizer, weights) = (tokenizer?, weights?);
        if tokenizer.n_vocab() > weights.spec().n_vocab {
            return Err(ModelError::Shape {
                tensor: "token_embd.weight".into(),
                expected: vec![weights.spec().n_embd as u64, tokenizer.n_vocab() as u64],
                got: vec![weights.spec().n_embd as u64, weights.spec().n_vocab as u64],
            });
        }
        Ok(Model {
            weights,
            tokenizer: Arc::new(tokenizer),
            path: path.to_path_buf(),
            batch: Mutex::new(None),
        })
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
        Session::new(self.weights.clone(), opts)
    }

    /// Evaluates `tokens[i]` after what `sessions[i]` holds for every session
    /// in one forward pass (see [`BatchRunner::decode`]). The sessions must be
    /// paged sessions of this model with one page size.
    ///
    /// # Errors
    /// As [`BatchRunner::decode`].
    pub fn decode_batch(&self, sessions: &mut [&mut Session], tokens: &[u32]) -> Result<()> {
        self.with_batch(|b| b.decode(sessions, tokens))
    }

    /// Evaluates `prompts[i]` after what `sessions[i]` holds, the prompts
    /// packed into shared forward passes (see [`BatchRunner::prefill`]).
    ///
    /// # Errors
    /// As [`BatchRunner::decode`].
    pub fn prefill_batch(&self, sessions: &mut [&mut Session], prompts: &[&[u32]]) -> Result<()> {
        self.with_batch(|b| b.prefill(sessions, prompts))
    }

    fn with_batch<T>(&self, f: impl FnOnce(&mut BatchRunner) -> Result<T>) -> Result<T> {
        let mut guard = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        let runner = guard.get_or_insert_with(|| BatchRunner::new(self.weights.clone()));
        f(runner)
    }
}
