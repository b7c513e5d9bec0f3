//! The integer decode path against its CPU references on fresh random data:
//! `quantize_q8_1` against llama.cpp's `quantize_row_q8_1` rounding (bit
//! for bit), the integer matvec (`matvec_q8.comp`) against the same integer
//! arithmetic on the CPU (each block's term bit for bit, only the order of
//! the f32 sum differs) with every epilogue it folds, and a tiny model under
//! llama.cpp numerics giving the same logits through the integer path as
//! through `act_round` and the f32 matvec. Lavapipe runs integer dot
//! products (Vulkan 1.3), so these run everywhere.

mod common;

use std::sync::Arc;

use combs::formats::gguf::GgufFile;
use combs::gpu::{Buffer, DeviceClass, GpuContext, MemoryKind, Recording, Uploader, upload_new};
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{GenerativeModel, LoadOptions, ModelRegistry};
use combs::ops::act_round::{ActRounding, Numerics, act_round_ref};
use combs::ops::glu::{Activation, act_ref};
use combs::ops::linear::matvec_q8::{Q8Input, matvec_q8_ref, record_matvec_q8, record_quantized};
use combs::ops::linear::{FoldedRope, Input, LinearCall, MatvecShape, Output};
use combs::ops::plan::{Fusion, IntDot};
use combs::ops::quantize_q8_1::{
    Q8Rows, pack_row_q8_1, quantize_row_q8_1_ref, record_quantize_q8_1, unpack_row_q8_1,
};
use combs::ops::rms_norm::{NormFlavor, NormWeight, rms_norm_ref};
use combs::ops::rope::{Rope, RopeScaling, RopeStyle, inv_freq, rope_ref};
use combs::ops::{AnyMat, Mat};
use combs::quant::{QuantType, QuantWeight};
use common::steps::prompt_and_decode_rows;
use common::{Rng, gpu, random_weight, rel_err};

fn device_f32(ctx: &Arc<GpuContext>, v: &[f32]) -> Arc<Buffer> {
    upload_new(ctx, bytemuck::cast_slice(v), "test input").expect("upload")
}

fn readback(ctx: &Arc<GpuContext>, words: usize) -> Arc<Buffer> {
    Buffer::new(ctx, (4 * words) as u64, MemoryKind::Readback, "out").expect("buffer")
}

fn run(ctx: &Arc<GpuContext>, f: impl FnOnce(&mut Recording)) {
    let mut rec = Recording::new(ctx, false).expect("recording");
    f(&mut rec);
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
}

fn int_dot_device() -> Arc<GpuContext> {
    let ctx = gpu();
    assert!(
        ctx.caps().int_dot,
        "{} runs no integer dot products (Vulkan 1.3 shaderIntegerDotProduct); \
         lavapipe of Mesa 22+ does",
        ctx.caps().name
    );
    ctx
}

/// Activations with the shapes real ones have: a spread of magnitudes,
/// whole blocks of zeros, and a few outliers.
fn activations(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut x = rng.normals(n, 2.0);
    for (b, blk) in x.chunks_mut(32).enumerate() {
        match b % 7 {
            3 => blk.iter_mut().for_each(|v| *v = 0.0),
            5 => blk.iter_mut().for_each(|v| *v *= 1e-3),
            _ => {}
        }
    }
    for _ in 0..n / 100 {
        let i = rng.below(n);
        x[i] *= 40.0;
    }
    x
}

#[test]
fn quantize_q8_1_matches_ref() {
    let ctx = int_dot_device();
    let mut rng = Rng::fresh("quantize_q8_1");
    for (n, cols) in [(1, 32), (3, 96), (2, 4096), (5, 14336 + 32)] {
        let ldx = cols + 4;
        let x = activations(&mut rng, n * ldx);
        let xb = device_f32(&ctx, &x);
        let ld = Q8Rows::row_words(cols) + 8;
        let out = readback(&ctx, n * ld);
        run(&ctx, |rec| {
            let xq = Q8Rows {
                ld,
                ..Q8Rows::new(&out, n, cols)
            };
            record_quantize_q8_1(rec, Mat::new(&xb, n, cols).with_ld(ldx), None, xq)
                .expect("record");
        });
        let mut words = vec![0u32; n * ld];
        out.read_slice(0, &mut words).expect("read");
        for t in 0..n {
            let got = unpack_row_q8_1(&words[t * ld..], cols);
            let want = quantize_row_q8_1_ref(&x[t * ldx..t * ldx + cols]);
            for (b, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.qs, w.qs, "{n}x{cols} token {t} block {b} quants");
                assert_eq!(
                    g.d.to_bits(),
                    w.d.to_bits(),
                    "{n}x{cols} token {t} block {b} d"
                );
                assert_eq!(g.sum, w.sum, "{n}x{cols} token {t} block {b} sum");
            }
        }
    }
}

/// The quantizer with the RMS norm folded in: the GPU's f32 sum of squares
/// is not the reference's f64 one, so a value on a rounding boundary may
/// land one step over; everything else is llama.cpp's rounding of the
/// rms_norm kernel's values.
#[test]
fn quantize_q8_1_folded_norm_matches_ref() {
    let ctx = int_dot_device();
    let mut rng = Rng::fresh("quantize_q8_1_norm");
    // 1056 columns: a row whose last workgroup is partly idle.
    for (flavor, n, cols) in [
        (NormFlavor::Plain, 3, 2048),
        (NormFlavor::ZeroCentred, 3, 2048),
        (NormFlavor::Plain, 2, 1056),
    ] {
        let eps = 1e-5;
        let x: Vec<f32> = rng.normals(n * cols, 3.0).iter().map(|v| v + 0.5).collect();
        let nw = rng.normals(cols, 1.0);
        let (xb, nb) = (device_f32(&ctx, &x), device_f32(&ctx, &nw));
        let ld = Q8Rows::row_words(cols);
        let out = readback(&ctx, n * ld);
        run(&ctx, |rec| {
            let norm = NormWeight {
                weight: &nb,
                flavor,
                eps,
            };
            record_quantize_q8_1(
                rec,
                Mat::new(&xb, n, cols),
                Some(norm),
                Q8Rows::new(&out, n, cols),
            )
            .expect("record");
        });
        let mut words = vec![0u32; n * ld];
        out.read_slice(0, &mut words).expect("read");
        let (mut off, mut total) = (0usize, 0usize);
        for t in 0..n {
            let xin = rms_norm_ref(&x[t * cols..(t + 1) * cols], Some(&nw), flavor, eps);
            let want = quantize_row_q8_1_ref(&xin);
            let got = unpack_row_q8_1(&words[t * ld..], cols);
            for (g, w) in got.iter().zip(&want) {
                let dd = (i32::from(g.d.to_bits()) - i32::from(w.d.to_bits())).abs();
                assert!(dd <= 1, "{flavor:?} token {t}: d {} vs {}", g.d, w.d);
                for (a, b) in g.qs.iter().zip(&w.qs) {
                    assert!(
                        (i32::from(*a) - i32::from(*b)).abs() <= 1,
                        "{flavor:?}: q {a} vs {b}"
                    );
                    off += usize::from(a != b);
                    total += 1;
                }
                assert_eq!(g.sum, g.qs.iter().map(|&q| i32::from(q)).sum::<i32>());
            }
        }
        assert!(
            off * 1000 <= total,
            "{flavor:?}: {off} of {total} quants moved"
        );
    }
}

/// A layout for the tests: see `MatvecShape`.
fn mv(tpr: u32, nr: u32, ks: u32, un: u32, wg: u32) -> Option<MatvecShape> {
    Some(MatvecShape {
        tpr,
        nr,
        ks,
        un,
        wg,
        stage_x: false,
        narrow: false,
    })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Epilogue {
    Store,
    Bias,
    Accumulate,
    Glu(Activation),
    Rope,
}

/// One integer matvec of `n` tokens against `matvec_q8_ref` and the CPU
/// epilogue, twice: with CPU-quantized x (rows a few words apart), and with
/// the f32 x that every workgroup quantizes itself (which must match the
/// CPU's quantization bit for bit).
fn check_matvec_q8(
    t: QuantType,
    rows: usize,
    cols: usize,
    n: usize,
    epi: Epilogue,
    shape: Option<MatvecShape>,
) {
    let ctx = int_dot_device();
    let label = format!("matvec_q8_{}_{rows}x{cols}_n{n}_{epi:?}", t.name());
    let mut rng = Rng::fresh(&label);
    let bytes = random_weight(&mut rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w =
        QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes).expect("upload");
    up.flush().expect("flush");
    let ldq = Q8Rows::row_words(cols) + 4;
    let x = activations(&mut rng, n * cols);
    let blocks: Vec<_> = x.chunks(cols).map(quantize_row_q8_1_ref).collect();
    let mut words = vec![0u32; n * ldq];
    for (tk, b) in blocks.iter().enumerate() {
        let p = pack_row_q8_1(b);
        words[tk * ldq..tk * ldq + p.len()].copy_from_slice(&p);
    }
    let xqb = upload_new(&ctx, bytemuck::cast_slice(&words), "xq").expect("upload");
    // The f32 x only gives the call its shape.
    let xb = device_f32(&ctx, &x);
    let out_len = if matches!(epi, Epilogue::Glu(_)) {
        rows / 2
    } else {
        rows
    };
    let ldo = out_len + 3;
    let init = rng.normals(n * ldo, 1.0);
    let bias = rng.normals(rows, 0.5);
    let bb = device_f32(&ctx, &bias);
    let out = readback(&ctx, n * ldo);
    out.write_slice(0, &init).expect("init");
    let (hd, n_rot) = (32, 24);
    let rope_rows = (rows / 2 / hd) * hd;
    let pos: Vec<i32> = (0..n).map(|_| rng.below(200) as i32).collect();
    let f = inv_freq(n_rot, 10000.0, &RopeScaling::None);
    let (pb, fb) = (
        upload_new(&ctx, bytemuck::cast_slice(&pos), "pos").expect("upload"),
        device_f32(&ctx, &f),
    );
    for in_wg in [false, true] {
        out.write_slice(0, &init).expect("init");
        run(&ctx, |rec| {
            let y = Mat::new(&out, n, out_len).with_ld(ldo);
            let output = match epi {
                Epilogue::Store | Epilogue::Bias => Output::Store(y),
                Epilogue::Accumulate => Output::Accumulate(y),
                Epilogue::Glu(act) => Output::Gated {
                    out: AnyMat::F32(y),
                    act,
                },
                Epilogue::Rope => {
                    let rope = Rope {
                        style: RopeStyle::Normal,
                        head_dim: hd,
                        n_rot,
                        positions: &pb,
                        inv_freq: &fb,
                        attn_factor: 0.9,
                    };
                    Output::Roped {
                        out: y,
                        rope: FoldedRope::adjacent(rope, rope_rows).expect("adjacent pairs"),
                    }
                }
            };
            let bias = (epi == Epilogue::Bias || epi == Epilogue::Accumulate).then_some(&bb);
            let call = LinearCall::new(&w, bias, Input::F32(Mat::new(&xb, n, cols)), output)
                .with_shape(shape);
            let xq = Q8Rows {
                ld: ldq,
                ..Q8Rows::new(&xqb, n, cols)
            };
            let input = if in_wg {
                Q8Input::F32 {
                    x: Mat::new(&xb, n, cols),
                    norm: None,
                }
            } else {
                Q8Input::Quantized(xq)
            };
            record_matvec_q8(rec, &call, input).expect("record");
        });
        let mut got = vec![0.0f32; n * ldo];
        out.read_slice(0, &mut got).expect("read");
        for tk in 0..n {
            let mut y = matvec_q8_ref(t, &bytes, rows, cols, &blocks[tk]);
            if matches!(epi, Epilogue::Bias | Epilogue::Accumulate) {
                y.iter_mut().zip(&bias).for_each(|(a, b)| *a += b);
            }
            let mut want: Vec<f32> = match epi {
                Epilogue::Glu(act) => y.chunks(2).map(|p| act_ref(act, p[0]) * p[1]).collect(),
                _ => y,
            };
            if epi == Epilogue::Rope {
                for h in 0..rope_rows / hd {
                    let at = h * hd;
                    rope_ref(
                        &mut want[at..at + hd],
                        pos[tk],
                        &f,
                        n_rot,
                        RopeStyle::Normal,
                        0.9,
                    );
                }
            }
            if epi == Epilogue::Accumulate {
                want.iter_mut()
                    .zip(&init[tk * ldo..])
                    .for_each(|(a, p)| *a += p);
            }
            let row = &got[tk * ldo..tk * ldo + out_len];
            let e = rel_err(row, &want);
            // The terms are the reference's bit for bit; only the f32 sum's order
            // differs (and the rope's and activation's f32 functions). The
            // gated rows multiply a gate's rounding by up to |a| (silu of a
            // negative a), and a few gated rows make a small norm: 12 rows
            // of 1888 columns on subgroups of 4 (another order of the sum)
            // read 1.7e-5.
            let bound = match epi {
                Epilogue::Store | Epilogue::Bias | Epilogue::Accumulate => 1e-6,
                Epilogue::Rope => 1e-5,
                Epilogue::Glu(_) => 1e-4,
            };
            assert!(
                e < bound,
                "{label} token {tk} shape {shape:?} in-workgroup {in_wg}: {e}"
            );
            assert_eq!(
                &got[tk * ldo + out_len..(tk + 1) * ldo],
                &init[tk * ldo + out_len..(tk + 1) * ldo],
                "{label} token {tk}: wrote past its row"
            );
        }
    }
}

#[test]
fn matvec_q8_matches_ref() {
    for t in [QuantType::Q4_0, QuantType::Q8_0] {
        // chosen layouts; units odd (37) and rows not a multiple of the group's
        check_matvec_q8(t, 64, 256, 1, Epilogue::Store, None);
        check_matvec_q8(t, 37, 32 * 37, 1, Epilogue::Store, mv(8, 4, 1, 2, 128));
        check_matvec_q8(t, 101, 32 * 37, 1, Epilogue::Store, mv(32, 3, 1, 4, 64));
        // column slices and row groups wider than a subgroup
        check_matvec_q8(t, 45, 32 * 75, 1, Epilogue::Store, mv(16, 2, 4, 1, 128));
        check_matvec_q8(t, 19, 14336, 1, Epilogue::Store, mv(64, 4, 2, 2, 256));
    }
}

#[test]
fn matvec_q8_epilogues_match_ref() {
    for t in [QuantType::Q4_0, QuantType::Q8_0] {
        check_matvec_q8(t, 37, 32 * 13, 1, Epilogue::Bias, mv(8, 2, 1, 1, 128));
        check_matvec_q8(t, 133, 512, 1, Epilogue::Accumulate, mv(32, 4, 1, 2, 128));
        check_matvec_q8(t, 134, 32 * 21, 1, Epilogue::Glu(Activation::Silu), None);
        check_matvec_q8(
            t,
            70,
            512,
            1,
            Epilogue::Glu(Activation::GeluTanh),
            mv(8, 3, 2, 1, 128),
        );
        check_matvec_q8(t, 160, 256, 1, Epilogue::Rope, mv(16, 2, 1, 2, 64));
    }
}

#[test]
fn matvec_q8_several_tokens_match_ref() {
    for t in [QuantType::Q4_0, QuantType::Q8_0] {
        check_matvec_q8(t, 75, 32 * 19, 3, Epilogue::Accumulate, None);
        check_matvec_q8(
            t,
            64,
            1024,
            8,
            Epilogue::Glu(Activation::Silu),
            mv(8, 2, 1, 2, 128),
        );
        check_matvec_q8(t, 96, 512, 5, Epilogue::Rope, None);
    }
}

/// Random sizes and layouts: rows, units, tokens, row groups, rows per
/// group, column slices, units in flight, workgroup size, epilogue.
#[test]
fn matvec_q8_random_shapes_match_ref() {
    let mut rng = Rng::fresh("matvec_q8_random");
    for _ in 0..8 {
        let t = [QuantType::Q4_0, QuantType::Q8_0][rng.below(2)];
        let wg = [64, 128, 256][rng.below(3)];
        let tpr = [4, 8, 16, 32, 64][rng.below(5)];
        let ks = [1, 2, 4][rng.below(3)];
        let ks = if tpr * ks > wg { 1 } else { ks };
        let shape = mv(
            tpr,
            1 + rng.below(4) as u32,
            ks,
            1 + rng.below(3) as u32,
            wg,
        );
        let rows = 2 * (1 + rng.below(100));
        let cols = 32 * (1 + rng.below(90));
        let n = 1 + rng.below(4);
        let epi = match rng.below(4) {
            0 => Epilogue::Store,
            1 => Epilogue::Bias,
            2 => Epilogue::Accumulate,
            _ => Epilogue::Glu(Activation::Silu),
        };
        check_matvec_q8(t, rows, cols, n, epi, shape);
    }
}

/// The integer matvec of `n` rows of f32 `x` through `w` (rows × cols),
/// each workgroup quantizing x itself, the RMS norm of weights `nw`
/// (`flavor`, `eps`) folded in where given: the outputs, token-major.
fn run_matvec_q8_f32(
    ctx: &Arc<GpuContext>,
    w: &QuantWeight,
    x: &[f32],
    nw: &[f32],
    (n, rows, cols): (usize, usize, usize),
    norm: Option<(NormFlavor, f32)>,
    shape: Option<MatvecShape>,
) -> Vec<f32> {
    let (xb, nb) = (device_f32(ctx, x), device_f32(ctx, nw));
    let out = readback(ctx, n * rows);
    run(ctx, |rec| {
        let xm = Mat::new(&xb, n, cols);
        let norm = norm.map(|(flavor, eps)| NormWeight {
            weight: &nb,
            flavor,
            eps,
        });
        let call = LinearCall::new(
            w,
            None,
            Input::F32(xm),
            Output::Store(Mat::new(&out, n, rows)),
        )
        .with_shape(shape);
        record_matvec_q8(rec, &call, Q8Input::F32 { x: xm, norm }).expect("record");
    });
    let mut got = vec![0.0f32; n * rows];
    out.read_slice(0, &mut got).expect("read");
    got
}

/// Q4_K weights on the integer path: x quantized to q8_K in every
/// workgroup (optionally from the raw residual with the norm folded in),
/// against llama.cpp's rounding of x (`act_round_ref`, q8_K) times the
/// dequantized weight in f64. Both sides' terms are exact or nearly; only
/// the f32 sums differ.
fn check_matvec_q4k(rows: usize, cols: usize, n: usize, norm: bool, shape: Option<MatvecShape>) {
    let ctx = int_dot_device();
    let label = format!("matvec_q4k_{rows}x{cols}_n{n}_norm{norm}");
    let mut rng = Rng::fresh(&label);
    let t = QuantType::Q4K;
    let bytes = random_weight(&mut rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let w =
        QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes).expect("upload");
    up.flush().expect("flush");
    // A few large values make each block's extreme and its sign matter.
    let mut x = activations(&mut rng, n * cols);
    for i in 0..n * cols / 97 {
        x[i * 97] *= if i % 2 == 0 { -9.0 } else { 7.0 };
    }
    let nw = rng.normals(cols, 1.0);
    let folded = norm.then_some((NormFlavor::Plain, 1e-5));
    let got = run_matvec_q8_f32(&ctx, &w, &x, &nw, (n, rows, cols), folded, shape);
    let wf = combs::quant::dequantize_vec(t, &bytes, rows * cols).expect("dequant");
    for tk in 0..n {
        let row = &x[tk * cols..(tk + 1) * cols];
        let xin = if norm {
            rms_norm_ref(row, Some(&nw), NormFlavor::Plain, 1e-5)
        } else {
            row.to_vec()
        };
        let xr = act_round_ref(ActRounding::Q8K, &xin);
        let want: Vec<f32> = (0..rows)
            .map(|r| {
                wf[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&xr)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32
            })
            .collect();
        let e = rel_err(&got[tk * rows..(tk + 1) * rows], &want);
        // With the norm folded, the GPU's f32 sum of squares may move a value
        // on a rounding boundary by one step of q8_K.
        let bound = if norm { 2e-3 } else { 1e-5 };
        assert!(e < bound, "{label} token {tk} shape {shape:?}: {e}");
    }
}

/// `mv`'s layout over 32-column units (Q4_K's narrow kernel).
fn narrow(s: Option<MatvecShape>) -> Option<MatvecShape> {
    s.map(|s| MatvecShape { narrow: true, ..s })
}

#[test]
fn matvec_q4k_matches_llama_cpp_rounding() {
    // 64-column steps (the default) and 32-column units, each with slices
    // that end mid-block and more lanes than steps.
    for w in [false, true] {
        let m = |s| if w { narrow(s) } else { s };
        check_matvec_q4k(64, 256, 1, false, m(None));
        check_matvec_q4k(37, 2048, 2, false, m(mv(32, 3, 1, 2, 64)));
        check_matvec_q4k(75, 256 * 7, 3, true, m(mv(16, 2, 2, 1, 128)));
        check_matvec_q4k(40, 256 * 9, 1, true, m(mv(8, 4, 1, 2, 256)));
        check_matvec_q4k(19, 256 * 56, 1, false, m(mv(32, 4, 2, 2, 256)));
        check_matvec_q4k(33, 256 * 5, 2, true, m(mv(4, 2, 4, 3, 64)));
    }
}

/// Q4_0 / Q8_0 with the RMS norm folded into each workgroup's quantization
/// (x · w quantized, 1 / rms applied to the sums) against llama.cpp's
/// rounding of the normed row (`quantize_row_q8_1` of the CPU norm, then
/// the integer dot products): the same but for f16 against f32 block
/// scales and values at rounding ties, so within a few parts in 10⁴, and
/// over all the cases together several times closer to it than to the
/// exact product. The second is pooled because one token's distance from
/// the exact product is heavy-tailed: per token the ratio reached 0.37 in
/// 420 draws, pooled over the test's seven tokens 0.030 in 500 runs.
#[test]
fn matvec_q8_folded_norm_is_llama_cpp_rounding_of_the_normed_row() {
    let ctx = int_dot_device();
    // Squared relative distances from llama.cpp's rounding and from the
    // exact product, summed over every case and token (each token weighs
    // the same: absolute distances would leave the widest case's one
    // token deciding, as heavy-tailed as a single token's ratio).
    let (mut to_rounding, mut to_exact) = (0f64, 0f64);
    for (t, rows, cols, n, flavor, shape) in [
        (QuantType::Q4_0, 70, 2048, 2, NormFlavor::Plain, None),
        (
            QuantType::Q8_0,
            45,
            32 * 33,
            1,
            NormFlavor::ZeroCentred,
            None,
        ),
        (
            QuantType::Q4_0,
            33,
            32 * 75,
            3,
            NormFlavor::Plain,
            mv(16, 2, 4, 1, 128),
        ),
        (
            QuantType::Q8_0,
            64,
            14336,
            1,
            NormFlavor::Plain,
            mv(32, 4, 2, 2, 256),
        ),
    ] {
        let label = format!("matvec_q8_norm_{}_{rows}x{cols}_n{n}", t.name());
        let mut rng = Rng::fresh(&label);
        let bytes = random_weight(&mut rng, t, rows * cols);
        let mut up = Uploader::new(&ctx).expect("staging");
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        // A residual's spread: a large mean square, so 1 / rms matters.
        let x: Vec<f32> = activations(&mut rng, n * cols)
            .iter()
            .map(|v| 6.0 * v)
            .collect();
        let nw = rng.normals(cols, 1.0);
        let eps = 1e-5;
        let norm = Some((flavor, eps));
        let got = run_matvec_q8_f32(&ctx, &w, &x, &nw, (n, rows, cols), norm, shape);
        let wf = combs::quant::dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        for tk in 0..n {
            let xin = rms_norm_ref(&x[tk * cols..(tk + 1) * cols], Some(&nw), flavor, eps);
            let want = matvec_q8_ref(t, &bytes, rows, cols, &quantize_row_q8_1_ref(&xin));
            let exact = combs::ops::linear::linear_ref(&wf, rows, cols, &xin, 1);
            let row = &got[tk * rows..(tk + 1) * rows];
            let e = rel_err(row, &want);
            assert!(
                e < 1e-3,
                "{label} token {tk}: {e} from llama.cpp's rounding"
            );
            to_rounding += e * e;
            to_exact += rel_err(row, &exact).powi(2);
        }
    }
    let ratio = (to_rounding / to_exact.max(1e-30)).sqrt();
    assert!(
        ratio < 0.25,
        "pooled distance from llama.cpp's rounding is {ratio} of that from the exact product"
    );
}

/// The quantizer and the matvec recorded together (`record_quantized`), the
/// norm folded into the quantizer, against the f32 matvec on the CPU: the
/// integer path's whole error is llama.cpp's rounding of x.
#[test]
fn matvec_q8_quantized_normed_input_is_close_to_exact() {
    let ctx = int_dot_device();
    let mut rng = Rng::fresh("matvec_q8_normed");
    let (rows, cols) = (96, 1024);
    for t in [QuantType::Q4_0, QuantType::Q8_0] {
        let bytes = random_weight(&mut rng, t, rows * cols);
        let mut up = Uploader::new(&ctx).expect("staging");
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)
            .expect("upload");
        up.flush().expect("flush");
        let x: Vec<f32> = rng.normals(cols, 3.0).iter().map(|v| v + 0.5).collect();
        let nw = rng.normals(cols, 1.0);
        let (xb, nb) = (device_f32(&ctx, &x), device_f32(&ctx, &nw));
        let scratch = readback(&ctx, Q8Rows::row_words(cols));
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
            let call = LinearCall::new(&w, None, input, Output::Store(Mat::new(&out, 1, rows)));
            record_quantized(rec, &call, &scratch).expect("record");
        });
        let mut got = vec![0.0f32; rows];
        out.read_slice(0, &mut got).expect("read");
        let xin = rms_norm_ref(&x, Some(&nw), NormFlavor::Plain, 1e-6);
        let wf = combs::quant::dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        let want = combs::ops::linear::linear_ref(&wf, rows, cols, &xin, 1);
        // 8-bit x: about 1/254 of each block's largest value per element.
        let e = rel_err(&got, &want);
        assert!(e < 2e-2, "{t}: {e}");
    }
}

fn load(cfg: &SynthConfig, int_dot: IntDot, fusion: Fusion) -> Arc<dyn GenerativeModel> {
    let g = GgufFile::from_bytes(synth_gguf(cfg).expect("synth").to_bytes()).expect("parse");
    let opts = LoadOptions {
        numerics: Numerics::LlamaCppCpu,
        // The Vulkan kernels' GPU plan (the matvec and its folds) on lavapipe too.
        plan_as: Some(DeviceClass::Gpu),
        int_dot,
        fusion,
        ..LoadOptions::default()
    };
    ModelRegistry::new().load(&gpu(), &g, &opts).expect("load")
}

/// Logit rows of a prompt in chunks of 5 (each a matvec batch) and 5 decode steps.
fn logits(model: Arc<dyn GenerativeModel>, prompt: &[u32], more: &[u32]) -> Vec<Vec<f32>> {
    prompt_and_decode_rows(&model, prompt, more, 64).1
}

/// Under llama.cpp numerics the integer path computes what `act_round` and
/// the f32 matvec compute, up to f32 summation order (and, with fusion on,
/// the order of the sum of squares of the norm folded into the quantizer).
/// That order can move a value lying within an ulp of a rounding boundary
/// of the 8-bit grid (x · 127 / amax at k + ½) by one step, and the KV
/// cache carries the change into every later row: a fifth to a half of the
/// models show such a flip over their 10 rows. So each sequence must agree
/// to 1e-5 up to its first flip and stay within 5e-2 after it, and two of
/// the ten models must agree throughout with fusion off (a wrong product
/// would flip every one). Most models' rows differ somewhere from the f32
/// path's (summation order); a tiny model whose sums are all exact in f32
/// can match it bit for bit (seed 1796558301469588275: one of 30), so only
/// a path that never ran would leave most of them identical.
#[test]
fn model_int_dot_matches_act_round() {
    int_dot_device();
    let mut rng = Rng::fresh("model_int_dot");
    let (mut clean, mut total) = (0, 0);
    let (mut ran, mut runs) = (0, 0);
    for _ in 0..5 {
        for (arch, t) in [
            ("llama", QuantType::Q4_0),
            ("qwen2", QuantType::Q8_0),
            ("llama", QuantType::Q4K),
        ] {
            let mut cfg = SynthConfig::preset("tiny", t).expect("preset");
            cfg.arch = arch.to_string();
            if t == QuantType::Q4K {
                // Rows of whole 256-blocks.
                (cfg.n_embd, cfg.head_dim, cfg.n_ff) = (256, 64, 512);
            }
            cfg.seed = rng.next_u64();
            let n_vocab = cfg.n_vocab;
            let prompt: Vec<u32> = (0..7).map(|_| rng.below(n_vocab) as u32).collect();
            let more: Vec<u32> = (0..3).map(|_| rng.below(n_vocab) as u32).collect();
            for fusion in [Fusion::On, Fusion::Off] {
                let int = logits(load(&cfg, IntDot::On, fusion), &prompt, &more);
                let f32_path = logits(load(&cfg, IntDot::Off, fusion), &prompt, &more);
                let mut differ = false;
                let mut flipped = None;
                for (i, (a, b)) in int.iter().zip(&f32_path).enumerate() {
                    let e = rel_err(a, b);
                    if e >= 1e-5 && flipped.is_none() {
                        eprintln!("{arch} {t} {fusion:?}: a rounding flip at row {i} ({e:.2e})");
                        flipped = Some(i);
                    }
                    assert!(e < 5e-2, "{arch} {t} {fusion:?} row {i}: {e}");
                    differ |= a != b;
                }
                if !differ {
                    eprintln!("{arch} {t} {fusion:?}: bit for bit the f32 path's rows");
                }
                ran += usize::from(differ);
                runs += 1;
                if fusion == Fusion::Off {
                    clean += usize::from(flipped.is_none());
                    total += 1;
                }
            }
        }
    }
    assert!(
        clean >= 2,
        "only {clean} of {total} models without a rounding flip"
    );
    // Identical rows throughout would mean the integer path never ran.
    assert!(
        2 * ran >= runs,
        "only {ran} of {runs} runs differ from the f32 path: the integer path did not run"
    );
}

/// The plan takes the integer path only under llama.cpp numerics, on the
/// Vulkan kernels, for decode-sized calls, and as `IntDot` asks.
#[test]
fn plan_int_dot_only_for_llama_cpp_decode() {
    use combs::ops::plan::{Backend, Planner};
    let ctx = int_dot_device();
    let planner = |numerics, int_dot| Planner {
        numerics,
        int_dot,
        plan_as: Some(DeviceClass::Gpu),
        backend: Some(Backend::Vulkan),
        ..Planner::default()
    };
    let on = planner(Numerics::LlamaCppCpu, IntDot::On);
    assert!(on.plan(&ctx, 1, true).int_dot_for(QuantType::Q4_0));
    assert!(on.plan(&ctx, 8, true).int_dot_for(QuantType::Q8_0));
    assert!(on.plan(&ctx, 1, true).int_dot_for(QuantType::Q4K));
    assert!(!on.plan(&ctx, 1, true).int_dot_for(QuantType::Q6K));
    assert!(!on.plan(&ctx, 9, false).int_dot_for(QuantType::Q4_0));
    let exact = planner(Numerics::Exact, IntDot::On);
    assert!(!exact.plan(&ctx, 1, true).int_dot_for(QuantType::Q4_0));
    let off = planner(Numerics::LlamaCppCpu, IntDot::Off);
    assert!(!off.plan(&ctx, 1, true).int_dot_for(QuantType::Q4_0));
    let auto = planner(Numerics::LlamaCppCpu, IntDot::Auto);
    assert_eq!(
        auto.plan(&ctx, 1, true).int_dot_for(QuantType::Q4_0),
        ctx.caps().int_dot_accelerated
    );
}
