//! The GGUF reader: a file mapped with memmap2 (or bytes owned in memory),
//! its metadata in file order with typed accessors, and its tensor table with
//! zero-copy views of the tensor data. Follows the GGUF spec (`docs/gguf.md`
//! in ggml), versions 2 and 3, little-endian only, and the validation of
//! llama.cpp's `gguf_init_from_file_impl`; every offset, size and count is
//! checked when the file is opened (see `gguf/parse.rs`), so accessors never fail
//! on bounds.
//!
//! Accessor convention: `get_*` returns `Ok(None)` for a missing key and
//! [`ModelError::Metadata`] for a value of the wrong type; `require_*` also
//! fails on a missing key. Integer getters accept any integer width whose value
//! fits; float getters accept `f32` and `f64`.

mod parse;
pub mod value;

use crate::formats::backing::Backing;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

pub use value::{MetaArray, MetaValue, ValueType};

use super::ggml_type::{QuantType, ggml_type_name};
use crate::error::{ModelError, Result};

/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One entry of the tensor table, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as in the file (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, `ne0` (the contiguous one) first; at most 4.
    pub dims: Vec<u64>,
    /// GGML type id.
    pub ggml_type: u32,
    /// The type if combs can compute with it; `None` for types it only lists.
    pub qtype: Option<QuantType>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
    /// Number of elements (product of `dims`).
    pub n_elements: u64,
}

impl TensorInfo {
    /// The GGML type's name (`Q4_K`, `IQ2_XXS`), also for types combs does not run.
    pub fn type_name(&self) -> String {
        ggml_type_name(self.ggml_type)
    }
}

/// An opened, validated GGUF file.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.data().len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

fn type_error(key: &str, expected: &str, found: &MetaValue) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: format!("expected {expected}, found {}", found.type_desc()),
    }
}

fn missing(key: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: "missing".into(),
    }
}

impl GgufFile {
    /// Maps the file at `path` and validates its header and tensor table.
    ///
    /// The mapping is read-only; as with every memory-mapped reader, the file
    /// must not be truncated or rewritten by another process while it is open.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be opened or mapped;
    /// [`ModelError::Format`] or [`ModelError::Metadata`] when it is not a
    /// valid GGUF v2/v3 file.
    pub fn open(path: &Path) -> Result<Self> {
        Self::from_backing(Backing::open(path)?)
    }

    /// Validates a GGUF file held in memory (tests, generated files).
    ///
    /// # Errors
    /// As [`GgufFile::open`], without the I/O errors.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::from_backing(Backing::Owned(bytes))
    }

    fn from_backing(backing: Backing) -> Result<Self> {
        let h = parse::parse(backing.bytes())?;
        Ok(GgufFile {
            backing,
            version: h.version,
            metadata: h.metadata,
            meta_index: h.meta_index,
            tensors: h.tensors,
            tensor_index: h.tensor_index,
            alignment: h.alignment,
            data_offset: h.data_offset,
        })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and tensor offsets (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn get_as<'s, T>(
        &'s self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'s MetaValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| type_error(key, expected, v)),
        }
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, expected: &str) -> Result<Option<T>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let i = v.as_int().ok_or_else(|| type_error(key, "an integer", v))?;
        T::try_from(i).map(Some).map_err(|_| ModelError::Metadata {
            key: key.to_string(),
            reason: format!("{i} is out of range for {expected}"),
        })
    }

    /// A string value.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not a UTF-8 string.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.get_as(key, "a UTF-8 string", MetaValue::as_str)
    }

    /// A string value as raw bytes, UTF-8 or not.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not a string.
    pub fn get_bytes(&self, key: &str) -> Result<Option<&[u8]>> {
        self.get_as(key, "a string", MetaValue::as_bytes)
    }

    /// An integer value that fits in u64.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an integer or is out of range.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get_int(key, "u64")
    }

    /// An integer value that fits in u32.
    ///
    /// # Errors
    /// As [`GgufFile::get_u64`].
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        self.get_int(key, "u32")
    }

    /// An integer value that fits in i64.
    ///
    /// # Errors
    /// As [`GgufFile::get_u64`].
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>> {
        self.get_int(key, "i64")
    }

    /// An integer value that fits in i32.
    ///
    /// # Errors
    /// As [`GgufFile::get_u64`].
    pub fn get_i32(&self, key: &str) -> Result<Option<i32>> {
        self.get_int(key, "i32")
    }

    /// A float value (`f32`, or `f64` rounded to f32).
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not a float.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get_as(key, "a float", |v| v.as_float().map(|f| f as f32))
    }

    /// A float value (`f32` widened, or `f64`).
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not a float.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get_as(key, "a float", MetaValue::as_float)
    }

    /// A bool value.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not a bool.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get_as(key, "a bool", MetaValue::as_bool)
    }

    /// An array value of any element type.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an array.
    pub fn get_arr(&self, key: &str) -> Result<Option<&MetaArray>> {
        self.get_as(key, "an array", MetaValue::as_array)
    }

    /// A string array whose entries are all valid UTF-8.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an array of strings, or
    /// one of them is not UTF-8 (use [`GgufFile::get_arr_bytes`] for those).
    pub fn get_arr_str(&self, key: &str) -> Result<Option<&[String]>> {
        self.get_as(key, "an array of UTF-8 strings", |v| match v {
            MetaValue::Array(MetaArray::Str(s)) => Some(s.as_slice()),
            _ => None,
        })
    }

    /// A string array as raw bytes per entry, whether or not the entries are UTF-8.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an array of strings.
    pub fn get_arr_bytes(&self, key: &str) -> Result<Option<Vec<&[u8]>>> {
        self.get_as(key, "an array of strings", |v| v.as_array()?.str_bytes())
    }

    /// A float array: borrowed when stored as `f32`, converted from `f64`.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an array of floats.
    pub fn get_arr_f32(&self, key: &str) -> Result<Option<Cow<'_, [f32]>>> {
        self.get_as(key, "an array of floats", |v| match v.as_array()? {
            MetaArray::F32(a) => Some(Cow::Borrowed(a.as_slice())),
            MetaArray::F64(a) => Some(Cow::Owned(a.iter().map(|&x| x as f32).collect())),
            _ => None,
        })
    }

    fn get_arr_int<T: TryFrom<i128> + Clone>(
        &self,
        key: &str,
        expected: &str,
        borrow: impl for<'a> FnOnce(&'a MetaArray) -> Option<&'a [T]>,
    ) -> Result<Option<Cow<'_, [T]>>> {
        let Some(a) = self.get_arr(key)? else {
            return Ok(None);
        };
        if let Some(s) = borrow(a) {
            return Ok(Some(Cow::Borrowed(s)));
        }
        match a.ints::<T>() {
            Some(Ok(v)) => Ok(Some(Cow::Owned(v))),
            Some(Err(i)) => Err(ModelError::Metadata {
                key: key.to_string(),
                reason: format!("element {i} is out of range for {expected}"),
            }),
            None => Err(ModelError::Metadata {
                key: key.to_string(),
                reason: format!("expected an array of integers, found {}", a.type_desc()),
            }),
        }
    }

    /// An integer array as i32: borrowed when stored as `i32`, else converted.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when the value is not an integer array or an element does not fit.
    pub fn get_arr_i32(&self, key: &str) -> Result<Option<Cow<'_, [i32]>>> {
        self.get_arr_int(key, "i32", |a| match a {
            MetaArray::I32(v) => Some(v.as_slice()),
            _ => None,
        })
    }

    /// An integer array as u32: borrowed when stored as `u32`, else converted.
    ///
    /// # Errors
    /// As [`GgufFile::get_arr_i32`].
    pub fn get_arr_u32(&self, key: &str) -> Result<Option<Cow<'_, [u32]>>> {
        self.get_arr_int(key, "u32", |a| match a {
            MetaArray::U32(v) => Some(v.as_slice()),
            _ => None,
        })
    }

    /// As [`GgufFile::get_str`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing or not a UTF-8 string.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_u64`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing, not an integer, or out of range.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_u32`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing, not an integer, or out of range.
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_i64`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing, not an integer, or out of range.
    pub fn require_i64(&self, key: &str) -> Result<i64> {
        self.get_i64(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_f32`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing or not a float.
    pub fn require_f32(&self, key: &str) -> Result<f32> {
        self.get_f32(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_bool`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing or not a bool.
    pub fn require_bool(&self, key: &str) -> Result<bool> {
        self.get_bool(key)?.ok_or_else(|| missing(key))
    }

    /// As [`GgufFile::get_arr_str`], failing when the key is missing.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing or not an array of UTF-8 strings.
    pub fn require_arr_str(&self, key: &str) -> Result<&[String]> {
        self.get_arr_str(key)?.ok_or_else(|| missing(key))
    }

    /// `general.architecture`.
    ///
    /// # Errors
    /// [`ModelError::Metadata`] when missing or not a string.
    pub fn architecture(&self) -> Result<&str> {
        self.require_str("general.architecture")
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor named `name`.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`] when absent.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })
    }

    /// The bytes of tensor `t` (zero-copy). `t` must come from this file's
    /// table, whose ranges were checked at open; a `TensorInfo` from another
    /// file that does not fit yields an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset).ok().and_then(|start| {
            let len = usize::try_from(t.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        });
        range.and_then(|r| self.data().get(r)).unwrap_or_default()
    }

    /// The whole file.
    pub fn data(&self) -> &[u8] {
        self.backing.bytes()
    }
}
