//! Loading tensors from a GGUF file onto the device with their shapes checked
//! against what the architecture expects, and load progress on a terminal.

use std::io::IsTerminal;
use std::sync::Arc;

use crate::error::{ModelError, Result};
use crate::formats::gguf::{GgufFile, TensorInfo};
use crate::gpu::phases::{self, Phase};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Uploader};
use crate::ops::linear::Linear;
use crate::quant::{QuantType, QuantWeight, RowSource, dequantize_vec};

/// Bytes of each half of a load's staging ring.
const LOAD_HALF: u64 = 64 << 20;

/// Whether `COMBS_LOAD_STAGING=1` asks loads to go through the staging ring
/// even where device memory is host-visible: the discrete-GPU path, timed
/// and tested on a CPU device.
fn staging_forced() -> bool {
    std::env::var_os("COMBS_LOAD_STAGING").is_some_and(|v| v != "0")
}

/// Reads tensors of one file onto one device, counting bytes for a progress bar.
pub struct TensorLoader<'a> {
    ctx: Arc<GpuContext>,
    gguf: &'a GgufFile,
    up: Uploader,
    bar: Option<indicatif::ProgressBar>,
}

impl<'a> TensorLoader<'a> {
    /// A loader for `gguf`; `show_progress` draws a bar when stderr is a terminal.
    ///
    /// # Errors
    /// The staging ring cannot be allocated.
    pub fn new(ctx: &Arc<GpuContext>, gguf: &'a GgufFile, show_progress: bool) -> Result<Self> {
        let bar = (show_progress && std::io::stderr().is_terminal()).then(|| {
            let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "loading {bar:40} {bytes}/{total_bytes} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        // Halves of 64 MiB: a submission and a wait per 64 MiB keeps their
        // cost (tens of microseconds each) far below the copy's, while two of
        // them stay a small part of host-visible memory; a small model's
        // ring is no larger than it.
        let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
        let half = (total / 2).clamp(1 << 20, LOAD_HALF);
        Ok(TensorLoader {
            ctx: ctx.clone(),
            gguf,
            up: if staging_forced() {
                Uploader::with_half_size(ctx, half)?
            } else {
                Uploader::for_new_buffers(ctx, half)?
            },
            bar,
        })
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo> {
        self.gguf
            .tensor(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.into() })
    }

    fn check_dims(t: &TensorInfo, expected: &[usize]) -> Result<()> {
        let got: Vec<u64> = t.dims.clone();
        let want: Vec<u64> = expected.iter().map(|&d| d as u64).collect();
        // Trailing 1s are not significant (ggml pads dims with 1).
        let trim = |v: &[u64]| {
            let mut v = v.to_vec();
            while v.len() > 1 && v.last() == Some(&1) {
                v.pop();
            }
            v
        };
        if trim(&got) != trim(&want) {
            return Err(ModelError::Shape {
                tensor: t.name.clone(),
                expected: want,
                got,
            });
        }
        Ok(())
    }

    fn advance(&self, t: &TensorInfo) {
        if let Some(bar) = &self.bar {
            bar.inc(t.n_bytes);
        }
    }

    /// The device tensors are loaded onto.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Whether the file has tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// Loads a matrix `[rows, cols]` (GGUF dims `[cols, rows]`) in its stored format.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type, device errors.
    pub fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<QuantWeight> {
        self.matrix_shaped(name, &[cols, rows], rows, cols)
    }

    /// Loads a tensor of GGUF dims `dims` whose last dimension is `rows` as
    /// the matrix `[rows, cols]` of its flattened rows (a convolution's
    /// `[kw, kh, channels, out]` kernel as `[out, channels·kh·kw]`).
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type, device errors.
    pub fn matrix_shaped(
        &mut self,
        name: &str,
        dims: &[usize],
        rows: usize,
        cols: usize,
    ) -> Result<QuantWeight> {
        let t = self.info(name)?;
        Self::check_dims(t, dims)?;
        let qtype = t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
            tensor: name.into(),
            ggml_type: crate::quant::types::ggml_type_name(t.ggml_type),
        })?;
        let w = QuantWeight::from_gguf_bytes(
            &self.ctx,
            &mut self.up,
            name,
            qtype,
            rows,
            cols,
            self.gguf.tensor_data(t),
        )?;
        self.advance(t);
        Ok(w)
    }

    /// Uploads a matrix `[rows, cols]` the caller built (`bytes` in the
    /// GGUF encoding of `qtype`), as [`TensorLoader::matrix`] would a stored one.
    ///
    /// # Errors
    /// Bytes not of that shape, device errors.
    pub fn upload_matrix(
        &mut self,
        name: &str,
        qtype: QuantType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<QuantWeight> {
        QuantWeight::from_gguf_bytes(&self.ctx, &mut self.up, name, qtype, rows, cols, bytes)
    }

    /// The GGUF dims of tensor `name` (`ne0` first).
    ///
    /// # Errors
    /// Missing tensor.
    pub fn host_dims(&self, name: &str) -> Result<Vec<u64>> {
        Ok(self.info(name)?.dims.clone())
    }

    /// The stored type of tensor `name`.
    ///
    /// # Errors
    /// Missing tensor, or a type combs does not compute with.
    pub fn qtype(&self, name: &str) -> Result<QuantType> {
        let t = self.info(name)?;
        t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
            tensor: name.into(),
            ggml_type: crate::quant::types::ggml_type_name(t.ggml_type),
        })
    }

    /// Loads matrices `names[i]` of `rows[i]` rows and `cols` columns as one
    /// weight named `name`: their rows one after another, or with
    /// `interleave` one row of each in turn (all must have the same rows;
    /// chunks then split the weight only between whole rounds). `None`
    /// (nothing read) when their storage types differ.
    ///
    /// # Errors
    /// Missing tensors, wrong shapes, unsupported types, device errors.
    pub fn matrix_stack(
        &mut self,
        name: &str,
        names: &[&str],
        rows: &[usize],
        cols: usize,
        interleave: bool,
    ) -> Result<Option<QuantWeight>> {
        let mut infos = Vec::with_capacity(names.len());
        for (&n, &r) in names.iter().zip(rows) {
            let t = self.info(n)?;
            Self::check_dims(t, &[cols, r])?;
            infos.push(t);
        }
        let Some(first) = infos.first() else {
            return Ok(None);
        };
        if infos.iter().any(|t| t.ggml_type != first.ggml_type)
            || (interleave && rows.iter().any(|&r| r != rows[0]))
        {
            return Ok(None);
        }
        let qtype = first
            .qtype
            .ok_or_else(|| ModelError::UnsupportedTensorType {
                tensor: first.name.clone(),
                ggml_type: crate::quant::types::ggml_type_name(first.ggml_type),
            })?;
        let data: Vec<&[u8]> = infos.iter().map(|t| self.gguf.tensor_data(t)).collect();
        let row_bytes = qtype.row_bytes(cols)?;
        for ((t, d), &r) in infos.iter().zip(&data).zip(rows) {
            if d.len() != r * row_bytes {
                return Err(ModelError::Shape {
                    tensor: t.name.clone(),
                    expected: vec![(r * row_bytes) as u64],
                    got: vec![d.len() as u64],
                });
            }
        }
        // The parts' rows read in place from the file, in the stacked order.
        let src = RowSource::new(data, row_bytes, interleave)?;
        let w = QuantWeight::from_rows(
            &self.ctx,
            &mut self.up,
            name,
            qtype,
            cols,
            &src,
            // whole rounds; or row pairs, for a rope folded into the matvec
            if interleave { names.len() } else { 2 },
        )?;
        for t in infos {
            self.advance(t);
        }
        Ok(Some(w))
    }

    /// Loads a vector of `len` values (any stored type) as f32 on the device.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type, device errors.
    pub fn vector(&mut self, name: &str, len: usize) -> Result<Arc<Buffer>> {
        let v = self.vector_host(name, len)?;
        self.upload_vector(&v, name)
    }

    /// A new device buffer holding `v`, through the loader's ring (on the
    /// device once [`TensorLoader::finish`] returns).
    fn upload_vector(&mut self, v: &[f32], name: &str) -> Result<Arc<Buffer>> {
        let bytes: &[u8] = bytemuck::cast_slice(v);
        let buf = Buffer::new(&self.ctx, bytes.len() as u64, MemoryKind::Device, name)?;
        self.up.upload(&buf, 0, bytes)?;
        Ok(buf)
    }

    /// Reads a vector of `len` values (any stored type) as f32 on the host.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type.
    pub fn vector_host(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        self.host_f32(name, &[len])
    }

    /// Reads a tensor of GGUF dims `dims` (any stored type) as f32 on the
    /// host, `dims[0]` the contiguous one.
    ///
    /// # Errors
    /// Missing tensor, wrong shape, unsupported type.
    pub fn host_f32(&mut self, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
        let len = dims.iter().product();
        let t = self.info(name)?;
        Self::check_dims(t, dims)?;
        let qtype = t.qtype.ok_or_else(|| ModelError::UnsupportedTensorType {
            tensor: name.into(),
            ggml_type: crate::quant::types::ggml_type_name(t.ggml_type),
        })?;
        let v = {
            let _t = phases::time(Phase::HostF32);
            dequantize_vec(qtype, self.gguf.tensor_data(t), len)?
        };
        self.advance(t);
        Ok(v)
    }

    /// Loads `name` if present.
    ///
    /// # Errors
    /// As [`TensorLoader::vector`] for a present tensor.
    pub fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<Arc<Buffer>>> {
        if self.has(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Loads the linear layer `{prefix}.weight` (`rows` × `cols`) with its
    /// bias `{prefix}.bias`: required where `bias`, else loaded if present.
    ///
    /// # Errors
    /// As [`TensorLoader::matrix`] and [`TensorLoader::vector`].
    pub fn linear(&mut self, prefix: &str, rows: usize, cols: usize, bias: bool) -> Result<Linear> {
        let weight = self.matrix(&format!("{prefix}.weight"), rows, cols)?;
        let name = format!("{prefix}.bias");
        let bias = if bias {
            Some(self.vector(&name, rows)?)
        } else {
            self.optional_vector(&name, rows)?
        };
        Ok(Linear { weight, bias })
    }

    /// Several linear layers over the same input (`(prefix, rows)` each) as
    /// one weight (see [`TensorLoader::matrix_stack`]), so one product
    /// computes them all; their biases, where any has one, stacked the same
    /// way (zeros for the others; every one required where `bias`). `None`
    /// when their weights are stored in different types.
    ///
    /// # Errors
    /// As [`TensorLoader::matrix_stack`], and a required bias missing.
    pub fn stacked_linear(
        &mut self,
        name: &str,
        parts: &[(&str, usize)],
        cols: usize,
        bias: bool,
        interleave: bool,
    ) -> Result<Option<Linear>> {
        let names: Vec<String> = parts.iter().map(|(p, _)| format!("{p}.weight")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let rows: Vec<usize> = parts.iter().map(|&(_, r)| r).collect();
        let Some(weight) = self.matrix_stack(name, &name_refs, &rows, cols, interleave)? else {
            return Ok(None);
        };
        let mut biases = Vec::with_capacity(parts.len());
        let mut any = false;
        for &(p, r) in parts {
            let bname = format!("{p}.bias");
            biases.push(if bias || self.has(&bname) {
                any = true;
                self.vector_host(&bname, r)?
            } else {
                vec![0.0; r]
            });
        }
        let bias = if any {
            let v: Vec<f32> = if interleave {
                (0..rows[0])
                    .flat_map(|i| biases.iter().map(move |b| b[i]))
                    .collect()
            } else {
                biases.concat()
            };
            Some(self.upload_vector(&v, name)?)
        } else {
            None
        };
        Ok(Some(Linear { weight, bias }))
    }

    /// Waits for every upload and clears the progress bar.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn finish(mut self) -> Result<()> {
        {
            let _t = phases::time(Phase::Flush);
            self.up.flush()?;
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        Ok(())
    }
}
