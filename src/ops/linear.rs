//! `linear`: y = W x (+ bias) (+ y) for N tokens with a GPU-resident weight of
//! any format, dequantized on the fly: the matvec kernel for one token
//! (decode), the tiled matmul kernel for several (prefill, batches). Weights
//! split into row chunks get one dispatch per chunk.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::glu::Activation;
use super::rms_norm::NormFlavor;
use super::{View, kernel_subgroup, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, Recording, groups_1d};
use crate::quant::{QuantType, QuantWeight, WeightChunk};

/// Push constants of `glsl/matvec.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct MatvecParams {
    /// Columns.
    pub k: u32,
    /// Rows in the chunk.
    pub m: u32,
    /// Blocks in the chunk.
    pub nb: u32,
    /// Output index of the chunk's first row.
    pub row_offset: u32,
    /// vec4 index of the input vector.
    pub x_offset: u32,
    /// Output index of row 0.
    pub d_offset: u32,
    /// 1: accumulate, 2: bias, 4: folded RMS norm, 8: with (1 + w), 16: gated
    /// pairs of rows, 32: GELU-tanh gate, 64: folded rope.
    pub flags: u32,
    /// Epsilon of the folded RMS norm.
    pub eps: f32,
    /// Output rows the folded rope rotates.
    pub rope_rows: u32,
    /// Floats per head of the folded rope.
    pub head_dim: u32,
    /// Rotated dimensions per head.
    pub n_rot: u32,
    /// Multiplier of the rope's cos and sin.
    pub attn_factor: f32,
    /// Tokens (rows of x and d).
    pub n_tok: u32,
    /// vec4s between tokens of x.
    pub ld_x: u32,
    /// Floats between tokens of d.
    pub ld_d: u32,
}
const _: () = assert!(std::mem::size_of::<MatvecParams>() == 60);

/// Push constants of `glsl/matmul.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct MatmulParams {
    /// Columns.
    pub k: u32,
    /// Rows in the chunk.
    pub m: u32,
    /// Blocks in the chunk.
    pub nb: u32,
    /// Output column of the chunk's first row.
    pub row_offset: u32,
    /// Tokens.
    pub n: u32,
    /// Floats between tokens of X.
    pub ld_x: u32,
    /// Floats between tokens of D.
    pub ld_d: u32,
    /// Float index of X[0, 0].
    pub x_offset: u32,
    /// Float index of D[0, 0].
    pub d_offset: u32,
    /// 1: accumulate, 2: bias; `matmul_coop.comp` also 16: gated pairs of
    /// rows, 32: GELU-tanh gate, 64: rope; `matmul_skinny.comp` also 128:
    /// gated output as f16, 256: sums of squares out, 512: normalized input
    /// (8: by 1 + w).
    pub flags: u32,
    /// Output rows the folded rope rotates (`matmul_coop.comp`).
    pub rope_rows: u32,
    /// Floats per head of the folded rope.
    pub head_dim: u32,
    /// Rotated dimensions per head.
    pub n_rot: u32,
    /// Multiplier of the rope's cos and sin.
    pub attn_factor: f32,
    /// Float index of token 0's first sum of squares (`matmul_skinny.comp`).
    pub sq_offset: u32,
    /// Sums of squares per token.
    pub sq_groups: u32,
    /// Epsilon of the norm folded into the input.
    pub eps: f32,
}
const _: () = assert!(std::mem::size_of::<MatmulParams>() == 68);

const FLAG_ACCUMULATE: u32 = 1;
const FLAG_BIAS: u32 = 2;
const FLAG_NORM: u32 = 4;
const FLAG_NORM_ZERO_CENTRED: u32 = 8;
const FLAG_GLU: u32 = 16;
const FLAG_GELU: u32 = 32;
const FLAG_ROPE: u32 = 64;
const FLAG_OUT_F16: u32 = 128;
const FLAG_SQUARES_OUT: u32 = 256;
const FLAG_NORM_IN: u32 = 512;
const MATVEC_WG: u32 = 128;
/// Most tokens [`LinearVariant::choose`] gives the matvec kernel on GPUs:
/// batched decode of a few sequences reads each weight once through L2
/// rather than through the prefill tiles, which leave most of a large GPU
/// idle at a handful of tokens. On the H200 (aggregate decode tok/s,
/// smollm2-135m / llama-1b q4_0): 4 sequences 900 / 807 against 563 / 376
/// with the cooperative-matrix tiles; 16 sequences 2271 / 1249 against
/// 1993 / 1346. With this round's kernels (folds in the matvec, K-split
/// 16-row cooperative tiles) 16 sequences through the matvec ran 5789 /
/// 2166 against 6270 / 3947 through the tiles.
pub const MATVEC_MAX_TOKENS: usize = 8;
const MATMUL_BM: usize = 64;
const MATMUL_BN: usize = 32;
/// `matmul_rows.comp`: invocations per workgroup.
const ROWS_WG: usize = 64;

/// (tokens per tile, rows per invocation) of `matmul_rows.comp` for `n` tokens:
/// tiles as wide as the batch (up to a register budget) so each weight is
/// dequantized once per tile.
fn rows_tiling(n: usize) -> (usize, usize) {
    // Wider tiles ran somewhat faster on lavapipe (16 rows per invocation for
    // one token, 16 tokens × 8 rows for batches) but LLVM then takes minutes
    // to compile the 13 weight formats' pipelines, which every process pays.
    match n {
        1 => (1, 8),
        2..=8 => (8, 4),
        _ => (16, 4),
    }
}

/// The `matvec.comp` layout for a weight of `rows` × `cols` of `qtype` on a
/// device with subgroups of `sg` (1: unknown).
///
/// Subgroups of 32 (NVIDIA), from `combs kernel-bench` on the H200
/// (2026-12-01, µs per dispatch in a chain with barriers, the previous
/// rule's figure first): x staged in shared memory wins almost everywhere
/// (smollm2-135m q4_0 down 576×1536: 7.5 → 6.3; llama-1b q4_0 out
/// 2048×2048: 9.8 → 7.4); matrices of 16384+ rows take workgroups of 256
/// (llama-1b gate/up 16384×2048: 21.6 → 14.3, llama-8b 28672×4096:
/// 44.5 → 37.6); 4096+ rows of 128+ units take two units in flight
/// (llama-8b q4_0 out 4096×4096: 18.2 → 11.1); long rows (down
/// projections) stage x in chunks, per the branches below. Other subgroup
/// sizes keep the layouts measured before: one row group of min(sg, 32)
/// invocations with 1, 2 or 4 rows.
fn matvec_shape(sg: u32, qtype: QuantType, rows: usize, cols: usize) -> MatvecShape {
    let s = |tpr, nr| MatvecShape::new(tpr, nr);
    if sg <= 1 {
        return s(32, 1);
    }
    if sg == 32 {
        let units = cols / unit_columns(qtype, false);
        // Q4_K over 32-column units where x is staged: as fast or faster
        // everywhere measured (llama-1b q4_k out 2048×2048 8.99 → 7.46 µs).
        let staged = |tpr, nr, un, wg| MatvecShape {
            un,
            wg,
            stage_x: true,
            narrow: true,
            ..s(tpr, nr)
        };
        return if cols > 6144 && rows >= 4096 {
            // llama-8b down 4096×14336: q4_0 36.1 → 26.6, q4_k 37.8 → 30.2
            staged(32, 4, 1, 256)
        } else if cols > 6144 {
            // llama-1b down 2048×8192: q4_0 18.1 → 12.0, q4_k 15.0 → 13.1
            staged(64, 4, 2, 128)
        } else if rows >= 16384 {
            // 8 rows per group at short rows: llama-1b gate/up 16.0 → 14.3,
            // its head 74 → 71 (q4_0), 16384×2048 q4_k 17.8 → 16.5
            staged(32, if cols <= 2048 { 8 } else { 4 }, 1, 256)
        } else if rows >= 4096 && units >= 128 {
            staged(32, 4, 2, 128)
        } else {
            staged(32, 2, 1, 128)
        };
    }
    if rows >= 4096 && cols >= 4096 && sg <= 64 {
        return s(64, 8);
    }
    let tpr = sg.min(32);
    let nr = if rows >= 8192 {
        4
    } else if rows >= 1024 {
        2
    } else {
        1
    };
    s(tpr, nr)
}

/// Columns one invocation of `matvec.comp` takes at a time (a unit).
fn unit_columns(qtype: QuantType, narrow: bool) -> usize {
    if qtype == QuantType::Q4K && !narrow {
        64
    } else {
        32
    }
}

/// How `matvec.comp` lays a workgroup over a weight: `ks` column slices of
/// row groups of `tpr` invocations, each group holding `nr` rows and each
/// invocation `un` units of columns in flight at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecShape {
    /// Invocations per row group (a power of two, at most `wg`).
    pub tpr: u32,
    /// Rows per row group (1..=8).
    pub nr: u32,
    /// Column slices (a power of two; `tpr * ks` at most `wg`).
    pub ks: u32,
    /// Units (32 columns, 64 for Q4_K) each invocation loads per step (1..=4).
    pub un: u32,
    /// Invocations per workgroup (64, 128 or 256).
    pub wg: u32,
    /// Stage x in shared memory once per workgroup (in chunks where it is long).
    pub stage_x: bool,
    /// Q4_K: units of 32 columns (one sub-block) instead of 64.
    pub narrow: bool,
}

impl MatvecShape {
    /// `ks` = 1, one unit per step, workgroups of 128, x read from cache.
    pub fn new(tpr: u32, nr: u32) -> Self {
        MatvecShape {
            tpr,
            nr,
            ks: 1,
            un: 1,
            wg: MATVEC_WG,
            stage_x: false,
            narrow: false,
        }
    }

    /// The shape combs picks for a chunk of `rows` × `cols` of `qtype` on this device.
    pub fn choose(ctx: &GpuContext, qtype: QuantType, rows: usize, cols: usize) -> Self {
        matvec_shape(kernel_subgroup(ctx), qtype, rows, cols)
    }

    /// Rows one workgroup covers.
    pub fn rows_per_workgroup(&self) -> usize {
        (self.wg / (self.tpr * self.ks) * self.nr) as usize
    }

    /// Whether the kernel can run this layout.
    fn valid(&self) -> bool {
        matches!(self.wg, 64 | 128 | 256)
            && self.tpr.is_power_of_two()
            && self.ks.is_power_of_two()
            && self.tpr * self.ks <= self.wg
            && (1..=8).contains(&self.nr)
            && (1..=4).contains(&self.un)
    }
}

/// Bytes of shared memory `matvec.comp` may give to a staged x.
const MATVEC_STAGE_BYTES: usize = 40 << 10;

/// How the cooperative-matrix kernels tile a product: `wm × wn × wk`
/// subgroups of 32, each multiplying `tm × tn` 16×16 matrices over `bk`
/// columns per step; `wk` > 1 splits K inside the workgroup. With `skinny`,
/// `matmul_skinny.comp` runs it: each subgroup streams its own chunks of K
/// without workgroup barriers (`wn` and `tn` are 1: 16 tokens per
/// workgroup); otherwise `matmul_coop.comp`, whose subgroups step through
/// K together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopTile {
    /// Subgroups along the weight's rows.
    pub wm: u32,
    /// Subgroups along the tokens.
    pub wn: u32,
    /// Subgroups along K.
    pub wk: u32,
    /// 16-row matrices per subgroup.
    pub tm: u32,
    /// 16-token matrices per subgroup.
    pub tn: u32,
    /// Columns per subgroup and step (a multiple of 32).
    pub bk: u32,
    /// Independent subgroups (`matmul_skinny.comp`).
    pub skinny: bool,
}

impl CoopTile {
    /// 16 rows × 16 tokens, K split four ways: batched decode of a few sequences.
    pub const SKINNY: CoopTile = CoopTile {
        wm: 1,
        wn: 1,
        wk: 4,
        tm: 1,
        tn: 1,
        bk: 64,
        skinny: false,
    };
    /// 32 rows × 16 tokens, K split two ways: wide matrices at a few tokens,
    /// small ones at many.
    pub const SKINNY_WIDE: CoopTile = CoopTile {
        wm: 2,
        wn: 1,
        wk: 2,
        tm: 1,
        tn: 1,
        bk: 64,
        skinny: false,
    };
    /// 16 rows × 16 tokens per subgroup, eight subgroups along K, streamed
    /// by each subgroup on its own (`matmul_skinny.comp`): batched decode.
    pub const STREAM: CoopTile = CoopTile {
        wm: 1,
        wn: 1,
        wk: 8,
        tm: 1,
        tn: 1,
        bk: 64,
        skinny: true,
    };
    /// 64 × 64 with four subgroups.
    pub const MID: CoopTile = CoopTile {
        wm: 2,
        wn: 2,
        wk: 1,
        tm: 2,
        tn: 2,
        bk: 64,
        skinny: false,
    };
    /// 128 × 128 with eight subgroups of 64 × 32 each: prompts.
    pub const BIG: CoopTile = CoopTile {
        wm: 2,
        wn: 4,
        wk: 1,
        tm: 4,
        tn: 2,
        bk: 64,
        skinny: false,
    };

    /// Rows per tile.
    pub fn bm(&self) -> usize {
        (self.wm * self.tm * 16) as usize
    }

    /// Tokens per tile.
    pub fn bn(&self) -> usize {
        (self.wn * self.tn * 16) as usize
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        32 * self.wm * self.wn * self.wk
    }

    /// Floats of the result staging area.
    fn staging_floats(&self) -> u32 {
        if self.skinny {
            self.wm * self.tm * 256
        } else if self.wk == 1 {
            256 * self.wm * self.wn
        } else {
            self.wk * (self.bm() * self.bn()) as u32
        }
    }

    /// Shared memory bytes the kernel takes.
    pub fn shared_bytes(&self) -> usize {
        let sa = (self.wk * self.bk + 8) as usize;
        let tiles = if self.skinny {
            // Each subgroup's 16 rows and 16 tokens of one chunk.
            let subgroups = (self.wm * self.wk) as usize;
            2 * (self.bk as usize + 8) * subgroups * 32
        } else {
            2 * sa * (self.bm() + self.bn())
        };
        tiles + 4 * self.staging_floats() as usize
    }

    /// Whether the device can run the tile: its shared memory and invocations.
    pub fn fits(&self, ctx: &GpuContext) -> bool {
        let caps = ctx.caps();
        self.shared_bytes() <= caps.max_shared_memory as usize
            && self.invocations() <= caps.max_workgroup_invocations
    }

    /// The kernel family that runs this tile.
    fn family(&self) -> &'static str {
        if self.skinny {
            "matmul_skinny"
        } else {
            "matmul_coop"
        }
    }

    /// The tile for a `rows` × `cols` weight and `n` tokens: K-split
    /// 16- or 32-row tiles for batched decode, 128 × 128 for 4096+ × 4096+
    /// weights where its workgroups fill whole waves ([`full_waves`]), 64 × 64
    /// for other weights of 1024+ rows, the 32-row tile for smaller ones.
    pub fn choose(ctx: &GpuContext, rows: usize, cols: usize, n: usize) -> Self {
        let fits = |t: &CoopTile| t.fits(ctx);
        if n <= SKINNY_MAX_TOKENS {
            // Wide weights take four row tiles per subgroup, so each
            // staged chunk of activations serves 64 rows; narrower ones
            // keep one so that their few rows still fill the GPU. On the
            // H200, llama-1b at 16 tokens (f16 activations): gate/up
            // 16384×2048 29.6 µs with 4 tiles and 8 K-subgroups (38.8 with
            // STREAM), head 128256×2048 176 µs with 4 and 4 (261), Q/K/V
            // and output 13.6, 11.0 µs with STREAM, down 2048×8192 27.6
            // with 10 K-subgroups (30.6 with 8; the most that 48 KB of
            // shared memory holds). Every other layout tried was slower.
            let tile = if rows >= 65536 {
                CoopTile {
                    wk: 4,
                    tm: 4,
                    ..CoopTile::STREAM
                }
            } else if rows >= 16384 {
                CoopTile {
                    tm: 4,
                    ..CoopTile::STREAM
                }
            } else if cols >= 8192 {
                CoopTile {
                    wk: 10,
                    ..CoopTile::STREAM
                }
            } else {
                CoopTile::STREAM
            };
            // STREAM, the smallest, where the device's shared memory holds
            // no more: every batch of this size then takes a skinny tile,
            // as [`f16_activations`] assumes.
            if let Some(t) = [tile, CoopTile::STREAM].into_iter().find(fits) {
                return t;
            }
        }
        if n <= 16 {
            return if rows >= 16384 {
                CoopTile::SKINNY_WIDE
            } else {
                CoopTile::SKINNY
            };
        }
        let big = CoopTile::BIG;
        let big_groups = rows.div_ceil(big.bm()) * n.div_ceil(big.bn());
        if n > 64 && rows >= 4096 && cols >= 4096 && fits(&big) && full_waves(ctx, big_groups) {
            big
        } else if rows >= 1024 {
            CoopTile::MID
        } else {
            CoopTile::SKINNY_WIDE
        }
    }

    /// Specialization constants of the tile's kernel.
    fn spec(&self) -> Result<Vec<u32>> {
        let base = self.wm > 0
            && self.wn > 0
            && self.wk > 0
            && (1..=4).contains(&self.tm)
            && (1..=4).contains(&self.tn)
            && self.bk > 0
            && self.bk.is_multiple_of(32);
        let ok = if self.skinny {
            // Whole weight sub-blocks per invocation and row tile.
            self.wm > 0
                && self.wk > 0
                && self.wn == 1
                && self.tn == 1
                && (1..=8).contains(&self.tm)
                && self.wm * self.wk <= 32
                && self.bk > 0
                && self.bk.is_multiple_of(64)
        } else {
            base && self.wm * self.wn * self.wk <= 8
        };
        if !ok {
            return Err(ModelError::Internal(format!("cooperative tile {self:?}")));
        }
        Ok(if self.skinny {
            vec![self.invocations(), 32, self.wm, self.wk, self.tm, self.bk]
        } else {
            vec![
                self.invocations(),
                32,
                self.wm,
                self.wn,
                self.wk,
                self.tm,
                self.tn,
                self.bk,
                self.staging_floats(),
            ]
        })
    }
}

/// Most tokens the cooperative-matrix products stream through
/// `matmul_skinny.comp` (one 16-token block per workgroup).
pub const SKINNY_MAX_TOKENS: usize = 16;

/// Whether the linear layers of a batch of `n` tokens take f16 activations
/// on this device ([`View::f16`]): batches past the matvec's
/// [`MATVEC_MAX_TOKENS`] up to [`SKINNY_MAX_TOKENS`], on GPUs with
/// cooperative matrices, where `matmul_skinny.comp` copies them into its
/// staging areas instead of converting them in every subgroup. The
/// kernels that produce those inputs (the RMS norm, the gated epilogue)
/// then write f16 directly, rounding as the product would.
pub fn f16_activations(ctx: &GpuContext, n: usize) -> bool {
    n > MATVEC_MAX_TOKENS
        && n <= SKINNY_MAX_TOKENS
        && ctx.caps().device_type != ash::vk::PhysicalDeviceType::CPU
        && LinearVariant::coop_available(ctx)
        && CoopTile::STREAM.fits(ctx)
}

/// Whether `groups` workgroups of the 128 × 128 tile (one resident per SM)
/// fill the waves they take well: on the H200 (132 SMs), llama-8b at 512
/// tokens, the output projection's 128 workgroups ran in 150 µs with it
/// (253 µs with 64 × 64 tiles), the Q/K/V projection's 192 (one and a half
/// waves) in 307 µs (257 with 64 × 64). Without an SM count, any number does.
fn full_waves(ctx: &GpuContext, groups: usize) -> bool {
    let Some(sms) = ctx.caps().sm_count else {
        return true;
    };
    let waves = groups as f64 / f64::from(sms.max(1));
    waves / waves.ceil() >= 0.85 || waves >= 4.0
}

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

    /// Records `out[t] (+)= W x[t] (+ bias)` for `n` tokens.
    ///
    /// # Errors
    /// Shapes that do not fit the kernels (input width not a multiple of 32).
    pub fn record(
        &self,
        rec: &mut Recording,
        x: View<'_>,
        n: usize,
        out: View<'_>,
        accumulate: bool,
    ) -> Result<()> {
        record_linear(rec, &self.weight, self.bias.as_ref(), x, n, out, accumulate)
    }
}

fn kernel(family: &str, w: &QuantWeight) -> Result<Kernel> {
    kernel_for(family, w, false, false)
}

/// `family`'s kernel for `w` with f16 activations or f32 ones, normalized
/// first with `norm` (the skinny kernel's `NORM_IN` variant).
fn kernel_for(family: &str, w: &QuantWeight, f16: bool, norm: bool) -> Result<Kernel> {
    let act = match (f16, norm) {
        (true, _) => "f16",
        (false, false) => "f32",
        (false, true) => "f32_norm",
    };
    Kernel::by_name(&format!("{family}_{}_{act}", w.qtype().name())).ok_or_else(|| {
        ModelError::UnsupportedTensorType {
            tensor: w.name().to_string(),
            ggml_type: w.qtype().to_string(),
        }
    })
}

/// The kernel a linear layer runs on.
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
    /// (`matmul_coop.comp`), where the device has 16×16×16 f16 matrices and
    /// subgroups of 32.
    Coop,
}

impl LinearVariant {
    /// Whether [`LinearVariant::Coop`] can run on this device.
    pub fn coop_available(ctx: &GpuContext) -> bool {
        ctx.caps().has_coop_mat_16x16x16()
            && ctx.caps().shader_float16
            && kernel_subgroup(ctx) == 32
    }

    /// The variant combs picks for `n` tokens on this device.
    pub fn choose(ctx: &GpuContext, n: usize, x: View<'_>) -> Self {
        let cpu = ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU;
        let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
        if x.f16 {
            // Only the cooperative-matrix products read f16 activations.
            return LinearVariant::Coop;
        }
        if n > MATVEC_MAX_TOKENS && !cpu && aligned && Self::coop_available(ctx) {
            LinearVariant::Coop
        } else {
            Self::choose_f32(ctx, n, x)
        }
    }

    /// Whether the matvec kernel can read `n` tokens of `x` (vec4 loads).
    fn matvec_fits(n: usize, x: View<'_>) -> bool {
        x.offset.is_multiple_of(4) && (n == 1 || x.ld.is_multiple_of(4))
    }

    /// The variant combs picks among those that keep f32 inputs (no f16
    /// rounding of weights or activations).
    pub fn choose_f32(ctx: &GpuContext, n: usize, x: View<'_>) -> Self {
        let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
        if aligned && ctx.caps().device_type == ash::vk::PhysicalDeviceType::CPU {
            LinearVariant::Rows
        } else if Self::matvec_fits(n, x) && n <= MATVEC_MAX_TOKENS {
            LinearVariant::Matvec
        } else {
            LinearVariant::Tiled
        }
    }
}

/// Records `out[t, :] (+)= W x[t, :] (+ bias)` for tokens `t < n` with the
/// variant [`LinearVariant::choose`] picks.
///
/// # Errors
/// Input width not a multiple of 32, or a value beyond 32 bits.
pub fn record_linear(
    rec: &mut Recording,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
) -> Result<()> {
    let variant = LinearVariant::choose(rec.context(), n, x);
    record_linear_with(rec, variant, w, bias, x, n, out, accumulate)
}

/// Records a linear layer with an explicit kernel variant.
///
/// # Errors
/// Input width not a multiple of 32, a variant that cannot take these
/// operands (matvec with several tokens, unaligned rows), or a value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_linear_with(
    rec: &mut Recording,
    variant: LinearVariant,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
) -> Result<()> {
    record_linear_tiled(rec, variant, None, w, bias, x, n, out, accumulate)
}

/// [`record_linear_with`] with the cooperative-matrix tile given instead of
/// chosen (tests, tuning); `tile` is ignored by the other variants.
///
/// # Errors
/// As [`record_linear_with`], and a tile the kernel cannot run.
#[allow(clippy::too_many_arguments)]
pub fn record_linear_tiled(
    rec: &mut Recording,
    variant: LinearVariant,
    coop_tile: Option<CoopTile>,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
) -> Result<()> {
    record_linear_inner(
        rec,
        variant,
        coop_tile,
        w,
        bias,
        x,
        n,
        out,
        accumulate,
        CoopEpilogue::default(),
    )
}

/// What the cooperative-matrix kernel folds into its stores, as the
/// single-token matvec does: a gated activation over interleaved gate/up
/// rows, or the rope of the first rows; and, with the skinny tiles of
/// batched decode, the RMS norm between two products ([`SquareSums`]).
#[derive(Clone, Copy, Default)]
pub struct CoopEpilogue<'a> {
    /// The weight's rows alternate gate, up: `out[t, i] = act(gate_i) * up_i`.
    pub glu: Option<Activation>,
    /// Rotate the first output rows at each token's position.
    pub rope: Option<MatvecRope<'a>>,
    /// Write each token's sums of squares of the stored values, 16 rows
    /// at a time (skinny tiles; no gate or rope).
    pub squares: Option<SquareSums<'a>>,
    /// Normalize the f32 input first, from the sums of squares a previous
    /// product wrote of it (skinny tiles).
    pub norm: Option<CoopNorm<'a>>,
}

/// Per-token sums of squares of a product's output, one for each 16 rows
/// (`matmul_skinny.comp`, flag 256): what the next product needs to fold the
/// RMS norm of that output into its input, without a norm dispatch between.
#[derive(Clone, Copy)]
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

/// An RMS norm folded into a skinny product's input, from the sums of
/// squares the residual's producer wrote: the kernel reads the raw
/// residual, stages `x * w` scaled by the smallest `1 / rms` of its
/// workgroup's tokens and applies each token's own at the end. A token of
/// far smaller rms than its workgroup's largest is staged that much closer
/// to f16's subnormals: the models fold it into decode steps only.
#[derive(Clone, Copy)]
pub struct CoopNorm<'a> {
    /// The norm's weight and flavour.
    pub norm: NormInput<'a>,
    /// The input's sums of squares.
    pub squares: SquareSums<'a>,
}

/// Records `out = W x (+ bias)` for `n` tokens with the cooperative-matrix
/// kernel (`tile`, or the one combs picks) and the folded steps of `epilogue`.
///
/// With `accumulate`, `out += W x (+ bias)` (no gate or rope then).
///
/// # Errors
/// No cooperative matrices on this device, unaligned rows of `x`, an odd
/// gated weight or a chunk splitting a pair of rows, sums of squares or a
/// folded norm where the tile is not skinny or the buffers are too small,
/// or a value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_linear_coop_folded(
    rec: &mut Recording,
    tile: Option<CoopTile>,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
    epilogue: CoopEpilogue<'_>,
) -> Result<()> {
    if (epilogue.glu.is_some() || epilogue.rope.is_some())
        && (!w.rows().is_multiple_of(2)
            || w.chunks().iter().any(|c| !c.row_start.is_multiple_of(2)))
    {
        return Err(ModelError::Internal(format!(
            "paired rows of `{}` ({} rows) split by its chunks",
            w.name(),
            w.rows()
        )));
    }
    record_linear_inner(
        rec,
        LinearVariant::Coop,
        tile,
        w,
        bias,
        x,
        n,
        out,
        accumulate,
        epilogue,
    )
}

#[allow(clippy::too_many_arguments)]
fn record_linear_inner(
    rec: &mut Recording,
    variant: LinearVariant,
    coop_tile: Option<CoopTile>,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
    epilogue: CoopEpilogue<'_>,
) -> Result<()> {
    let k = w.cols();
    if !k.is_multiple_of(32) {
        return Err(ModelError::Shape {
            tensor: w.name().to_string(),
            expected: vec![k.next_multiple_of(32) as u64],
            got: vec![k as u64],
        });
    }
    let aligned = x.offset.is_multiple_of(4) && x.ld.is_multiple_of(4);
    if variant != LinearVariant::Coop {
        super::expect_f32(&format!("{variant:?} linear"), &[x, out])?;
    }
    let fits = match variant {
        LinearVariant::Matvec => LinearVariant::matvec_fits(n, x),
        LinearVariant::Rows => aligned,
        LinearVariant::Tiled => true,
        // (f16 activations too: the skinny kernel reads them four at a time)
        LinearVariant::Coop => LinearVariant::coop_available(rec.context()) && aligned,
    };
    if !fits {
        return Err(ModelError::Internal(format!(
            "{variant:?} linear cannot take {n} tokens at offset {} stride {}",
            x.offset, x.ld
        )));
    }
    let folded = epilogue.glu.is_some() || epilogue.rope.is_some();
    if folded && (variant != LinearVariant::Coop || accumulate) {
        return Err(ModelError::Internal(format!(
            "{variant:?} linear cannot fold a gate or rope (accumulate {accumulate})"
        )));
    }
    if (epilogue.squares.is_some() || epilogue.norm.is_some()) && variant != LinearVariant::Coop {
        return Err(ModelError::Internal(format!(
            "{variant:?} linear neither writes nor reads sums of squares"
        )));
    }
    let mut flags =
        if accumulate { FLAG_ACCUMULATE } else { 0 } | if bias.is_some() { FLAG_BIAS } else { 0 };
    if let Some(act) = epilogue.glu {
        flags |= FLAG_GLU;
        if act == Activation::GeluTanh {
            flags |= FLAG_GELU;
        }
    }
    if epilogue.rope.is_some() {
        flags |= FLAG_ROPE;
    }
    if out.f16 {
        // Only the gated output, the next product's input, goes out as f16.
        if epilogue.glu.is_none() || accumulate {
            return Err(ModelError::Internal(
                "f16 linear output without a gated activation".into(),
            ));
        }
        flags |= FLAG_OUT_F16;
    }
    if let Some(sq) = epilogue.squares {
        if folded
            || out.f16
            || sq.groups < w.rows().div_ceil(16)
            || !sq.fits(n)
            || w.chunks().iter().any(|c| !c.row_start.is_multiple_of(16))
        {
            return Err(ModelError::Internal(format!(
                "sums of squares of `{}` ({} rows, {} tokens) into {} per token at {} \
                 of {} bytes: no gate, rope or f16 output, 16-row chunks",
                w.name(),
                w.rows(),
                n,
                sq.groups,
                sq.offset,
                sq.buf.size()
            )));
        }
        flags |= FLAG_SQUARES_OUT;
    }
    if let Some(cn) = epilogue.norm {
        let sq = cn.squares;
        if x.f16
            || epilogue.squares.is_some()
            || sq.groups != k.div_ceil(16)
            || !sq.fits(n)
            || cn.norm.weight.size() < 4 * k as u64
        {
            return Err(ModelError::Internal(format!(
                "norm folded into `{}` ({k} columns, {n} tokens) from {} sums per token \
                 at {}: f32 input, no sums written, sums of {k} columns",
                w.name(),
                sq.groups,
                sq.offset
            )));
        }
        flags |= FLAG_NORM_IN;
        if cn.norm.flavor == NormFlavor::ZeroCentred {
            flags |= FLAG_NORM_ZERO_CENTRED;
        }
    }
    let rope = epilogue.rope;
    let bias_buf = bias.unwrap_or(x.buf);
    let sq = epilogue.squares.or(epilogue.norm.map(|c| c.squares));
    for chunk in w.chunks() {
        let nb = chunk.n_rows * k / w.qtype().block_size();
        let bindings = [
            Binding::read(&chunk.buffer),
            Binding::read(x.buf),
            Binding::write(out.buf),
            Binding::read(bias_buf),
            Binding::read(rope.map_or(x.buf, |r| r.positions)),
            Binding::read(rope.map_or(x.buf, |r| r.inv_freq)),
            // The skinny kernel's f16 alias of D (gated f16 outputs).
            Binding::write(out.buf),
            match (epilogue.squares, epilogue.norm) {
                (Some(s), _) => Binding::write(s.buf),
                (None, Some(c)) => Binding::read(c.squares.buf),
                (None, None) => Binding::read(x.buf),
            },
            Binding::read(epilogue.norm.map_or(x.buf, |c| c.norm.weight)),
        ];
        let mm_params = |x_unit: usize| -> Result<MatmulParams> {
            Ok(MatmulParams {
                k: pc_u32("k", k)?,
                m: pc_u32("m", chunk.n_rows)?,
                nb: pc_u32("nb", nb)?,
                row_offset: pc_u32("row_offset", chunk.row_start)?,
                n: pc_u32("n", n)?,
                ld_x: pc_u32("ld_x", x.ld / x_unit)?,
                ld_d: pc_u32("ld_d", out.ld)?,
                x_offset: pc_u32("x_offset", x.offset / x_unit)?,
                d_offset: pc_u32("d_offset", out.offset)?,
                flags,
                rope_rows: pc_u32("rope rows", rope.map_or(0, |r| r.rows))?,
                head_dim: pc_u32("head_dim", rope.map_or(2, |r| r.head_dim))?,
                n_rot: pc_u32("n_rot", rope.map_or(0, |r| r.n_rot))?,
                attn_factor: rope.map_or(1.0, |r| r.attn_factor),
                sq_offset: pc_u32("sq_offset", sq.map_or(0, |q| q.offset))?,
                sq_groups: pc_u32("sq_groups", sq.map_or(0, |q| q.groups))?,
                eps: epilogue.norm.map_or(0.0, |c| c.norm.eps),
            })
        };
        match variant {
            LinearVariant::Rows => {
                let (tn, rpi) = rows_tiling(n);
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(ROWS_WG * rpi))?,
                    pc_u32("groups", n.div_ceil(tn))?,
                    1,
                ];
                rec.dispatch(
                    kernel("matmul_rows", w)?,
                    &[ROWS_WG as u32, tn as u32, rpi as u32],
                    &bindings[..6],
                    bytemuck::bytes_of(&mm_params(4)?),
                    groups,
                )?;
            }
            LinearVariant::Matvec => {
                record_matvec_chunk(
                    rec,
                    w,
                    chunk,
                    bias,
                    x,
                    n,
                    out,
                    accumulate,
                    MatvecOptions::default(),
                )?;
            }
            LinearVariant::Coop => {
                let tile = coop_tile
                    .unwrap_or_else(|| CoopTile::choose(rec.context(), chunk.n_rows, k, n));
                if !tile.fits(rec.context()) {
                    return Err(ModelError::Internal(format!(
                        "cooperative tile {tile:?} takes {} bytes of shared memory",
                        tile.shared_bytes()
                    )));
                }
                if (x.f16 || out.f16) && !tile.skinny {
                    return Err(ModelError::Internal(format!(
                        "cooperative tile {tile:?} takes f32 activations only"
                    )));
                }
                if sq.is_some() && !tile.skinny {
                    return Err(ModelError::Internal(format!(
                        "cooperative tile {tile:?} neither writes nor reads sums of squares"
                    )));
                }
                let n_bindings = if tile.skinny { 9 } else { 6 };
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(tile.bm()))?,
                    pc_u32("groups", n.div_ceil(tile.bn()))?,
                    1,
                ];
                rec.dispatch(
                    kernel_for(tile.family(), w, x.f16, epilogue.norm.is_some())?,
                    &tile.spec()?,
                    &bindings[..n_bindings],
                    bytemuck::bytes_of(&mm_params(1)?),
                    groups,
                )?;
            }
            LinearVariant::Tiled => {
                let groups = [
                    pc_u32("groups", chunk.n_rows.div_ceil(MATMUL_BM))?,
                    pc_u32("groups", n.div_ceil(MATMUL_BN))?,
                    1,
                ];
                rec.dispatch(
                    kernel("matmul", w)?,
                    &[],
                    &bindings[..6],
                    bytemuck::bytes_of(&mm_params(1)?),
                    groups,
                )?;
            }
        }
    }
    Ok(())
}

/// An RMS norm folded into a matvec's input: the kernel reads the raw
/// residual `x` and uses `x / rms(x) * w` (`rms_norm` numerics up to
/// rounding), so the normalized vector is never written.
#[derive(Clone, Copy)]
pub struct NormInput<'a> {
    /// The norm's weight, `[cols]` f32.
    pub weight: &'a Arc<Buffer>,
    /// How the weight scales the normalized row.
    pub flavor: NormFlavor,
    /// Epsilon inside the square root.
    pub eps: f32,
}

/// What a single-token matvec does besides `W x`, and how it is laid out.
#[derive(Clone, Copy, Default)]
pub struct MatvecOptions<'a> {
    /// The workgroup layout instead of the device's choice (tests, tuning).
    pub shape: Option<MatvecShape>,
    /// Normalize the input first.
    pub norm: Option<NormInput<'a>>,
    /// The weight's rows alternate gate, up (an even number of them): write
    /// `out[i] = act(gate_i x) * (up_i x)` instead of every row.
    pub glu: Option<Activation>,
    /// Rotate the first output rows as `ops::rope` would afterwards.
    pub rope: Option<MatvecRope<'a>>,
}

/// A rope of llama.cpp's normal layout (pairs of adjacent dimensions) folded
/// into a single-token matvec's output: its arithmetic equals `rope.comp`'s
/// on the values the matvec would have stored.
#[derive(Clone, Copy)]
pub struct MatvecRope<'a> {
    /// Output rows rotated (the query and key heads of a fused projection).
    pub rows: usize,
    /// Floats per head (even).
    pub head_dim: usize,
    /// Rotated dimensions per head (even, at most `head_dim`).
    pub n_rot: usize,
    /// The token's position, one i32.
    pub positions: &'a Arc<Buffer>,
    /// Inverse frequencies, `n_rot / 2` f32.
    pub inv_freq: &'a Arc<Buffer>,
    /// Multiplier of cos and sin.
    pub attn_factor: f32,
}

/// Records `out (+)= W x (+ bias)` for one token with the matvec kernel and
/// the fused steps `opts` asks for.
///
/// # Errors
/// Input width not a multiple of 32 (256 for K-quants), an unaligned `x`,
/// accumulating with a gated output, an odd gated weight or chunk, or a
/// value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_matvec(
    rec: &mut Recording,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    out: View<'_>,
    accumulate: bool,
    opts: MatvecOptions<'_>,
) -> Result<()> {
    record_matvec_tokens(rec, w, bias, x, 1, out, accumulate, opts)
}

/// [`record_matvec`] for `n` tokens (rows of `x` and `out`), each workgroup
/// taking one token's share of the rows: batched decode of a few
/// sequences, the folded steps applied per token (the rope at each token's
/// position).
///
/// # Errors
/// As [`record_matvec`], and rows of `x` that are not 4-float aligned.
#[allow(clippy::too_many_arguments)]
pub fn record_matvec_tokens(
    rec: &mut Recording,
    w: &QuantWeight,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
    opts: MatvecOptions<'_>,
) -> Result<()> {
    super::expect_f32("matvec", &[x, out])?;
    if !LinearVariant::matvec_fits(n, x) {
        return Err(ModelError::Internal(format!(
            "matvec of {n} tokens at float {} stride {} (not multiples of 4)",
            x.offset, x.ld
        )));
    }
    let k = w.cols();
    if !k.is_multiple_of(32) || !k.is_multiple_of(w.qtype().block_size()) {
        return Err(ModelError::Shape {
            tensor: w.name().to_string(),
            expected: vec![k.next_multiple_of(32.max(w.qtype().block_size())) as u64],
            got: vec![k as u64],
        });
    }
    if !x.offset.is_multiple_of(4) {
        return Err(ModelError::Internal(format!(
            "matvec input at float {} (not a multiple of 4)",
            x.offset
        )));
    }
    if let Some(r) = opts.rope
        && (!r.head_dim.is_multiple_of(2)
            || !r.n_rot.is_multiple_of(2)
            || r.n_rot > r.head_dim
            || r.rows > w.rows())
    {
        return Err(ModelError::Internal(format!(
            "rope folded into `{}`: {} rows, head dim {}, n_rot {}",
            w.name(),
            r.rows,
            r.head_dim,
            r.n_rot
        )));
    }
    if opts.glu.is_some() && (accumulate || !w.rows().is_multiple_of(2)) {
        return Err(ModelError::Internal(format!(
            "gated matvec of `{}`: {} rows, accumulate {accumulate}",
            w.name(),
            w.rows()
        )));
    }
    for chunk in w.chunks() {
        record_matvec_chunk(rec, w, chunk, bias, x, n, out, accumulate, opts)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn record_matvec_chunk(
    rec: &mut Recording,
    w: &QuantWeight,
    chunk: &WeightChunk,
    bias: Option<&Arc<Buffer>>,
    x: View<'_>,
    n: usize,
    out: View<'_>,
    accumulate: bool,
    opts: MatvecOptions<'_>,
) -> Result<()> {
    let k = w.cols();
    let mut flags =
        if accumulate { FLAG_ACCUMULATE } else { 0 } | if bias.is_some() { FLAG_BIAS } else { 0 };
    let mut eps = 0.0;
    if let Some(n) = opts.norm {
        flags |= FLAG_NORM;
        if n.flavor == NormFlavor::ZeroCentred {
            flags |= FLAG_NORM_ZERO_CENTRED;
        }
        eps = n.eps;
    }
    if opts.rope.is_some() {
        flags |= FLAG_ROPE;
    }
    if let Some(act) = opts.glu {
        flags |= FLAG_GLU;
        if act == Activation::GeluTanh {
            flags |= FLAG_GELU;
        }
    }
    if (opts.glu.is_some() || opts.rope.is_some()) && !chunk.row_start.is_multiple_of(2) {
        return Err(ModelError::Internal(format!(
            "matvec of `{}` with paired rows: chunk of rows {}+{} splits a pair",
            w.name(),
            chunk.row_start,
            chunk.n_rows
        )));
    }
    let ctx = rec.context().clone();
    let sg = kernel_subgroup(&ctx);
    let mut shape = opts
        .shape
        .unwrap_or_else(|| matvec_shape(sg, w.qtype(), chunk.n_rows, k));
    if !shape.valid() {
        return Err(ModelError::Internal(format!("matvec shape {shape:?}")));
    }
    let MatvecShape {
        tpr, ks, un, wg, ..
    } = shape;
    // Staged x: in chunks of whole units that fit the shared memory left
    // beside the reduction's, as few and as even as possible.
    let xsv = if shape.stage_x {
        let unit_vec4 = unit_columns(w.qtype(), shape.narrow) / 4;
        let red = 4 * (wg * (shape.nr + 2)) as usize + 128;
        let budget =
            MATVEC_STAGE_BYTES.min((ctx.caps().max_shared_memory as usize).saturating_sub(red));
        let max_vec4 = budget / 16 / unit_vec4 * unit_vec4;
        if max_vec4 < unit_vec4 {
            1
        } else {
            let total = k / 4;
            let chunks = total.div_ceil(max_vec4);
            pc_u32("k", total.div_ceil(chunks).next_multiple_of(unit_vec4))?
        }
    } else {
        1
    };
    if (opts.glu.is_some() || opts.rope.is_some()) && shape.nr % 2 == 1 {
        shape.nr += 1;
    }
    let nr = shape.nr;
    let nb = chunk.n_rows * k / w.qtype().block_size();
    let params = MatvecParams {
        k: pc_u32("k", k)?,
        m: pc_u32("m", chunk.n_rows)?,
        nb: pc_u32("nb", nb)?,
        row_offset: pc_u32("row_offset", chunk.row_start)?,
        x_offset: pc_u32("x_offset", x.offset / 4)?,
        d_offset: pc_u32("d_offset", out.offset)?,
        flags,
        eps,
        rope_rows: pc_u32("rope rows", opts.rope.map_or(0, |r| r.rows))?,
        head_dim: pc_u32("head_dim", opts.rope.map_or(2, |r| r.head_dim))?,
        n_rot: pc_u32("n_rot", opts.rope.map_or(0, |r| r.n_rot))?,
        attn_factor: opts.rope.map_or(1.0, |r| r.attn_factor),
        n_tok: pc_u32("n_tok", n.max(1))?,
        ld_x: pc_u32("ld_x", x.ld / 4)?,
        ld_d: pc_u32("ld_d", out.ld)?,
    };
    let rows_per_wg = shape.rows_per_workgroup();
    let groups = groups_1d(
        &ctx,
        pc_u32("groups", chunk.n_rows.div_ceil(rows_per_wg) * n.max(1))?,
    );
    rec.dispatch(
        if shape.narrow && w.qtype() == QuantType::Q4K {
            Kernel::MatvecQ4KU32F32
        } else {
            kernel("matvec", w)?
        },
        &[wg, sg, tpr, nr, ks, un, xsv],
        &[
            Binding::read(&chunk.buffer),
            Binding::read(x.buf),
            Binding::write(out.buf),
            Binding::read(bias.unwrap_or(x.buf)),
            Binding::read(opts.norm.map_or(x.buf, |n| n.weight)),
            Binding::read(opts.rope.map_or(x.buf, |r| r.positions)),
            Binding::read(opts.rope.map_or(x.buf, |r| r.inv_freq)),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
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
