//! The GGUF header parser: magic, version, metadata, tensor infos and the data
//! section start, from untrusted bytes. Layout per the GGUF spec
//! (`docs/gguf.md` in ggml) and the checks of llama.cpp's `gguf_init_from_file_impl`.
//!
//! Every count, length, dimension and offset is checked with checked
//! arithmetic against the bytes that remain, so a malformed file is a
//! [`ModelError::Format`] and never a panic or an allocation larger than the
//! file justifies: a count of `n` elements is accepted only when `n` times the
//! element's smallest encoding fits in what is left of the file.

use std::collections::HashMap;

use super::value::{MetaArray, MetaValue, ValueType};
use super::{DEFAULT_ALIGNMENT, TensorInfo};
use crate::error::{ModelError, Result};
use crate::formats::ggml_type::{QuantType, ggml_block_geometry, ggml_type_name};

/// `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted; bounds recursion on hostile input.
const MAX_ARRAY_DEPTH: usize = 8;
/// Most entries reserved ahead for lists whose entries are much larger in
/// memory than their smallest encoding (or nest); larger lists grow as read.
const PREALLOC_CAP: usize = 4096;
/// Smallest tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO: usize = 8 + 4 + 4 + 8;
/// Smallest key/value pair: key length, value type, a one-byte value.
const MIN_KV: usize = 8 + 4 + 1;

/// Everything the header says, validated.
pub(super) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetaValue)>,
    pub meta_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn err(&self, reason: impl Into<String>) -> ModelError {
        ModelError::gguf(self.pos(), reason)
    }

    fn take(&mut self, n: usize, what: &dyn std::fmt::Display) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "unexpected end of file reading {what}: {n} bytes needed, {} left",
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn std::fmt::Display) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn std::fmt::Display) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn std::fmt::Display) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a u64 count of items each at least `min_size` bytes long and
    /// checks that they can fit in the rest of the file.
    fn count(&mut self, min_size: usize, what: &dyn std::fmt::Display) -> Result<usize> {
        let at = self.pos();
        let n = self.u64(what)?;
        self.fitting(n, min_size, at, &format_args!("{what}: count"))
    }

    /// `n` (read at `at`, named `label` in the error) as a count of items each
    /// at least `min_size` bytes long that can fit in the rest of the file.
    fn fitting(
        &self,
        n: u64,
        min_size: usize,
        at: u64,
        label: &dyn std::fmt::Display,
    ) -> Result<usize> {
        let fits = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(min_size))
            .is_some_and(|b| b <= self.remaining());
        if !fits {
            return Err(ModelError::gguf(
                at,
                format!(
                    "{label} {n} cannot fit in the {} bytes left in the file",
                    self.remaining()
                ),
            ));
        }
        // The check above proves n fits in usize.
        Ok(n as usize)
    }

    /// A GGUF string: u64 length then bytes; `Err(bytes)` when not UTF-8.
    fn string(&mut self, what: &dyn std::fmt::Display) -> Result<Result<String, Vec<u8>>> {
        let at = self.pos();
        let len = self.u64(what)?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.remaining())
            .ok_or_else(|| {
                ModelError::gguf(
                    at,
                    format!(
                        "{what}: string length {len} runs past the end of the file ({} bytes left)",
                        self.remaining()
                    ),
                )
            })?;
        let bytes = self.take(len, what)?;
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(bytes.to_vec()),
        })
    }

    /// A string that the spec requires to be text (keys, tensor names).
    fn utf8_string(&mut self, what: &dyn std::fmt::Display) -> Result<String> {
        let at = self.pos();
        self.string(what)?
            .map_err(|_| ModelError::gguf(at, format!("{what} is not valid UTF-8")))
    }

    fn value_type(&mut self, what: &dyn std::fmt::Display) -> Result<ValueType> {
        let at = self.pos();
        let id = self.u32(what)?;
        ValueType::from_id(id)
            .ok_or_else(|| ModelError::gguf(at, format!("{what}: unknown value type id {id}")))
    }

    fn bool(&mut self, what: &dyn std::fmt::Display) -> Result<bool> {
        let at = self.pos();
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(ModelError::gguf(
                at,
                format!("{what}: bool byte is {b}, must be 0 or 1"),
            )),
        }
    }

    fn value(&mut self, t: ValueType, what: &dyn std::fmt::Display) -> Result<MetaValue> {
        Ok(match t {
            ValueType::U8 => MetaValue::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => MetaValue::U32(self.u32(what)?),
            ValueType::I32 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => MetaValue::U64(self.u64(what)?),
            ValueType::I64 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => MetaValue::Bool(self.bool(what)?),
            ValueType::Str => match self.string(what)? {
                Ok(s) => MetaValue::Str(s),
                Err(b) => MetaValue::Bytes(b),
            },
            ValueType::Array => MetaValue::Array(self.meta_array(0, what)?),
        })
    }

    /// Reads `n` fixed-size elements in one bounds check.
    fn fixed<T, const N: usize>(
        &mut self,
        n: usize,
        what: &dyn std::fmt::Display,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>> {
        // `count` already proved n * N fits in the remaining bytes.
        let bytes = self.take(n * N, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    /// An array value: element type, count, elements.
    fn meta_array(&mut self, depth: usize, what: &dyn std::fmt::Display) -> Result<MetaArray> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(format!(
                "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
            )));
        }
        let t = self.value_type(what)?;
        let n = self.count(t.min_encoded_size(), what)?;
        Ok(match t {
            ValueType::U8 => MetaArray::U8(self.take(n, what)?.to_vec()),
            ValueType::I8 => MetaArray::I8(self.fixed(n, what, i8::from_le_bytes)?),
            ValueType::U16 => MetaArray::U16(self.fixed(n, what, u16::from_le_bytes)?),
            ValueType::I16 => MetaArray::I16(self.fixed(n, what, i16::from_le_bytes)?),
            ValueType::U32 => MetaArray::U32(self.fixed(n, what, u32::from_le_bytes)?),
            ValueType::I32 => MetaArray::I32(self.fixed(n, what, i32::from_le_bytes)?),
            ValueType::U64 => MetaArray::U64(self.fixed(n, what, u64::from_le_bytes)?),
            ValueType::I64 => MetaArray::I64(self.fixed(n, what, i64::from_le_bytes)?),
            ValueType::F32 => MetaArray::F32(self.fixed(n, what, f32::from_le_bytes)?),
            ValueType::F64 => MetaArray::F64(self.fixed(n, what, f64::from_le_bytes)?),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n.min(PREALLOC_CAP));
                for _ in 0..n {
                    v.push(self.bool(what)?);
                }
                MetaArray::Bool(v)
            }
            ValueType::Str => self.string_array(n, what)?,
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(PREALLOC_CAP));
                for _ in 0..n {
                    v.push(self.meta_array(depth + 1, what)?);
                }
                MetaArray::Array(v)
            }
        })
    }

    /// `n` strings (bounded by the caller); switches to [`MetaArray::StrBytes`]
    /// at the first entry that is not UTF-8.
    fn string_array(&mut self, n: usize, what: &dyn std::fmt::Display) -> Result<MetaArray> {
        let mut strings: Vec<String> = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            match self.string(what)? {
                Ok(s) => strings.push(s),
                Err(b) => {
                    let mut raw: Vec<Vec<u8>> = Vec::with_capacity(n);
                    raw.extend(strings.into_iter().map(String::into_bytes));
                    raw.push(b);
                    for _ in i + 1..n {
                        raw.push(match self.string(what)? {
                            Ok(s) => s.into_bytes(),
                            Err(b) => b,
                        });
                    }
                    return Ok(MetaArray::StrBytes(raw));
                }
            }
            i += 1;
        }
        Ok(MetaArray::Str(strings))
    }
}

/// Describes a field for error messages without allocating unless one is raised.
struct Field<'s>(&'s str, usize, Option<&'s str>);

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.2 {
            Some(name) => write!(f, "{} #{} (`{name}`)", self.0, self.1),
            None => write!(f, "{} #{}", self.0, self.1),
        }
    }
}

/// Parses and validates everything up to the data section.
pub(super) fn parse(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&"the GGUF magic")?;
    if &magic != b"GGUF" {
        return Err(ModelError::gguf(
            0,
            format!("bad magic {magic:02x?}, expected \"GGUF\" (47 47 55 46); not a GGUF file"),
        ));
    }
    let version = c.u32(&"the version")?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(ModelError::gguf(
                4,
                "GGUF version 1 is not supported (only versions 2 and 3); \
                 re-convert the model with a current llama.cpp",
            ));
        }
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(ModelError::gguf(
                4,
                "big-endian GGUF files are not supported",
            ));
        }
        v => {
            return Err(ModelError::gguf(
                4,
                format!("unsupported GGUF version {v} (only versions 2 and 3)"),
            ));
        }
    }
    let n_tensors_at = c.pos();
    let n_tensors = c.u64(&"the tensor count")?;
    let n_kv = c.u64(&"the metadata count")?;
    // The kv pairs come first, so the tensor infos must fit after them too.
    let n_kv = c.fitting(n_kv, MIN_KV, 16, &"metadata count")?;
    let n_tensors = c.fitting(n_tensors, MIN_TENSOR_INFO, n_tensors_at, &"tensor count")?;

    let mut metadata = Vec::with_capacity(n_kv.min(PREALLOC_CAP));
    let mut meta_index = HashMap::with_capacity(n_kv.min(PREALLOC_CAP));
    for i in 0..n_kv {
        let at = c.pos();
        let key = c.utf8_string(&Field("metadata key", i, None))?;
        let what = Field("metadata key", i, Some(&key));
        let t = c.value_type(&what)?;
        let value = c.value(t, &what)?;
        if meta_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(ModelError::gguf(
                at,
                format!("duplicate metadata key `{key}`"),
            ));
        }
        metadata.push((key, value));
    }

    let alignment = match meta_index.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(&i) => {
            let v = &metadata[i].1;
            match v.as_int().and_then(|a| u32::try_from(a).ok()) {
                Some(a) if a != 0 && a.is_power_of_two() => u64::from(a),
                _ => {
                    return Err(ModelError::Metadata {
                        key: "general.alignment".into(),
                        reason: format!(
                            "must be a non-zero power of two u32, found {} {v:?}",
                            v.type_desc()
                        ),
                    });
                }
            }
        }
    };

    let mut raw = Vec::with_capacity(n_tensors.min(PREALLOC_CAP));
    for i in 0..n_tensors {
        let at = c.pos();
        let name = c.utf8_string(&Field("tensor name", i, None))?;
        let what = Field("tensor", i, Some(&name));
        let n_dims_at = c.pos();
        let n_dims = c.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(ModelError::gguf(
                n_dims_at,
                format!("{what}: {n_dims} dimensions, at most {MAX_DIMS} allowed"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d_at = c.pos();
            let d = c.u64(&what)?;
            if d > i64::MAX as u64 {
                return Err(ModelError::gguf(
                    d_at,
                    format!("{what}: dimension {d} exceeds the int64 range"),
                ));
            }
            dims.push(d);
        }
        let ggml_type = c.u32(&what)?;
        let offset = c.u64(&what)?;
        raw.push(RawInfo {
            at,
            name,
            dims,
            ggml_type,
            offset,
        });
    }

    let end_of_infos = c.pos();
    let data_offset = end_of_infos
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| ModelError::gguf(end_of_infos, "data section offset overflows"))?;
    let layout = Layout {
        alignment,
        data_offset,
        file_len: buf.len() as u64,
    };

    let mut tensors = Vec::with_capacity(raw.len());
    let mut tensor_index = HashMap::with_capacity(raw.len());
    for r in raw {
        let at = r.at;
        let t = r.place(&layout)?;
        if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
            return Err(ModelError::gguf(
                at,
                format!("duplicate tensor name `{}`", t.name),
            ));
        }
        tensors.push(t);
    }
    check_overlaps(&tensors)?;

    Ok(Header {
        version,
        metadata,
        meta_index,
        tensors,
        tensor_index,
        alignment,
        data_offset,
    })
}

/// Where the data section is and how large the file is.
struct Layout {
    alignment: u64,
    data_offset: u64,
    file_len: u64,
}

/// A tensor info as read, before it is sized and placed.
struct RawInfo {
    /// File offset of the entry, for errors.
    at: u64,
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    /// Offset relative to the data section.
    offset: u64,
}

impl RawInfo {
    /// Sizes the tensor and checks its placement in the file.
    fn place(self, layout: &Layout) -> Result<TensorInfo> {
        let RawInfo {
            at,
            name,
            dims,
            ggml_type,
            offset,
        } = self;
        let Layout {
            alignment,
            data_offset,
            file_len,
        } = *layout;
        let fail = |reason: String| ModelError::gguf(at, format!("tensor `{name}`: {reason}"));
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| fail(format!("dimensions {dims:?} overflow the element count")))?;
        let (block, block_bytes) = ggml_block_geometry(ggml_type)
            .ok_or_else(|| fail(format!("unknown ggml type id {ggml_type}")))?;
        let (block, block_bytes) = (block as u64, block_bytes as u64);
        let ne0 = dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(block) {
            return Err(fail(format!(
                "row length {ne0} is not a multiple of the {} block size {block}",
                ggml_type_name(ggml_type)
            )));
        }
        let n_bytes = (n_elements / block)
            .checked_mul(block_bytes)
            .ok_or_else(|| fail(format!("byte size of dimensions {dims:?} overflows")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(fail(format!(
                "data offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        let start = data_offset
            .checked_add(offset)
            .filter(|s| s.checked_add(n_bytes).is_some_and(|e| e <= file_len))
            .ok_or_else(|| {
                fail(format!(
                    "data ({n_bytes} bytes at data-section offset {offset}) runs past the end of \
                     the file ({file_len} bytes, data section at {data_offset})"
                ))
            })?;
        Ok(TensorInfo {
            qtype: QuantType::from_id(ggml_type),
            name,
            dims,
            ggml_type,
            offset: start,
            n_bytes,
            n_elements,
        })
    }
}

/// Rejects tensors whose byte ranges overlap.
fn check_overlaps(tensors: &[TensorInfo]) -> Result<()> {
    let mut ranges: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    ranges.sort_unstable_by_key(|t| t.offset);
    for w in ranges.windows(2) {
        if w[0].offset + w[0].n_bytes > w[1].offset {
            return Err(ModelError::gguf(
                w[1].offset,
                format!(
                    "data of tensors `{}` and `{}` overlap",
                    w[0].name, w[1].name
                ),
            ));
        }
    }
    Ok(())
}
