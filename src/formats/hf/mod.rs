//! Hugging Face model directories (what `save_pretrained` writes):
//! `config.json`, the weights in safetensors form (one file, or shards with
//! `model.safetensors.index.json`), `tokenizer.json`, and optionally
//! `tokenizer_config.json` / `chat_template.jinja` for special tokens and the
//! chat template.
//!
//! This module only reads and validates the files. `models::hf` turns a
//! directory into the GGUF view the rest of the engine loads — GGUF
//! metadata keys from `config.json`, GGUF tensor names and layouts from the
//! safetensors names, the `tokenizer.ggml.*` keys from `tokenizer.json`
//! ([`tokenizer::gguf_tokenizer_keys`]) — so one loader, one `ArchSpec` and
//! one tokenizer implementation serve both formats, as llama.cpp's
//! `convert_hf_to_gguf.py` makes them serve llama.cpp.

mod safetensors_set;
mod spm;
pub mod tokenizer;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use safetensors_set::{INDEX_FILE, SINGLE_FILE, SafetensorsSet, StDtype, StTensor};

use crate::error::{ModelError, Result};

/// The model configuration file.
pub const CONFIG_FILE: &str = "config.json";
/// The tokenizer file (the `tokenizers` library's format).
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Special tokens and the chat template, beside the tokenizer.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template as transformers 5 saves it, outside tokenizer_config.json.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Whether `path` looks like a Hugging Face model directory (a directory
/// with a `config.json` and no CTranslate2 `model.bin`).
pub fn is_hf_dir(path: &Path) -> bool {
    path.is_dir() && path.join(CONFIG_FILE).is_file() && !path.join("model.bin").is_file()
}

/// A metadata error naming the file and the key.
pub(crate) fn key_err(path: &Path, key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: format!("{}: {key}", path.display()),
        reason: reason.into(),
    }
}

/// Reads and parses a JSON file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Format {
        format: "JSON",
        offset: 0,
        reason: format!("{}: {e}", path.display()),
    })
}

/// An opened, validated Hugging Face model directory.
pub struct HfDir {
    dir: PathBuf,
    config: Value,
    tensors: SafetensorsSet,
    tokenizer: Value,
    tokenizer_config: Option<Value>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for HfDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfDir")
            .field("dir", &self.dir)
            .field("tensors", &self.tensors.tensors().len())
            .finish()
    }
}

impl HfDir {
    /// Opens `dir`: parses `config.json`, `tokenizer.json` (and
    /// `tokenizer_config.json`, `chat_template.jinja` where present) and
    /// maps and validates the safetensors files.
    ///
    /// # Errors
    /// A missing file ([`ModelError::Io`] naming it), malformed JSON or
    /// safetensors (naming the file), an index pointing at a missing shard.
    pub fn open(dir: &Path) -> Result<Self> {
        let required = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(ModelError::Io {
                    path: p,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("{name} is missing from the model directory"),
                    ),
                })
            }
        };
        let config = read_json(&required(CONFIG_FILE)?)?;
        if !config.is_object() {
            return Err(key_err(&dir.join(CONFIG_FILE), "(root)", "not an object"));
        }
        let tokenizer = read_json(&required(TOKENIZER_FILE)?)?;
        let tokenizer_config = {
            let p = dir.join(TOKENIZER_CONFIG_FILE);
            if p.is_file() {
                Some(read_json(&p)?)
            } else {
                None
            }
        };
        let chat_template = {
            let p = dir.join(CHAT_TEMPLATE_FILE);
            if p.is_file() {
                Some(
                    std::fs::read_to_string(&p)
                        .map_err(|source| ModelError::Io { path: p, source })?,
                )
            } else {
                tokenizer_config
                    .as_ref()
                    .and_then(|c| c.get("chat_template"))
                    .and_then(template_of)
            }
        };
        let tensors = SafetensorsSet::open(dir)?;
        Ok(HfDir {
            dir: dir.to_path_buf(),
            config,
            tensors,
            tokenizer,
            tokenizer_config,
            chat_template,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json`, parsed.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The path of `config.json`, for error messages.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    /// `config.json::model_type`, else the first of `architectures`.
    ///
    /// # Errors
    /// Neither present.
    pub fn model_type(&self) -> Result<&str> {
        self.config
            .get("model_type")
            .and_then(Value::as_str)
            .or_else(|| {
                self.config
                    .get("architectures")
                    .and_then(|a| a.get(0))
                    .and_then(Value::as_str)
            })
            .ok_or_else(|| key_err(&self.config_path(), "model_type", "missing"))
    }

    /// The weights.
    pub fn tensors(&self) -> &SafetensorsSet {
        &self.tensors
    }

    /// `tokenizer.json`, parsed.
    pub fn tokenizer(&self) -> &Value {
        &self.tokenizer
    }

    /// `tokenizer_config.json`, parsed, if present.
    pub fn tokenizer_config(&self) -> Option<&Value> {
        self.tokenizer_config.as_ref()
    }

    /// The chat template: `chat_template.jinja`, else `tokenizer_config.json`'s.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// A template given as a string, or as a list of named templates (the
/// `default` one).
fn template_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string),
        _ => None,
    }
}
