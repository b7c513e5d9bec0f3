//! The planner: the one place that decides which kernels run a model's
//! blocks and which steps fold into which. A model states *what* to compute
//! — a [`DecoderBlock`]: norm → projection (then rope or gated activation) →
//! attention → projection added to the residual (optionally post-normed) —
//! and the planner records it for the device, the token count, whether each
//! token is alone in its sequence and the numerics mode ([`Plan`], made once
//! per shape class), over the activation buffers it owns ([`Workspace`]).
//!
//! Fusions it makes (each only where the kernel that would run supports it):
//! the RMS norm into the matvec's input (decode), the norm between two
//! products through sums of squares (batched decode on cooperative-matrix
//! GPUs), the rope and the gated activation into the products' stores, the
//! K/V store into the decode attention kernel, f16 activations between the
//! skinny products, the RMS norm into the quantizer of the integer decode
//! path (llama.cpp numerics, [`IntDot`]). [`Fusion::Off`] (or
//! `COMBS_DISABLE_FUSION=1`, as llama.cpp's `GGML_VK_DISABLE_FUSION`)
//! records every step as a dispatch of its own, for debugging and for tests
//! comparing the two.

mod block;
mod forward;
mod full_kv;
mod speech_block;
mod workspace;

pub use block::{AttentionSpec, DecoderBlock, Ffn, OutputHead, QkNorm, Qkv, RopeSpec};
pub use forward::Forward;
pub use full_kv::{FullKv, FullKvAddressing};
pub use speech_block::{
    ConvStem, CrossDecoderBlock, EncoderBlock, Heads, LnCrossAttention, LnMlp, LnSelfAttention,
};
pub use workspace::{Workspace, WorkspaceShape};

use super::act_round::Numerics;
use super::attention::{AttentionShape, AttentionVariant};
use super::backend::{Kernels, VULKAN};
use super::host::HOST;
use super::linear::{
    CoopTile, Input, KernelCaps, LinearVariant, MATVEC_MAX_TOKENS, SKINNY_MAX_TOKENS,
    SKINNY_MIN_TOKENS,
};
use super::{AnyMat, is_cpu};
use crate::gpu::{DeviceClass, GpuContext};

/// Whether the planner may fold steps into each other's kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fusion {
    /// Fold where the kernels support it (the default).
    #[default]
    On,
    /// Every step a dispatch of its own, f32 activations between them.
    Off,
}

impl Fusion {
    /// `Off` where the environment sets `COMBS_DISABLE_FUSION` to anything
    /// but empty or `0`, else `On`.
    pub fn from_env() -> Self {
        match std::env::var("COMBS_DISABLE_FUSION") {
            Ok(v) if !v.is_empty() && v != "0" => Fusion::Off,
            _ => Fusion::On,
        }
    }
}

/// Whether decode products of Q4_0 / Q8_0 weights under
/// [`Numerics::LlamaCppCpu`] quantize their input to 8-bit blocks and run
/// the integer matvec ([`super::linear::matvec_q8`]) instead of `act_round`
/// and the f32 matvec: the same value up to f32 summation order, with about
/// a sixth of the ALU work per weight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IntDot {
    /// Where the device reports accelerated 4x8-bit dot products.
    #[default]
    Auto,
    /// Wherever the device runs integer dot products at all (lavapipe too:
    /// tests, and measuring against the f32 path).
    On,
    /// Never.
    Off,
}

impl IntDot {
    /// Parses `auto`, `on` or `off`.
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(s: &str) -> crate::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(IntDot::Auto),
            "on" | "1" | "true" => Ok(IntDot::On),
            "off" | "0" | "false" => Ok(IntDot::Off),
            other => Err(crate::ModelError::invalid(
                "int-dot",
                format!("{other:?}: expected \"auto\", \"on\" or \"off\""),
            )),
        }
    }

    /// Whether the integer path runs on `ctx` by this setting.
    pub fn enabled(self, ctx: &GpuContext) -> bool {
        let caps = ctx.caps();
        match self {
            IntDot::Auto => caps.int_dot && caps.int_dot_accelerated,
            IntDot::On => caps.int_dot,
            IntDot::Off => false,
        }
    }
}

/// The planner's settings for one model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Planner {
    /// How products treat their inputs (exact, or rounded as llama.cpp's CPU backend).
    pub numerics: Numerics,
    /// Whether steps fold into each other.
    pub fusion: Fusion,
    /// Plan as for this class of device instead of the device's own: every
    /// kernel runs everywhere, so the tests run the GPU plans (the matvec
    /// with its folds, the decode attention storing K/V) on lavapipe too.
    /// Cooperative-matrix kernels still need a device that has them.
    pub plan_as: Option<DeviceClass>,
    /// The kernels to record with (`None`: the host's native kernels on CPU
    /// devices, Vulkan elsewhere).
    pub backend: Option<Backend>,
    /// Whether decode products take the integer path under llama.cpp numerics.
    pub int_dot: IntDot,
}

/// Where the planned steps run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Vulkan dispatches (`glsl/`).
    Vulkan,
    /// Native kernels on the host (`ops::host`), over the same buffers:
    /// for CPU devices, whose buffers the host reaches.
    Host,
}

impl Backend {
    /// The kernels of this backend.
    pub fn kernels(self) -> &'static dyn Kernels {
        match self {
            Backend::Vulkan => &VULKAN,
            Backend::Host => &HOST,
        }
    }
}

impl Planner {
    /// The decisions for calls of `n_tokens` tokens on `ctx`, each the only
    /// new one of its sequence where `one_per_sequence` says so.
    pub fn plan(&self, ctx: &GpuContext, n_tokens: usize, one_per_sequence: bool) -> Plan {
        let fuse = self.fusion == Fusion::On;
        let exact = self.numerics == Numerics::Exact;
        let cpu = self.plan_as.map_or(is_cpu(ctx), |c| c == DeviceClass::Cpu);
        let backend = self.backend(ctx);
        let vulkan = backend == Backend::Vulkan;
        let f16 = fuse && exact && vulkan && !cpu && f16_activations(ctx, n_tokens);
        let one = one_per_sequence || n_tokens == 1;
        Plan {
            planner: *self,
            backend,
            n_tokens,
            caps: KernelCaps {
                cpu,
                ..KernelCaps::of(ctx)
            },
            f16_activations: f16,
            // A prompt's tokens may differ in scale by orders of magnitude,
            // and the skinny kernel stages a workgroup's tokens with one
            // scale: only decode steps fold the norm from sums of squares,
            // and only on the skinny kernel (f16 activations now reach past
            // its batches, to the tiles of matmul_coop, which do not fold it).
            norm_in_products: f16 && one && n_tokens <= SKINNY_MAX_TOKENS,
            store_in_attention: fuse && one && (!cpu || !vulkan),
            int_dot: !exact
                && vulkan
                && (1..=MATVEC_MAX_TOKENS).contains(&n_tokens)
                && self.int_dot.enabled(ctx),
        }
    }

    /// The backend of plans on `ctx`: the native kernels where the device
    /// is the host's CPU and no other was asked for.
    pub fn backend(&self, ctx: &GpuContext) -> Backend {
        self.backend
            .unwrap_or(if is_cpu(ctx) && self.plan_as.is_none() {
                Backend::Host
            } else {
                Backend::Vulkan
            })
    }
}

/// What the planner decided for one shape class: which kernel family the
/// products of a given input run on, and which steps fold.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    planner: Planner,
    /// Where the steps run.
    pub backend: Backend,
    /// Tokens per call.
    pub n_tokens: usize,
    caps: KernelCaps,
    /// Products take f16 activations, which the steps before them write.
    pub f16_activations: bool,
    /// Products adding into the residual write its sums of squares, and the
    /// next ones fold the RMS norm of it into their input.
    pub norm_in_products: bool,
    /// The decode attention kernel stores the new K/V rows itself.
    pub store_in_attention: bool,
    /// Products of Q4_0 / Q8_0 weights quantize their input and run the
    /// integer matvec ([`IntDot`]).
    pub int_dot: bool,
}

impl Plan {
    /// The kernel family a product of `x` runs on: the f32-only ones under
    /// llama.cpp numerics, since f16 matrix units would add their own
    /// rounding.
    pub fn variant(&self, x: AnyMat<'_>) -> LinearVariant {
        match (self.planner.numerics, x) {
            (Numerics::LlamaCppCpu, AnyMat::F32(x)) => {
                LinearVariant::choose_f32_for(self.caps, self.n_tokens, x)
            }
            _ => LinearVariant::choose_for(self.caps, self.n_tokens, x),
        }
    }

    /// The kernels of the plan's backend.
    pub fn kernels(&self) -> &'static dyn Kernels {
        self.backend.kernels()
    }

    /// Whether the RMS norm of `x` folds into the products reading it (the
    /// matvec's, or the host's; not under llama.cpp numerics, which round
    /// the normalized input).
    pub fn folds_norm(&self, x: AnyMat<'_>) -> bool {
        self.planner.fusion == Fusion::On
            && self.planner.numerics == Numerics::Exact
            && (self.backend == Backend::Host || self.variant(x) == LinearVariant::Matvec)
    }

    /// Whether a product reading `input` folds a rope or a gated activation
    /// into its stores: the matvec and the cooperative-matrix kernels do.
    pub fn folds_epilogue(&self, input: &Input<'_>) -> bool {
        self.planner.fusion == Fusion::On
            && (self.backend == Backend::Host
                || match input {
                    Input::F32(x) => matches!(
                        self.variant(AnyMat::F32(*x)),
                        LinearVariant::Matvec | LinearVariant::Coop
                    ),
                    _ => true,
                })
    }

    /// Whether products of weights with `rows` output features read the
    /// raw residual with its RMS norm folded in from the sums of squares the
    /// previous product wrote (decode steps on the skinny kernel), rather
    /// than the norm's f16 output. Past 32 tokens the wide weights (gate/up)
    /// lose more to the fold than a norm dispatch costs: their f16 layout
    /// holds twice the accumulators, which the folded variant's f32 loads
    /// leave no registers for. On the H200, gate/up with the norm folded
    /// against f16 input, µs: llama-1b at 64 tokens 93.0 / 66.4, at 128
    /// 181.3 / 127.0; llama-8b at 64 298.0 / 239.1, at 128 576.9 / 414.2
    /// (`combs kernel-bench --tokens 32,64,128 --x-f16 --fold-norm`); a norm
    /// dispatch is ~10 µs. Q/K/V keep the fold (1b at 64: 27.4 / 24.7).
    pub fn folds_norm_from_squares(&self, rows: usize) -> bool {
        self.norm_in_products && (self.n_tokens <= 32 || rows < 16384)
    }

    /// Whether the step producing `cols`-wide activations for the products
    /// writes them as f16 (the products read them four at a time).
    pub fn f16_for(&self, cols: usize) -> bool {
        self.f16_activations && cols.is_multiple_of(4)
    }

    /// The attention kernel of this call for heads of `shape`: the tiled
    /// one where it stores the new rows itself, else
    /// [`AttentionVariant::choose`]'s. The call records it as chosen here,
    /// so that what [`Plan::attention_out_f16`] assumed is what runs.
    pub fn attention_variant(&self, ctx: &GpuContext, shape: AttentionShape) -> AttentionVariant {
        if self.store_in_attention {
            AttentionVariant::Tiled
        } else {
            AttentionVariant::choose(ctx, self.n_tokens, shape)
        }
    }

    /// Whether the attention of `shape` on `variant` writes its output as
    /// f16 for the output projection: where that product reads f16 and the
    /// kernel writes it (the decode kernel storing the new rows, or the
    /// cooperative-matrix kernel of prompts, whose f16 output is what the
    /// product's tiles would round the f32 one to).
    pub fn attention_out_f16(&self, shape: AttentionShape, variant: AttentionVariant) -> bool {
        let cols = shape.n_head * shape.head_dim;
        self.f16_for(cols) && (self.store_in_attention || variant == AttentionVariant::Coop)
    }

    /// Whether the integer path's quantizer takes the RMS norm of its
    /// products' input (where all of them take the integer path).
    pub fn quantizer_folds_norm(&self) -> bool {
        self.int_dot && self.planner.fusion == Fusion::On
    }

    /// Whether a product of a weight of type `t` takes the integer path.
    pub fn int_dot_for(&self, t: crate::quant::QuantType) -> bool {
        self.int_dot && super::linear::matvec_q8::supports(t)
    }

    /// How products treat their inputs.
    pub fn numerics(&self) -> Numerics {
        self.planner.numerics
    }
}

/// Whether the products of a call of `n` tokens take f16 activations on
/// this device: calls of [`SKINNY_MIN_TOKENS`] or more, on GPUs with
/// cooperative matrices, whose kernels (`matmul_skinny.comp`,
/// `matmul_coop.comp`) then copy them into their staging areas instead of
/// converting f32 in every workgroup. The steps that produce those inputs
/// (the RMS norm, the gated epilogue, the decode attention) write f16
/// directly, rounding as the product would.
pub fn f16_activations(ctx: &GpuContext, n: usize) -> bool {
    n >= SKINNY_MIN_TOKENS
        && !is_cpu(ctx)
        && LinearVariant::coop_available(ctx)
        && CoopTile::STREAM.fits(ctx)
}
