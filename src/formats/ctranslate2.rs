//! CTranslate2 model directories (what faster-whisper loads): `model.bin`,
//! read as CTranslate2's `models::Model::load` (`src/models/model.cc`) reads
//! what `ModelSpec._serialize` (`python/ctranslate2/specs/model_spec.py`)
//! writes, over memmap2 with zero-copy variable views; plus `config.json` and
//! the vocabulary (`vocabulary.txt`, `vocabulary.json`, or `tokenizer.json`).
//!
//! `model.bin`, little-endian, nothing padded or aligned:
//! `u32 binary_version` (1..=6); from version 2 a string spec name and
//! `u32 revision`; `u32 n_variables`, each: string name, `u8 rank`,
//! `u32 dims[rank]`, then (version 4 on) `u8 dtype` and `u32 n_bytes`
//! (before: `u8 item_size` and `u32 n_items`), then the data; from version 3
//! `u32 n_aliases`, each two strings (alias, target). A string is
//! `u16 length` counting a trailing NUL, the bytes, the NUL.

use crate::formats::backing::Backing;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use crate::error::{ModelError, Result};

/// Newest `model.bin` layout this reader knows (CTranslate2 4.x writes 6).
pub const MAX_BINARY_VERSION: u32 = 6;

fn format_err(offset: usize, reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "CTranslate2",
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Element type of a variable (`ctranslate2::DataType`, in its order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ct2Dtype {
    /// float32.
    F32,
    /// int8 (quantized weights, with a `*_scale` variable beside them).
    I8,
    /// int16.
    I16,
    /// int32.
    I32,
    /// float16.
    F16,
    /// bfloat16.
    BF16,
}

impl Ct2Dtype {
    fn from_id(id: u8) -> Option<Self> {
        Some(match id {
            0 => Ct2Dtype::F32,
            1 => Ct2Dtype::I8,
            2 => Ct2Dtype::I16,
            3 => Ct2Dtype::I32,
            4 => Ct2Dtype::F16,
            5 => Ct2Dtype::BF16,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Ct2Dtype::I8 => 1,
            Ct2Dtype::I16 | Ct2Dtype::F16 | Ct2Dtype::BF16 => 2,
            Ct2Dtype::F32 | Ct2Dtype::I32 => 4,
        }
    }
}

#[derive(Clone, Debug)]
struct VariableEntry {
    name: String,
    shape: Vec<usize>,
    dtype: Ct2Dtype,
    offset: usize,
    n_bytes: usize,
}

/// A view of one variable of a [`Ct2Model`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ct2Variable<'a> {
    /// The variable's own name (an alias resolves to its target's name).
    pub name: &'a str,
    /// Shape, outermost first (row-major, as numpy's).
    pub shape: &'a [usize],
    /// Element type.
    pub dtype: Ct2Dtype,
    /// The data (not aligned).
    pub bytes: &'a [u8],
}

impl Ct2Variable<'_> {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The values widened to f32 (float types only; int8 weights need their scale).
    ///
    /// # Errors
    /// [`ModelError::UnsupportedTensorType`] for integer variables.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let b = self.bytes;
        Ok(match self.dtype {
            Ct2Dtype::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Ct2Dtype::F16 => b
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Ct2Dtype::BF16 => b
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Ct2Dtype::I8 | Ct2Dtype::I16 | Ct2Dtype::I32 => {
                return Err(ModelError::UnsupportedTensorType {
                    tensor: self.name.to_string(),
                    ggml_type: format!("CTranslate2 {:?}", self.dtype),
                });
            }
        })
    }

    /// The value of a scalar integer variable (`num_heads`), if it is one.
    pub fn scalar_int(&self) -> Option<i64> {
        if !self.shape.is_empty() {
            return None;
        }
        let b = self.bytes;
        Some(match self.dtype {
            Ct2Dtype::I8 => i64::from(*b.first()? as i8),
            Ct2Dtype::I16 => i64::from(i16::from_le_bytes([*b.first()?, *b.get(1)?])),
            Ct2Dtype::I32 => i64::from(i32::from_le_bytes(b.get(..4)?.try_into().ok()?)),
            _ => return None,
        })
    }
}

/// An opened, validated CTranslate2 `model.bin`.
pub struct Ct2Model {
    backing: Backing,
    /// Layout version of the file (1..=6).
    pub binary_version: u32,
    /// Spec name (`WhisperSpec`); empty for version 1 files.
    pub spec: String,
    /// Spec revision (Whisper: 3).
    pub revision: u32,
    variables: Vec<VariableEntry>,
    index: HashMap<String, usize>,
    aliases: HashMap<String, String>,
}

impl std::fmt::Debug for Ct2Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ct2Model")
            .field("binary_version", &self.binary_version)
            .field("spec", &self.spec)
            .field("revision", &self.revision)
            .field("variables", &self.variables.len())
            .field("aliases", &self.aliases.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let left = self.buf.len() - self.pos;
        if n > left {
            return Err(format_err(
                self.pos,
                format!("unexpected end of file reading {what}: {n} bytes needed, {left} left"),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let at = self.pos;
        let len = self.u16(what)? as usize;
        if len == 0 {
            return Err(format_err(at, format!("{what}: invalid string length 0")));
        }
        let s = self.take(len, what)?;
        let text = &s[..len - 1];
        std::str::from_utf8(text)
            .map(str::to_string)
            .map_err(|_| format_err(at, format!("{what} is not UTF-8")))
    }
}

/// What `model.bin` holds, validated.
struct Parsed {
    version: u32,
    spec: String,
    revision: u32,
    vars: Vec<VariableEntry>,
    aliases: HashMap<String, String>,
}

fn parse(buf: &[u8]) -> Result<Parsed> {
    let mut c = Cursor { buf, pos: 0 };
    let version = c.u32("binary version")?;
    if version == 0 || version > MAX_BINARY_VERSION {
        return Err(format_err(
            0,
            format!("binary version {version}, this reader knows 1..={MAX_BINARY_VERSION}"),
        ));
    }
    let (spec, revision) = if version >= 2 {
        (c.string("spec name")?, c.u32("spec revision")?)
    } else {
        (String::new(), 1)
    };
    let at = c.pos;
    let n = c.u32("variable count")? as usize;
    // Each variable takes at least a 3-byte name, rank, dtype and size.
    if n > (buf.len() - c.pos) / 9 {
        return Err(format_err(
            at,
            format!("{n} variables cannot fit in the file"),
        ));
    }
    let mut vars = Vec::with_capacity(n);
    for _ in 0..n {
        let name = c.string("variable name")?;
        let rank = c.u8("rank")? as usize;
        let mut shape = Vec::with_capacity(rank);
        for _ in 0..rank {
            shape.push(c.u32("dimension")? as usize);
        }
        let at = c.pos;
        let (dtype, n_bytes) = if version >= 4 {
            let id = c.u8("dtype")?;
            let dtype = Ct2Dtype::from_id(id)
                .ok_or_else(|| format_err(at, format!("variable `{name}`: unknown dtype {id}")))?;
            (dtype, c.u32("byte count")? as usize)
        } else {
            let item = c.u8("item size")?;
            let dtype = match item {
                1 => Ct2Dtype::I8,
                2 => Ct2Dtype::I16,
                4 => Ct2Dtype::F32,
                _ => {
                    return Err(format_err(
                        at,
                        format!("variable `{name}`: item size {item}"),
                    ));
                }
            };
            let count = c.u32("item count")? as usize;
            (dtype, count.saturating_mul(item as usize))
        };
        let n_elements = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size()));
        if n_elements != Some(n_bytes) {
            return Err(format_err(
                at,
                format!(
                    "variable `{name}` has an invalid payload size ({n_bytes} bytes for {shape:?} {dtype:?})"
                ),
            ));
        }
        let offset = c.pos;
        c.take(n_bytes, &format!("data of `{name}`"))?;
        vars.push(VariableEntry {
            name,
            shape,
            dtype,
            offset,
            n_bytes,
        });
    }
    let mut aliases = HashMap::new();
    if version >= 3 {
        let at = c.pos;
        let n = c.u32("alias count")? as usize;
        if n > (buf.len() - c.pos) / 6 {
            return Err(format_err(
                at,
                format!("{n} aliases cannot fit in the file"),
            ));
        }
        for _ in 0..n {
            let alias = c.string("alias")?;
            let target = c.string("alias target")?;
            aliases.insert(alias, target);
        }
    }
    if c.pos != buf.len() {
        return Err(format_err(
            c.pos,
            format!("{} bytes after the last alias", buf.len() - c.pos),
        ));
    }
    Ok(Parsed {
        version,
        spec,
        revision,
        vars,
        aliases,
    })
}

impl Ct2Model {
    /// Maps and validates the `model.bin` at `path`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when it cannot be read; [`ModelError::Format`] when
    /// it is not a well-formed `model.bin`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_backing(Backing::open(path)?)
    }

    /// Validates a `model.bin` held in memory.
    ///
    /// # Errors
    /// As [`Ct2Model::open`], without the I/O errors.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<Self> {
        let Parsed {
            version: binary_version,
            spec,
            revision,
            vars: variables,
            aliases,
        } = parse(backing.bytes())?;
        let mut index = HashMap::with_capacity(variables.len());
        for (i, v) in variables.iter().enumerate() {
            if index.insert(v.name.clone(), i).is_some() {
                return Err(format_err(0, format!("duplicate variable `{}`", v.name)));
            }
        }
        Ok(Ct2Model {
            backing,
            binary_version,
            spec,
            revision,
            variables,
            index,
            aliases,
        })
    }

    fn view<'a>(&'a self, e: &'a VariableEntry) -> Ct2Variable<'a> {
        Ct2Variable {
            name: &e.name,
            shape: &e.shape,
            dtype: e.dtype,
            // The range was checked when the file was parsed.
            bytes: self
                .backing
                .bytes()
                .get(e.offset..e.offset + e.n_bytes)
                .unwrap_or_default(),
        }
    }

    /// The variable `name`, following an alias (one level, as CTranslate2 does).
    pub fn variable(&self, name: &str) -> Option<Ct2Variable<'_>> {
        let i = self
            .index
            .get(name)
            .or_else(|| self.index.get(self.aliases.get(name)?))?;
        Some(self.view(&self.variables[*i]))
    }

    /// The variable `name`.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] when absent.
    pub fn require(&self, name: &str) -> Result<Ct2Variable<'_>> {
        self.variable(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    /// Every stored variable, in file order (aliases not repeated).
    pub fn variables(&self) -> impl ExactSizeIterator<Item = Ct2Variable<'_>> + '_ {
        self.variables.iter().map(|e| self.view(e))
    }

    /// The aliases: alias name to the name of the variable it stands for.
    pub fn aliases(&self) -> &HashMap<String, String> {
        &self.aliases
    }
}

/// A CTranslate2 model directory: `model.bin`, its `config.json` and its vocabulary.
#[derive(Debug)]
pub struct Ct2Directory {
    /// The directory.
    pub path: PathBuf,
    /// `model.bin`.
    pub model: Ct2Model,
    /// `config.json` (an empty object when the file is absent).
    pub config: serde_json::Value,
    /// The tokens by id, as the vocabulary file spells them (GPT-2
    /// byte-level pieces for Whisper, special tokens as `<|...|>`).
    pub vocabulary: Vec<String>,
}

/// Whether `path` is a directory holding a CTranslate2 `model.bin`.
pub fn is_ct2_dir(path: &Path) -> bool {
    path.is_dir() && path.join("model.bin").is_file()
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn json_err(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "CTranslate2 JSON",
        offset: 0,
        reason: format!("{}: {}", path.display(), reason.into()),
    }
}

fn parse_json(path: &Path) -> Result<serde_json::Value> {
    serde_json::from_str(&read_text(path)?).map_err(|e| json_err(path, e.to_string()))
}

/// Tokens by id from a `tokenizer.json` (Hugging Face tokenizers): the BPE
/// model's vocabulary plus the added tokens.
fn vocabulary_from_tokenizer_json(path: &Path) -> Result<Vec<String>> {
    let v = parse_json(path)?;
    let mut by_id: Vec<Option<String>> = Vec::new();
    let mut put = |id: u64, tok: &str| -> Result<()> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&i| i < (1 << 24))
            .ok_or_else(|| json_err(path, format!("token id {id} out of range")))?;
        if by_id.len() <= id {
            by_id.resize(id + 1, None);
        }
        by_id[id] = Some(tok.to_string());
        Ok(())
    };
    let vocab = v
        .pointer("/model/vocab")
        .and_then(|m| m.as_object())
        .ok_or_else(|| json_err(path, "no model.vocab object"))?;
    for (tok, id) in vocab {
        put(
            id.as_u64()
                .ok_or_else(|| json_err(path, "a vocab id is not an integer"))?,
            tok,
        )?;
    }
    for t in v
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .into_iter()
        .flatten()
    {
        let id = t.get("id").and_then(|i| i.as_u64());
        let content = t.get("content").and_then(|c| c.as_str());
        if let (Some(id), Some(content)) = (id, content) {
            put(id, content)?;
        }
    }
    by_id
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| json_err(path, format!("no token with id {i}"))))
        .collect()
}

impl Ct2Directory {
    /// Opens the CTranslate2 model in directory `dir`. The vocabulary is read
    /// from `vocabulary.txt` (one token a line), else `vocabulary.json` (a
    /// list), else `tokenizer.json`.
    ///
    /// # Errors
    /// [`ModelError::Io`] for unreadable files, [`ModelError::Format`] for
    /// malformed ones or a directory without any vocabulary file.
    pub fn open(dir: &Path) -> Result<Self> {
        let model = Ct2Model::open(&dir.join("model.bin"))?;
        let config_path = dir.join("config.json");
        let config = if config_path.is_file() {
            parse_json(&config_path)?
        } else {
            serde_json::Value::Object(Default::default())
        };
        let txt = dir.join("vocabulary.txt");
        let json = dir.join("vocabulary.json");
        let tok = dir.join("tokenizer.json");
        let vocabulary = if txt.is_file() {
            let text = read_text(&txt)?;
            // one token a line; the file ends with a newline
            let text = text.strip_suffix('\n').unwrap_or(&text);
            text.split('\n').map(str::to_string).collect()
        } else if json.is_file() {
            let v = parse_json(&json)?;
            v.as_array()
                .ok_or_else(|| json_err(&json, "not a list"))?
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| json_err(&json, "a token is not a string"))
                })
                .collect::<Result<_>>()?
        } else if tok.is_file() {
            vocabulary_from_tokenizer_json(&tok)?
        } else {
            return Err(format_err(
                0,
                format!(
                    "{}: no vocabulary.txt, vocabulary.json or tokenizer.json",
                    dir.display()
                ),
            ));
        };
        Ok(Ct2Directory {
            path: dir.to_path_buf(),
            model,
            config,
            vocabulary,
        })
    }
}
