//! GPU-resident weight matrices. A `[rows, cols]` tensor is uploaded straight
//! from its GGUF bytes (the mmap, no intermediate copy of the whole tensor)
//! into the device layout of its type, split by rows into chunks that each
//! fit one storage-buffer descriptor (`maxStorageBufferRange`: 128 MiB on
//! lavapipe), so any tensor size runs on any device.

use std::marker::PhantomData;
use std::sync::Arc;

use super::QuantType;
use super::layout::{RowSource, device_bytes, repack_rows};
use crate::error::{ModelError, Result};
use crate::gpu::phases::{self, Phase};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Uploader};

/// A contiguous range of rows of a weight, in one buffer.
pub struct WeightChunk {
    /// The chunk's data in the device layout of the weight's type.
    pub buffer: Arc<Buffer>,
    /// First row of the chunk.
    pub row_start: usize,
    /// Rows in the chunk.
    pub n_rows: usize,
}

/// A `[rows, cols]` tensor of `qtype` as its GGUF bytes: what an upload reads.
#[derive(Clone, Copy, Debug)]
pub struct TensorBytes<'a> {
    /// The tensor's name, for errors and the device buffer's label.
    pub name: &'a str,
    /// The storage type of `bytes`.
    pub qtype: QuantType,
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features), a multiple of the block size.
    pub cols: usize,
    /// The GGUF blocks of every row, row after row.
    pub bytes: &'a [u8],
}

/// A `[rows, cols]` weight of any supported type, resident on the device.
pub struct QuantWeight {
    name: String,
    qtype: QuantType,
    rows: usize,
    cols: usize,
    chunks: Vec<WeightChunk>,
}

impl std::fmt::Debug for QuantWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QuantWeight(`{}`, {}, {} x {}, {} chunks)",
            self.name,
            self.qtype,
            self.rows,
            self.cols,
            self.chunks.len()
        )
    }
}

/// Rows per chunk so that a chunk fits in `max` bytes (one descriptor's
/// range), or `None` if even one row does not.
pub fn rows_per_chunk(max: usize, qtype: QuantType, rows: usize, cols: usize) -> Option<usize> {
    let nb_row = cols / qtype.block_size();
    let row_bytes = device_bytes(qtype, nb_row).max(1);
    // Dense 16-bit rows of odd length share words across rows: keep chunk starts even.
    let per_row = if qtype.is_dense() {
        (nb_row * qtype.block_bytes()).max(1)
    } else {
        row_bytes
    };
    let mut n = (max / per_row).min(rows.max(1));
    if qtype.block_bytes() == 2 && cols % 2 == 1 && n < rows {
        n -= n % 2;
    }
    (n > 0).then_some(n)
}

impl QuantWeight {
    /// Uploads a `[rows, cols]` tensor of `qtype` from its GGUF bytes.
    ///
    /// # Errors
    /// `bytes` has the wrong length for the shape, `cols` is not a multiple of
    /// the block size, a row does not fit one descriptor, or out of device memory.
    pub fn from_gguf_bytes(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        name: &str,
        qtype: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        let tensor = TensorBytes {
            name,
            qtype,
            rows,
            cols,
            bytes,
        };
        // Chunks as large as the device's descriptor range (upload clamps to it).
        Self::upload_bytes(ctx, up, tensor, usize::MAX, 1)
    }

    /// Like [`QuantWeight::from_gguf_bytes`] with chunks of at most
    /// `max_chunk_bytes` (clamped to the device's descriptor range) — the split
    /// path every device with a small range takes, exercised anywhere.
    ///
    /// # Errors
    /// As [`QuantWeight::from_gguf_bytes`].
    pub fn from_gguf_bytes_chunked(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        tensor: TensorBytes<'_>,
        max_chunk_bytes: usize,
    ) -> Result<Self> {
        Self::upload_bytes(ctx, up, tensor, max_chunk_bytes, 1)
    }

    /// Like [`QuantWeight::from_gguf_bytes`] with every chunk's rows a
    /// multiple of `row_multiple` (except a last short one), so groups of
    /// rows that belong together (gate/up pairs) never straddle two chunks.
    ///
    /// # Errors
    /// As [`QuantWeight::from_gguf_bytes`].
    pub fn from_gguf_bytes_grouped(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        tensor: TensorBytes<'_>,
        row_multiple: usize,
    ) -> Result<Self> {
        Self::upload_bytes(ctx, up, tensor, usize::MAX, row_multiple)
    }

    /// Uploads the `[rows, cols]` tensor of `qtype` whose GGUF rows `src`
    /// holds (several tensors' rows stacked, read in place), with chunks'
    /// rows a multiple of `row_multiple` as in
    /// [`QuantWeight::from_gguf_bytes_grouped`].
    ///
    /// # Errors
    /// As [`QuantWeight::from_gguf_bytes`].
    #[allow(clippy::too_many_arguments)]
    pub fn from_rows(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        name: &str,
        qtype: QuantType,
        cols: usize,
        src: &RowSource<'_>,
        row_multiple: usize,
    ) -> Result<Self> {
        Self::upload(ctx, up, name, qtype, cols, src, usize::MAX, row_multiple)
    }

    fn upload_bytes(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        tensor: TensorBytes<'_>,
        max_chunk_bytes: usize,
        row_multiple: usize,
    ) -> Result<Self> {
        let TensorBytes {
            name,
            qtype,
            rows,
            cols,
            bytes,
        } = tensor;
        let shape_error = || ModelError::Shape {
            tensor: name.to_string(),
            expected: vec![
                cols.next_multiple_of(qtype.block_size()) as u64,
                rows as u64,
            ],
            got: vec![cols as u64, rows as u64],
        };
        let row_bytes = qtype.row_bytes(cols).map_err(|_| shape_error())?;
        if rows.checked_mul(row_bytes) != Some(bytes.len()) {
            return Err(ModelError::Shape {
                tensor: name.to_string(),
                expected: vec![(rows * row_bytes) as u64],
                got: vec![bytes.len() as u64],
            });
        }
        let src = RowSource::single(bytes, row_bytes)?;
        Self::upload(
            ctx,
            up,
            name,
            qtype,
            cols,
            &src,
            max_chunk_bytes,
            row_multiple,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn upload(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        name: &str,
        qtype: QuantType,
        cols: usize,
        src: &RowSource<'_>,
        max_chunk_bytes: usize,
        row_multiple: usize,
    ) -> Result<Self> {
        let rows = src.rows();
        let max_chunk_bytes = max_chunk_bytes.min(ctx.caps().max_binding_bytes(4) as usize);
        let row_bytes = qtype.row_bytes(cols).map_err(|_| ModelError::Shape {
            tensor: name.to_string(),
            expected: vec![
                cols.next_multiple_of(qtype.block_size()) as u64,
                rows as u64,
            ],
            got: vec![cols as u64, rows as u64],
        })?;
        if row_bytes != src.row_bytes() {
            return Err(ModelError::Shape {
                tensor: name.to_string(),
                expected: vec![row_bytes as u64],
                got: vec![src.row_bytes() as u64],
            });
        }
        let per_chunk = rows_per_chunk(max_chunk_bytes, qtype, rows, cols)
            .map(|n| {
                if n < rows {
                    n - n % row_multiple.max(1)
                } else {
                    n
                }
            })
            .filter(|&n| n > 0)
            .ok_or_else(|| ModelError::MissingFeature {
                device: ctx.caps().name.clone(),
                feature: format!(
                    "a storage buffer range of {row_bytes} bytes for one row of `{name}`"
                ),
            })?;
        let nb_row = cols / qtype.block_size();
        let mut chunks = Vec::new();
        let mut row_start = 0;
        while row_start < rows {
            let n_rows = per_chunk.min(rows - row_start);
            let nb = n_rows * nb_row;
            let buffer = {
                let _t = phases::time(Phase::Alloc);
                Buffer::new(
                    ctx,
                    device_bytes(qtype, nb) as u64,
                    MemoryKind::Device,
                    name,
                )?
            };
            let len = device_bytes(qtype, nb);
            up.upload_with(&buffer, 0, len as u64, |pos, out| {
                repack_rows(qtype, src, row_start, n_rows, pos as usize, out)
            })?;
            chunks.push(WeightChunk {
                buffer,
                row_start,
                n_rows,
            });
            row_start += n_rows;
        }
        Ok(QuantWeight {
            name: name.to_string(),
            qtype,
            rows,
            cols,
            chunks,
        })
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The storage type.
    pub fn qtype(&self) -> QuantType {
        self.qtype
    }

    /// Number of rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The row chunks, in order.
    pub fn chunks(&self) -> &[WeightChunk] {
        &self.chunks
    }

    /// Bytes the weight occupies on the device.
    pub fn device_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.buffer.size()).sum()
    }
}

/// Marker for one weight format, giving [`QWeight`] its static type.
pub trait WeightFormat {
    /// The format's type.
    const TYPE: QuantType;
}

/// A [`QuantWeight`] whose format is known at compile time: the spec's
/// `Q40Weight`, `Q4KWeight`, ... are this type for one format each. A
/// newtype over the engine's weight (same chunks, same device layout, same
/// kernels); [`QWeight::as_weight`] or `From` hands it to the ops.
pub struct QWeight<F: WeightFormat> {
    inner: QuantWeight,
    _format: PhantomData<F>,
}

impl<F: WeightFormat> std::fmt::Debug for QWeight<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<F: WeightFormat> QWeight<F> {
    /// Uploads a `[n_out, k]` matrix of `F` from its GGUF bytes, taken
    /// unchanged (the mmap'd tensor data; `k` a multiple of the block size),
    /// through a staging ring of its own that is flushed before returning.
    ///
    /// # Errors
    /// As [`QuantWeight::from_gguf_bytes`].
    pub fn from_gguf_bytes(
        ctx: &Arc<GpuContext>,
        bytes: &[u8],
        n_out: usize,
        k: usize,
    ) -> Result<Self> {
        let mut up = Uploader::for_new_buffers(ctx, 16 << 20)?;
        let w = Self::upload(ctx, &mut up, F::TYPE.name(), n_out, k, bytes)?;
        up.flush()?;
        Ok(w)
    }

    /// As [`QWeight::from_gguf_bytes`] through a caller's staging ring (many
    /// weights share one; the data is on the device once `up` is flushed).
    ///
    /// # Errors
    /// As [`QuantWeight::from_gguf_bytes`].
    pub fn upload(
        ctx: &Arc<GpuContext>,
        up: &mut Uploader,
        name: &str,
        n_out: usize,
        k: usize,
        bytes: &[u8],
    ) -> Result<Self> {
        Ok(QWeight {
            inner: QuantWeight::from_gguf_bytes(ctx, up, name, F::TYPE, n_out, k, bytes)?,
            _format: PhantomData,
        })
    }

    /// Output features (rows).
    pub fn n_out(&self) -> usize {
        self.inner.rows()
    }

    /// Input features (columns).
    pub fn k(&self) -> usize {
        self.inner.cols()
    }

    /// Bytes the weight occupies on the device.
    pub fn device_bytes(&self) -> u64 {
        self.inner.device_bytes()
    }

    /// The untyped weight, as ops take it.
    pub fn as_weight(&self) -> &QuantWeight {
        &self.inner
    }

    /// Gives up the static type.
    pub fn into_weight(self) -> QuantWeight {
        self.inner
    }
}

impl<F: WeightFormat> From<QWeight<F>> for QuantWeight {
    fn from(w: QWeight<F>) -> Self {
        w.inner
    }
}

impl<F: WeightFormat> TryFrom<QuantWeight> for QWeight<F> {
    type Error = ModelError;

    /// Takes on the static type of the weight's format.
    ///
    /// # Errors
    /// The weight is of another format.
    fn try_from(w: QuantWeight) -> Result<Self> {
        if w.qtype() != F::TYPE {
            return Err(ModelError::invalid(
                "weight",
                format!("`{}` is {}, not {}", w.name(), w.qtype(), F::TYPE),
            ));
        }
        Ok(QWeight {
            inner: w,
            _format: PhantomData,
        })
    }
}

/// Declares the marker of each format and its weight alias. A format given
/// `example(name, lower-case name, n_out, k)` gets a doc example that uploads
/// a matrix of that shape (the spec's named weights); the others get one
/// sentence.
macro_rules! weight_formats {
    ($(
        $(#[$doc:meta])* $marker:ident, $alias:ident => $t:ident
        $(, example($upper:literal, $lower:literal, $n:literal, $k:literal))?;
    )*) => {$(
        $(#[$doc])*
        pub struct $marker;
        impl WeightFormat for $marker {
            const TYPE: QuantType = QuantType::$t;
        }
        weight_formats!(@alias $marker, $alias, $t $(, $upper, $lower, $n, $k)?);
    )*};
    (@alias $marker:ident, $alias:ident, $t:ident) => {
        #[doc = concat!("A GPU-resident weight stored as ", stringify!($marker), ".")]
        pub type $alias = QWeight<$marker>;
    };
    (
        @alias $marker:ident, $alias:ident, $t:ident,
        $upper:literal, $lower:literal, $n:literal, $k:literal
    ) => {
        #[doc = concat!(
            "A weight matrix `[n_out, k]` resident in VRAM as ", $upper,
            " blocks (`k` a multiple of the block) in the device layout of [`repack_",
            $lower, "`](crate::repack_", $lower, ") (the file's bytes per weight), read by \
             the fused ", $upper, " kernels.\n\n",
            "```\n",
            "use combs::gpu::GpuContext;\n",
            "use combs::quant::{QuantType, quantize};\n",
            "use combs::", stringify!($alias), ";\n\n",
            "fn main() -> combs::Result<()> {\n",
            "    let ctx = GpuContext::new(None)?;\n",
            "    let (n_out, k) = (", stringify!($n), ", ", stringify!($k), ");\n",
            "    let w: Vec<f32> = (0..n_out * k).map(|i| (i as f32 * 0.37).sin()).collect();\n",
            "    // The blocks as a GGUF file holds them.\n",
            "    let bytes = quantize(QuantType::", stringify!($t), ", &w)?;\n",
            "    let weight = ", stringify!($alias),
            "::from_gguf_bytes(&ctx, &bytes, n_out, k)?;\n",
            "    assert_eq!((weight.n_out(), weight.k()), (n_out, k));\n",
            "    assert_eq!(weight.device_bytes(), bytes.len() as u64);\n",
            "    Ok(())\n",
            "}\n",
            "```"
        )]
        pub type $alias = QWeight<$marker>;
    };
}

weight_formats! {
    /// 32-bit float weights.
    F32, F32Weight => F32;
    /// IEEE half weights.
    F16, F16Weight => F16;
    /// bfloat16 weights.
    BF16, BF16Weight => BF16;
    /// Q4_0 weights.
    Q4_0, Q40Weight => Q4_0, example("Q4_0", "q4_0", 2, 64);
    /// Q4_1 weights.
    Q4_1, Q41Weight => Q4_1;
    /// Q5_0 weights.
    Q5_0, Q50Weight => Q5_0, example("Q5_0", "q5_0", 2, 64);
    /// Q5_1 weights.
    Q5_1, Q51Weight => Q5_1;
    /// Q8_0 weights.
    Q8_0, Q80Weight => Q8_0, example("Q8_0", "q8_0", 2, 64);
    /// Q2_K weights.
    Q2K, Q2KWeight => Q2K;
    /// Q3_K weights.
    Q3K, Q3KWeight => Q3K;
    /// Q4_K weights.
    Q4K, Q4KWeight => Q4K, example("Q4_K", "q4_k", 2, 256);
    /// Q5_K weights.
    Q5K, Q5KWeight => Q5K, example("Q5_K", "q5_k", 2, 256);
    /// Q6_K weights.
    Q6K, Q6KWeight => Q6K, example("Q6_K", "q6_k", 2, 256);
}
