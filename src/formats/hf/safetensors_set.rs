//! The weights of a Hugging Face model directory: one `model.safetensors`, or
//! the shards `model.safetensors.index.json` maps tensor names to. Each file
//! is mapped read-only and validated by the `safetensors` crate
//! (`SafeTensors::deserialize`: header length, JSON header, offsets covering
//! the data exactly), so tensor views never fail on bounds afterwards.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{ModelError, Result};
use crate::formats::backing::Backing;

/// The name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The name of a sharded checkpoint's index.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Element type of a stored tensor, as far as combs computes with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    BF16,
}

impl StDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StDtype::F32 => 4,
            StDtype::F16 | StDtype::BF16 => 2,
        }
    }
}

/// One tensor of the checkpoint.
#[derive(Clone, Debug)]
pub struct StTensor {
    /// Name as stored (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Element type.
    pub dtype: StDtype,
    /// Shape, outermost first (PyTorch order).
    pub shape: Vec<usize>,
    shard: usize,
    range: Range<usize>,
}

struct Shard {
    path: PathBuf,
    backing: Backing,
}

/// Every tensor of a directory's safetensors file(s).
pub struct SafetensorsSet {
    shards: Vec<Shard>,
    tensors: Vec<StTensor>,
    index: HashMap<String, usize>,
}

fn format_err(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "safetensors",
        offset: 0,
        reason: reason.into(),
    }
    .context(path.display().to_string())
}

fn not_found(path: PathBuf, what: &str) -> ModelError {
    ModelError::Io {
        path,
        source: std::io::Error::new(std::io::ErrorKind::NotFound, what.to_string()),
    }
}

impl SafetensorsSet {
    /// Opens the checkpoint of `dir`: the shards of its index when it has
    /// one, else `model.safetensors`.
    ///
    /// # Errors
    /// Neither file present, an unreadable or malformed file (naming it), an
    /// index naming a shard that is missing or lacks a tensor, a tensor of a
    /// type combs does not compute with.
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join(INDEX_FILE);
        let mut set = SafetensorsSet {
            shards: Vec::new(),
            tensors: Vec::new(),
            index: HashMap::new(),
        };
        if index_path.is_file() {
            let map = read_index(&index_path)?;
            let mut files: Vec<&str> = map.values().map(String::as_str).collect();
            files.sort_unstable();
            files.dedup();
            for f in files {
                let path = dir.join(f);
                if !path.is_file() {
                    return Err(not_found(
                        path,
                        &format!("shard named by {INDEX_FILE} is missing"),
                    ));
                }
                set.add_shard(path)?;
            }
            // every name of the index must be in the shard it names
            let mut names: Vec<(&String, &String)> = map.iter().collect();
            names.sort_unstable();
            for (name, file) in names {
                let found = set.index.get(name).map(|&i| &set.tensors[i]);
                let in_shard = found.is_some_and(|t| set.shards[t.shard].path == dir.join(file));
                if !in_shard {
                    return Err(format_err(
                        &dir.join(file),
                        format!("tensor `{name}` named by {INDEX_FILE} is not in this shard"),
                    ));
                }
            }
        } else {
            let path = dir.join(SINGLE_FILE);
            if !path.is_file() {
                return Err(not_found(
                    path,
                    &format!("no {SINGLE_FILE} (nor {INDEX_FILE}) in the model directory"),
                ));
            }
            set.add_shard(path)?;
        }
        Ok(set)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<()> {
        let backing = Backing::open(&path)?;
        let bytes = backing.bytes();
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| format_err(&path, e.to_string()))?;
        let base = bytes.as_ptr() as usize;
        let shard = self.shards.len();
        let mut found: Vec<StTensor> = Vec::new();
        for (name, view) in st.tensors() {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => StDtype::F32,
                safetensors::Dtype::F16 => StDtype::F16,
                safetensors::Dtype::BF16 => StDtype::BF16,
                other => {
                    return Err(ModelError::UnsupportedTensorType {
                        tensor: name,
                        ggml_type: format!("safetensors {other:?}"),
                    }
                    .context(path.display().to_string()));
                }
            };
            let data = view.data();
            let start = data.as_ptr() as usize - base;
            found.push(StTensor {
                name,
                dtype,
                shape: view.shape().to_vec(),
                shard,
                range: start..start + data.len(),
            });
        }
        // file order, so conversion is deterministic
        found.sort_by_key(|t| t.range.start);
        for t in found {
            if self.index.contains_key(&t.name) {
                return Err(format_err(
                    &path,
                    format!("tensor `{}` is stored in two shards", t.name),
                ));
            }
            self.index.insert(t.name.clone(), self.tensors.len());
            self.tensors.push(t);
        }
        self.shards.push(Shard { path, backing });
        Ok(())
    }

    /// Every tensor, shard by shard in file order.
    pub fn tensors(&self) -> &[StTensor] {
        &self.tensors
    }

    /// The tensor `name`, if stored.
    pub fn get(&self, name: &str) -> Option<&StTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The file tensor `t` is stored in.
    pub fn path_of(&self, t: &StTensor) -> &Path {
        &self.shards[t.shard].path
    }

    /// The raw little-endian bytes of `t`.
    pub fn data(&self, t: &StTensor) -> &[u8] {
        &self.shards[t.shard].backing.bytes()[t.range.clone()]
    }

    /// `t`'s values as f32.
    pub fn to_f32(&self, t: &StTensor) -> Vec<f32> {
        let d = self.data(t);
        match t.dtype {
            StDtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            StDtype::F16 => d
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            StDtype::BF16 => d
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
        }
    }
}

/// `weight_map` of an index: tensor name → shard file name.
fn read_index(path: &Path) -> Result<HashMap<String, String>> {
    let v = super::read_json(path)?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| super::key_err(path, "weight_map", "missing or not an object"))?;
    let mut out = HashMap::with_capacity(map.len());
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains('\\') && !f.is_empty())
            .ok_or_else(|| {
                super::key_err(path, &format!("weight_map.{name}"), "not a file name")
            })?;
        out.insert(name.clone(), file.to_string());
    }
    Ok(out)
}
