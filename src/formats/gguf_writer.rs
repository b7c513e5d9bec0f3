//! The GGUF v3 writer: a builder of metadata and tensors that writes the
//! layout llama.cpp's `gguf_write_to_file` does (header, key/value pairs,
//! tensor infos, padding to the alignment, then each tensor's data padded to
//! the alignment). Used by tests and by `combs synth`.
//!
//! The builder checks what it is given (unique keys and names, a valid
//! `general.alignment`, data length matching type and dimensions), so what it
//! writes is always a file [`GgufFile`](super::gguf::GgufFile) accepts; tests
//! of malformed files corrupt its output afterwards.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::ggml_type::{ggml_block_geometry, ggml_type_name};
use super::gguf::{DEFAULT_ALIGNMENT, MetaArray, MetaValue};
use crate::error::{ModelError, Result};

/// GGUF version written.
pub const GGUF_WRITE_VERSION: u32 = 3;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory and writes it out.
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, MetaValue)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

/// Byte length of the data of a tensor, or why it cannot be stored.
fn tensor_bytes(ggml_type: u32, dims: &[u64]) -> std::result::Result<u64, String> {
    if dims.len() > 4 {
        return Err(format!("{} dimensions, at most 4 allowed", dims.len()));
    }
    let (block, block_bytes) = ggml_block_geometry(ggml_type)
        .ok_or_else(|| format!("unknown ggml type id {ggml_type}"))?;
    let n = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| format!("dimensions {dims:?} overflow the element count"))?;
    let ne0 = dims.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(block as u64) {
        return Err(format!(
            "row length {ne0} is not a multiple of the {} block size {block}",
            ggml_type_name(ggml_type)
        ));
    }
    (n / block as u64)
        .checked_mul(block_bytes as u64)
        .ok_or_else(|| format!("byte size of dimensions {dims:?} overflows"))
}

fn put_str(out: &mut impl Write, s: &[u8]) -> std::io::Result<()> {
    out.write_all(&(s.len() as u64).to_le_bytes())?;
    out.write_all(s)
}

fn put_array(out: &mut impl Write, a: &MetaArray) -> std::io::Result<()> {
    out.write_all(&a.elem_type().id().to_le_bytes())?;
    out.write_all(&(a.len() as u64).to_le_bytes())?;
    macro_rules! le {
        ($v:expr) => {{
            for x in $v {
                out.write_all(&x.to_le_bytes())?;
            }
        }};
    }
    match a {
        MetaArray::U8(v) => out.write_all(v)?,
        MetaArray::I8(v) => le!(v),
        MetaArray::U16(v) => le!(v),
        MetaArray::I16(v) => le!(v),
        MetaArray::U32(v) => le!(v),
        MetaArray::I32(v) => le!(v),
        MetaArray::U64(v) => le!(v),
        MetaArray::I64(v) => le!(v),
        MetaArray::F32(v) => le!(v),
        MetaArray::F64(v) => le!(v),
        MetaArray::Bool(v) => le!(v.iter().map(|&b| b as u8)),
        MetaArray::Str(v) => {
            for s in v {
                put_str(out, s.as_bytes())?;
            }
        }
        MetaArray::StrBytes(v) => {
            for s in v {
                put_str(out, s)?;
            }
        }
        MetaArray::Array(v) => {
            for inner in v {
                put_array(out, inner)?;
            }
        }
    }
    Ok(())
}

fn put_value(out: &mut impl Write, v: &MetaValue) -> std::io::Result<()> {
    out.write_all(&v.value_type().id().to_le_bytes())?;
    match v {
        MetaValue::U8(x) => out.write_all(&[*x]),
        MetaValue::I8(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::U16(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::I16(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::U32(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::I32(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::U64(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::I64(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::F32(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::F64(x) => out.write_all(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.write_all(&[*x as u8]),
        MetaValue::Str(s) => put_str(out, s.as_bytes()),
        MetaValue::Bytes(b) => put_str(out, b),
        MetaValue::Array(a) => put_array(out, a),
    }
}

fn pad(out: &mut impl Write, written: u64, alignment: u64) -> std::io::Result<u64> {
    let n = written.next_multiple_of(alignment) - written;
    // Padding is below the alignment (at most 2^31); write it in small chunks.
    let zeros = [0u8; 4096];
    let mut left = n;
    while left > 0 {
        let k = left.min(zeros.len() as u64) as usize;
        out.write_all(&zeros[..k])?;
        left -= k as u64;
    }
    Ok(n)
}

/// Counts bytes passed through to the inner writer.
struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl GgufWriter {
    /// An empty file with the default alignment of 32.
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Alignment the file will use.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Appends a metadata pair. `general.alignment` also sets the alignment used.
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a duplicate key;
    /// [`ModelError::Metadata`] for a `general.alignment` that is not a
    /// non-zero power-of-two `u32`.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        value: impl Into<MetaValue>,
    ) -> Result<&mut Self> {
        let key = key.into();
        let value = value.into();
        if self.keys.contains(&key) {
            return Err(ModelError::invalid(
                "key",
                format!("duplicate metadata key `{key}`"),
            ));
        }
        if key == "general.alignment" {
            match value {
                MetaValue::U32(a) if a != 0 && a.is_power_of_two() => self.alignment = a.into(),
                _ => {
                    return Err(ModelError::Metadata {
                        key,
                        reason: format!(
                            "must be a non-zero power-of-two u32, got {}",
                            value.type_desc()
                        ),
                    });
                }
            }
        }
        self.keys.insert(key.clone());
        self.metadata.push((key, value));
        Ok(self)
    }

    /// Appends a tensor of GGML type `ggml_type` with dimensions `dims`
    /// (`ne0` first) and its raw GGUF bytes.
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a duplicate name, more than 4
    /// dimensions, a type id without known geometry, a row length that is not a
    /// multiple of the block size, or `data` of the wrong length.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: u32,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(ModelError::invalid(
                "tensor",
                format!("duplicate tensor name `{name}`"),
            ));
        }
        let n = tensor_bytes(ggml_type, dims)
            .map_err(|r| ModelError::invalid("tensor", format!("`{name}`: {r}")))?;
        if data.len() as u64 != n {
            return Err(ModelError::invalid(
                "tensor",
                format!(
                    "`{name}`: {} bytes given, {n} expected for {} {dims:?}",
                    data.len(),
                    ggml_type_name(ggml_type)
                ),
            ));
        }
        self.names.insert(name.clone());
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        Ok(self)
    }

    /// Writes the file to `out`.
    ///
    /// # Errors
    /// Whatever `out` reports.
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut out = Counting { inner: out, n: 0 };
        out.write_all(b"GGUF")?;
        out.write_all(&GGUF_WRITE_VERSION.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            put_str(&mut out, k.as_bytes())?;
            put_value(&mut out, v)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, t.name.as_bytes())?;
            out.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                out.write_all(&d.to_le_bytes())?;
            }
            out.write_all(&t.ggml_type.to_le_bytes())?;
            out.write_all(&offset.to_le_bytes())?;
            offset = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
        }
        let written = out.n;
        pad(&mut out, written, self.alignment)?;
        for t in &self.tensors {
            out.write_all(&t.data)?;
            pad(&mut out, t.data.len() as u64, self.alignment)?;
        }
        out.flush()
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_to(&mut v)
            .expect("writing into a Vec<u8> cannot fail");
        v
    }

    /// Writes the file to `path`.
    ///
    /// # Errors
    /// [`ModelError::Io`] when the file cannot be created or written.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut w = BufWriter::new(File::create(path).map_err(io)?);
        self.write_to(&mut w).map_err(io)?;
        w.into_inner()
            .map_err(|e| io(e.into_error()))?
            .sync_all()
            .map_err(io)
    }
}
