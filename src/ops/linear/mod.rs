//! `linear`: `y = W x (+ bias) (+ y)` for the tokens of a call, with a
//! GPU-resident weight of any format dequantized on the fly, and the steps
//! the kernels can fold into their loads and stores (an RMS norm of the
//! input, a rope or a gated activation of the output, the sums of squares
//! the next product's folded norm needs). One call struct ([`LinearCall`])
//! for every kernel family, one entry point ([`record_linear`]); the
//! families live in their own files, each with its push constants:
//!
//! - [`matvec`]: one token (decode) or a few, a subgroup's lanes per row;
//! - [`matvec_q8`]: the same with 8-bit activations and integer dot
//!   products (Q4_0 / Q8_0 under llama.cpp numerics);
//! - [`tiled`]: tiles through shared memory (portable prompts);
//! - [`rows`]: one invocation per row with uniform loads (CPU devices);
//! - [`coop`]: cooperative-matrix tiles (prompts on GPUs that have them),
//!   and the workgroup-scope ones of `VK_NV_cooperative_matrix2` (opt-in);
//! - [`skinny`]: cooperative-matrix products of 4-128 tokens (batched decode).
//!
//! Weights split into row chunks get one dispatch per chunk. [`api`] holds
//! the spec's `Linear` (dense or `Quant(Box<dyn QuantLinearOp>)`), a layer
//! a caller builds and runs on its own over this struct and entry point.

pub mod api;
pub mod coop;
pub mod matvec;
pub mod matvec_q8;
pub mod rows;
pub mod skinny;
pub mod tiled;

use std::sync::Arc;

use half::f16;

pub use coop::{CoopInput, CoopTile};
pub use matvec::{MATVEC_MAX_TOKENS, MatvecShape};
pub use skinny::{SKINNY_MAX_TOKENS, SKINNY_MIN_TOKENS};

use super::glu::Activation;
use super::params::LinearDims;
use super::rms_norm::NormWeight;
use super::rope::{Rope, RopeStyle};
use super::{AnyMat, Mat, is_cpu, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, Recording};
use crate::quant::{QuantWeight, WeightChunk};

/// A linear layer: a weight `[out, in]` and an optional f32 bias `[out]`.
pub struct Linear {
    /// The weight, `rows` = output features, `cols` = input features.
    pub weight: QuantWeight,
    /// Optional bias on the device.
    pub bias: Option<Arc<Buffer>>,
}

impl Linear {
    /// Input features.
    pub fn n_in(&self) -> usize {
        self.weight.cols()
    }

    /// Output features.
    pub fn n_out(&self) -> usize {
        self.weight.rows()
    }

    /// A call of this layer on `input` into `output`.
    pub fn call<'a>(&'a self, input: Input<'a>, output: Output<'a>) -> LinearCall<'a> {
        LinearCall::new(&self.weight, self.bias.as_ref(), input, output)
    }

    /// Bytes of device memory of the weight and bias.
    pub fn device_bytes(&self) -> u64 {
        self.weight.device_bytes() + self.bias.as_ref().map_or(0, |b| b.size())
    }
}

/// Per-token sums of squares of a product's output, one for each 16 rows:
/// what the next product needs to fold the RMS norm of that output into its
/// input, without a norm dispatch between.
#[derive(Clone, Copy, Debug)]
pub struct SquareSums<'a> {
    /// f32 sums, token-major.
    pub buf: &'a Arc<Buffer>,
    /// Float index of token 0's first sum.
    pub offset: usize,
    /// Sums per token: the producer's rows / 16, rounded up.
    pub groups: usize,
}

impl SquareSums<'_> {
    /// Whether `n` tokens' sums fit the buffer.
    fn fits(&self, n: usize) -> bool {
        self.offset + n * self.groups <= (self.buf.size() / 4) as usize
    }
}

/// A rope of llama.cpp's normal layout (pairs of adjacent dimensions) folded
/// into a product's stores: its arithmetic is `rope.comp`'s
/// (`common/rope.glsl`) on the values the product would have stored. NeoX
/// pairs lie in different output rows' halves and cannot be folded.
#[derive(Clone, Copy, Debug)]
pub struct FoldedRope<'a> {
    /// The rope (always of adjacent pairs).
    rope: Rope<'a>,
    /// Output rows rotated (the query and key heads of a fused projection).
    pub rows: usize,
}

impl<'a> FoldedRope<'a> {
    /// `rope` on the first `rows` output rows, where its pairs are adjacent.
    pub fn adjacent(rope: Rope<'a>, rows: usize) -> Option<Self> {
        (rope.style == RopeStyle::Normal).then_some(FoldedRope { rope, rows })
    }

    /// The rope.
    pub fn rope(&self) -> &Rope<'a> {
        &self.rope
    }
}

/// What a product reads. A norm is folded into f32 input only:
///
/// ```
/// # use combs::ops::linear::{Input, SquareSums};
/// # use combs::ops::rms_norm::{NormFlavor, NormWeight};
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let norm = NormWeight { weight: b, flavor: NormFlavor::Plain, eps: 1e-5 };
/// let squares = SquareSums { buf: b, offset: 0, groups: 4 };
/// let x = Mat::new(b, 16, 64);
/// let input = Input::NormedBySquares { x, norm, squares };
/// # }
/// ```
///
/// ```compile_fail
/// # use combs::ops::linear::{Input, SquareSums};
/// # use combs::ops::rms_norm::{NormFlavor, NormWeight};
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let norm = NormWeight { weight: b, flavor: NormFlavor::Plain, eps: 1e-5 };
/// let squares = SquareSums { buf: b, offset: 0, groups: 4 };
/// let x = Mat::<half::f16>::new(b, 16, 64);
/// let input = Input::NormedBySquares { x, norm, squares }; // the norm of f16 input
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// f32 activations.
    F32(Mat<'a>),
    /// f16 activations (only the skinny products take them).
    F16(Mat<'a, f16>),
    /// The raw residual with an RMS norm the matvec folds in (each workgroup
    /// sums its token's squares as it loads it).
    Normed {
        /// The residual.
        x: Mat<'a>,
        /// The norm.
        norm: NormWeight<'a>,
    },
    /// The raw residual with an RMS norm the skinny products fold in, from
    /// the sums of squares the residual's producer wrote. The kernel stages
    /// `x * w` scaled by the smallest `1 / rms` of its workgroup's tokens and
    /// applies each token's own at the end: a token of far smaller rms than
    /// the workgroup's largest is staged that much closer to f16's
    /// subnormals, which is why only decode steps fold it.
    NormedBySquares {
        /// The residual.
        x: Mat<'a>,
        /// The norm.
        norm: NormWeight<'a>,
        /// The residual's sums of squares.
        squares: SquareSums<'a>,
    },
}

impl<'a> Input<'a> {
    /// The activations read.
    pub fn x(&self) -> AnyMat<'a> {
        match *self {
            Input::F32(x) | Input::Normed { x, .. } | Input::NormedBySquares { x, .. } => {
                AnyMat::F32(x)
            }
            Input::F16(x) => AnyMat::F16(x),
        }
    }
}

/// Where a product's result goes. What a kernel cannot do is not a value
/// of it: an f16 result is only the gated one, a gated or roped result is
/// stored (never added), and only a plain accumulation writes sums of
/// squares:
///
/// ```
/// # use combs::ops::linear::Output;
/// # use combs::ops::glu::Activation;
/// # use combs::ops::{AnyMat, Mat};
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let out = AnyMat::F16(Mat::<half::f16>::new(b, 4, 64));
/// let gated = Output::Gated { out, act: Activation::Silu };
/// # }
/// ```
///
/// ```compile_fail
/// # use combs::ops::linear::Output;
/// # use combs::ops::Mat;
/// # fn f(b: &std::sync::Arc<combs::gpu::Buffer>) {
/// let out = Output::Store(Mat::<half::f16>::new(b, 4, 64)); // f16 without a gate
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub enum Output<'a> {
    /// `out = W x (+ bias)`.
    Store(Mat<'a>),
    /// `out += W x (+ bias)` (the residual add).
    Accumulate(Mat<'a>),
    /// `out += W x (+ bias)`, and each token's sums of squares of the
    /// stored values, 16 rows at a time (skinny products).
    AccumulateSquares {
        /// The residual.
        out: Mat<'a>,
        /// Where the sums go.
        squares: SquareSums<'a>,
    },
    /// `out = W x (+ bias)` with the first rows roped.
    Roped {
        /// The result.
        out: Mat<'a>,
        /// The rope.
        rope: FoldedRope<'a>,
    },
    /// The weight's rows alternate gate, up: `out[t, i] = act(gate_i) * up_i`
    /// (half as wide as the weight's rows); f16 only from the cooperative
    /// products on f16 input.
    Gated {
        /// The result.
        out: AnyMat<'a>,
        /// The gate's activation.
        act: Activation,
    },
}

impl<'a> Output<'a> {
    /// The matrix written.
    pub fn out(&self) -> AnyMat<'a> {
        match *self {
            Output::Store(m)
            | Output::Accumulate(m)
            | Output::AccumulateSquares { out: m, .. }
            | Output::Roped { out: m, .. } => AnyMat::F32(m),
            Output::Gated { out, .. } => out,
        }
    }

    /// Whether the result adds into the output.
    pub fn accumulates(&self) -> bool {
        matches!(
            self,
            Output::Accumulate(_) | Output::AccumulateSquares { .. }
        )
    }

    /// Whether the kernel pairs neighbouring rows (gate/up, rope).
    fn paired(&self) -> bool {
        matches!(self, Output::Roped { .. } | Output::Gated { .. })
    }
}

/// The kernel family a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearVariant {
    /// One token, a subgroup's lanes sharing each row (`matvec.comp`); a
    /// few tokens as neighbouring workgroups over the same rows.
    Matvec,
    /// Tiled through shared memory (`matmul.comp`).
    Tiled,
    /// One invocation per row with uniform activation loads (`matmul_rows.comp`),
    /// for CPU devices such as lavapipe.
    Rows,
    /// Cooperative-matrix tiles, f16 inputs and f32 accumulation
    /// (`matmul_coop.comp`, or `matmul_skinny.comp` for skinny tiles), where
    /// the device has 16×16×16 f16 matrices and subgroups of 32.
    Coop,
}

/// What the choice of a kernel family needs to know of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCaps {
    /// The device is the host's CPU (lavapipe).
    pub cpu: bool,
    /// Cooperative-matrix kernels run here ([`LinearVariant::coop_available`]).
    pub coop: bool,
}

impl KernelCaps {
    /// The device's.
    pub fn of(ctx: &GpuContext) -> Self {
        KernelCaps {
            cpu: is_cpu(ctx),
            coop: LinearVariant::coop_available(ctx),
        }
    }
}

impl LinearVariant {
    /// Whether [`LinearVariant::Coop`] can run on this device: 16×16×16
    /// f16 cooperative matrices, f16 arithmetic, subgroups of 32, and the
    /// Vulkan memory model, which the kernels' SPIR-V declares (a module
    /// declaring it on a device without the feature enabled is invalid).
    pub fn coop_available(ctx: &GpuContext) -> bool {
        ctx.caps().has_coop_mat_16x16x16()
            && ctx.caps().shader_float16
            && ctx.caps().vulkan_memory_model
            && kernel_subgroup(ctx) == 32
    }

    /// The variant combs picks for `n` tokens of `x` on this device.
    pub fn choose(ctx: &GpuContext, n: usize, x: AnyMat<'_>) -> Self {
        Self::choose_for(KernelCaps::of(ctx), n, x)
    }

    /// [`Self::choose`] for a device of `caps`.
    pub fn choose_for(caps: KernelCaps, n: usize, x: AnyMat<'_>) -> Self {
        match x {
            // Only the cooperative-matrix products read f16 activations.
            AnyMat::F16(_) => LinearVariant::Coop,
            AnyMat::F32(x) => {
                if n >= SKINNY_MIN_TOKENS && !caps.cpu && x.aligned4() && caps.coop {
                    LinearVariant::Coop
                } else {
                    Self::choose_f32_for(caps, n, x)
                }
            }
        }
    }

    /// The variant combs picks among those that keep f32 inputs (no f16
    /// rounding of weights or activations).
    pub fn choose_f32(ctx: &GpuContext, n: usize, x: Mat<'_>) -> Self {
        Self::choose_f32_for(KernelCaps::of(ctx), n, x)
    }

    /// [`Self::choose_f32`] for a device of `caps`.
    pub fn choose_f32_for(caps: KernelCaps, n: usize, x: Mat<'_>) -> Self {
        let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
        if aligned && caps.cpu {
            LinearVariant::Rows
        } else if matvec::fits(n, x) && n <= MATVEC_MAX_TOKENS {
            LinearVariant::Matvec
        } else {
            LinearVariant::Tiled
        }
    }
}

/// One product: a weight (and bias) from `input` into `output`, on the
/// kernel of `variant` (or the one the input asks for, or the one combs
/// picks), with a layout given where tests and tuning want one.
#[derive(Clone, Copy)]
pub struct LinearCall<'a> {
    /// The weight, `[out, in]`.
    pub weight: &'a QuantWeight,
    /// The bias, `[out]` f32.
    pub bias: Option<&'a Arc<Buffer>>,
    /// What the product reads.
    pub input: Input<'a>,
    /// Where its result goes.
    pub output: Output<'a>,
    /// The kernel family (`None`: [`LinearVariant::choose`], or the one the
    /// input needs).
    pub variant: Option<LinearVariant>,
    /// The matvec's layout (`None`: [`MatvecShape::choose`]).
    pub matvec_shape: Option<MatvecShape>,
    /// The cooperative tile (`None`: [`CoopTile::choose`]).
    pub coop_tile: Option<CoopTile>,
}

impl std::fmt::Debug for LinearCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinearCall")
            .field("weight", &self.weight.name())
            .field("input", &self.input)
            .field("output", &self.output)
            .field("variant", &self.variant)
            .field("matvec_shape", &self.matvec_shape)
            .field("coop_tile", &self.coop_tile)
            .finish()
    }
}

impl<'a> LinearCall<'a> {
    /// A call with the kernel and its layout left to combs.
    pub fn new(
        weight: &'a QuantWeight,
        bias: Option<&'a Arc<Buffer>>,
        input: Input<'a>,
        output: Output<'a>,
    ) -> Self {
        LinearCall {
            weight,
            bias,
            input,
            output,
            variant: None,
            matvec_shape: None,
            coop_tile: None,
        }
    }

    /// The same call on the kernel family `v`.
    pub fn on(self, v: LinearVariant) -> Self {
        LinearCall {
            variant: Some(v),
            ..self
        }
    }

    /// The same call with the matvec's layout given (`None`: chosen).
    pub fn with_shape(self, shape: Option<MatvecShape>) -> Self {
        LinearCall {
            matvec_shape: shape,
            ..self
        }
    }

    /// The same call with the cooperative tile given (`None`: chosen).
    pub fn with_tile(self, tile: Option<CoopTile>) -> Self {
        LinearCall {
            coop_tile: tile,
            ..self
        }
    }

    /// Tokens.
    pub fn n(&self) -> usize {
        self.input.x().rows()
    }

    /// The kernel family this call runs on.
    pub fn resolve_variant(&self, ctx: &GpuContext) -> LinearVariant {
        if let Some(v) = self.variant {
            return v;
        }
        match self.input {
            Input::F16(_) | Input::NormedBySquares { .. } => LinearVariant::Coop,
            Input::Normed { .. } => LinearVariant::Matvec,
            Input::F32(x) => match self.output {
                // The matvec and the cooperative kernels fold the rope and the gate.
                Output::Roped { .. } | Output::Gated { .. }
                    if LinearVariant::choose(ctx, self.n(), self.input.x())
                        != LinearVariant::Coop =>
                {
                    LinearVariant::Matvec
                }
                Output::AccumulateSquares { .. } => LinearVariant::Coop,
                _ => LinearVariant::choose(ctx, self.n(), AnyMat::F32(x)),
            },
        }
    }

    /// Checks what every kernel needs: the operands' shapes against the
    /// weight's, rows pairs kept in one chunk where the kernel pairs them,
    /// sums of squares that fit.
    pub(crate) fn check(&self) -> Result<()> {
        let w = self.weight;
        let (k, n) = (w.cols(), self.n());
        let shape_err = |what: &str, expected: Vec<usize>, got: Vec<usize>| ModelError::Shape {
            tensor: format!("`{}` {what}", w.name()),
            expected: expected.into_iter().map(|v| v as u64).collect(),
            got: got.into_iter().map(|v| v as u64).collect(),
        };
        if !k.is_multiple_of(32) {
            return Err(shape_err("columns", vec![k.next_multiple_of(32)], vec![k]));
        }
        let x = self.input.x();
        if x.cols() != k {
            return Err(shape_err("input", vec![n, k], vec![x.rows(), x.cols()]));
        }
        let out = self.output.out();
        let width = match self.output {
            Output::Gated { .. } => {
                if !w.rows().is_multiple_of(2) {
                    return Err(shape_err(
                        "gate/up rows",
                        vec![w.rows() + 1],
                        vec![w.rows()],
                    ));
                }
                w.rows() / 2
            }
            _ => w.rows(),
        };
        if out.rows() != n || out.cols() != width {
            return Err(shape_err(
                "output",
                vec![n, width],
                vec![out.rows(), out.cols()],
            ));
        }
        x.check("linear input")?;
        out.check("linear output")?;
        let chunks_at = |m: usize| w.chunks().iter().all(|c| c.row_start.is_multiple_of(m));
        if self.output.paired() && !chunks_at(2) {
            return Err(ModelError::invalid(
                "weight",
                format!("paired rows of `{}` split by its chunks", w.name()),
            ));
        }
        if let Output::Roped { rope, .. } = self.output {
            rope.rope.check(rope.rows)?;
            if rope.rows > w.rows() {
                return Err(shape_err("roped rows", vec![w.rows()], vec![rope.rows]));
            }
        }
        if let Output::AccumulateSquares { squares, .. } = self.output
            && (squares.groups < w.rows().div_ceil(16) || !squares.fits(n) || !chunks_at(16))
        {
            return Err(ModelError::invalid(
                "sums of squares",
                format!(
                    "of `{}` ({} rows, {n} tokens) into {} per token at {} of {} bytes \
                     (16-row chunks needed)",
                    w.name(),
                    w.rows(),
                    squares.groups,
                    squares.offset,
                    squares.buf.size()
                ),
            ));
        }
        if let Input::NormedBySquares { norm, squares, .. } = self.input
            && (squares.groups != k.div_ceil(16)
                || !squares.fits(n)
                || norm.weight.size() < 4 * k as u64)
        {
            return Err(ModelError::invalid(
                "sums of squares",
                format!(
                    "norm folded into `{}` ({k} columns, {n} tokens) from {} sums per \
                     token at {}",
                    w.name(),
                    squares.groups,
                    squares.offset
                ),
            ));
        }
        Ok(())
    }

    /// The flag bits of the bias and the accumulation (the same two bits in
    /// every family's interface).
    fn store_flags(&self, accumulate: u32, bias: u32) -> u32 {
        (if self.output.accumulates() {
            accumulate
        } else {
            0
        }) | if self.bias.is_some() { bias } else { 0 }
    }
}

/// The sizes and offsets every tiled family's push constants start with,
/// for one chunk of the weight: `x_unit` is the elements per unit of x's
/// stride and offset.
fn chunk_dims(call: &LinearCall<'_>, chunk: &WeightChunk, x_unit: usize) -> Result<LinearDims> {
    let w = call.weight;
    let k = w.cols();
    let (x_off, _, _, x_ld) = call.input.x().layout();
    let (d_off, _, _, d_ld) = call.output.out().layout();
    Ok(LinearDims {
        k: pc_u32("k", k)?,
        m: pc_u32("m", chunk.n_rows)?,
        nb: pc_u32("nb", chunk.n_rows * k / w.qtype().block_size())?,
        row_offset: pc_u32("row_offset", chunk.row_start)?,
        n: pc_u32("n", call.n())?,
        ld_x: pc_u32("ld_x", x_ld / x_unit)?,
        ld_d: pc_u32("ld_d", d_ld)?,
        x_offset: pc_u32("x_offset", x_off / x_unit)?,
        d_offset: pc_u32("d_offset", d_off)?,
    })
}

/// A family that only stores or adds its products (no folds): its kernel,
/// specialization constants and tile (rows × tokens per workgroup).
struct PlainKernel {
    name: &'static str,
    kernel: Kernel,
    spec: Vec<u32>,
    tile: (usize, usize),
    /// Elements per unit of x's stride and offset.
    x_unit: usize,
}

/// Records a product on a family that only stores or adds, one dispatch per
/// chunk; `params` lays out its push constants.
fn record_plain<P: bytemuck::Pod>(
    rec: &mut Recording,
    call: &LinearCall<'_>,
    k: PlainKernel,
    params: impl Fn(LinearDims, u32) -> P,
) -> Result<()> {
    let (Input::F32(x), Output::Store(out) | Output::Accumulate(out)) = (call.input, call.output)
    else {
        return Err(unsupported(k.name, call));
    };
    // Both families' interfaces number the two bits alike.
    let flags = call.store_flags(1, 2);
    for chunk in call.weight.chunks() {
        let p = params(chunk_dims(call, chunk, k.x_unit)?, flags);
        let groups = [
            pc_u32("groups", chunk.n_rows.div_ceil(k.tile.0))?,
            pc_u32("groups", call.n().div_ceil(k.tile.1))?,
            1,
        ];
        let bindings = [
            Binding::read(&chunk.buffer),
            Binding::read(x.buf),
            Binding::write(out.buf),
            Binding::read(call.bias.unwrap_or(x.buf)),
        ];
        rec.dispatch(k.kernel, &k.spec, &bindings, bytemuck::bytes_of(&p), groups)?;
    }
    Ok(())
}

/// The error of a family asked for a step it does not fold or an input it
/// does not read.
fn unsupported(kernel: &'static str, call: &LinearCall<'_>) -> ModelError {
    ModelError::kernel(
        kernel,
        format!(
            "`{}`: input {:?} / output {:?} not supported",
            call.weight.name(),
            call.input.x().dtype(),
            call.output
        ),
    )
}

/// Records the product on its kernel family.
///
/// # Errors
/// Operands that do not match the weight, a family that cannot take this
/// input or fold these steps, a layout the device cannot run, or a value
/// beyond 32 bits.
pub fn record_linear(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    call.check()?;
    match call.resolve_variant(rec.context()) {
        LinearVariant::Matvec => matvec::record(rec, call),
        LinearVariant::Tiled => tiled::record(rec, call),
        LinearVariant::Rows => rows::record(rec, call),
        LinearVariant::Coop => {
            if !LinearVariant::coop_available(rec.context()) {
                return Err(ModelError::kernel(
                    "matmul_coop",
                    "no 16x16x16 f16 cooperative matrices with subgroups of 32 on this device",
                ));
            }
            for chunk in call.weight.chunks() {
                let tile = call.coop_tile.unwrap_or_else(|| {
                    CoopTile::choose_for(
                        rec.context(),
                        chunk.n_rows,
                        call.weight.cols(),
                        call.n(),
                        match call.input {
                            Input::F16(_) => CoopInput::F16,
                            Input::NormedBySquares { .. } => CoopInput::NormedBySquares,
                            Input::F32(_) | Input::Normed { .. } => CoopInput::F32,
                        },
                        matches!(call.output, Output::AccumulateSquares { .. }),
                    )
                    .for_weights(
                        rec.context().caps(),
                        call.weight.qtype(),
                        chunk.n_rows,
                        call.weight.cols(),
                    )
                });
                if tile.skinny {
                    skinny::record_chunk(rec, call, chunk, tile)?;
                } else {
                    coop::record_chunk(rec, call, chunk, tile)?;
                }
            }
            Ok(())
        }
    }
}

/// Reference: `out[t * rows + r] = sum_c w[r * cols + c] * x[t * cols + c]` in f64.
pub fn linear_ref(w: &[f32], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * rows];
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let s: f64 = wr
                .iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            out[t * rows + r] = s as f32;
        }
    }
    out
}
