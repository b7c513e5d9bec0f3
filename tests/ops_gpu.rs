//! Every kernel family against its CPU reference on fresh random data:
//! linear (matvec and tiled matmul, every weight format, split weights,
//! bias and accumulate), rms_norm, rope, glu, get_rows, kv_store + attention.

mod common;

use std::sync::Arc;

use combs::gpu::{Buffer, DeviceClass, GpuContext, MemoryKind, Recording, Uploader, upload_new};
use combs::ops::attention::{
    AttentionCall, AttentionOptions, AttentionScratch, AttentionShape, AttentionVariant, KeySplit,
    MAX_KEY_SPLITS, NewKv, NewRows, attention_ref, blocks_split, coop_layout, key_splits,
    record_attention,
};
use combs::ops::get_rows::record_get_rows;
use combs::ops::glu::{Activation, GluCall, GluInput, act_ref, record_glu};
use combs::ops::kv_store::{CacheAddressing, KvStoreCall, LayerKv, record_kv_store};
use combs::ops::linear::{
    CoopInput, CoopTile, FoldedRope, Input, LinearCall, LinearVariant, MatvecShape, Output,
    SquareSums, linear_ref, record_linear,
};
use combs::ops::rms_norm::{
    NormFlavor, NormOut, NormWeight, RmsNorm, RmsNormCall, record_rms_norm, rms_norm_ref,
};
use combs::ops::rope::{Rope, RopeCall, RopeScaling, RopeStyle, inv_freq, record_rope, rope_ref};
use combs::ops::{AnyMat, Mat};
use combs::quant::{QuantType, QuantWeight, dequantize_vec};
use common::{Rng, gpu, random_weight, rel_err};
use half::f16;

fn device_f32(ctx: &Arc<GpuContext>, v: &[f32]) -> Arc<Buffer> {
    upload_new(ctx, bytemuck::cast_slice(v), "test input").expect("upload")
}

fn host_i32(ctx: &Arc<GpuContext>, v: &[i32]) -> Arc<Buffer> {
    let b = Buffer::new(ctx, (4 * v.len()) as u64, MemoryKind::Upload, "ints").expect("buffer");
    b.write_slice(0, v).expect("write");
    b
}

fn readback(ctx: &Arc<GpuContext>, floats: usize) -> Arc<Buffer> {
    Buffer::new(ctx, (4 * floats) as u64, MemoryKind::Readback, "out").expect("buffer")
}

fn read(b: &Arc<Buffer>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    b.read_slice(0, &mut v).expect("read");
    v
}

/// Stores `src`'s rows into `cache` as `at` says.
fn store(rec: &mut Recording, src: Mat<'_>, cache: &Arc<Buffer>, at: CacheAddressing<'_>) {
    record_kv_store(rec, &KvStoreCall { src, cache, at }).expect("kv store");
}

/// A product of `w` (and `bias`) from `x` into `out`, stored or added.
fn linear<'a>(
    w: &'a QuantWeight,
    bias: Option<&'a Arc<Buffer>>,
    x: Mat<'a>,
    out: Mat<'a>,
    accumulate: bool,
) -> LinearCall<'a> {
    let output = if accumulate {
        Output::Accumulate(out)
    } else {
        Output::Store(out)
    };
    LinearCall::new(w, bias, Input::F32(x), output)
}

fn run(ctx: &Arc<GpuContext>, f: impl FnOnce(&mut Recording)) {
    let mut rec = Recording::new(ctx, false).expect("recording");
    f(&mut rec);
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
}

fn check_linear(t: QuantType, rows: usize, cols: usize, n: usize, bias: bool, accumulate: bool) {
    let variants: &[LinearVariant] = if n == 1 {
        &[
            LinearVariant::Matvec,
            LinearVariant::Tiled,
            LinearVariant::Rows,
        ]
    } else if n <= combs::ops::linear::MATVEC_MAX_TOKENS {
        &[
            LinearVariant::Matvec,
            LinearVariant::Tiled,
            LinearVariant::Rows,
            LinearVariant::Coop,
        ]
    } else {
        &[
            LinearVariant::Tiled,
            LinearVariant::Rows,
            LinearVariant::Coop,
        ]
    };
    let coop = LinearVariant::coop_available(&gpu());
    for &v in variants
        .iter()
        .filter(|&&v| v != LinearVariant::Coop || coop)
    {
        check_linear_variant(v, None, t, rows, cols, n, bias, accumulate);
    }
}

#[allow(clippy::too_many_arguments)]
fn check_linear_variant(
    variant: LinearVariant,
    tile: Option<CoopTile>,
    t: QuantType,
    rows: usize,
    cols: usize,
    n: usize,
    bias: bool,
    accumulate: bool,
) {
    let ctx = gpu();
    let mut rng = Rng::fresh(&format!("linear_{}_{rows}x{cols}_n{n}", t.name()));
    let bytes = random_weight(&mut rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w =
        QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes).expect("upload");
    up.flush().expect("flush");
    let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
    let x = rng.normals(n * cols, 1.0);
    let b = rng.normals(rows, 1.0);
    let init = rng.normals(n * rows, 1.0);
    let xb = device_f32(&ctx, &x);
    let bb = device_f32(&ctx, &b);
    let out = readback(&ctx, n * rows);
    out.write_slice(0, &init).expect("init");
    run(&ctx, |rec| {
        let (x, y) = (Mat::new(&xb, n, cols), Mat::new(&out, n, rows));
        let call = linear(&w, bias.then_some(&bb), x, y, accumulate)
            .on(variant)
            .with_tile(tile);
        record_linear(rec, &call).expect("record");
    });
    let mut want = linear_ref(&wf, rows, cols, &x, n);
    for tkn in 0..n {
        for (r, &br) in b.iter().enumerate().take(rows) {
            let i = tkn * rows + r;
            if bias {
                want[i] += br;
            }
            if accumulate {
                want[i] += init[i];
            }
        }
    }
    let got = read(&out, n * rows);
    let e = rel_err(&got, &want);
    // the cooperative-matrix kernel rounds weights and activations to f16
    let tol = if variant == LinearVariant::Coop {
        2e-3
    } else {
        1e-5
    };
    assert!(
        e < tol,
        "{variant:?} {tile:?} {t} {rows}x{cols} n={n}: relative error {e}"
    );
}

/// Every cooperative-matrix tiling (K split inside the workgroup, 64 × 64,
/// 128 × 128 both ways) on partial tiles of rows and tokens, with bias and
/// accumulation, for a fast and a generic weight type. Runs where the device
/// has cooperative matrices.
#[test]
fn coop_tiles_match_ref() {
    if !LinearVariant::coop_available(&gpu()) {
        eprintln!("no cooperative matrices on this device: skipped");
        return;
    }
    let tiles = [
        CoopTile::SKINNY,
        CoopTile::MID,
        CoopTile::BIG,
        CoopTile::TALL,
        CoopTile::WIDE,
        CoopTile::MID8,
        CoopTile::DEEP,
        // 128 rows × 64 tokens, four subgroups of 64 × 32
        CoopTile {
            wm: 2,
            wn: 2,
            wk: 1,
            tm: 4,
            tn: 2,
            bk: 64,
            skinny: false,
            nv2: false,
        },
        CoopTile {
            wm: 2,
            wn: 1,
            wk: 2,
            tm: 1,
            tn: 1,
            bk: 32,
            skinny: false,
            nv2: false,
        },
        // independent subgroups: 16 rows, K split eight ways
        CoopTile::STREAM,
        SKINNY_2X32_ROWS,
        SKINNY_TOKEN_BLOCKS[0],
        SKINNY_TOKEN_BLOCKS[1],
        SKINNY_TOKEN_BLOCKS[2],
    ];
    for tile in tiles {
        for (t, rows, cols, n) in [
            (QuantType::Q4_0, 333, 576, 5),
            (QuantType::Q4K, 200, 512, 37),
            (QuantType::Q6K, 130, 768, 130),
            (QuantType::Q8_0, 64, 96, 16),
        ] {
            check_linear_variant(
                LinearVariant::Coop,
                Some(tile),
                t,
                rows,
                cols,
                n,
                true,
                true,
            );
        }
    }
}

/// This device's capabilities with an H200's limits for the tile choice:
/// 48 KB of shared memory, 1024 invocations, 132 SMs, no workgroup-scope
/// matrices.
fn h200_caps() -> combs::gpu::DeviceCaps {
    let mut h200 = gpu().caps().clone();
    h200.max_shared_memory = 49152;
    h200.max_workgroup_invocations = 1024;
    h200.sm_count = Some(132);
    h200.coop_mat2 = None;
    h200
}

/// The tile choice, on this device's limits and on an H200's (48 KB of
/// shared memory, 132 SMs): what only the skinny kernel does (writing sums
/// of squares, reading the residual with its norm folded in) stays on
/// skinny tiles at every batch size; past 32 tokens the weights
/// `CoopTile::takes_wide` names leave them for `WIDE` where its workgroups
/// make 1.4 per SM, else `MID8`; every other weight of up to 128 tokens
/// keeps them.
#[test]
fn coop_tile_choice_keeps_skinny_work_on_skinny_tiles() {
    let h200 = h200_caps();
    let shapes = [
        (3072, 2048),
        (2048, 8192),
        (16384, 2048),
        (28672, 4096),
        (49152, 576),
        (128256, 2048),
    ];
    for caps in [gpu().caps().clone(), h200.clone()] {
        if !CoopTile::STREAM.fits_on(&caps) {
            eprintln!("{}: no skinny tile fits: skipped", caps.name);
            continue;
        }
        for (rows, cols) in shapes {
            for n in [4, 16, 17, 32, 33, 48, 64, 96, 128] {
                for (input, squares) in [
                    (CoopInput::NormedBySquares, false),
                    (CoopInput::F16, true),
                    (CoopInput::F32, true),
                ] {
                    let t = CoopTile::choose_on(&caps, rows, cols, n, input, squares);
                    assert!(t.skinny, "{rows}x{cols}, {n} tokens, {input:?}: {t:?}");
                }
                let t = CoopTile::choose_on(&caps, rows, cols, n, CoopInput::F16, false);
                if CoopTile::takes_wide(rows, cols, n) {
                    assert!(
                        t.skinny || t == CoopTile::WIDE || t == CoopTile::MID8,
                        "{rows}x{cols}, {n} tokens: {t:?}"
                    );
                } else {
                    assert!(t.skinny, "{rows}x{cols}, {n} tokens: {t:?}");
                }
            }
        }
    }
    let on_h200 = |rows, cols, n| CoopTile::choose_on(&h200, rows, cols, n, CoopInput::F16, false);
    // llama-1b's gate/up: 128 workgroups of WIDE at 64 tokens are too few
    assert_eq!(on_h200(16384, 2048, 64), CoopTile::MID8);
    assert_eq!(on_h200(16384, 2048, 128), CoopTile::WIDE);
    assert!(on_h200(16384, 2048, 32).skinny);
    assert_eq!(on_h200(128256, 2048, 48), CoopTile::WIDE);
    assert_eq!(on_h200(28672, 4096, 512), CoopTile::WIDE);
    assert_eq!(on_h200(16384, 2048, 512), CoopTile::WIDE);
    // Where 128 x 128 tiles would fill their waves, WIDE runs them (faster
    // inside a prompt); where they would not, 64 x 64
    assert_eq!(on_h200(16384, 2048, 2048), CoopTile::WIDE);
    assert_eq!(on_h200(4096, 4096, 512), CoopTile::WIDE);
    assert_eq!(on_h200(4096, 14336, 512), CoopTile::WIDE);
    assert_eq!(on_h200(6144, 4096, 2048), CoopTile::WIDE);
    assert_eq!(on_h200(6144, 4096, 512), CoopTile::MID);
    // 64 x 64 making one to two workgroups per SM: eight subgroups on it
    assert_eq!(on_h200(2048, 2048, 512), CoopTile::MID8);
    assert_eq!(on_h200(2048, 8192, 512), CoopTile::MID8);
    assert_eq!(on_h200(3072, 2048, 512), CoopTile::MID);
    // Q4_K down projections hold their weights raw on DEEP
    let wide = on_h200(4096, 14336, 512);
    assert_eq!(
        wide.for_weights(&h200, QuantType::Q4K, 4096, 14336),
        CoopTile::DEEP
    );
    assert_eq!(
        wide.for_weights(&h200, QuantType::Q4_0, 4096, 14336),
        CoopTile::WIDE
    );
    assert_eq!(
        wide.for_weights(&h200, QuantType::Q4K, 4096, 4096),
        CoopTile::WIDE
    );
    let mid = CoopTile::MID;
    assert_eq!(
        mid.for_weights(&h200, QuantType::Q4K, 2048, 8192),
        CoopTile::MID
    );
    assert!(!CoopTile::takes_wide(8192, 4096, 64));
}

/// The kernels' reductions keep a shared slot per subgroup of 4+
/// invocations: a device whose subgroups may be narrower is refused by
/// name, and this one (whatever its width, 4 on 128-bit lavapipe) is not.
#[test]
fn devices_with_subgroups_below_four_are_refused() {
    let caps = gpu().caps().clone();
    assert!(caps.check_required().is_ok());
    for narrow in [1, 2] {
        let mut c = caps.clone();
        c.min_subgroup_size = narrow;
        let e = c.check_required().expect_err("narrow subgroups");
        assert!(
            matches!(&e, combs::ModelError::MissingFeature { feature, .. } if feature.contains("subgroups of at least 4")),
            "{e}"
        );
    }
}

const ALL_TYPES: [QuantType; 13] = QuantType::ALL;

/// The workgroup-scope tiles (`matmul_cm2.comp`) this device accepts:
/// 128 × 128, 128 rows × 64 tokens, 64 × 128 and 64 × 64; none without
/// `VK_NV_cooperative_matrix2`.
fn nv2_tiles(ctx: &GpuContext) -> Vec<CoopTile> {
    [
        CoopTile::NV2,
        CoopTile {
            wn: 2,
            ..CoopTile::NV2
        },
        CoopTile {
            wm: 1,
            ..CoopTile::NV2
        },
        CoopTile {
            wm: 1,
            wn: 2,
            ..CoopTile::NV2
        },
    ]
    .into_iter()
    .filter(|t| t.fits(ctx))
    .collect()
}

/// One product of f16 activations on `tile`, with bias, accumulating into
/// its output: fresh weights of type `t` and inputs of `[rows, cols, n]`.
struct F16Product {
    /// The weight's GGUF blocks.
    bytes: Vec<u8>,
    /// Their dequantized values.
    wf: Vec<f32>,
    /// The activations as the kernel read them (f16, widened).
    xr: Vec<f32>,
    /// The bias.
    b: Vec<f32>,
    /// What the output held before.
    init: Vec<f32>,
    /// What the kernel left there.
    got: Vec<f32>,
    /// The f64 reference of the same inputs.
    want: Vec<f32>,
}

fn f16_product(
    ctx: &Arc<GpuContext>,
    rng: &mut Rng,
    tile: CoopTile,
    t: QuantType,
    [rows, cols, n]: [usize; 3],
) -> F16Product {
    let bytes = random_weight(rng, t, rows * cols);
    let mut up = Uploader::new(ctx).expect("staging");
    let w = QuantWeight::from_gguf_bytes(ctx, &mut up, "w", t, rows, cols, &bytes).expect("upload");
    up.flush().expect("flush");
    let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
    let (xh, xr) = halves(&rng.normals(n * cols, 1.0));
    let xb = upload_new(ctx, bytemuck::cast_slice(&xh), "x f16").expect("upload");
    let b = rng.normals(rows, 0.5);
    let bb = device_f32(ctx, &b);
    let init = rng.normals(n * rows, 1.0);
    let out = readback(ctx, n * rows);
    out.write_slice(0, &init).expect("init");
    run(ctx, |rec| {
        let input = Input::F16(Mat::new(&xb, n, cols));
        let output = Output::Accumulate(Mat::new(&out, n, rows));
        let call = LinearCall::new(&w, Some(&bb), input, output)
            .on(LinearVariant::Coop)
            .with_tile(Some(tile));
        record_linear(rec, &call).expect("record");
    });
    let y = linear_ref(&wf, rows, cols, &xr[..n * cols], n);
    let want: Vec<f32> = (0..n * rows)
        .map(|i| y[i] + b[i % rows] + init[i])
        .collect();
    F16Product {
        got: read(&out, n * rows),
        bytes,
        wf,
        xr,
        b,
        init,
        want,
    }
}

/// Workgroup-scope tiles on every weight format (each decoded by the
/// kernel's callback), partial tiles of an odd number of rows and of
/// tokens, with bias and accumulation, from f32 activations and from f16
/// ones. Runs where the device has `VK_NV_cooperative_matrix2`.
#[test]
fn nv2_tiles_match_ref() {
    let ctx = gpu();
    let tiles = nv2_tiles(&ctx);
    if tiles.is_empty() {
        eprintln!("no workgroup-scope cooperative matrices on this device: skipped");
        return;
    }
    let mut rng = Rng::fresh("nv2_f16");
    for &tile in &tiles {
        for t in ALL_TYPES {
            check_linear_variant(
                LinearVariant::Coop,
                Some(tile),
                t,
                333,
                512,
                141,
                true,
                true,
            );
        }
        for (t, rows, cols, n) in [
            (QuantType::Q4_0, 333, 576, 200),
            (QuantType::Q6K, 130, 768, 131),
        ] {
            let p = f16_product(&ctx, &mut rng, tile, t, [rows, cols, n]);
            let e = rel_err(&p.got, &p.want);
            assert!(e < 2e-3, "{tile:?} {t} {rows}x{cols} n={n} f16 input: {e}");
        }
    }
}

/// Skinny layouts besides `CoopTile::STREAM`: 2 × 32 rows with K split two
/// ways in 128-column chunks, and four 16-row tiles per subgroup.
const SKINNY_2X32_ROWS: CoopTile = CoopTile {
    wm: 2,
    wk: 2,
    tm: 2,
    bk: 128,
    ..CoopTile::STREAM
};
const SKINNY_4_TILES: CoopTile = CoopTile {
    wk: 4,
    tm: 4,
    ..CoopTile::STREAM
};
/// Skinny layouts of several 16-token blocks per workgroup (each weight
/// tile dequantized once for all of them): 2 blocks with six K-subgroups, 4
/// with three, and 3 blocks of two row tiles each (partial blocks of tokens
/// in every case below).
const SKINNY_TOKEN_BLOCKS: [CoopTile; 3] = [
    CoopTile {
        wk: 6,
        tn: 2,
        ..CoopTile::STREAM
    },
    CoopTile {
        wk: 3,
        tn: 4,
        ..CoopTile::STREAM
    },
    CoopTile {
        wk: 2,
        tm: 2,
        tn: 3,
        ..CoopTile::STREAM
    },
];

#[test]
fn matvec_every_type_matches_ref() {
    for t in ALL_TYPES {
        check_linear(t, 67, 512, 1, false, false);
    }
}

#[test]
fn matmul_every_type_matches_ref() {
    for t in ALL_TYPES {
        check_linear(t, 67, 512, 37, false, false);
    }
}

#[test]
fn matvec_odd_rows_bias_accumulate_matches_ref() {
    check_linear(QuantType::Q4_0, 131, 96, 1, true, true);
    check_linear(QuantType::Q6K, 5, 768, 1, true, true);
    // several rows per invocation group (1024+ and 8192+ rows), odd tails
    check_linear(QuantType::Q4_1, 1029, 128, 1, true, true);
    check_linear(QuantType::Q8_0, 8195, 64, 1, false, true);
}

#[test]
fn matvec_several_tokens_match_ref() {
    // Batched decode: a few tokens through the matvec kernel, one workgroup
    // per (row block, token).
    for t in [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
        QuantType::F16,
    ] {
        check_linear_variant(LinearVariant::Matvec, None, t, 67, 512, 5, true, true);
    }
    check_linear_variant(
        LinearVariant::Matvec,
        None,
        QuantType::Q4_1,
        1029,
        128,
        8,
        false,
        true,
    );
}

#[test]
fn matmul_partial_tiles_bias_accumulate_matches_ref() {
    check_linear(QuantType::Q8_0, 65, 96, 33, true, true);
    check_linear(QuantType::Q4K, 3, 256, 2, true, false);
    check_linear(QuantType::F16, 130, 64, 65, false, true);
}

/// One matvec with folded steps against the CPU chain it replaces:
/// rms_norm_ref, linear_ref (+ bias), and act_ref on (gate, up) row pairs.
#[allow(clippy::too_many_arguments)]
/// A matvec layout for the tests: see `MatvecShape`.
fn mv(tpr: u32, nr: u32, ks: u32, un: u32, wg: u32, stage_x: bool) -> Option<MatvecShape> {
    Some(MatvecShape {
        tpr,
        nr,
        ks,
        un,
        wg,
        stage_x,
        narrow: false,
    })
}

/// [`mv`] with Q4_K's 32-column units.
fn mv_narrow(tpr: u32, nr: u32, un: u32, stage_x: bool) -> Option<MatvecShape> {
    mv(tpr, nr, 1, un, 128, stage_x).map(|m| MatvecShape { narrow: true, ..m })
}

#[allow(clippy::too_many_arguments)]
fn check_matvec_folded(
    t: QuantType,
    rows: usize,
    cols: usize,
    norm: Option<NormFlavor>,
    glu: Option<Activation>,
    bias: bool,
    accumulate: bool,
    shape: Option<MatvecShape>,
) {
    check_matvec_folded_n(t, rows, cols, 1, norm, glu, bias, accumulate, shape);
}

/// The folded matvec for `n` tokens (rows of x and of the output a few
/// floats apart, as in a batch's scratch) against the CPU chain per token.
#[allow(clippy::too_many_arguments)]
fn check_matvec_folded_n(
    t: QuantType,
    rows: usize,
    cols: usize,
    n: usize,
    norm: Option<NormFlavor>,
    glu: Option<Activation>,
    bias: bool,
    accumulate: bool,
    shape: Option<MatvecShape>,
) {
    let ctx = gpu();
    let label = format!("matvec_folded_{}_{rows}x{cols}_n{n}", t.name());
    let mut rng = Rng::fresh(&label);
    let bytes = random_weight(&mut rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w =
        QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes).expect("upload");
    up.flush().expect("flush");
    let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
    let (ldx, out_len) = (cols + 8, if glu.is_some() { rows / 2 } else { rows });
    let ldo = out_len + 4;
    // Random scale and offset, so the norm has something to undo.
    let x: Vec<f32> = rng.normals(n * ldx, 3.0).iter().map(|v| v + 0.5).collect();
    let nw = rng.normals(cols, 1.0);
    let b = rng.normals(rows, 1.0);
    let init = rng.normals(n * ldo, 1.0);
    let (xb, nb, bb) = (
        device_f32(&ctx, &x),
        device_f32(&ctx, &nw),
        device_f32(&ctx, &b),
    );
    let out = readback(&ctx, n * ldo);
    out.write_slice(0, &init).expect("init");
    let eps = 1e-5;
    run(&ctx, |rec| {
        let x = Mat::new(&xb, n, cols).with_ld(ldx);
        let y = Mat::new(&out, n, out_len).with_ld(ldo);
        let input = match norm {
            Some(flavor) => Input::Normed {
                x,
                norm: NormWeight {
                    weight: &nb,
                    flavor,
                    eps,
                },
            },
            None => Input::F32(x),
        };
        let output = match (glu, accumulate) {
            (Some(act), false) => Output::Gated {
                out: AnyMat::F32(y),
                act,
            },
            (None, true) => Output::Accumulate(y),
            (None, false) => Output::Store(y),
            (Some(_), true) => panic!("a gated output does not accumulate"),
        };
        let call = LinearCall::new(&w, bias.then_some(&bb), input, output)
            .on(LinearVariant::Matvec)
            .with_shape(shape);
        record_linear(rec, &call).expect("record");
    });
    let got = read(&out, n * ldo);
    for tk in 0..n {
        let xt = &x[tk * ldx..tk * ldx + cols];
        let xin = match norm {
            Some(flavor) => rms_norm_ref(xt, Some(&nw), flavor, eps),
            None => xt.to_vec(),
        };
        let mut y = linear_ref(&wf, rows, cols, &xin, 1);
        if bias {
            y.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
        }
        let mut want: Vec<f32> = match glu {
            Some(act) => y.chunks(2).map(|p| act_ref(act, p[0]) * p[1]).collect(),
            None => y,
        };
        if accumulate {
            want.iter_mut()
                .zip(&init[tk * ldo..])
                .for_each(|(a, p)| *a += p);
        }
        let row = &got[tk * ldo..tk * ldo + out_len];
        let e = rel_err(row, &want);
        assert!(
            e < 2e-5,
            "{label} token {tk} norm {norm:?} glu {glu:?} bias {bias} acc {accumulate} shape {shape:?}: {e}"
        );
        // the gap between rows is left alone
        assert_eq!(
            &got[tk * ldo + out_len..(tk + 1) * ldo],
            &init[tk * ldo + out_len..(tk + 1) * ldo],
            "{label} token {tk}: wrote past its row"
        );
    }
}

/// The cooperative-matrix kernel with the gated activation or the rope
/// folded into its stores (each tiling's epilogue), against the CPU chain.
/// Runs where the device has cooperative matrices.
#[test]
fn coop_epilogue_matches_ref() {
    let ctx = gpu();
    if !LinearVariant::coop_available(&ctx) {
        eprintln!("no cooperative matrices on this device: skipped");
        return;
    }
    let mut rng = Rng::fresh("coop_epilogue");
    let (hd, n_rot, cols) = (64, 48, 512);
    let rows = 6 * hd; // 4 rotated heads (q, k), 2 value heads
    let mut tiles = vec![
        CoopTile::SKINNY,
        CoopTile::SKINNY_WIDE,
        CoopTile::MID,
        CoopTile::BIG,
        CoopTile::TALL,
        CoopTile::WIDE,
        CoopTile::MID8,
        // 128 rows × 64 tokens, four subgroups of 64 × 32
        CoopTile {
            wm: 2,
            wn: 2,
            wk: 1,
            tm: 4,
            tn: 2,
            bk: 64,
            skinny: false,
            nv2: false,
        },
        SKINNY_4_TILES,
        SKINNY_TOKEN_BLOCKS[1],
        SKINNY_TOKEN_BLOCKS[2],
    ];
    tiles.extend(nv2_tiles(&ctx));
    for tile in tiles {
        for (t, n) in [
            (QuantType::Q4_0, 7),
            (QuantType::Q4K, 40),
            (QuantType::Q8_0, 133),
        ] {
            let bytes = random_weight(&mut rng, t, rows * cols);
            let mut up = Uploader::new(&ctx).expect("staging");
            let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
                .expect("upload");
            up.flush().expect("flush");
            let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
            let x = rng.normals(n * cols, 1.0);
            let b = rng.normals(rows, 0.5);
            let pos: Vec<i32> = (0..n).map(|_| rng.below(3000) as i32).collect();
            let f = inv_freq(n_rot, 10000.0, &RopeScaling::None);
            let (xb, bb, fb) = (
                device_f32(&ctx, &x),
                device_f32(&ctx, &b),
                device_f32(&ctx, &f),
            );
            let pb = host_i32(&ctx, &pos);
            let mut y = linear_ref(&wf, rows, cols, &x, n);
            for tk in 0..n {
                y[tk * rows..(tk + 1) * rows]
                    .iter_mut()
                    .zip(&b)
                    .for_each(|(a, b)| *a += b);
            }
            // the gated activation over interleaved pairs
            let out = readback(&ctx, n * rows / 2);
            run(&ctx, |rec| {
                let output = Output::Gated {
                    out: AnyMat::F32(Mat::new(&out, n, rows / 2)),
                    act: Activation::Silu,
                };
                let call =
                    LinearCall::new(&w, Some(&bb), Input::F32(Mat::new(&xb, n, cols)), output)
                        .on(LinearVariant::Coop)
                        .with_tile(Some(tile));
                record_linear(rec, &call).expect("record");
            });
            let want: Vec<f32> = y
                .chunks(2)
                .map(|p| act_ref(Activation::Silu, p[0]) * p[1])
                .collect();
            let e = rel_err(&read(&out, n * rows / 2), &want);
            assert!(e < 3e-3, "{tile:?} {t} n={n} glu: {e}");
            // the rope of the first 4 heads
            let out = readback(&ctx, n * rows);
            run(&ctx, |rec| {
                let rope = Rope {
                    style: RopeStyle::Normal,
                    head_dim: hd,
                    n_rot,
                    positions: &pb,
                    inv_freq: &fb,
                    attn_factor: 0.9,
                };
                let output = Output::Roped {
                    out: Mat::new(&out, n, rows),
                    rope: FoldedRope::adjacent(rope, 4 * hd).expect("adjacent pairs"),
                };
                let call =
                    LinearCall::new(&w, Some(&bb), Input::F32(Mat::new(&xb, n, cols)), output)
                        .on(LinearVariant::Coop)
                        .with_tile(Some(tile));
                record_linear(rec, &call).expect("record");
            });
            let mut want = y.clone();
            for (tk, &p) in pos.iter().enumerate() {
                for h in 0..4 {
                    let at = tk * rows + h * hd;
                    rope_ref(&mut want[at..at + hd], p, &f, n_rot, RopeStyle::Normal, 0.9);
                }
            }
            let e = rel_err(&read(&out, n * rows), &want);
            assert!(e < 3e-3, "{tile:?} {t} n={n} rope: {e}");
        }
    }
}

/// Batched decode's matvec over a few tokens with the norm and the gated
/// activation folded in (each workgroup one token's share of rows).
#[test]
fn matvec_folded_several_tokens_match_ref() {
    for (t, shape) in [
        (QuantType::Q4_0, None),
        (QuantType::Q4K, mv(32, 2, 1, 1, 128, true)),
        (QuantType::Q8_0, mv(8, 4, 2, 2, 128, false)),
        (QuantType::Q6K, None),
    ] {
        check_matvec_folded_n(
            t,
            70,
            512,
            3,
            Some(NormFlavor::Plain),
            None,
            true,
            true,
            shape,
        );
        check_matvec_folded_n(
            t,
            134,
            512,
            5,
            Some(NormFlavor::ZeroCentred),
            Some(Activation::Silu),
            false,
            false,
            shape,
        );
    }
}

#[test]
fn matvec_folded_norm_matches_ref() {
    // The fast-path types, a generic one and a dense one; rows that fill no
    // workgroup evenly; invocation groups narrower than, equal to and wider
    // than a subgroup (the last reduces through shared memory).
    for t in [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q6K,
        QuantType::Q5_0,
        QuantType::F16,
    ] {
        for (flavor, shape) in [
            (NormFlavor::Plain, None),
            (NormFlavor::ZeroCentred, mv(4, 3, 1, 1, 128, false)),
            (NormFlavor::Plain, mv(8, 3, 4, 1, 128, false)),
            (NormFlavor::Plain, mv(64, 2, 1, 1, 128, false)),
            (NormFlavor::ZeroCentred, mv(32, 1, 2, 1, 128, false)),
            (NormFlavor::Plain, mv(32, 2, 1, 2, 128, true)),
            (NormFlavor::ZeroCentred, mv(16, 3, 2, 3, 256, true)),
            (NormFlavor::Plain, mv(8, 2, 1, 4, 64, false)),
            (NormFlavor::ZeroCentred, mv_narrow(16, 3, 2, false)),
        ] {
            check_matvec_folded(t, 37, 768, Some(flavor), None, true, false, shape);
        }
    }
    check_matvec_folded(
        QuantType::Q4_0,
        1029,
        2048,
        Some(NormFlavor::Plain),
        None,
        false,
        true,
        None,
    );
    // the 8B shape: 8 rows per group of 64
    for t in [QuantType::Q4_0, QuantType::Q4K] {
        check_matvec_folded(
            t,
            1029,
            4096,
            Some(NormFlavor::Plain),
            None,
            true,
            true,
            mv(64, 8, 1, 1, 128, false),
        );
    }
}

#[test]
fn matvec_gated_pairs_match_ref() {
    for t in [
        QuantType::Q4_0,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5_1,
    ] {
        for (act, norm, shape) in [
            (Activation::Silu, Some(NormFlavor::Plain), None),
            (Activation::GeluTanh, None, mv(16, 1, 1, 1, 128, false)),
            (Activation::Silu, None, mv(8, 4, 2, 1, 128, false)),
            (
                Activation::GeluTanh,
                Some(NormFlavor::Plain),
                mv(64, 4, 1, 2, 64, true),
            ),
            (Activation::Silu, None, mv(64, 4, 1, 1, 128, false)),
        ] {
            // 2 x 67 rows: pairs straddle no group, the last group is partial
            check_matvec_folded(t, 134, 512, norm, Some(act), false, false, shape);
        }
    }
    check_matvec_folded(
        QuantType::Q4_0,
        2 * 1031,
        256,
        None,
        Some(Activation::Silu),
        true,
        false,
        None,
    );
}

/// Every quantized type on the layouts subgroups of 32 now take for
/// 8B-sized weights: the down projection's 64-wide row groups in
/// workgroups of 256 (x staged in chunks past 10240 columns), Q4_K's
/// 64-column units with x staged, in workgroups of 128 and 256; with the
/// norm folded in and accumulating, 67 rows (a partial workgroup).
#[test]
fn matvec_8b_layouts_match_ref_for_every_type() {
    for t in QuantType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        for (cols, shape) in [
            (12288, mv(64, 4, 1, 1, 256, true)),
            (4096, mv(32, 4, 1, 1, 128, true)),
            (12288, mv(32, 4, 1, 1, 256, true)),
        ] {
            check_matvec_folded(
                t,
                67,
                cols,
                Some(NormFlavor::Plain),
                None,
                true,
                true,
                shape,
            );
        }
    }
}

#[test]
fn matvec_fast_paths_long_rows_match_ref() {
    // 14336 columns (an 8B FFN's down projection): the sum-of-x correction of
    // the fast paths must not lose precision over long rows.
    check_matvec_folded(
        QuantType::Q4K,
        37,
        14336,
        None,
        None,
        false,
        true,
        mv_narrow(32, 4, 2, true),
    );
    for t in [QuantType::Q4_0, QuantType::Q8_0, QuantType::Q4K] {
        check_matvec_folded(t, 19, 14336, None, None, false, false, None);
        // x staged in two chunks (57 KiB of it), with the norm folded in
        check_matvec_folded(
            t,
            37,
            14336,
            Some(NormFlavor::Plain),
            None,
            true,
            false,
            mv(32, 2, 1, 2, 128, true),
        );
    }
}

#[test]
fn matvec_folded_rope_matches_ref() {
    // A fused QKV projection of 3 query heads, 1 key head, 1 value head of
    // 64: the first 4 heads rotated (24 of 64 dims), the value head not.
    let ctx = gpu();
    let mut rng = Rng::fresh("matvec_folded_rope");
    let (hd, n_rot, cols) = (64, 24, 512);
    let rows = 5 * hd;
    for (t, shape) in [
        (QuantType::Q4_0, None),
        (QuantType::Q6K, mv(8, 3, 1, 1, 128, false)),
        (QuantType::Q4K, mv(8, 2, 4, 1, 128, false)),
        (QuantType::Q8_0, mv(32, 2, 1, 4, 128, true)),
    ] {
        let bytes = random_weight(&mut rng, t, rows * cols);
        let mut up = Uploader::new(&ctx).expect("staging");
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        let x = rng.normals(cols, 2.0);
        let nw = rng.normals(cols, 1.0);
        let pos = rng.below(4000) as i32;
        let f = inv_freq(n_rot, 10000.0, &RopeScaling::None);
        let (xb, nb, fb) = (
            device_f32(&ctx, &x),
            device_f32(&ctx, &nw),
            device_f32(&ctx, &f),
        );
        let pb = host_i32(&ctx, &[pos]);
        let out = readback(&ctx, rows);
        run(&ctx, |rec| {
            let input = Input::Normed {
                x: Mat::new(&xb, 1, cols),
                norm: NormWeight {
                    weight: &nb,
                    flavor: NormFlavor::Plain,
                    eps: 1e-6,
                },
            };
            let rope = Rope {
                style: RopeStyle::Normal,
                head_dim: hd,
                n_rot,
                positions: &pb,
                inv_freq: &fb,
                attn_factor: 0.9,
            };
            let output = Output::Roped {
                out: Mat::new(&out, 1, rows),
                rope: FoldedRope::adjacent(rope, 4 * hd).expect("adjacent pairs"),
            };
            let call = LinearCall::new(&w, None, input, output)
                .on(LinearVariant::Matvec)
                .with_shape(shape);
            record_linear(rec, &call).expect("record");
        });
        let xin = rms_norm_ref(&x, Some(&nw), NormFlavor::Plain, 1e-6);
        let mut want = linear_ref(&wf, rows, cols, &xin, 1);
        for h in 0..4 {
            rope_ref(
                &mut want[h * hd..(h + 1) * hd],
                pos,
                &f,
                n_rot,
                RopeStyle::Normal,
                0.9,
            );
        }
        // f32 angles near 4000 rad carry ~1e-4 absolute error (as rope's test).
        let e = rel_err(&read(&out, rows), &want);
        assert!(e < 5e-4, "matvec rope {t}: {e}");
    }
}

#[test]
fn glu_interleaved_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("glu_interleaved");
    let (n, w) = (3, 333);
    let gu = rng.normals(n * 2 * w, 2.0);
    let gb = device_f32(&ctx, &gu);
    let out = readback(&ctx, n * w);
    run(&ctx, |rec| {
        let call = GluCall {
            act: Activation::Silu,
            input: GluInput::Interleaved(Mat::new(&gb, n, 2 * w)),
            out: Mat::new(&out, n, w),
        };
        record_glu(rec, &call).expect("record");
    });
    let want: Vec<f32> = gu
        .chunks(2)
        .map(|p| act_ref(Activation::Silu, p[0]) * p[1])
        .collect();
    let e = rel_err(&read(&out, n * w), &want);
    assert!(e < 1e-5, "glu interleaved: {e}");
}

#[test]
fn rms_norm_heads_in_wide_rows_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("rms_norm_heads");
    // 3 tokens of (5 heads of 64 to normalize, then 192 floats left alone)
    let (n, heads, hd, ld) = (3, 5, 64, 5 * 64 + 192);
    let x = rng.normals(n * ld, 2.0);
    let w = rng.normals(hd, 1.0);
    let xb = readback(&ctx, n * ld);
    xb.write_slice(0, &x).expect("init");
    let wb = device_f32(&ctx, &w);
    run(&ctx, |rec| {
        let x = Mat::new(&xb, n, heads * hd).with_ld(ld);
        let call = RmsNormCall {
            x,
            norm: RmsNorm {
                weight: Some(&wb),
                flavor: NormFlavor::Plain,
                eps: 1e-6,
            },
            out: NormOut::Store(AnyMat::F32(x)),
            head_dim: Some(hd),
        };
        record_rms_norm(rec, &call).expect("record");
    });
    let mut want = x.clone();
    for t in 0..n {
        for h in 0..heads {
            let s = t * ld + h * hd;
            let r = rms_norm_ref(&x[s..s + hd], Some(&w), NormFlavor::Plain, 1e-6);
            want[s..s + hd].copy_from_slice(&r);
        }
    }
    let e = rel_err(&read(&xb, n * ld), &want);
    assert!(e < 1e-5, "rms_norm heads: {e}");
}

#[test]
fn rms_norm_f32_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("rms_norm");
    // 5000 columns: past what the kernel keeps in registers; 100 and 80
    // rows: the narrower workgroups of prompts
    for (rows, cols) in [
        (1, 576),
        (7, 1000),
        (3, 33),
        (2, 5000),
        (100, 576),
        (80, 1500),
    ] {
        let x = rng.normals(rows * cols, 2.0);
        let w = rng.normals(cols, 1.0);
        let prev = rng.normals(rows * cols, 1.0);
        for (flavor, add, weighted) in [
            (NormFlavor::Plain, false, true),
            (NormFlavor::ZeroCentred, false, true),
            (NormFlavor::Plain, true, true),
            (NormFlavor::Plain, false, false),
        ] {
            let xb = device_f32(&ctx, &x);
            let wb = device_f32(&ctx, &w);
            let out = readback(&ctx, rows * cols);
            out.write_slice(0, &prev).expect("init");
            run(&ctx, |rec| {
                let d = Mat::new(&out, rows, cols);
                let call = RmsNormCall {
                    x: Mat::new(&xb, rows, cols),
                    norm: RmsNorm {
                        weight: weighted.then_some(&wb),
                        flavor,
                        eps: 1e-5,
                    },
                    out: if add {
                        NormOut::Add(d)
                    } else {
                        NormOut::Store(AnyMat::F32(d))
                    },
                    head_dim: None,
                };
                record_rms_norm(rec, &call).expect("record");
            });
            let mut want = Vec::new();
            for r in 0..rows {
                let row = rms_norm_ref(
                    &x[r * cols..(r + 1) * cols],
                    weighted.then_some(&w[..]),
                    flavor,
                    1e-5,
                );
                want.extend(row);
            }
            if add {
                want.iter_mut().zip(&prev).for_each(|(a, p)| *a += p);
            }
            let e = rel_err(&read(&out, rows * cols), &want);
            assert!(e < 1e-5, "rms_norm {rows}x{cols} {flavor:?} add={add}: {e}");
        }
    }
}

#[test]
fn rope_normal_and_neox_match_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("rope");
    let (n, heads, hd) = (5, 3, 64);
    for (style, n_rot, scaling) in [
        (RopeStyle::Normal, 64, RopeScaling::None),
        (RopeStyle::Neox, 64, RopeScaling::Linear { factor: 4.0 }),
        (
            RopeStyle::Neox,
            32,
            RopeScaling::FreqFactors((0..16).map(|i| 1.0 + i as f32).collect()),
        ),
    ] {
        let x = rng.normals(n * heads * hd, 1.0);
        let pos: Vec<i32> = (0..n).map(|_| rng.below(4000) as i32).collect();
        let f = inv_freq(n_rot, 10000.0, &scaling);
        let xb = readback(&ctx, x.len());
        xb.write_slice(0, &x).expect("init");
        let pb = host_i32(&ctx, &pos);
        let fb = device_f32(&ctx, &f);
        run(&ctx, |rec| {
            let call = RopeCall {
                x: Mat::new(&xb, n, heads * hd),
                rope: Rope {
                    style,
                    head_dim: hd,
                    n_rot,
                    positions: &pb,
                    inv_freq: &fb,
                    attn_factor: 1.0,
                },
            };
            record_rope(rec, &call).expect("record");
        });
        let mut want = x.clone();
        for (t, &p) in pos.iter().enumerate().take(n) {
            for h in 0..heads {
                let s = (t * heads + h) * hd;
                rope_ref(&mut want[s..s + hd], p, &f, n_rot, style, 1.0);
            }
        }
        // Angles up to ~4000 rad in f32 lose ~1e-4 absolute precision.
        let e = rel_err(&read(&xb, x.len()), &want);
        assert!(e < 5e-4, "rope {style:?} n_rot={n_rot}: {e}");
    }
}

#[test]
fn glu_silu_and_gelu_match_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("glu");
    let (n, w) = (3, 1000);
    let g = rng.normals(n * w, 3.0);
    let u = rng.normals(n * w, 1.0);
    for act in [Activation::Silu, Activation::GeluTanh] {
        let gb = device_f32(&ctx, &g);
        let ub = device_f32(&ctx, &u);
        let out = readback(&ctx, n * w);
        run(&ctx, |rec| {
            let call = GluCall {
                act,
                input: GluInput::Separate {
                    gate: Mat::new(&gb, n, w),
                    up: Mat::new(&ub, n, w),
                },
                out: Mat::new(&out, n, w),
            };
            record_glu(rec, &call).expect("record");
        });
        let want: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| act_ref(act, a) * b)
            .collect();
        let e = rel_err(&read(&out, n * w), &want);
        assert!(e < 1e-5, "glu {act:?}: {e}");
    }
}

#[test]
fn get_rows_every_type_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("get_rows");
    let (rows, cols) = (50, 256);
    for t in ALL_TYPES {
        let bytes = random_weight(&mut rng, t, rows * cols);
        let mut up = Uploader::new(&ctx).expect("staging");
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "emb", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        let ids: Vec<i32> = (0..9).map(|_| rng.below(rows) as i32).collect();
        let idb = host_i32(&ctx, &ids);
        let out = readback(&ctx, ids.len() * cols);
        run(&ctx, |rec| {
            record_get_rows(rec, &w, &idb, Mat::new(&out, ids.len(), cols), 1.5).expect("record");
        });
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                wf[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .map(|v| v * 1.5)
            })
            .collect();
        let e = rel_err(&read(&out, want.len()), &want);
        assert!(e < 1e-6, "get_rows {t}: {e}");
    }
}

/// Stores `n_past + n_new` random K/V rows through kv_store in a contiguous
/// cache, then attends the `n_new` newest queries, comparing with the f64
/// reference; covers GQA, sliding windows and soft-capping.
fn check_attention(n_past: usize, n_new: usize, shape: AttentionShape, opts: AttentionOptions) {
    check_attention_growing(n_past, n_new, shape, opts, 0.0);
}

/// [`check_attention`] with key `j` scaled by `1 + growth * j`, so that a
/// query's scores keep growing along the keys (the running maxima move
/// tile after tile).
fn check_attention_growing(
    n_past: usize,
    n_new: usize,
    shape: AttentionShape,
    opts: AttentionOptions,
    growth: f32,
) {
    for v in [
        AttentionVariant::Tiled,
        AttentionVariant::Rows,
        AttentionVariant::Blocks,
        AttentionVariant::Coop,
    ] {
        // Kernels with no layout for this head here (the planner takes
        // another): the cooperative one without cooperative matrices, the
        // query-block one for 256-wide heads on subgroups of 4.
        if (v == AttentionVariant::Coop && coop_layout(&gpu(), shape.head_dim).is_none())
            || (v == AttentionVariant::Blocks && blocks_split(&gpu(), shape.head_dim).is_none())
        {
            continue;
        }
        check_attention_variant(v, n_past, n_new, shape, opts, growth);
    }
}

/// Bound of the relative error of a variant against the f64 reference:
/// the cooperative kernel rounds queries and probabilities to f16 (as
/// llama.cpp's does), the others compute in f32.
fn attention_bound(v: AttentionVariant) -> f64 {
    if v == AttentionVariant::Coop {
        2e-3
    } else {
        1e-4
    }
}

fn check_attention_variant(
    variant: AttentionVariant,
    n_past: usize,
    n_new: usize,
    shape: AttentionShape,
    opts: AttentionOptions,
    growth: f32,
) {
    let ctx = gpu();
    let mut rng = Rng::fresh(&format!("attention_{n_past}_{n_new}_{}", shape.head_dim));
    let total = n_past + n_new;
    let width = shape.n_head_kv * shape.head_dim;
    let qw = shape.n_head * shape.head_dim;
    let n_ctx = total + 3;
    let kc = Buffer::new(&ctx, (n_ctx * width * 2) as u64, MemoryKind::Device, "k").expect("k");
    let vc = Buffer::new(&ctx, (n_ctx * width * 2) as u64, MemoryKind::Device, "v").expect("v");
    let mut keys: Vec<f32> = rng.normals(total * width, 1.0);
    for (j, row) in keys.chunks_mut(width).enumerate() {
        let f = 1.0 + growth * j as f32;
        row.iter_mut().for_each(|x| *x *= f);
    }
    let values: Vec<f32> = rng.normals(total * width, 1.0);
    // The cache holds f16; the reference sees the same rounded values.
    let round = |v: &[f32]| {
        v.iter()
            .map(|&x| f16::from_f32(x).to_f32())
            .collect::<Vec<_>>()
    };
    let (keys_h, values_h) = (round(&keys), round(&values));
    let q = rng.normals(n_new * qw, 1.0);
    let pos: Vec<i32> = (0..total as i32).collect();
    let page_table = host_i32(&ctx, &[0]);
    let seq_base = host_i32(&ctx, &vec![0; total]);
    let posb = host_i32(&ctx, &pos);
    let new_pos = host_i32(&ctx, &pos[n_past..]);
    let kb = device_f32(&ctx, &keys);
    let vb = device_f32(&ctx, &values);
    let qb = device_f32(&ctx, &q);
    let out = readback(&ctx, n_new * qw);
    // The cooperative kernel's f16 output (prompts whose output projection
    // reads f16) is also written, from the same inputs.
    let coop = variant == AttentionVariant::Coop;
    let out16 = readback(&ctx, (n_new * qw).div_ceil(2));
    let at_all = CacheAddressing {
        positions: &posb,
        page_table: &page_table,
        seq_base: &seq_base,
        page_size: n_ctx,
        ring: 0,
    };
    let at_new = CacheAddressing {
        positions: &new_pos,
        ..at_all
    };
    run(&ctx, |rec| {
        store(rec, Mat::new(&kb, total, width), &kc, at_all);
        store(rec, Mat::new(&vb, total, width), &vc, at_all);
        let call = AttentionCall {
            q: Mat::new(&qb, n_new, qw),
            out: AnyMat::F32(Mat::new(&out, n_new, qw)),
            kv: LayerKv {
                k: &kc,
                v: &vc,
                at: at_new,
            },
            new: NewKv::Stored,
            shape,
            opts,
            variant: Some(variant),
            split: None,
        };
        record_attention(rec, &call).expect("attention");
        if coop {
            let call = AttentionCall {
                out: AnyMat::F16(Mat::<f16>::new(&out16, n_new, qw)),
                ..call
            };
            record_attention(rec, &call).expect("attention, f16 output");
        }
    });
    let got = read(&out, n_new * qw);
    if coop {
        // Each element is the f32 result rounded once to f16.
        let got16 = read_f16(&out16, n_new * qw);
        let bad = got
            .iter()
            .zip(&got16)
            .position(|(&a, &b)| f16::from_f32(a).to_f32().to_bits() != b.to_bits());
        assert!(
            bad.is_none(),
            "Coop attention f16 output at {bad:?}, past={n_past} new={n_new} {shape:?}"
        );
    }
    let hd = shape.head_dim;
    let group = shape.n_head / shape.n_head_kv;
    let mut want = Vec::new();
    for t in 0..n_new {
        for h in 0..shape.n_head {
            let kvh = h / group;
            let ks: Vec<&[f32]> = (0..total)
                .map(|j| &keys_h[j * width + kvh * hd..j * width + (kvh + 1) * hd])
                .collect();
            let vs: Vec<&[f32]> = (0..total)
                .map(|j| &values_h[j * width + kvh * hd..j * width + (kvh + 1) * hd])
                .collect();
            want.extend(attention_ref(
                &q[t * qw + h * hd..t * qw + (h + 1) * hd],
                &ks,
                &vs,
                n_past + t,
                opts,
            ));
        }
    }
    let e = rel_err(&got, &want);
    assert!(
        e < attention_bound(variant),
        "{variant:?} attention past={n_past} new={n_new} growth={growth} {shape:?} {opts:?}: {e}"
    );
}

/// Scores that grow along the keys move each query's running maximum
/// again and again: past the lag the cooperative kernel lets it trail
/// (its rescaling path), and within it.
#[test]
fn attention_with_growing_scores_matches_ref() {
    let opts = AttentionOptions {
        scale: 0.125,
        softcap: 0.0,
        window: 0,
    };
    for head_dim in [64, 128] {
        let shape = AttentionShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim,
        };
        // Slow growth moves the maxima by less than the lag per tile, fast
        // growth by more.
        for growth in [0.004, 0.05] {
            check_attention_growing(0, 200, shape, opts, growth);
            check_attention_growing(90, 110, shape, opts, growth);
        }
    }
}

#[test]
fn attention_decode_and_prefill_match_ref() {
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let opts = AttentionOptions {
        scale: 0.125,
        softcap: 0.0,
        window: 0,
    };
    check_attention(0, 1, shape, opts);
    check_attention(150, 1, shape, opts);
    check_attention(0, 77, shape, opts);
    check_attention(40, 70, shape, opts);
    let wide = AttentionShape {
        n_head: 8,
        n_head_kv: 2,
        head_dim: 128,
    };
    check_attention(20, 100, wide, opts);
}

#[test]
fn attention_window_softcap_and_wide_heads_match_ref() {
    let shape = AttentionShape {
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
    };
    check_attention(
        100,
        30,
        shape,
        AttentionOptions {
            scale: 0.0625,
            softcap: 0.0,
            window: 16,
        },
    );
    check_attention(
        10,
        5,
        shape,
        AttentionOptions {
            scale: 0.0625,
            softcap: 20.0,
            window: 0,
        },
    );
    let odd = AttentionShape {
        n_head: 3,
        n_head_kv: 3,
        head_dim: 96,
    };
    check_attention(
        65,
        2,
        odd,
        AttentionOptions {
            scale: 0.1,
            softcap: 0.0,
            window: 0,
        },
    );
}

/// The decode kernel storing each sequence's new K/V row itself: the same
/// cache contents and the same outputs, bit for bit, as `kv_store` followed by
/// the kernel reading them back, for several sequences of a paged cache
/// (pages out of order, one new token each at different lengths, GQA, a
/// sliding window on the second run).
#[test]
fn attention_decode_storing_equals_store_then_attend() {
    let ctx = gpu();
    let mut rng = Rng::fresh("attention_storing");
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let (page, n_pages) = (4usize, 40usize);
    let width = shape.n_head_kv * shape.head_dim;
    let qw = shape.n_head * shape.head_dim;
    // Sequence lengths before the new token, and each one's pages.
    let past = [0usize, 7, 13, 30];
    let mut free: Vec<i32> = (0..n_pages as i32).rev().collect();
    free.swap(3, 17);
    let mut table = Vec::new();
    let mut base = Vec::new();
    for &n in &past {
        base.push(table.len() as i32);
        for _ in 0..(n + 1).div_ceil(page) {
            table.push(free.pop().expect("pages"));
        }
    }
    let nt = past.len();
    let bytes = (n_pages * page * width * 2) as u64;
    let table_b = host_i32(&ctx, &table);
    let base_b = host_i32(&ctx, &base);
    for window in [0usize, 9] {
        let opts = AttentionOptions {
            scale: 0.125,
            softcap: 0.0,
            window,
        };
        // Old rows of every sequence, written by kv_store into both caches.
        let caches: Vec<(Arc<Buffer>, Arc<Buffer>)> = (0..2)
            .map(|_| {
                (
                    Buffer::new(&ctx, bytes, MemoryKind::Readback, "k").expect("k"),
                    Buffer::new(&ctx, bytes, MemoryKind::Readback, "v").expect("v"),
                )
            })
            .collect();
        let zero = vec![0u8; bytes as usize];
        for (k, v) in &caches {
            k.write_bytes(0, &zero).expect("clear");
            v.write_bytes(0, &zero).expect("clear");
        }
        let mut old_pos = Vec::new();
        let mut old_base = Vec::new();
        for (i, &n) in past.iter().enumerate() {
            for j in 0..n {
                old_pos.push(j as i32);
                old_base.push(base[i]);
            }
        }
        let n_old = old_pos.len();
        let old_k = device_f32(&ctx, &rng.normals(n_old * width, 1.0));
        let old_v = device_f32(&ctx, &rng.normals(n_old * width, 1.0));
        let (op, ob) = (host_i32(&ctx, &old_pos), host_i32(&ctx, &old_base));
        let at_old = CacheAddressing {
            positions: &op,
            page_table: &table_b,
            seq_base: &ob,
            page_size: page,
            ring: 0,
        };
        for (k, v) in &caches {
            run(&ctx, |rec| {
                store(rec, Mat::new(&old_k, n_old, width), k, at_old);
                store(rec, Mat::new(&old_v, n_old, width), v, at_old);
            });
        }
        // The new token of every sequence, inside a wider row as in a fused QKV.
        let ld = qw + 2 * width;
        let qkv = device_f32(&ctx, &rng.normals(nt * ld, 1.0));
        let new_pos: Vec<i32> = past.iter().map(|&n| n as i32).collect();
        let np = host_i32(&ctx, &new_pos);
        let at = CacheAddressing {
            positions: &np,
            page_table: &table_b,
            seq_base: &base_b,
            page_size: page,
            ring: 0,
        };
        let rows = Mat::new(&qkv, nt, qw + 2 * width).with_ld(ld);
        let q = rows.cols_at(0, qw);
        let new = NewRows {
            k: rows.cols_at(qw, width),
            v: rows.cols_at(qw + width, width),
        };
        let outs = [readback(&ctx, nt * qw), readback(&ctx, nt * qw)];
        let call = |i: usize, out, new_kv, variant| AttentionCall {
            q,
            out,
            kv: LayerKv {
                k: &caches[i].0,
                v: &caches[i].1,
                at,
            },
            new: new_kv,
            shape,
            opts,
            variant,
            split: None,
        };
        run(&ctx, |rec| {
            let (k, v) = &caches[0];
            store(rec, new.k, k, at);
            store(rec, new.v, v, at);
            let out = AnyMat::F32(Mat::new(&outs[0], nt, qw));
            let c = call(0, out, NewKv::Stored, Some(AttentionVariant::Tiled));
            record_attention(rec, &c).expect("attention");
        });
        run(&ctx, |rec| {
            let out = AnyMat::F32(Mat::new(&outs[1], nt, qw));
            let c = call(1, out, NewKv::StoreInKernel(new), None);
            record_attention(rec, &c).expect("attention storing");
        });
        let (a, b) = (read(&outs[0], nt * qw), read(&outs[1], nt * qw));
        assert!(
            a.iter().all(|x| x.is_finite()),
            "window {window}: non-finite output"
        );
        assert_eq!(a, b, "window {window}: outputs differ");
        // f16 output (batched decode's output projection input): each value
        // the f32 one rounded once; storing the same rows again changes nothing.
        let oh = readback(&ctx, (nt * qw).div_ceil(2));
        let oh16 = AnyMat::F16(Mat::new(&oh, nt, qw));
        run(&ctx, |rec| {
            let c = call(1, oh16, NewKv::StoreInKernel(new), None);
            record_attention(rec, &c).expect("attention storing, f16 output");
        });
        let want: Vec<f32> = b.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        assert_eq!(read_f16(&oh, nt * qw), want, "window {window}: f16 output");
        // only the decode kernel writes f16
        let mut rec = Recording::new(&ctx, false).expect("recording");
        for variant in [AttentionVariant::Tiled, AttentionVariant::Rows] {
            let c = call(0, oh16, NewKv::Stored, Some(variant));
            let r = record_attention(&mut rec, &c);
            assert!(
                r.is_err(),
                "{variant:?} attention wrote f16 without storing"
            );
        }
        let mut ka = vec![0u8; bytes as usize];
        let mut kb = vec![0u8; bytes as usize];
        for pick in [0, 1] {
            let sel =
                |c: &(Arc<Buffer>, Arc<Buffer>)| if pick == 0 { c.0.clone() } else { c.1.clone() };
            sel(&caches[0]).read_bytes(0, &mut ka).expect("read");
            sel(&caches[1]).read_bytes(0, &mut kb).expect("read");
            assert!(
                ka == kb,
                "window {window}: cache {} differs",
                ["K", "V"][pick]
            );
        }
    }
}

/// Sequences of a paged cache for the split decode tests: each one's pages,
/// handed out in a shuffled order.
struct PagedSeqs {
    page: usize,
    n_pages: usize,
    table: Vec<i32>,
    base: Vec<i32>,
}

impl PagedSeqs {
    fn new(rng: &mut Rng, lens: &[usize], page: usize) -> Self {
        let n_pages = lens.iter().map(|&n| n.div_ceil(page)).sum::<usize>() + 2;
        let mut free: Vec<i32> = (0..n_pages as i32).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.below(i + 1));
        }
        let (mut table, mut base) = (Vec::new(), Vec::new());
        for &n in lens {
            base.push(table.len() as i32);
            for _ in 0..n.div_ceil(page) {
                table.push(free.pop().expect("pages"));
            }
        }
        PagedSeqs {
            page,
            n_pages,
            table,
            base,
        }
    }

    /// The cache row of position `j` of sequence `i`.
    fn slot(&self, i: usize, j: usize) -> usize {
        self.table[self.base[i] as usize + j / self.page] as usize * self.page + j % self.page
    }
}

/// The f64 reference of one decode token per sequence: row i of `q` over
/// sequence i's keys and values (rows of `n_head_kv × head_dim`) at
/// positions `0..=pos[i]`, rounded to f16 as the cache holds them.
fn decode_ref(
    q: &[f32],
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    pos: &[usize],
    shape: AttentionShape,
    opts: AttentionOptions,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let (width, qw) = (shape.n_head_kv * hd, shape.n_head * hd);
    let group = shape.n_head / shape.n_head_kv;
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|&x| f16::from_f32(x).to_f32()).collect() };
    let mut want = Vec::new();
    for (i, &p) in pos.iter().enumerate() {
        let (kh, vh) = (
            round(&keys[i][..(p + 1) * width]),
            round(&values[i][..(p + 1) * width]),
        );
        for h in 0..shape.n_head {
            let c = (h / group) * hd;
            let ks: Vec<&[f32]> = (0..=p)
                .map(|j| &kh[j * width + c..j * width + c + hd])
                .collect();
            let vs: Vec<&[f32]> = (0..=p)
                .map(|j| &vh[j * width + c..j * width + c + hd])
                .collect();
            want.extend(attention_ref(
                &q[i * qw + h * hd..i * qw + (h + 1) * hd],
                &ks,
                &vs,
                p,
                opts,
            ));
        }
    }
    want
}

/// One decode token per sequence (`past[i]` keys before it) over a paged
/// cache, each (token, head)'s keys split `n_split` ways, against the f64
/// reference: the new rows stored by kv_store first or, with
/// `in_kernel`, by the kernel itself (its cache rows then the new rows in
/// f16); f32 or f16 output. Returns the output.
fn check_split_decode(
    seed: u64,
    n_split: usize,
    past: &[usize],
    shape: AttentionShape,
    opts: AttentionOptions,
    in_kernel: bool,
    f16_out: bool,
) -> Vec<f32> {
    check_decode_on(seed, n_split, None, past, shape, opts, in_kernel, f16_out)
}

/// [`check_split_decode`] with the unsplit kernel's workgroup size forced
/// to `wg` where given.
#[allow(clippy::too_many_arguments)]
fn check_decode_on(
    seed: u64,
    n_split: usize,
    wg: Option<u32>,
    past: &[usize],
    shape: AttentionShape,
    opts: AttentionOptions,
    in_kernel: bool,
    f16_out: bool,
) -> Vec<f32> {
    let ctx = gpu();
    let mut rng = Rng::seeded(seed);
    let (hd, nt) = (shape.head_dim, past.len());
    let (width, qw) = (shape.n_head_kv * hd, shape.n_head * hd);
    let lens: Vec<usize> = past.iter().map(|&n| n + 1).collect();
    let seqs = PagedSeqs::new(&mut rng, &lens, 8);
    let keys: Vec<Vec<f32>> = lens.iter().map(|&n| rng.normals(n * width, 1.0)).collect();
    let values: Vec<Vec<f32>> = lens.iter().map(|&n| rng.normals(n * width, 1.0)).collect();
    let q = rng.normals(nt * qw, 1.0);
    let bytes = (seqs.n_pages * seqs.page * width * 2) as u64;
    let kc = Buffer::new(&ctx, bytes, MemoryKind::Readback, "k").expect("k");
    let vc = Buffer::new(&ctx, bytes, MemoryKind::Readback, "v").expect("v");
    let (mut old_pos, mut old_base, mut old_k, mut old_v) = (vec![], vec![], vec![], vec![]);
    for (i, &n) in past.iter().enumerate() {
        for j in 0..n {
            old_pos.push(j as i32);
            old_base.push(seqs.base[i]);
        }
        old_k.extend_from_slice(&keys[i][..n * width]);
        old_v.extend_from_slice(&values[i][..n * width]);
    }
    let row = |m: &[Vec<f32>], i: usize| m[i][past[i] * width..(past[i] + 1) * width].to_vec();
    let new_k: Vec<f32> = (0..nt).flat_map(|i| row(&keys, i)).collect();
    let new_v: Vec<f32> = (0..nt).flat_map(|i| row(&values, i)).collect();
    let n_old = old_pos.len();
    let table = host_i32(&ctx, &seqs.table);
    let (op, ob) = (host_i32(&ctx, &old_pos), host_i32(&ctx, &old_base));
    let new_pos: Vec<i32> = past.iter().map(|&n| n as i32).collect();
    let (np, nb) = (host_i32(&ctx, &new_pos), host_i32(&ctx, &seqs.base));
    let (okb, ovb) = (device_f32(&ctx, &old_k), device_f32(&ctx, &old_v));
    let (nkb, nvb, qb) = (
        device_f32(&ctx, &new_k),
        device_f32(&ctx, &new_v),
        device_f32(&ctx, &q),
    );
    let at_old = CacheAddressing {
        positions: &op,
        page_table: &table,
        seq_base: &ob,
        page_size: seqs.page,
        ring: 0,
    };
    let at = CacheAddressing {
        positions: &np,
        seq_base: &nb,
        ..at_old
    };
    let new = NewRows {
        k: Mat::new(&nkb, nt, width),
        v: Mat::new(&nvb, nt, width),
    };
    let scratch = AttentionScratch::new(&ctx, nt * shape.n_head * n_split, hd).expect("scratch");
    let out = readback(&ctx, nt * qw);
    run(&ctx, |rec| {
        if n_old > 0 {
            store(rec, Mat::new(&okb, n_old, width), &kc, at_old);
            store(rec, Mat::new(&ovb, n_old, width), &vc, at_old);
        }
        let new_kv = if in_kernel {
            NewKv::StoreInKernel(new)
        } else {
            store(rec, new.k, &kc, at);
            store(rec, new.v, &vc, at);
            NewKv::Stored
        };
        let call = AttentionCall {
            q: Mat::new(&qb, nt, qw),
            out: if f16_out {
                AnyMat::F16(Mat::new(&out, nt, qw))
            } else {
                AnyMat::F32(Mat::new(&out, nt, qw))
            },
            kv: LayerKv { k: &kc, v: &vc, at },
            new: new_kv,
            shape,
            opts,
            variant: Some(AttentionVariant::Tiled),
            split: Some(KeySplit {
                scratch: &scratch,
                n: Some(n_split),
                max_keys: None,
                wg,
            }),
        };
        record_attention(rec, &call).expect("split attention");
    });
    let got = if f16_out {
        read_f16(&out, nt * qw)
    } else {
        read(&out, nt * qw)
    };
    let want = decode_ref(&q, &keys, &values, past, shape, opts);
    let e = rel_err(&got, &want);
    let bound = if f16_out { 1e-3 } else { 1e-4 };
    assert!(
        e < bound,
        "{n_split} splits, workgroup {wg:?}, past {past:?}, {shape:?} {opts:?}, \
         in kernel {in_kernel}, f16 {f16_out}: {e}"
    );
    if in_kernel {
        for (cache, src) in [(&kc, &new_k), (&vc, &new_v)] {
            for i in 0..nt {
                let mut h = vec![0u16; width];
                let at = (seqs.slot(i, past[i]) * width * 2) as u64;
                cache.read_slice(at, &mut h).expect("read cache");
                let want: Vec<u16> = src[i * width..(i + 1) * width]
                    .iter()
                    .map(|&x| f16::from_f32(x).to_bits())
                    .collect();
                assert_eq!(h, want, "{n_split} splits: sequence {i}'s new row");
            }
        }
    }
    got
}

/// The decode kernel with each (token, head)'s keys split over 2, 3, 8 and
/// 16 workgroups: several sequences of a paged cache (GQA), contexts
/// shorter than the split count (splits without keys) and of hundreds of
/// keys.
#[test]
fn attention_split_decode_matches_ref() {
    let mut rng = Rng::fresh("attention_split");
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let opts = AttentionOptions {
        scale: 0.125,
        softcap: 0.0,
        window: 0,
    };
    for n in [2, 3, 8, 16] {
        check_split_decode(
            rng.next_u64(),
            n,
            &[0, 5, 450, 37],
            shape,
            opts,
            false,
            false,
        );
        check_split_decode(rng.next_u64(), n, &[700], shape, opts, false, false);
        check_split_decode(rng.next_u64(), n, &[2], shape, opts, false, false);
    }
}

/// The unsplit decode kernel on narrower workgroups than its default (what
/// batches of short sessions run on GPUs): fewer key groups each walking
/// more keys, over [`decode_cases`], the new rows stored by kv_store or in
/// the kernel, f32 and f16 output.
#[test]
fn attention_decode_on_narrow_workgroups_matches_ref() {
    let mut rng = Rng::fresh("attention_narrow_wg");
    let sg = gpu().caps().subgroup_size.max(8);
    for wg in [sg, 2 * sg, 64] {
        for (shape, o, past) in decode_cases() {
            let stored =
                check_decode_on(rng.next_u64(), 1, Some(wg), &past, shape, o, false, false);
            assert!(stored.iter().all(|v| v.is_finite()));
            check_decode_on(rng.next_u64(), 1, Some(wg), &past, shape, o, true, false);
            check_decode_on(rng.next_u64(), 1, Some(wg), &past, shape, o, true, true);
        }
    }
}

/// Split decode with a sliding window (contexts inside and past it),
/// soft-capping with 256-wide heads, and an odd head width.
#[test]
fn attention_split_window_softcap_and_wide_heads_match_ref() {
    let mut rng = Rng::fresh("attention_split_window");
    for n in [2, 3, 8, 16] {
        for (shape, o, past) in decode_cases() {
            check_split_decode(rng.next_u64(), n, &past, shape, o, false, false);
        }
    }
}

/// Decode cases over a paged cache, each (shape, options, keys before each
/// sequence's token): GQA with a sliding window (contexts inside and past
/// it) and a narrow one, soft-capping with 256-wide heads, an odd head
/// width.
fn decode_cases() -> [(AttentionShape, AttentionOptions, Vec<usize>); 4] {
    let gqa = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let wide = AttentionShape {
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
    };
    let odd = AttentionShape {
        n_head: 3,
        n_head_kv: 3,
        head_dim: 96,
    };
    let opts = |scale, softcap, window| AttentionOptions {
        scale,
        softcap,
        window,
    };
    [
        (gqa, opts(0.125, 0.0, 50), vec![3usize, 300, 49, 50]),
        (gqa, opts(0.125, 0.0, 7), vec![400, 1]),
        (wide, opts(0.0625, 20.0, 0), vec![10, 260]),
        (odd, opts(0.1, 0.0, 0), vec![65, 1, 333]),
    ]
}

/// Split decode storing the new rows itself (only split 0 of the first
/// head of each KV group writes them; every split takes the key at its
/// token's position from the f32 source): the reference's result, the new
/// rows in the cache, and bit for bit the output of the same split reading
/// rows kv_store wrote; its f16 output the f32 one rounded once.
#[test]
fn attention_split_storing_matches_ref_and_store_then_attend() {
    let mut rng = Rng::fresh("attention_split_storing");
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    for window in [0usize, 9] {
        let opts = AttentionOptions {
            scale: 0.125,
            softcap: 0.0,
            window,
        };
        for n in [2, 3, 8, 16] {
            let seed = rng.next_u64();
            let past = [0usize, 7, 13, 300];
            let a = check_split_decode(seed, n, &past, shape, opts, true, false);
            let b = check_split_decode(seed, n, &past, shape, opts, false, false);
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{n} splits, window {window}: storing differs");
            // f16 output: each value the f32 one rounded once.
            let h = check_split_decode(seed, n, &past, shape, opts, true, true);
            let want: Vec<f32> = a.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            assert_eq!(h, want, "{n} splits, window {window}: f16 output");
        }
    }
}

/// One recording replayed for several decode steps as every sequence
/// grows (positions and new rows written by the host between replays):
/// each step matches the reference, so every dispatch leaves its counters
/// at zero for the next — two calls of the recording with different split
/// counts sharing one scratch included (the first storing the new rows,
/// the second reading them back).
#[test]
fn attention_split_replay_growing_context_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("attention_split_replay");
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let opts = AttentionOptions {
        scale: 0.125,
        softcap: 0.0,
        window: 0,
    };
    let (hd, steps) = (shape.head_dim, 6usize);
    let (width, qw) = (shape.n_head_kv * hd, shape.n_head * hd);
    let start = [1usize, 40, 200];
    let nt = start.len();
    let lens: Vec<usize> = start.iter().map(|&n| n + steps).collect();
    let seqs = PagedSeqs::new(&mut rng, &lens, 8);
    let keys: Vec<Vec<f32>> = lens.iter().map(|&n| rng.normals(n * width, 1.0)).collect();
    let values: Vec<Vec<f32>> = lens.iter().map(|&n| rng.normals(n * width, 1.0)).collect();
    let bytes = (seqs.n_pages * seqs.page * width * 2) as u64;
    let kc = Buffer::new(&ctx, bytes, MemoryKind::Device, "k").expect("k");
    let vc = Buffer::new(&ctx, bytes, MemoryKind::Device, "v").expect("v");
    let table = host_i32(&ctx, &seqs.table);
    // The rows before the first step, through kv_store.
    let (mut old_pos, mut old_base, mut old_k, mut old_v) = (vec![], vec![], vec![], vec![]);
    for (i, &n) in start.iter().enumerate() {
        for j in 0..n {
            old_pos.push(j as i32);
            old_base.push(seqs.base[i]);
        }
        old_k.extend_from_slice(&keys[i][..n * width]);
        old_v.extend_from_slice(&values[i][..n * width]);
    }
    let (op, ob) = (host_i32(&ctx, &old_pos), host_i32(&ctx, &old_base));
    let at_old = CacheAddressing {
        positions: &op,
        page_table: &table,
        seq_base: &ob,
        page_size: seqs.page,
        ring: 0,
    };
    let (okb, ovb) = (device_f32(&ctx, &old_k), device_f32(&ctx, &old_v));
    run(&ctx, |rec| {
        store(rec, Mat::new(&okb, old_pos.len(), width), &kc, at_old);
        store(rec, Mat::new(&ovb, old_pos.len(), width), &vc, at_old);
    });
    // Each step's inputs, written by the host before its replay.
    let upload = |floats: usize| {
        Buffer::new(&ctx, (4 * floats) as u64, MemoryKind::Upload, "step input").expect("buffer")
    };
    let (posb, qb, nkb, nvb) = (
        upload(nt),
        upload(nt * qw),
        upload(nt * width),
        upload(nt * width),
    );
    let nb = host_i32(&ctx, &seqs.base);
    let at = CacheAddressing {
        positions: &posb,
        seq_base: &nb,
        ..at_old
    };
    let scratch = AttentionScratch::new(&ctx, nt * shape.n_head * 8, hd).expect("scratch");
    let outs = [readback(&ctx, nt * qw), readback(&ctx, nt * qw)];
    let mut rec = Recording::new(&ctx, false).expect("recording");
    for (out, n, new) in [
        (
            &outs[0],
            8,
            NewKv::StoreInKernel(NewRows {
                k: Mat::new(&nkb, nt, width),
                v: Mat::new(&nvb, nt, width),
            }),
        ),
        (&outs[1], 3, NewKv::Stored),
    ] {
        let call = AttentionCall {
            q: Mat::new(&qb, nt, qw),
            out: AnyMat::F32(Mat::new(out, nt, qw)),
            kv: LayerKv { k: &kc, v: &vc, at },
            new,
            shape,
            opts,
            variant: Some(AttentionVariant::Tiled),
            split: Some(KeySplit {
                scratch: &scratch,
                n: Some(n),
                max_keys: None,
                wg: None,
            }),
        };
        record_attention(&mut rec, &call).expect("split attention");
    }
    rec.finish().expect("finish");
    for t in 0..steps {
        let pos: Vec<usize> = start.iter().map(|&s| s + t).collect();
        let row = |m: &[Vec<f32>], i: usize| m[i][pos[i] * width..(pos[i] + 1) * width].to_vec();
        let q = rng.normals(nt * qw, 1.0);
        let pos_i32: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        posb.write_slice(0, &pos_i32).expect("positions");
        qb.write_slice(0, &q).expect("queries");
        let new_k: Vec<f32> = (0..nt).flat_map(|i| row(&keys, i)).collect();
        let new_v: Vec<f32> = (0..nt).flat_map(|i| row(&values, i)).collect();
        nkb.write_slice(0, &new_k).expect("keys");
        nvb.write_slice(0, &new_v).expect("values");
        rec.submit_and_wait().expect("replay");
        let want = decode_ref(&q, &keys, &values, &pos, shape, opts);
        for (out, n) in outs.iter().zip([8, 3]) {
            let e = rel_err(&read(out, nt * qw), &want);
            assert!(e < 1e-4, "step {t}, {n} splits: {e}");
        }
    }
}

/// Splits are the tiled kernel's, at most MAX_KEY_SPLITS, within the
/// scratch, and a forced workgroup of the unsplit kernel a power of two
/// from a key group's width to the default: anything else is an error,
/// never a dispatch; CPU devices pick no splits by themselves.
#[test]
fn attention_split_out_of_reach_is_an_error() {
    let ctx = gpu();
    let shape = AttentionShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
    };
    let opts = AttentionOptions {
        scale: 0.125,
        softcap: 0.0,
        window: 0,
    };
    let (qw, width) = (4 * 64, 2 * 64);
    let q = device_f32(&ctx, &vec![0.5; qw]);
    let (kc, vc) = (
        Buffer::new(&ctx, (16 * width * 2) as u64, MemoryKind::Device, "k").expect("k"),
        Buffer::new(&ctx, (16 * width * 2) as u64, MemoryKind::Device, "v").expect("v"),
    );
    let (pos, table, base) = (
        host_i32(&ctx, &[3]),
        host_i32(&ctx, &[0]),
        host_i32(&ctx, &[0]),
    );
    let out = readback(&ctx, qw);
    let scratch = AttentionScratch::new(&ctx, 4 * 8, 64).expect("scratch");
    let mut rec = Recording::new(&ctx, false).expect("recording");
    let cases = [
        (AttentionVariant::Rows, Some(2), None),
        (AttentionVariant::Tiled, Some(16), None),
        (AttentionVariant::Tiled, Some(MAX_KEY_SPLITS + 1), None),
        (AttentionVariant::Tiled, Some(1), Some(3)),
        (AttentionVariant::Tiled, Some(1), Some(1)),
        (AttentionVariant::Tiled, Some(1), Some(256)),
    ];
    for (variant, n, wg) in cases {
        let call = AttentionCall {
            q: Mat::new(&q, 1, qw),
            out: AnyMat::F32(Mat::new(&out, 1, qw)),
            kv: LayerKv {
                k: &kc,
                v: &vc,
                at: CacheAddressing {
                    positions: &pos,
                    page_table: &table,
                    seq_base: &base,
                    page_size: 16,
                    ring: 0,
                },
            },
            new: NewKv::Stored,
            shape,
            opts,
            variant: Some(variant),
            split: Some(KeySplit {
                scratch: &scratch,
                n,
                max_keys: None,
                wg,
            }),
        };
        let r = record_attention(&mut rec, &call);
        assert!(
            r.is_err(),
            "{variant:?} with {n:?} splits, workgroup {wg:?} recorded"
        );
        if let (Some(_), Err(e)) = (wg, r) {
            assert!(e.to_string().contains("workgroup"), "{e}");
        }
    }
    assert_eq!(rec.n_dispatches(), 0);
    if ctx.caps().class() == DeviceClass::Cpu {
        assert_eq!(key_splits(&ctx, 1, 64, Some(1 << 20)), 1);
    }
}

/// Prompts of several sequences packed into one call (batched prefill):
/// query blocks straddle sequences, each of which reads its own pages; the
/// block kernel agrees with the rows kernel, which walks each query alone.
#[test]
fn attention_blocks_across_sequences_match_rows() {
    let ctx = gpu();
    let mut rng = Rng::fresh("attention_blocks_seqs");
    let shape = AttentionShape {
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
    };
    let (page, n_pages) = (8usize, 64usize);
    let width = shape.n_head_kv * shape.head_dim;
    let qw = shape.n_head * shape.head_dim;
    // (tokens already held, new tokens) per sequence.
    let seqs = [(0usize, 5usize), (11, 40), (3, 13), (0, 1)];
    let mut free: Vec<i32> = (0..n_pages as i32).collect();
    free.reverse();
    free.swap(2, 40);
    let (mut table, mut base_of) = (Vec::new(), Vec::new());
    for &(past, new) in &seqs {
        base_of.push(table.len() as i32);
        for _ in 0..(past + new).div_ceil(page) {
            table.push(free.pop().expect("pages"));
        }
    }
    // Every row of every sequence, old and new, stored once.
    let (mut pos, mut base, mut new_pos, mut new_base) = (vec![], vec![], vec![], vec![]);
    for (i, &(past, new)) in seqs.iter().enumerate() {
        for j in 0..past + new {
            pos.push(j as i32);
            base.push(base_of[i]);
            if j >= past {
                new_pos.push(j as i32);
                new_base.push(base_of[i]);
            }
        }
    }
    let n_all = pos.len();
    let nt = new_pos.len();
    let bytes = (n_pages * page * width * 2) as u64;
    let kc = Buffer::new(&ctx, bytes, MemoryKind::Device, "k").expect("k");
    let vc = Buffer::new(&ctx, bytes, MemoryKind::Device, "v").expect("v");
    let kb = device_f32(&ctx, &rng.normals(n_all * width, 1.0));
    let vb = device_f32(&ctx, &rng.normals(n_all * width, 1.0));
    let qb = device_f32(&ctx, &rng.normals(nt * qw, 1.0));
    let (tb, pb, bb) = (
        host_i32(&ctx, &table),
        host_i32(&ctx, &pos),
        host_i32(&ctx, &base),
    );
    let (npb, nbb) = (host_i32(&ctx, &new_pos), host_i32(&ctx, &new_base));
    let at_all = CacheAddressing {
        positions: &pb,
        page_table: &tb,
        seq_base: &bb,
        page_size: page,
        ring: 0,
    };
    run(&ctx, |rec| {
        store(rec, Mat::new(&kb, n_all, width), &kc, at_all);
        store(rec, Mat::new(&vb, n_all, width), &vc, at_all);
    });
    let at = CacheAddressing {
        positions: &npb,
        seq_base: &nbb,
        ..at_all
    };
    for window in [0usize, 7] {
        let opts = AttentionOptions {
            scale: 0.125,
            softcap: if window > 0 { 15.0 } else { 0.0 },
            window,
        };
        let mut variants = vec![AttentionVariant::Rows, AttentionVariant::Blocks];
        if coop_layout(&ctx, shape.head_dim).is_some() {
            variants.push(AttentionVariant::Coop);
        }
        let outs: Vec<_> = variants.iter().map(|_| readback(&ctx, nt * qw)).collect();
        for (&v, out) in variants.iter().zip(&outs) {
            run(&ctx, |rec| {
                let call = AttentionCall {
                    q: Mat::new(&qb, nt, qw),
                    out: AnyMat::F32(Mat::new(out, nt, qw)),
                    kv: LayerKv { k: &kc, v: &vc, at },
                    new: NewKv::Stored,
                    shape,
                    opts,
                    variant: Some(v),
                    split: None,
                };
                record_attention(rec, &call).expect("attention");
            });
        }
        let rows = read(&outs[0], nt * qw);
        for (&v, out) in variants.iter().zip(&outs).skip(1) {
            let e = rel_err(&read(out, nt * qw), &rows);
            let bound = if v == AttentionVariant::Coop {
                2e-3
            } else {
                1e-5
            };
            assert!(e < bound, "window {window}: {v:?} vs rows {e}");
        }
    }
}

#[test]
fn act_round_every_mode_matches_ref_bit_for_bit() {
    use combs::ops::act_round::{ActRounding, act_round_ref, record_act_round};
    let ctx = gpu();
    let mut rng = Rng::fresh("act_round");
    let (n, w, ld) = (5, 768, 800);
    let mut x = rng.normals(n * ld, 2.0);
    // values on rounding boundaries, a zero block and tiny magnitudes
    for v in &mut x[0..32] {
        *v = 0.0;
    }
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = (i as f32 - 16.0) * 0.5;
    }
    for v in &mut x[64..96] {
        *v *= 1e-6;
    }
    for mode in [
        ActRounding::Q8_0,
        ActRounding::Q8K,
        ActRounding::F16,
        ActRounding::Bf16,
    ] {
        let xb = device_f32(&ctx, &x);
        let out = readback(&ctx, n * w);
        run(&ctx, |rec| {
            let x = Mat::new(&xb, n, w).with_ld(ld);
            record_act_round(rec, mode, x, Mat::new(&out, n, w)).expect("record");
        });
        let got = read(&out, n * w);
        for t in 0..n {
            let want = act_round_ref(mode, &x[t * ld..t * ld + w]);
            for (c, (&g, &e)) in got[t * w..(t + 1) * w].iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{mode:?} token {t} col {c}: x {} gpu {g} ref {e}",
                    x[t * ld + c]
                );
            }
        }
    }
    // a width that is not a multiple of the block is an error, not a dispatch
    let xb = device_f32(&ctx, &x);
    let mut rec = Recording::new(&ctx, false).expect("recording");
    let x = Mat::new(&xb, 1, 100);
    assert!(record_act_round(&mut rec, ActRounding::Q8K, x, x).is_err());
}

#[test]
fn linear_on_rounded_inputs_matches_ref() {
    use combs::ops::act_round::{ActRounding, act_round_ref, record_act_round};
    let ctx = gpu();
    let mut rng = Rng::fresh("linear_rounded");
    let (rows, cols, n) = (96, 256, 19);
    for t in [
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::F16,
    ] {
        let bytes = random_weight(&mut rng, t, rows * cols);
        let mut up = Uploader::new(&ctx).expect("staging");
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        let wf = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        let x = rng.normals(n * cols, 1.0);
        let mode = ActRounding::llama_cpp_cpu(t);
        let xb = device_f32(&ctx, &x);
        let xq = device_f32(&ctx, &vec![0.0; n * cols]);
        for variant in [LinearVariant::Rows, LinearVariant::Tiled] {
            let out = readback(&ctx, n * rows);
            run(&ctx, |rec| {
                let xqm = Mat::new(&xq, n, cols);
                record_act_round(rec, mode, Mat::new(&xb, n, cols), xqm).expect("round");
                let call = linear(&w, None, xqm, Mat::new(&out, n, rows), false).on(variant);
                record_linear(rec, &call).expect("record");
            });
            let xr: Vec<f32> = x
                .chunks(cols)
                .flat_map(|r| act_round_ref(mode, r))
                .collect();
            let want = linear_ref(&wf, rows, cols, &xr, n);
            let e = rel_err(&read(&out, n * rows), &want);
            assert!(e < 1e-5, "{t:?} {variant:?} on rounded inputs: {e}");
        }
    }
}

/// f32 values rounded to f16, as bits and as the f32 they stand for.
fn halves(v: &[f32]) -> (Vec<u16>, Vec<f32>) {
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    (
        h.iter().map(|x| x.to_bits()).collect(),
        h.iter().map(|x| x.to_f32()).collect(),
    )
}

fn read_f16(b: &Arc<Buffer>, n: usize) -> Vec<f32> {
    let mut v = vec![0u16; n];
    b.read_slice(0, &mut v).expect("read");
    v.into_iter().map(|h| f16::from_bits(h).to_f32()).collect()
}

/// The RMS norm's f16 output (the input of batched decode's products):
/// each element the f32 result rounded once to f16.
#[test]
fn rms_norm_f16_output_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("rms_norm_f16");
    for (rows, cols) in [(12, 576), (16, 1000), (3, 64)] {
        let x = rng.normals(rows * cols, 3.0);
        let w = rng.normals(cols, 1.0);
        let xb = device_f32(&ctx, &x);
        let wb = device_f32(&ctx, &w);
        let out = readback(&ctx, rows * cols / 2 + 1);
        run(&ctx, |rec| {
            let call = RmsNormCall {
                x: Mat::new(&xb, rows, cols),
                norm: RmsNorm {
                    weight: Some(&wb),
                    flavor: NormFlavor::Plain,
                    eps: 1e-5,
                },
                out: NormOut::Store(AnyMat::F16(Mat::new(&out, rows, cols))),
                head_dim: None,
            };
            record_rms_norm(rec, &call).expect("record");
        });
        let got = read_f16(&out, rows * cols);
        for r in 0..rows {
            let want = rms_norm_ref(
                &x[r * cols..(r + 1) * cols],
                Some(&w),
                NormFlavor::Plain,
                1e-5,
            );
            for (c, (&g, &v)) in got[r * cols..].iter().zip(&want).enumerate() {
                // one rounding to f16 of a value within f32 error of the reference
                let ulp = f16::from_f32(v).to_f32().abs().max(6.1e-5) / 1024.0;
                assert!(
                    (g - v).abs() <= ulp * 1.01,
                    "row {r} col {c}: {g} against {v}"
                );
            }
        }
    }
}

/// Kernels that take f32 activations refuse f16 views instead of reading
/// their bits as floats: the f32-only linear families at run time (f16
/// input is a kernel choice); the gated activation and a norm adding into
/// its output cannot even be handed f16 (their views are `Mat<f32>`: see
/// the `compile_fail` examples of `ops::glu::GluCall` and
/// `ops::rms_norm::NormOut`).
#[test]
fn f16_views_refused_where_f32_expected() {
    let ctx = gpu();
    let mut rng = Rng::fresh("f16_refused");
    let (rows, cols, n) = (64, 256, 4);
    let bytes = random_weight(&mut rng, QuantType::Q4_0, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", QuantType::Q4_0, rows, cols, &bytes)
        .expect("upload");
    up.flush().expect("flush");
    let xb = device_f32(&ctx, &rng.normals(n * cols, 1.0));
    let out = readback(&ctx, n * rows);
    let mut rec = Recording::new(&ctx, false).expect("recording");
    for variant in [
        LinearVariant::Matvec,
        LinearVariant::Rows,
        LinearVariant::Tiled,
    ] {
        let input = Input::F16(Mat::new(&xb, n, cols));
        let call = LinearCall::new(&w, None, input, Output::Store(Mat::new(&out, n, rows)));
        let r = record_linear(&mut rec, &call.on(variant));
        assert!(r.is_err(), "{variant:?} took f16 activations");
    }
}

/// The cooperative-matrix kernels (skinny and tiled) with f16 activations
/// (copied into their staging areas, not converted), and their gated
/// epilogue writing f16: against
/// the reference on the f16-rounded inputs, for partial tiles of rows and
/// 16-token blocks, bias and accumulation. Runs where the device has
/// cooperative matrices.
#[test]
fn coop_f16_activations_match_ref() {
    let ctx = gpu();
    if !LinearVariant::coop_available(&ctx) {
        eprintln!("no cooperative matrices on this device: skipped");
        return;
    }
    let mut rng = Rng::fresh("skinny_f16");
    let mut tiles = vec![
        // matmul_coop.comp's tiles (K split in the workgroup or not)
        CoopTile::SKINNY_WIDE,
        CoopTile::MID,
        CoopTile::BIG,
        CoopTile::TALL,
        CoopTile::WIDE,
        CoopTile::MID8,
        CoopTile::STREAM,
        // ten K-subgroups: not a power of two
        CoopTile {
            wk: 10,
            ..CoopTile::STREAM
        },
        SKINNY_4_TILES,
        SKINNY_2X32_ROWS,
        SKINNY_TOKEN_BLOCKS[0],
        SKINNY_TOKEN_BLOCKS[1],
        SKINNY_TOKEN_BLOCKS[2],
    ];
    tiles.extend(nv2_tiles(&ctx));
    for tile in tiles {
        for (t, rows, cols, n) in [
            (QuantType::Q4_0, 333usize, 576usize, 9usize),
            (QuantType::Q4K, 200, 512, 16),
            (QuantType::Q8_0, 130, 768, 21),
            (QuantType::Q4_0, 333, 576, 64),
            // a whole 128-token tile and a partial one after it
            (QuantType::Q4_0, 300, 640, 130),
            (QuantType::Q4K, 200, 512, 128),
        ] {
            let F16Product {
                bytes,
                wf,
                xr,
                b,
                init,
                got,
                want,
            } = f16_product(&ctx, &mut rng, tile, t, [rows, cols, n]);
            let e = rel_err(&got, &want);
            assert!(e < 2e-3, "{tile:?} {t} {rows}x{cols} n={n}: {e}");
            // The weights reach the matrices as their f16 roundings, each
            // rounded once (Q4_0 dequantized in f16 arithmetic as well): only
            // the order of the f32 sums differs.
            let (_, wh) = halves(&wf);
            let y = linear_ref(&wh, rows, cols, &xr[..n * cols], n);
            let want: Vec<f32> = (0..n * rows)
                .map(|i| y[i] + b[i % rows] + init[i])
                .collect();
            let e = rel_err(&got, &want);
            assert!(
                e < 2e-5,
                "{tile:?} {t} {rows}x{cols} n={n}: {e} from f16 weights"
            );

            // gated pairs of rows, out as f16 (inputs small enough that the
            // products of pairs stay inside f16's range)
            let (xh, xr) = halves(&rng.normals(n * cols, 0.05));
            let xb = upload_new(&ctx, bytemuck::cast_slice(&xh), "x f16").expect("upload");
            let rows2 = rows & !1;
            let out = readback(&ctx, n * rows2 / 4 + 1);
            let mut up = Uploader::new(&ctx).expect("staging");
            let w2 = QuantWeight::from_gguf_bytes(
                &ctx,
                &mut up,
                "w2",
                t,
                rows2,
                cols,
                &bytes[..bytes.len() / rows * rows2],
            )
            .expect("upload");
            up.flush().expect("flush");
            run(&ctx, |rec| {
                let input = Input::F16(Mat::new(&xb, n, cols));
                let output = Output::Gated {
                    out: AnyMat::F16(Mat::new(&out, n, rows2 / 2)),
                    act: Activation::Silu,
                };
                let call = LinearCall::new(&w2, None, input, output)
                    .on(LinearVariant::Coop)
                    .with_tile(Some(tile));
                record_linear(rec, &call).expect("record");
            });
            let y = linear_ref(&wf[..rows2 * cols], rows2, cols, &xr[..n * cols], n);
            let want: Vec<f32> = y
                .chunks(2)
                .map(|p| act_ref(Activation::Silu, p[0]) * p[1])
                .collect();
            let e = rel_err(&read_f16(&out, n * rows2 / 2), &want);
            assert!(e < 3e-3, "{tile:?} {t} n={n} glu f16: {e}");
        }
    }
    // rows that are not 4-element aligned are refused
    let bytes = random_weight(&mut rng, QuantType::Q4_0, 64 * 256);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", QuantType::Q4_0, 64, 256, &bytes)
        .expect("upload");
    up.flush().expect("flush");
    let small = readback(&ctx, 10 * 258);
    let out = readback(&ctx, 10 * 64);
    let mut rec = Recording::new(&ctx, false).expect("recording");
    for x in [
        Mat::<f16>::new(&small, 10, 256).with_ld(258),
        Mat::<f16>::new(&small, 10, 256).cols_at(2, 256),
    ] {
        let output = Output::Store(Mat::new(&out, 10, 64));
        let call = LinearCall::new(&w, None, Input::F16(x), output)
            .on(LinearVariant::Coop)
            .with_tile(Some(CoopTile::STREAM));
        let r = record_linear(&mut rec, &call);
        assert!(r.is_err(), "f16 rows at {} stride {} taken", x.offset, x.ld);
    }
}

/// The RMS norm between two skinny products of batched decode: the product
/// adding into the residual writes each token's sums of squares per 16 rows
/// (checked against the squares of what it stored), and the next product
/// normalizes its f32 input from them (checked against the reference norm
/// of that residual, rounded to f16 as the kernel stages it), for partial
/// row tiles, several 16-token blocks, both norm flavours and every skinny
/// layout. Misuse is refused. Runs where the device has cooperative matrices.
#[test]
fn skinny_norm_between_products_matches_ref() {
    let ctx = gpu();
    if !LinearVariant::coop_available(&ctx) {
        eprintln!("no cooperative matrices on this device: skipped");
        return;
    }
    let mut rng = Rng::fresh("skinny_norm");
    let tiles = [
        CoopTile::STREAM,
        CoopTile {
            wk: 10,
            ..CoopTile::STREAM
        },
        SKINNY_4_TILES,
        SKINNY_2X32_ROWS,
        SKINNY_TOKEN_BLOCKS[0],
        SKINNY_TOKEN_BLOCKS[1],
        SKINNY_TOKEN_BLOCKS[2],
    ];
    let cases = [
        (
            QuantType::Q4_0,
            544usize,
            256usize,
            333usize,
            9usize,
            NormFlavor::Plain,
        ),
        (QuantType::Q4K, 512, 768, 200, 16, NormFlavor::ZeroCentred),
        (QuantType::Q8_0, 576, 512, 130, 21, NormFlavor::Plain),
        (QuantType::Q4_0, 544, 256, 333, 64, NormFlavor::ZeroCentred),
    ];
    let eps = 1e-5;
    let mut up = Uploader::new(&ctx).expect("staging");
    let mut upload = |rng: &mut Rng, t: QuantType, rows: usize, cols: usize| {
        let bytes = random_weight(rng, t, rows * cols);
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        (w, dequantize_vec(t, &bytes, rows * cols).expect("dequant"))
    };
    for tile in tiles {
        for (t, e, k1, rows2, n, flavor) in cases {
            // x += W1 h, with the sums of squares of x's new rows
            let (w1, w1f) = upload(&mut rng, t, e, k1);
            let (hh, hr) = halves(&rng.normals(n * k1, 1.0));
            let hb = upload_new(&ctx, bytemuck::cast_slice(&hh), "h f16").expect("upload");
            let init = rng.normals(n * e, 1.0);
            let xb = readback(&ctx, n * e);
            xb.write_slice(0, &init).expect("init");
            let (offset, groups) = (5, e / 16);
            let sqb = readback(&ctx, offset + n * groups);
            let squares = SquareSums {
                buf: &sqb,
                offset,
                groups,
            };
            run(&ctx, |rec| {
                let input = Input::F16(Mat::new(&hb, n, k1));
                let output = Output::AccumulateSquares {
                    out: Mat::new(&xb, n, e),
                    squares,
                };
                let call = LinearCall::new(&w1, None, input, output)
                    .on(LinearVariant::Coop)
                    .with_tile(Some(tile));
                record_linear(rec, &call).expect("record");
            });
            let y = linear_ref(&w1f, e, k1, &hr, n);
            let want: Vec<f32> = y.iter().zip(&init).map(|(a, b)| a + b).collect();
            let x = read(&xb, n * e);
            let err = rel_err(&x, &want);
            assert!(err < 2e-3, "{tile:?} {t} {e}x{k1} n={n}: residual {err}");
            let sq = read(&sqb, offset + n * groups);
            for tk in 0..n {
                for g in 0..groups {
                    let row = &x[tk * e + 16 * g..tk * e + 16 * g + 16];
                    let want: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum();
                    let got = f64::from(sq[offset + tk * groups + g]);
                    assert!(
                        (got - want).abs() <= 1e-5 * want + 1e-6,
                        "{tile:?} {t} n={n}: squares of token {tk} rows {}.. {got} want {want}",
                        16 * g
                    );
                }
            }

            // out = W2 norm(x) + bias, the norm from those sums
            let (w2, w2f) = upload(&mut rng, t, rows2, e);
            let nw = rng.normals(e, 1.0);
            let nwb = device_f32(&ctx, &nw);
            let b = rng.normals(rows2, 0.5);
            let bb = device_f32(&ctx, &b);
            let out = readback(&ctx, n * rows2);
            let norm = NormWeight {
                weight: &nwb,
                flavor,
                eps,
            };
            run(&ctx, |rec| {
                let input = Input::NormedBySquares {
                    x: Mat::new(&xb, n, e),
                    norm,
                    squares,
                };
                let output = Output::Store(Mat::new(&out, n, rows2));
                let call = LinearCall::new(&w2, Some(&bb), input, output)
                    .on(LinearVariant::Coop)
                    .with_tile(Some(tile));
                record_linear(rec, &call).expect("record");
            });
            let xn: Vec<f32> = x
                .chunks(e)
                .flat_map(|row| rms_norm_ref(row, Some(&nw), flavor, eps))
                .collect();
            let (_, xn) = halves(&xn);
            let y = linear_ref(&w2f, rows2, e, &xn, n);
            let want: Vec<f32> = (0..n * rows2).map(|i| y[i] + b[i % rows2]).collect();
            let err = rel_err(&read(&out, n * rows2), &want);
            assert!(
                err < 2e-3,
                "{tile:?} {t} {rows2}x{e} n={n} {flavor:?}: normed {err}"
            );
        }
    }

    // refused: sums from a tile that is not skinny or into too small a
    // buffer, a norm from sums of another width (sums with a gate and a
    // norm of f16 input cannot be stated: `Output::Gated` writes no sums,
    // `Input::NormedBySquares` reads `Mat<f32>`)
    let (w, _) = upload(&mut rng, QuantType::Q4_0, 64, 256);
    let xb = readback(&ctx, 16 * 256);
    let out = readback(&ctx, 16 * 64);
    let sqb = readback(&ctx, 16 * 16);
    let sums = |groups| SquareSums {
        buf: &sqb,
        offset: 0,
        groups,
    };
    let nwb = device_f32(&ctx, &rng.normals(256, 1.0));
    let norm = NormWeight {
        weight: &nwb,
        flavor: NormFlavor::Plain,
        eps,
    };
    let (x, y) = (Mat::new(&xb, 16, 256), Mat::new(&out, 16, 64));
    let mut rec = Recording::new(&ctx, false).expect("recording");
    for (what, tile, input, output) in [
        (
            "sums from matmul_coop",
            CoopTile::SKINNY,
            Input::F32(x),
            Output::AccumulateSquares {
                out: y,
                squares: sums(4),
            },
        ),
        (
            "sums past the buffer",
            CoopTile::STREAM,
            Input::F32(x),
            Output::AccumulateSquares {
                out: y,
                squares: sums(32),
            },
        ),
        (
            "norm from sums of 128 columns",
            CoopTile::STREAM,
            Input::NormedBySquares {
                x,
                norm,
                squares: sums(8),
            },
            Output::Store(y),
        ),
    ] {
        let call = LinearCall::new(&w, None, input, output)
            .on(LinearVariant::Coop)
            .with_tile(Some(tile));
        let r = record_linear(&mut rec, &call);
        assert!(r.is_err(), "{what} taken");
    }
}

/// The final logit soft-cap on the device, in place on strided rows (the
/// gap between rows left alone), against the f64 reference.
#[test]
fn softcap_matches_ref() {
    use combs::ops::softcap::{record_softcap, softcap_ref};
    let ctx = gpu();
    let mut rng = Rng::fresh("softcap");
    let (rows, cols, ld) = (3, 1000, 1003);
    let x = rng.normals(rows * ld, 40.0);
    let xb = readback(&ctx, rows * ld);
    xb.write_slice(0, &x).expect("init");
    run(&ctx, |rec| {
        let m = Mat::new(&xb, rows, cols).with_ld(ld);
        record_softcap(rec, m, 30.0).expect("record");
    });
    let got = read(&xb, rows * ld);
    for r in 0..rows {
        let (row, want) = (&got[r * ld..r * ld + cols], &x[r * ld..r * ld + cols]);
        let want: Vec<f32> = want.iter().map(|&v| softcap_ref(v, 30.0)).collect();
        let e = rel_err(row, &want);
        assert!(e < 1e-6, "softcap row {r}: {e}");
        assert_eq!(
            &got[r * ld + cols..(r + 1) * ld],
            &x[r * ld + cols..(r + 1) * ld]
        );
    }
    let mut rec = Recording::new(&ctx, false).expect("recording");
    let m = Mat::new(&xb, rows, cols);
    assert!(
        record_softcap(&mut rec, m, 0.0).is_err(),
        "a zero cap taken"
    );
}
