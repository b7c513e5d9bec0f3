//! Requantizing a GGUF file to another [`FileType`], producing the same file
//! as llama.cpp's `llama-quantize --allow-requantize IN OUT TYPE` (no
//! importance matrix): `llama_model_quantize_impl` in `src/llama-quant.cpp`.
//!
//! Same as llama.cpp, byte for byte:
//! - metadata: the input's pairs in file order, without `split.*`,
//!   `general.quantization_version` and `general.file_type`, which are then
//!   appended (2, and the target's `llama_ftype` value);
//! - tensors: in `weights_map` order (global tensors, then by block, each
//!   group by name), with the type [`policy::plan`] picks; a tensor that
//!   keeps its type is copied, the others are dequantized to f32 and
//!   quantized with the reference quantizers of [`crate::quant`];
//! - layout: GGUF v3, data aligned to 32 bytes.
//!
//! One deliberate difference: an input with `general.alignment` other than 32
//! keeps that alignment here, while llama.cpp copies the key but pads to 32
//! and so writes a file its own reader rejects.
//!
//! Rows are independent in every quantizer, so the work is split across
//! threads by chunks of rows without changing a byte of the result.

mod ftype;
pub mod policy;

use std::sync::Mutex;

pub use ftype::FileType;
pub use policy::{TensorPlan, plan};

use crate::error::{ModelError, Result};
use crate::formats::ggml_type::ggml_type_name;
use crate::formats::gguf::GgufFile;
use crate::formats::gguf_writer::GgufWriter;
use crate::quant::{DeviceLayout, QuantType, dequantize, quantize};

/// `GGML_QNT_VERSION`, written to `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// Keys llama.cpp drops from the copied metadata (split files are merged).
const DROPPED_KEYS: [&str; 5] = [
    "general.quantization_version",
    "general.file_type",
    "split.no",
    "split.count",
    "split.tensors.count",
];

/// Weights per unit of work handed to a thread (llama.cpp's `min_chunk_size`).
const CHUNK_ELEMENTS: u64 = 32 * 512;

/// How to run a requantization.
#[derive(Clone, Debug, Default)]
pub struct RequantizeOptions {
    /// Worker threads; 0 means one per available core.
    pub threads: usize,
}

impl RequantizeOptions {
    fn thread_count(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

/// One finished tensor, as reported to the progress callback.
#[derive(Clone, Debug)]
pub struct TensorDone<'a> {
    /// Position in the output, from 0.
    pub position: usize,
    /// Number of tensors in the output.
    pub total: usize,
    /// What was done.
    pub plan: &'a TensorPlan,
    /// Bytes in the input.
    pub old_bytes: u64,
    /// Bytes in the output.
    pub new_bytes: u64,
}

/// Requantizes `input` to `ftype` and returns the output file, ready to write.
///
/// # Errors
/// As [`requantize_with_progress`].
pub fn requantize(
    input: &GgufFile,
    ftype: FileType,
    opts: &RequantizeOptions,
) -> Result<GgufWriter> {
    requantize_with_progress(input, ftype, opts, |_| {})
}

/// As [`requantize`], calling `progress` after each tensor, in output order.
///
/// # Errors
/// [`ModelError::Metadata`] when the architecture or block count is missing;
/// [`ModelError::UnsupportedTensorType`] when a tensor that must be converted
/// has a type combs cannot dequantize; [`ModelError::Format`] when the
/// converted data has NaN or infinite values (llama.cpp's
/// `ggml_validate_row_data` refuses the same).
pub fn requantize_with_progress(
    input: &GgufFile,
    ftype: FileType,
    opts: &RequantizeOptions,
    mut progress: impl FnMut(&TensorDone<'_>),
) -> Result<GgufWriter> {
    let plans = plan(input, ftype)?;
    let mut w = GgufWriter::new();
    for (k, v) in input.metadata() {
        if !DROPPED_KEYS.contains(&k.as_str()) {
            w.add(k.clone(), v.clone())?;
        }
    }
    w.add("general.quantization_version", QUANTIZATION_VERSION)?;
    w.add("general.file_type", ftype.id())?;

    let threads = opts.thread_count();
    let total = plans.len();
    for (position, p) in plans.iter().enumerate() {
        let info = &input.tensors()[p.input_index];
        let src = input.tensor_data(info);
        let data = if p.converts() {
            convert(p, src, info.offset, threads)?
        } else {
            src.to_vec()
        };
        let new_bytes = data.len() as u64;
        w.add_tensor(p.name.clone(), p.to, &p.dims, data)?;
        progress(&TensorDone {
            position,
            total,
            plan: p,
            old_bytes: src.len() as u64,
            new_bytes,
        });
    }
    Ok(w)
}

/// Dequantizes and requantizes one tensor (whose data starts at file offset
/// `offset`), chunks of rows on `threads` threads.
fn convert(p: &TensorPlan, src: &[u8], offset: u64, threads: usize) -> Result<Vec<u8>> {
    let unsupported = |id: u32| ModelError::UnsupportedTensorType {
        tensor: p.name.clone(),
        ggml_type: ggml_type_name(id),
    };
    let from = QuantType::from_id(p.from).ok_or_else(|| unsupported(p.from))?;
    let to = QuantType::from_id(p.to).ok_or_else(|| unsupported(p.to))?;
    let too_big = || ModelError::invalid("tensor", format!("`{}` is too large", p.name));
    let n_per_row = usize::try_from(p.dims.first().copied().unwrap_or(1)).map_err(|_| too_big())?;
    let n = usize::try_from(p.n_elements).map_err(|_| too_big())?;
    if n_per_row == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let n_rows = n / n_per_row;
    let (row_src, row_dst) = (from.row_bytes(n_per_row)?, to.row_bytes(n_per_row)?);
    if src.len() != n_rows * row_src {
        return Err(ModelError::gguf(
            offset,
            format!(
                "tensor `{}` has {} bytes, expected {}",
                p.name,
                src.len(),
                n_rows * row_src
            ),
        ));
    }

    let rows_per_chunk = (CHUNK_ELEMENTS as usize).div_ceil(n_per_row).max(1);
    let mut out = vec![0u8; n_rows * row_dst];
    let work: Vec<(usize, &mut [u8])> = out
        .chunks_mut(rows_per_chunk * row_dst)
        .enumerate()
        .map(|(i, c)| (i * rows_per_chunk, c))
        .collect();
    let n_workers = threads.clamp(1, work.len().max(1));
    let queue = Mutex::new(work.into_iter());
    let worker = || -> Result<()> {
        let mut buf = Vec::new();
        loop {
            let next = queue.lock().map_err(|_| poisoned())?.next();
            let Some((row0, dst)) = next else {
                return Ok(());
            };
            let rows = dst.len() / row_dst;
            buf.resize(rows * n_per_row, 0.0f32);
            dequantize(
                from,
                &src[row0 * row_src..(row0 + rows) * row_src],
                &mut buf,
            )?;
            let q = quantize(to, &buf)?;
            validate(to, &q, &p.name, offset)?;
            dst.copy_from_slice(&q);
        }
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..n_workers).map(|_| s.spawn(worker)).collect();
        let mine = worker();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(poisoned())))
            .fold(mine, |acc, r| acc.and(r))
    })?;
    Ok(out)
}

fn poisoned() -> ModelError {
    ModelError::Internal("a requantization worker panicked".into())
}

/// llama.cpp's `ggml_validate_row_data` on freshly quantized bytes: every
/// value of a dense type and every f16 scale of a block type must be finite.
fn validate(t: QuantType, bytes: &[u8], name: &str, offset: u64) -> Result<()> {
    let finite = match (t, DeviceLayout::of(t)) {
        (QuantType::F32, _) => bytes
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        (QuantType::F16, _) => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 != 0x7c00),
        (QuantType::BF16, _) => bytes
            .chunks_exact(2)
            .all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 != 0x7f80),
        (_, Some(layout)) => bytes.chunks_exact(t.block_bytes()).all(|b| {
            layout
                .scales
                .iter()
                .all(|&o| u16::from_le_bytes([b[o], b[o + 1]]) & 0x7c00 != 0x7c00)
        }),
        (_, None) => true,
    };
    if finite {
        Ok(())
    } else {
        Err(ModelError::gguf(
            offset,
            format!("tensor `{name}`: converting to {t} gives NaN or infinite values"),
        ))
    }
}
