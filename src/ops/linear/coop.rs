//! The cooperative-matrix family (`glsl/matmul_coop.comp`): tiles of 16×16
//! f16 matrices with f32 accumulation, K split inside the workgroup, the
//! next step's loads behind the current products; and [`CoopTile`], the tile
//! geometry it shares with the skinny products (`skinny.rs`), with the rule
//! that picks one per shape. Its epilogue (`common/coop_out.glsl`) folds the
//! rope and the gated activation into the stores, as the matvec does. An
//! `nv2` tile runs `glsl/matmul_cm2.comp` (`VK_NV_cooperative_matrix2`,
//! only with `COMBS_COOPMAT2=1`) behind the same bindings and epilogue.

use super::{FoldedRope, Input, LinearCall, Output, unsupported};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, DeviceCaps, GpuContext, Kernel, Recording};
use crate::ops::glu::Activation;
use crate::ops::params::{CoopParams, RopeFold};
use crate::ops::{AnyMat, pc_u32};
use crate::quant::{QuantType, WeightChunk};

/// What a cooperative-matrix product reads, as far as its tile depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoopInput {
    /// f32 activations.
    F32,
    /// f16 activations (what batched decode's norms and gates write).
    F16,
    /// The f32 residual with its RMS norm folded in from sums of squares.
    NormedBySquares,
}

/// How the cooperative-matrix kernels tile a product: `wm × wn × wk`
/// subgroups of 32, each multiplying `tm × tn` 16×16 matrices over `bk`
/// columns per step; `wk` > 1 splits K inside the workgroup. With `skinny`,
/// `matmul_skinny.comp` runs it: each subgroup streams its own chunks of K
/// without workgroup barriers (`wn` is 1; `tn` 16-token blocks per
/// workgroup share each dequantized weight tile); otherwise `matmul_coop.comp`, whose subgroups step through
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
    /// Workgroup-scope matrices (`matmul_cm2.comp`, `VK_NV_cooperative_matrix2`):
    /// the driver spreads the `bm × bn` tile over the `32·wm·wn·wk`
    /// invocations (`tm`, `tn` only size the tile); `bk` columns per step.
    pub nv2: bool,
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
        nv2: false,
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
        nv2: false,
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
        nv2: false,
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
        nv2: false,
    };
    /// 128 × 128 with eight subgroups of 32 rows × 64 tokens each: encoders
    /// and long prompts of narrow weights.
    pub const TALL: CoopTile = CoopTile {
        wm: 4,
        wn: 2,
        wk: 1,
        tm: 2,
        tn: 4,
        bk: 64,
        skinny: false,
        nv2: false,
    };
    /// 128 × 128 with eight subgroups of 64 × 32 each. No longer chosen:
    /// inside a prompt [`CoopTile::WIDE`] (less shared memory, so it fits
    /// wherever this does) runs the same weights faster
    /// ([`CoopTile::choose_on`]); kept for `combs kernel-bench` and the tests.
    pub const BIG: CoopTile = CoopTile {
        wm: 2,
        wn: 4,
        wk: 1,
        tm: 4,
        tn: 2,
        bk: 64,
        skinny: false,
        nv2: false,
    };

    /// 128 × 128 on workgroup-scope matrices, 256 invocations, 32 columns
    /// per step: prompts where the device has `VK_NV_cooperative_matrix2`.
    pub const NV2: CoopTile = CoopTile {
        wm: 2,
        wn: 4,
        wk: 1,
        tm: 4,
        tn: 2,
        bk: 32,
        skinny: false,
        nv2: true,
    };

    /// 128 rows × 64 tokens with eight subgroups of 32 × 32: weights of
    /// 16384+ rows (gate/up, output heads) past 32 tokens
    /// ([`CoopTile::takes_wide`]). Its 111 registers per invocation on the
    /// H200 leave room for two workgroups per SM where 128 × 128 (180)
    /// holds one.
    pub const WIDE: CoopTile = CoopTile {
        wm: 4,
        ..CoopTile::MID
    };

    /// 64 × 64 with eight subgroups of 32 rows × 16 tokens (90 registers on
    /// the H200): [`CoopTile::WIDE`]'s weights in batches too small for
    /// its workgroups to fill the GPU (llama-1b's gate/up at 33-64
    /// sequences: 56 µs a step against the skinny tile's 69, where `WIDE`'s
    /// 128 workgroups took 75).
    pub const MID8: CoopTile = CoopTile {
        wn: 4,
        tn: 1,
        ..CoopTile::MID
    };

    /// 64 rows × 128 tokens with four subgroups of 64 × 32, holding Q4_K
    /// weights raw to the staging: Q4_K weights of 2+ times more columns
    /// than rows (down projections) in prompts ([`CoopTile::for_weights`]).
    pub const DEEP: CoopTile = CoopTile {
        wm: 1,
        wn: 4,
        tm: 4,
        ..CoopTile::MID
    };

    /// Whether a product of `rows` × `cols` weights and `n` tokens takes
    /// [`CoopTile::WIDE`] (or [`CoopTile::MID8`]) where its workgroups make
    /// about one and a half waves ([`CoopTile::choose_for`]): 16384+ rows
    /// past 32 tokens (where batched decode's gate/up stop folding the
    /// norm), and for weights narrower than 4096 columns only below 1024
    /// tokens. On the H200
    /// (`combs kernel-bench --preset llama-1b|llama-8b --type q4_0 --tokens
    /// 32,40,48,64,128,256,512,2048 --x-f16 --coop-tiles ...`, µs, against
    /// what ran before): llama-1b gate/up 16384×2048 at 128 tokens 73.3
    /// (skinny 124.6), 256: 145.2 (64 × 64 173.1), 512: 282 (64 × 64 339;
    /// whole prompts of 512 tokens +4% on Q4_0, +7% on Q4_K), at 1024 561
    /// against 128 × 128's 536 (kept there); its head
    /// 128256×2048 at 48 tokens 285 (skinny 510, 64 × 64 on f32 input 378),
    /// 64: 290 (419); llama-8b gate/up 28672×4096 at 48 tokens 141 (228),
    /// 64: 143 (236), 128: 279 (411), 256: 552 (567), 512: 963 (1041), head
    /// at 64 554 (951); Q4_K gate/up at 64 180 (347), at 2048 4764 (4929).
    /// At 32 tokens the skinny tiles still win (llama-1b gate/up 35.0
    /// against 50.1, llama-8b 115.9 against 137.5).
    pub fn takes_wide(rows: usize, cols: usize, n: usize) -> bool {
        rows >= 16384 && n > 32 && (cols >= 4096 || n < 1024)
    }

    /// Whether `matmul_coop.comp` holds Q4_K weights raw from their load
    /// to the staging (as it does Q4_0's), rather than dequantizing them at
    /// the load: every tile but [`CoopTile::WIDE`], sized for two
    /// workgroups per SM. Measured on the H100, llama-8b at 512 tokens:
    /// faster on the 128 × 128 and 64 × 64 tiles (output 164 -> 123 µs,
    /// down 542 -> 453, Q/K/V 289 -> 283), slower on `WIDE` (gate/up 1168
    /// -> 1410); the other tiles take it untimed.
    pub fn holds_q4k_raw(&self) -> bool {
        *self != CoopTile::WIDE
    }

    /// Rows per tile.
    pub fn bm(&self) -> usize {
        (self.wm * self.tm * 16) as usize
    }

    /// Tokens per tile.
    pub fn bn(&self) -> usize {
        (self.wn * self.tn * 16) as usize
    }

    /// Workgroups of a product of `rows` outputs and `n` tokens.
    fn workgroups(&self, rows: usize, n: usize) -> usize {
        rows.div_ceil(self.bm()) * n.div_ceil(self.bn())
    }

    /// Invocations per workgroup.
    pub fn invocations(&self) -> u32 {
        32 * self.wm * self.wn * self.wk
    }

    /// Floats of the result staging area.
    fn staging_floats(&self) -> u32 {
        if self.skinny {
            self.wm * self.tm * self.tn * 256
        } else if self.wk == 1 {
            256 * self.wm * self.wn
        } else {
            self.wk * (self.bm() * self.bn()) as u32
        }
    }

    /// Shared memory bytes the kernel takes (what the driver keeps for
    /// workgroup-scope matrices is its own).
    pub fn shared_bytes(&self) -> usize {
        if self.nv2 {
            return 0;
        }
        let sa = (self.wk * self.bk + 8) as usize;
        let tiles = if self.skinny {
            // Each subgroup's 16 rows and 16 * tn tokens of one chunk, and
            // the workgroup's 1 / rms per token (NORM_IN).
            let subgroups = (self.wm * self.wk) as usize;
            2 * (self.bk as usize + 8) * subgroups * 16 * (1 + self.tn as usize) + 4 * self.bn()
        } else {
            2 * sa * (self.bm() + self.bn())
        };
        tiles + 4 * self.staging_floats() as usize
    }

    /// Whether the device can run the tile: its shared memory and invocations.
    pub fn fits(&self, ctx: &GpuContext) -> bool {
        self.fits_on(ctx.caps())
    }

    /// [`CoopTile::fits`] on a device of `caps`.
    pub fn fits_on(&self, caps: &DeviceCaps) -> bool {
        if self.nv2 {
            return caps.coop_mat2.as_ref().is_some_and(|m2| {
                m2.accepts(
                    self.bm() as u32,
                    self.bn() as u32,
                    self.bk,
                    self.invocations(),
                )
            });
        }
        self.shared_bytes() <= caps.max_shared_memory as usize
            && self.invocations() <= caps.max_workgroup_invocations
    }

    /// The tile for a `rows` × `cols` weight and `n` tokens: skinny tiles
    /// for batched decode, [`CoopTile::WIDE`] for weights of 16384+ rows
    /// past 32 tokens ([`CoopTile::takes_wide`]), 128 × 128 for 4096+ × 4096+
    /// weights where its workgroups fill whole waves (`full_waves`), and
    /// for 2048+ × 2048+ ones likewise from 1024 tokens (on the H200 at 2048
    /// tokens, llama-1b's 2048-wide matrices 5–19% faster than on 64 × 64
    /// tiles: whole prompts +2.6% on Q4_0, +7.8% on Q4_K), and for
    /// narrower ones at 1024+ tokens where they make four waves or more
    /// (`many_waves`), 64 × 64 for other weights of 1024+ rows or at 512+
    /// tokens, the 32-row tile for smaller ones. On the H200, SmolLM2-135M's
    /// f16 weights at 13312 tokens (a 13-tile image's vision encoder):
    /// 59-76 TFLOP/s with [`CoopTile::TALL`], 19-77 with [`CoopTile::BIG`]
    /// (19 on Q/K/V with the rope folded in), 30-64 with 64 × 64, 10-21
    /// with the 32-row tile; at 1536 tokens 35-56 with 64 × 64, 17-20 with
    /// the 32-row tile (`combs kernel-bench --preset smollm2-135m --type
    /// f16 --tokens 1536,13312 --coop-tiles ...`).
    pub fn choose(ctx: &GpuContext, rows: usize, cols: usize, n: usize) -> Self {
        Self::choose_for(ctx, rows, cols, n, CoopInput::F16, false)
    }

    /// [`CoopTile::choose`] for a product reading `input` and, with
    /// `squares`, writing each token's sums of squares (which only the
    /// skinny tiles do). The raw residual with its RMS norm folded in
    /// (batched decode's Q/K/V and gate/up) leaves registers for fewer
    /// accumulators, and only the skinny kernel reads it.
    pub fn choose_for(
        ctx: &GpuContext,
        rows: usize,
        cols: usize,
        n: usize,
        input: CoopInput,
        squares: bool,
    ) -> Self {
        Self::choose_on(ctx.caps(), rows, cols, n, input, squares)
    }

    /// [`CoopTile::choose_for`] on a device of `caps`.
    pub fn choose_on(
        caps: &DeviceCaps,
        rows: usize,
        cols: usize,
        n: usize,
        input: CoopInput,
        squares: bool,
    ) -> Self {
        let fits = |t: &CoopTile| t.fits_on(caps);
        // Sums of squares and the folded norm are the skinny kernel's alone.
        let wide_rows =
            !squares && input != CoopInput::NormedBySquares && Self::takes_wide(rows, cols, n);
        let fills = |t: &CoopTile| fits(t) && waves_and_a_half(caps, t, rows, n);
        let wide = wide_rows && fills(&CoopTile::WIDE);
        if wide_rows
            && n <= super::SKINNY_MAX_TOKENS
            && let Some(t) = [CoopTile::WIDE, CoopTile::MID8].into_iter().find(fills)
        {
            return t;
        }
        if n <= super::SKINNY_MAX_TOKENS {
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
            let norm_in = input == CoopInput::NormedBySquares;
            let tile = if n > 16 {
                skinny_blocks(caps, rows, cols, n, norm_in).unwrap_or(tile)
            } else {
                tile
            };
            // STREAM, the smallest, where the device's shared memory holds
            // no more: every batch of this size then takes a skinny tile,
            // as the planner assumes when it hands them f16 activations.
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
        if let Some(t) = nv2_tile(caps, rows, n) {
            return t;
        }
        if wide {
            return CoopTile::WIDE;
        }
        // The wave rules below count 128 × 128 workgroups, as they were
        // measured, though that tile itself is no longer chosen.
        let big_groups = CoopTile::BIG.workgroups(rows, n);
        let mid = CoopTile::MID;
        // 2048-wide weights only from 1024 tokens: at 512 the 64 × 64
        // tile beats the larger ones on llama-1b's Q/K/V, output and down.
        let min_dim = if n >= 1024 { 2048 } else { 4096 };
        if n > 64 && rows >= min_dim && cols >= min_dim && full_waves(caps, big_groups) {
            // Where 128 × 128 tiles fill their waves, `WIDE` (128 × 64, two
            // workgroups per SM) runs faster inside a prompt, though alone
            // (activations and residual resident in L2) 128 × 128 won:
            // between the products of a layer the activations come from
            // memory, and one workgroup per SM waits on each step's loads
            // with nothing to cover them. On an H100, products chained as
            // a prompt chains them (`combs kernel-bench --prompt-chain 3
            // --tokens 512,2048 --coop-tiles ...`, µs, 128 × 128 -> WIDE):
            // llama-8b Q4_0 at 512 output 157 -> 130, down 445 -> 382; at
            // 2048 Q/K/V 1008 -> 690, output 576 -> 485, down 1743 -> 1558;
            // Q4_K alike; llama-1b Q4_0 at 2048 Q/K/V 300 -> 190, output
            // 194 -> 149, gate/up 1270 -> 911, down 532 -> 459
            // (docs/perf-notes.md, "Session 37").
            if fits(&CoopTile::WIDE) {
                return CoopTile::WIDE;
            }
        }
        if n >= 1024 && fits(&CoopTile::TALL) && many_waves(caps, big_groups) {
            // Encoders (a vision encoder's tiles, Whisper's window) and long
            // prompts: narrow weights, but tokens enough for big tiles.
            CoopTile::TALL
        } else if rows >= 1024 || n >= 512 {
            // Eight subgroups on the same 64 × 64 tile where 64 × 64 makes
            // one to two workgroups per SM: more warps cover each step's
            // loads. On an H100 inside a prompt (`combs kernel-bench
            // --prompt-chain`, llama-1b Q4_0 at 512 tokens, µs): output
            // 55.1 -> 49.3, down 176.4 -> 157.8 (256 workgroups of 64 × 64
            // on 132 SMs); Q/K/V (384 workgroups, 2.9 per SM) 59.5 -> 86.1,
            // so not there.
            let mid_groups = mid.workgroups(rows, n);
            let sms = sm_count(caps);
            if n >= 512
                && rows >= 2048
                && cols >= 2048
                && (sms..=2 * sms).contains(&mid_groups)
                && fits(&CoopTile::MID8)
            {
                CoopTile::MID8
            } else {
                mid
            }
        } else {
            CoopTile::SKINNY_WIDE
        }
    }

    /// The tile [`CoopTile::choose_for`] chose, adjusted for the weights'
    /// format: Q4_K weights of two or more columns per row that would run
    /// on [`CoopTile::WIDE`] (which dequantizes Q4_K as it loads) take
    /// [`CoopTile::DEEP`], which holds them raw. On an H100 inside a prompt
    /// (`combs kernel-bench --prompt-chain`, µs): llama-8b's down at 512
    /// tokens 453 -> 389, at 2048 1771 -> 1660; llama-1b's at 2048 568 ->
    /// 538. Square weights (the output projection) gain nothing there (8B
    /// at 2048: 547 -> 581) and Q4_0's down loses (397 -> 446).
    pub fn for_weights(self, caps: &DeviceCaps, t: QuantType, rows: usize, cols: usize) -> Self {
        if self == CoopTile::WIDE
            && t == QuantType::Q4K
            && cols >= 2 * rows
            && CoopTile::DEEP.fits_on(caps)
        {
            CoopTile::DEEP
        } else {
            self
        }
    }

    /// Specialization constants of the tile's kernel.
    pub(super) fn spec(&self) -> Result<Vec<u32>> {
        let base = self.wm > 0
            && self.wn > 0
            && self.wk > 0
            && (1..=4).contains(&self.tm)
            && (1..=4).contains(&self.tn)
            && self.bk > 0
            && self.bk.is_multiple_of(32);
        let ok = if self.nv2 {
            // Two accumulators of bm / 2 rows (even and odd rows).
            !self.skinny
                && self.bm().is_multiple_of(32)
                && self.bk > 0
                && self.bk.is_multiple_of(16)
                && (1..=32).contains(&(self.wm * self.wn * self.wk))
        } else if self.skinny {
            // Whole weight sub-blocks per invocation and row tile; the
            // accumulators (tm * tn matrices) within what registers hold.
            self.wm > 0
                && self.wk > 0
                && self.wn == 1
                && (1..=4).contains(&self.tn)
                && (1..=8).contains(&self.tm)
                && self.tm * self.tn <= 8
                && self.wm * self.wk <= 32
                && self.bk > 0
                && self.bk.is_multiple_of(64)
        } else {
            base && self.wm * self.wn * self.wk <= 8
        };
        if !ok {
            return Err(ModelError::kernel(
                "matmul_coop",
                format!("cooperative tile {self:?}"),
            ));
        }
        Ok(if self.nv2 {
            vec![
                self.invocations(),
                self.bm() as u32,
                self.bn() as u32,
                self.bk,
            ]
        } else if self.skinny {
            vec![
                self.invocations(),
                32,
                self.wm,
                self.wk,
                self.tm,
                self.bk,
                self.tn,
            ]
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
                u32::from(self.holds_q4k_raw()),
            ]
        })
    }
}

/// The skinny layout for 17-128 tokens: the one that reuses each
/// dequantized weight tile the most (row tiles per subgroup × 16-token
/// blocks per workgroup) while its workgroups still make about one and a
/// half waves (1.4 per SM), with as many K-subgroups as shared memory
/// holds. On the H200 (`combs kernel-bench --preset llama-1b|llama-8b
/// --type q4_0 --tokens 24,32,48,64,128 --x-f16 --coop-tiles ...`, µs,
/// against one row tile and one token block per subgroup): llama-1b at 64
/// tokens Q/K/V 25.0 (28.4), output 17.7 (20.8), gate/up 66.5 (84.5 with 4
/// row tiles), down 48.6 (57.2), head 530 (648); at 32 tokens output and
/// down keep one block (12.6, 31.7), Q/K/V takes two (18.0 against 20.5);
/// at 128 (two workgroup rows of 64 tokens) Q/K/V 35.7, output 24.2,
/// gate/up 127.7, down 68.5 where the 64 × 64 tiles of `matmul_coop` take
/// 56.8, 57.2, 131.2, 200.4. llama-8b at 64: Q/K/V 58.8 with 4 row tiles
/// and 2 blocks, output 40.5 and down 122.8 with 2 and 2, gate/up 241.5,
/// head 971. With the norm folded in (f32 input), four row tiles and two
/// blocks lose to two and two: llama-1b gate/up at 64 tokens 117.8 against
/// 93.0, llama-8b 389.0 against 298.0.
fn skinny_blocks(
    caps: &DeviceCaps,
    rows: usize,
    cols: usize,
    n: usize,
    norm_in: bool,
) -> Option<CoopTile> {
    let one = CoopTile {
        wk: if cols >= 8192 { 10 } else { 8 },
        ..CoopTile::STREAM
    };
    let ladder = [
        CoopTile {
            wk: 5,
            tm: 4,
            tn: 2,
            ..CoopTile::STREAM
        },
        CoopTile {
            wk: 5,
            tm: 2,
            tn: 2,
            ..CoopTile::STREAM
        },
        CoopTile {
            wk: 6,
            tn: 2,
            ..CoopTile::STREAM
        },
    ];
    let enough = |t: &CoopTile| waves_and_a_half(caps, t, rows, n);
    // Fewer K-subgroups where shared memory holds fewer.
    let fitted = |t: CoopTile| {
        (1..=t.wk)
            .rev()
            .map(|wk| CoopTile { wk, ..t })
            .find(|c| c.fits_on(caps))
    };
    ladder
        .into_iter()
        .skip(usize::from(norm_in))
        .filter(enough)
        .find_map(fitted)
        // one row tile and one block where none of them fills the SMs
        .or_else(|| fitted(one))
}

/// The workgroup-scope tile for a product of more than
/// [`super::SKINNY_MAX_TOKENS`] tokens where the device has
/// `VK_NV_cooperative_matrix2`: 128 × 128 where its workgroups make a wave,
/// else 128 rows × 64 tokens.
fn nv2_tile(caps: &DeviceCaps, rows: usize, n: usize) -> Option<CoopTile> {
    caps.coop_mat2.as_ref()?;
    let sms = sm_count(caps);
    let narrow = CoopTile {
        wn: 2,
        ..CoopTile::NV2
    };
    let fitting: Vec<CoopTile> = [CoopTile::NV2, narrow]
        .into_iter()
        .filter(|t| t.fits_on(caps))
        .collect();
    fitting
        .iter()
        .find(|t| t.workgroups(rows, n) >= sms)
        .or(fitting.last())
        .copied()
}

/// Whether `groups` workgroups of the 128 × 128 tile (one resident per SM)
/// fill the waves they take well: on the H200 (132 SMs), llama-8b at 512
/// tokens, the output projection's 128 workgroups ran in 150 µs with it
/// (253 µs with 64 × 64 tiles), the Q/K/V projection's 192 (one and a half
/// waves) in 307 µs (257 with 64 × 64). Without an SM count, any number does.
fn full_waves(caps: &DeviceCaps, groups: usize) -> bool {
    let Some(sms) = caps.sm_count else {
        return true;
    };
    let waves = groups as f64 / f64::from(sms.max(1));
    waves / waves.ceil() >= 0.85 || waves >= 4.0
}

/// Whether `tile`'s workgroups for `rows` × `n` make about one and a half
/// waves or more (1.4 per SM). Fewer leave SMs idle while the last ones run:
/// on the H200 llama-1b's gate/up at 64 tokens (128 workgroups of
/// [`CoopTile::WIDE`]) took 75 µs inside a decode step against the skinny
/// tile's 69, though 51 against 64 timed alone.
fn waves_and_a_half(caps: &DeviceCaps, tile: &CoopTile, rows: usize, n: usize) -> bool {
    10 * tile.workgroups(rows, n) >= 14 * sm_count(caps)
}

/// Whether `groups` workgroups make four waves or more.
fn many_waves(caps: &DeviceCaps, groups: usize) -> bool {
    groups >= 4 * sm_count(caps)
}

/// The device's SMs where the driver says, otherwise as on a GPU of 128.
fn sm_count(caps: &DeviceCaps) -> usize {
    caps.sm_count.unwrap_or(128) as usize
}

/// What a cooperative epilogue folds into the stores: the gate's
/// activation, the rope, and whether the gated output is f16.
pub(super) struct Epilogue<'a> {
    pub glu: Option<Activation>,
    pub rope: Option<FoldedRope<'a>>,
    pub f16_out: bool,
}

impl<'a> Epilogue<'a> {
    /// The epilogue of `output`; `None` for the sums of squares, which
    /// only the skinny products write.
    pub(super) fn of(output: Output<'a>) -> Option<Self> {
        let plain = Epilogue {
            glu: None,
            rope: None,
            f16_out: false,
        };
        match output {
            Output::Store(_) | Output::Accumulate(_) => Some(plain),
            Output::Roped { rope, .. } => Some(Epilogue {
                rope: Some(rope),
                ..plain
            }),
            Output::Gated { out, act } => Some(Epilogue {
                glu: Some(act),
                f16_out: matches!(out, AnyMat::F16(_)),
                ..plain
            }),
            Output::AccumulateSquares { .. } => None,
        }
    }

    /// The flag bits, as both cooperative interfaces number them.
    pub(super) fn flags(&self, glu: u32, gelu: u32, rope: u32) -> u32 {
        let mut f = 0;
        if let Some(act) = self.glu {
            f |= glu;
            if act == Activation::GeluTanh {
                f |= gelu;
            }
        }
        if self.rope.is_some() {
            f |= rope;
        }
        f
    }

    /// The rope's push constants (zeros and a head of 2 without a rope).
    pub(super) fn rope_fields(&self) -> Result<RopeFold> {
        rope_fold(self.rope)
    }
}

/// The push constants of a folded rope (zeros and a head of 2 without one).
pub(super) fn rope_fold(rope: Option<FoldedRope<'_>>) -> Result<RopeFold> {
    let r = rope.map(|r| (r.rows, *r.rope()));
    Ok(RopeFold {
        rope_rows: pc_u32("rope rows", r.map_or(0, |r| r.0))?,
        head_dim: pc_u32("head_dim", r.map_or(2, |r| r.1.head_dim))?,
        n_rot: pc_u32("n_rot", r.map_or(0, |r| r.1.n_rot))?,
        attn_factor: r.map_or(1.0, |r| r.1.attn_factor),
    })
}

/// Checks that `tile` fits the device and returns its workgroup counts over
/// a chunk of `rows` rows and `n` tokens.
pub(super) fn tile_groups(
    ctx: &GpuContext,
    tile: CoopTile,
    rows: usize,
    n: usize,
) -> Result<[u32; 3]> {
    if !tile.fits(ctx) {
        return Err(ModelError::kernel(
            "matmul_coop",
            format!(
                "cooperative tile {tile:?} takes {} bytes of shared memory",
                tile.shared_bytes()
            ),
        ));
    }
    Ok([
        pc_u32("groups", rows.div_ceil(tile.bm()))?,
        pc_u32("groups", n.div_ceil(tile.bn()))?,
        1,
    ])
}

/// Records one chunk's product on the cooperative-matrix kernel, or on the
/// workgroup-scope one (`glsl/matmul_cm2.comp`) for an `nv2` tile: the
/// driver spreads that tile's matrices over the workgroup and stages their
/// loads, the weights come through a decode callback per format; bindings,
/// push constants and folded epilogues are the same.
///
/// # Errors
/// Anything but f32 or f16 in (4-element-aligned for `matmul_coop`), an
/// f16 output from f32 input, sums of squares out, a skinny tile or one the
/// device cannot run, or a value beyond 32 bits.
pub(super) fn record_chunk(
    rec: &mut Recording,
    call: &LinearCall<'_>,
    chunk: &WeightChunk,
    tile: CoopTile,
) -> Result<()> {
    let name = if tile.nv2 {
        "matmul_cm2"
    } else {
        "matmul_coop"
    };
    let Some(ep) = Epilogue::of(call.output) else {
        return Err(unsupported(name, call));
    };
    let t = call.weight.qtype();
    // f16 input comes with the f16 gated output (the next product's input).
    let (kernel, f16_in) = match (call.input, tile.nv2) {
        (Input::F32(_), false) => (Kernel::coop(t), false),
        (Input::F16(_), false) => (Kernel::coop_f16(t), true),
        (Input::F32(_), true) => (Kernel::cm2(t), false),
        (Input::F16(_), true) => (Kernel::cm2_f16(t), true),
        (Input::Normed { .. } | Input::NormedBySquares { .. }, _) => {
            return Err(unsupported(name, call));
        }
    };
    let x = call.input.x();
    // matmul_coop reads activations four at a time; the decode callbacks
    // of matmul_cm2 one at a time.
    if (ep.f16_out && !f16_in) || (!tile.nv2 && !x.aligned4()) || tile.skinny {
        return Err(unsupported(name, call));
    }
    let groups = tile_groups(rec.context(), tile, chunk.n_rows, call.n())?;
    let mut flags = call.store_flags(CoopParams::ACCUMULATE, CoopParams::BIAS)
        | ep.flags(CoopParams::GLU, CoopParams::GELU, CoopParams::ROPE);
    if ep.f16_out {
        flags |= CoopParams::OUT_F16;
    }
    let params = CoopParams {
        dims: super::chunk_dims(call, chunk, 1)?,
        flags,
        rope: ep.rope_fields()?,
    };
    rec.dispatch(
        kernel,
        &tile.spec()?,
        &family_bindings(call, chunk, ep.rope),
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// The bindings the cooperative-matrix kernels share (`matmul_coop`,
/// `matmul_cm2`, and the first seven of `matmul_skinny`): weights,
/// activations, output, bias, the folded rope's positions and inverse
/// frequencies, and the f16 alias of the output (gated f16 outputs; unused
/// by f32-output variants). Unused slots bind the activations.
pub(super) fn family_bindings<'a>(
    call: &LinearCall<'a>,
    chunk: &'a WeightChunk,
    rope: Option<FoldedRope<'a>>,
) -> [Binding<'a>; 7] {
    let rope = rope.map(|r| *r.rope());
    let (xb, out) = (call.input.x().buf(), call.output.out().buf());
    [
        Binding::read(&chunk.buffer),
        Binding::read(xb),
        Binding::write(out),
        Binding::read(call.bias.unwrap_or(xb)),
        Binding::read(rope.map_or(xb, |r| r.positions)),
        Binding::read(rope.map_or(xb, |r| r.inv_freq)),
        Binding::write(out),
    ]
}
