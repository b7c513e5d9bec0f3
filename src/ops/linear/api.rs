//! The spec's `Linear`: one layer `y = x W^T (+ b)` that a caller builds and
//! runs on its own — a dense tensor on the portable f32 product, or packed
//! quant blocks bound to a fused dequantizing kernel
//! (`Linear::Quant(Box<dyn QuantLinearOp>)`), picked at load time by
//! [`try_quant_linear`].
//!
//! Thin over the engine's product: each variant holds an engine
//! [`super::Linear`] (a [`QuantWeight`] and a bias) and records through
//! [`record_linear`]. The models keep the engine struct: their planner
//! folds norms, ropes and gated activations into products, which this
//! one-product interface does not describe.

use std::sync::Arc;

use super::{Input, LinearVariant, Output, record_linear};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording, Uploader, run_once, upload_new};
use crate::ops::Mat;
use crate::quant::weight::{QWeight, WeightFormat};
use crate::quant::{QuantType, QuantWeight, TensorBytes, dequantize_vec};

/// The engine's layer: a weight `[n_out, n_in]` and an optional bias.
pub type EngineLinear = super::Linear;

/// A product over packed quant blocks on a device kernel: what
/// [`Linear::Quant`] holds. [`FusedQuantLinear`] is the engine's (every
/// GGUF quant type combs reads); another implementation (a quantizer's
/// own block format) plugs in beside it.
///
/// ```
/// use combs::gpu::GpuContext;
/// use combs::quant::{QuantType, quantize};
/// use combs::{Linear, Q4KWeight, QuantLinearOp};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     let w: Vec<f32> = (0..2 * 256).map(|i| (i as f32 * 0.37).sin()).collect();
///     let bytes = quantize(QuantType::Q4K, &w)?;
///     let layer = Linear::from(Q4KWeight::from_gguf_bytes(&ctx, &bytes, 2, 256)?);
///     assert!(layer.is_quant());
///     if let Linear::Quant(op) = &layer {
///         let op: &dyn QuantLinearOp = op.as_ref();
///         assert_eq!((op.qtype(), op.n_in(), op.n_out()), (QuantType::Q4K, 256, 2));
///     }
///     assert_eq!(layer.forward(&ctx, &vec![1.0; 256])?.len(), 2);
///     Ok(())
/// }
/// ```
pub trait QuantLinearOp: Send + Sync {
    /// The weight's storage type.
    fn qtype(&self) -> QuantType;

    /// Input features (`k`).
    fn n_in(&self) -> usize;

    /// Output features.
    fn n_out(&self) -> usize;

    /// Records `y = x W^T (+ b)` for every row (token) of `x` into the rows
    /// of `y`; records only, the caller submits.
    ///
    /// # Errors
    /// Operands that do not match the weight, or a layout the device cannot run.
    fn record(&self, rec: &mut Recording, x: Mat<'_>, y: Mat<'_>) -> Result<()>;

    /// Bytes of device memory of the weight and bias.
    fn device_bytes(&self) -> u64;
}

/// The engine's fused product over a quantized weight: the matvec, tiled,
/// row-per-invocation or cooperative-matrix kernel of the weight's type,
/// as combs picks for the device and the number of tokens.
///
/// ```
/// use combs::gpu::GpuContext;
/// use combs::ops::linear::api::{FusedQuantLinear, QuantLinearOp};
/// use combs::quant::{QuantType, quantize};
/// use combs::Q80Weight;
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     let w: Vec<f32> = (0..4 * 64).map(|i| (i as f32 * 0.37).sin()).collect();
///     let weight = Q80Weight::from_gguf_bytes(&ctx, &quantize(QuantType::Q8_0, &w)?, 4, 64)?;
///     let op = FusedQuantLinear::new(weight.into(), None)?;
///     assert_eq!((op.qtype(), op.n_out(), op.n_in()), (QuantType::Q8_0, 4, 64));
///     Ok(())
/// }
/// ```
pub struct FusedQuantLinear {
    layer: EngineLinear,
}

impl FusedQuantLinear {
    /// The product of a quantized `weight` and an optional f32 `bias`
    /// (`n_out` floats) on the device.
    ///
    /// # Errors
    /// A dense weight (that is [`Linear::Dense`]'s), or a bias of another length.
    pub fn new(weight: QuantWeight, bias: Option<Arc<Buffer>>) -> Result<Self> {
        if weight.qtype().is_dense() {
            return Err(ModelError::invalid(
                "weight",
                format!(
                    "`{}` is {}, not quantized blocks",
                    weight.name(),
                    weight.qtype()
                ),
            ));
        }
        check_bias_buffer(&weight, bias.as_ref())?;
        Ok(FusedQuantLinear {
            layer: EngineLinear { weight, bias },
        })
    }

    /// The engine's layer underneath.
    pub fn layer(&self) -> &EngineLinear {
        &self.layer
    }
}

impl QuantLinearOp for FusedQuantLinear {
    fn qtype(&self) -> QuantType {
        self.layer.weight.qtype()
    }

    fn n_in(&self) -> usize {
        self.layer.n_in()
    }

    fn n_out(&self) -> usize {
        self.layer.n_out()
    }

    fn record(&self, rec: &mut Recording, x: Mat<'_>, y: Mat<'_>) -> Result<()> {
        record_linear(rec, &self.layer.call(Input::F32(x), Output::Store(y)))
    }

    fn device_bytes(&self) -> u64 {
        self.layer.device_bytes()
    }
}

/// A dense weight (f32, f16 or bf16) on the f32 product kernels, the
/// portable path every device runs: what [`Linear::Dense`] holds.
pub struct DenseLinear {
    layer: EngineLinear,
}

impl DenseLinear {
    /// The product of a dense `weight` and an optional f32 `bias` on the device.
    ///
    /// # Errors
    /// A quantized weight, or a bias of another length.
    pub fn new(weight: QuantWeight, bias: Option<Arc<Buffer>>) -> Result<Self> {
        if !weight.qtype().is_dense() {
            return Err(ModelError::invalid(
                "weight",
                format!(
                    "`{}` is {}, not a dense type",
                    weight.name(),
                    weight.qtype()
                ),
            ));
        }
        check_bias_buffer(&weight, bias.as_ref())?;
        Ok(DenseLinear {
            layer: EngineLinear { weight, bias },
        })
    }

    /// The engine's layer underneath.
    pub fn layer(&self) -> &EngineLinear {
        &self.layer
    }
}

fn check_bias_buffer(weight: &QuantWeight, bias: Option<&Arc<Buffer>>) -> Result<()> {
    match bias {
        Some(b) if b.size() < 4 * weight.rows() as u64 => Err(ModelError::Shape {
            tensor: format!("`{}` bias", weight.name()),
            expected: vec![weight.rows() as u64],
            got: vec![b.size() / 4],
        }),
        _ => Ok(()),
    }
}

/// A linear layer `y = x W^T (+ b)` with `W` of `[n_out, n_in]`: a dense
/// tensor on the portable path, or packed quant blocks bound to a fused
/// device kernel. [`try_quant_linear`] builds one from a tensor's GGUF bytes.
///
/// ```
/// use combs::gpu::GpuContext;
/// use combs::quant::{QuantType, TensorBytes, quantize};
/// use combs::{Linear, try_quant_linear};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     let (n_out, k) = (4, 64);
///     let w: Vec<f32> = (0..n_out * k).map(|i| (i as f32 * 0.37).sin()).collect();
///     let bytes = quantize(QuantType::Q4_0, &w)?;
///     let (qtype, rows, cols) = (QuantType::Q4_0, n_out, k);
///     let tensor = TensorBytes { name: "w", qtype, rows, cols, bytes: &bytes };
///     let quant = try_quant_linear(&ctx, tensor, Some(&[0.5; 4]))?;
///     assert!(matches!(quant, Linear::Quant(_)));
///     let dense = Linear::dense(&ctx, tensor, Some(&[0.5; 4]))?; // the same weights, expanded
///
///     let x: Vec<f32> = (0..2 * k).map(|i| (i as f32 * 0.11).cos()).collect(); // 2 tokens
///     let (a, b) = (quant.forward(&ctx, &x)?, dense.forward(&ctx, &x)?);
///     assert_eq!(a.len(), 2 * n_out);
///     assert!(a.iter().zip(&b).all(|(a, b)| (a - b).abs() < 1e-3));
///     Ok(())
/// }
/// ```
pub enum Linear {
    /// A dense weight on the portable f32 product.
    Dense(DenseLinear),
    /// Packed quant blocks bound to a fused device kernel.
    Quant(Box<dyn QuantLinearOp>),
}

impl std::fmt::Debug for Linear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.is_quant() { "Quant" } else { "Dense" };
        write!(
            f,
            "Linear::{kind}({}, {} -> {})",
            self.qtype(),
            self.n_in(),
            self.n_out()
        )
    }
}

/// Uploads an optional f32 bias of `n_out` floats for the tensor `name`.
fn upload_bias(
    ctx: &Arc<GpuContext>,
    name: &str,
    bias: Option<&[f32]>,
    n_out: usize,
) -> Result<Option<Arc<Buffer>>> {
    let Some(b) = bias else {
        return Ok(None);
    };
    if b.len() != n_out {
        return Err(ModelError::Shape {
            tensor: format!("{name}.bias"),
            expected: vec![n_out as u64],
            got: vec![b.len() as u64],
        });
    }
    upload_new(ctx, bytemuck::cast_slice(b), &format!("{name}.bias")).map(Some)
}

/// Uploads `tensor` as it is stored.
fn upload_weight(ctx: &Arc<GpuContext>, tensor: TensorBytes<'_>) -> Result<QuantWeight> {
    let mut up = Uploader::for_new_buffers(ctx, 16 << 20)?;
    let w = QuantWeight::from_gguf_bytes(
        ctx,
        &mut up,
        tensor.name,
        tensor.qtype,
        tensor.rows,
        tensor.cols,
        tensor.bytes,
    )?;
    up.flush()?;
    Ok(w)
}

/// Whether the engine has a fused product kernel for weights of `t` on this
/// device. Every quantized type combs reads has one in every kernel
/// family, and the portable families run on any device combs opens
/// ([`crate::gpu::DeviceCaps::check_required`]); dense types take the
/// dense path instead.
///
/// ```
/// use combs::gpu::GpuContext;
/// use combs::ops::linear::api::has_fused_kernel;
/// use combs::quant::QuantType;
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     assert!(has_fused_kernel(&ctx, QuantType::Q4K));
///     assert!(!has_fused_kernel(&ctx, QuantType::F16));
///     Ok(())
/// }
/// ```
pub fn has_fused_kernel(ctx: &GpuContext, t: QuantType) -> bool {
    !t.is_dense() && ctx.caps().check_required().is_ok()
}

/// Builds the layer of one tensor at load time: the quantized op
/// ([`Linear::Quant`] over [`FusedQuantLinear`], the bytes uploaded
/// unchanged) where a fused kernel exists for the tensor's type on this
/// device ([`has_fused_kernel`]), else the dense path ([`Linear::dense`]).
/// `bias`, if any, is `n_out` floats.
///
/// ```
/// use combs::gpu::GpuContext;
/// use combs::quant::{QuantType, TensorBytes, quantize};
/// use combs::{Linear, try_quant_linear};
///
/// fn main() -> combs::Result<()> {
///     let ctx = GpuContext::new(None)?;
///     let w: Vec<f32> = (0..2 * 256).map(|i| (i as f32 * 0.37).sin()).collect();
///     for t in [QuantType::Q4K, QuantType::F16] {
///         let bytes = quantize(t, &w)?;
///         let tensor = TensorBytes { name: "w", qtype: t, rows: 2, cols: 256, bytes: &bytes };
///         let layer = try_quant_linear(&ctx, tensor, None)?;
///         assert_eq!(layer.is_quant(), t == QuantType::Q4K);
///         assert_eq!(layer.device_bytes(), bytes.len() as u64); // the file's bytes either way
///     }
///     Ok(())
/// }
/// ```
///
/// # Errors
/// Bytes that do not match the shape, `cols` not a multiple of the block,
/// a bias of another length, or out of device memory.
pub fn try_quant_linear(
    ctx: &Arc<GpuContext>,
    tensor: TensorBytes<'_>,
    bias: Option<&[f32]>,
) -> Result<Linear> {
    if !has_fused_kernel(ctx, tensor.qtype) {
        return Linear::dense(ctx, tensor, bias);
    }
    let b = upload_bias(ctx, tensor.name, bias, tensor.rows)?;
    let op = FusedQuantLinear::new(upload_weight(ctx, tensor)?, b)?;
    Ok(Linear::Quant(Box::new(op)))
}

impl Linear {
    /// The dense path for `tensor`: dense types keep their bytes, quantized
    /// ones are expanded to f32 on the CPU by the reference dequantizer
    /// (`n_out * n_in * 4` bytes on the device). `bias`, if any, is `n_out` floats.
    ///
    /// # Errors
    /// As [`try_quant_linear`].
    pub fn dense(
        ctx: &Arc<GpuContext>,
        tensor: TensorBytes<'_>,
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        let b = upload_bias(ctx, tensor.name, bias, tensor.rows)?;
        let weight = if tensor.qtype.is_dense() {
            upload_weight(ctx, tensor)?
        } else {
            let n = tensor.rows.checked_mul(tensor.cols).ok_or_else(|| {
                ModelError::invalid("shape", format!("{} x {}", tensor.rows, tensor.cols))
            })?;
            let w = dequantize_vec(tensor.qtype, tensor.bytes, n)?;
            upload_weight(
                ctx,
                TensorBytes {
                    qtype: QuantType::F32,
                    bytes: bytemuck::cast_slice(&w),
                    ..tensor
                },
            )?
        };
        Ok(Linear::Dense(DenseLinear::new(weight, b)?))
    }

    /// The layer of a weight already on the device, without a bias: dense
    /// or quantized as its type is.
    pub fn from_weight(weight: QuantWeight) -> Self {
        let dense = weight.qtype().is_dense();
        let layer = EngineLinear { weight, bias: None };
        if dense {
            Linear::Dense(DenseLinear { layer })
        } else {
            Linear::Quant(Box::new(FusedQuantLinear { layer }))
        }
    }

    /// Whether the layer runs on a fused quant kernel.
    pub fn is_quant(&self) -> bool {
        matches!(self, Linear::Quant(_))
    }

    /// The weight's storage type on the device.
    pub fn qtype(&self) -> QuantType {
        match self {
            Linear::Dense(d) => d.layer.weight.qtype(),
            Linear::Quant(q) => q.qtype(),
        }
    }

    /// Input features.
    pub fn n_in(&self) -> usize {
        match self {
            Linear::Dense(d) => d.layer.n_in(),
            Linear::Quant(q) => q.n_in(),
        }
    }

    /// Output features.
    pub fn n_out(&self) -> usize {
        match self {
            Linear::Dense(d) => d.layer.n_out(),
            Linear::Quant(q) => q.n_out(),
        }
    }

    /// Bytes of device memory of the weight and bias.
    pub fn device_bytes(&self) -> u64 {
        match self {
            Linear::Dense(d) => d.layer.device_bytes(),
            Linear::Quant(q) => q.device_bytes(),
        }
    }

    /// Records `y = x W^T (+ b)` for every row of `x` (f32 `[n, n_in]`)
    /// into `y` (f32 `[n, n_out]`); records only, the caller submits.
    ///
    /// # Errors
    /// Operands that do not match the weight, or a layout the device cannot run.
    pub fn record(&self, rec: &mut Recording, x: Mat<'_>, y: Mat<'_>) -> Result<()> {
        match self {
            Linear::Dense(d) => {
                // f32 kernels only: the portable path rounds nothing to f16.
                let variant = LinearVariant::choose_f32(rec.context(), x.rows, x);
                let call = d.layer.call(Input::F32(x), Output::Store(y)).on(variant);
                record_linear(rec, &call)
            }
            Linear::Quant(q) => q.record(rec, x, y),
        }
    }

    /// Runs the layer once on the rows of `x` (`n * n_in` floats, row-major)
    /// and returns `y` (`n * n_out` floats): uploads, records, submits, waits
    /// and reads back.
    ///
    /// # Errors
    /// `x` empty or not whole rows, out of memory, or a failing Vulkan call.
    pub fn forward(&self, ctx: &Arc<GpuContext>, x: &[f32]) -> Result<Vec<f32>> {
        let (k, m) = (self.n_in(), self.n_out());
        if x.is_empty() || k == 0 || !x.len().is_multiple_of(k) {
            return Err(ModelError::invalid(
                "x",
                format!("{} floats are not whole rows of {k}", x.len()),
            ));
        }
        let n = x.len() / k;
        let xb = Buffer::new(ctx, (4 * x.len()) as u64, MemoryKind::Upload, "linear x")?;
        xb.write_slice(0, x)?;
        let yb = Buffer::new(ctx, (4 * n * m) as u64, MemoryKind::Readback, "linear y")?;
        run_once(ctx, |rec| {
            self.record(rec, Mat::new(&xb, n, k), Mat::new(&yb, n, m))
        })?;
        let mut y = vec![0.0f32; n * m];
        yb.read_slice(0, &mut y)?;
        Ok(y)
    }
}

impl<F: WeightFormat> From<QWeight<F>> for Linear {
    /// The layer of a typed weight, without a bias ([`Linear::from_weight`]).
    fn from(w: QWeight<F>) -> Self {
        Linear::from_weight(w.into_weight())
    }
}
