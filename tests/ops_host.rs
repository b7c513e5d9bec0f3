//! The native host kernels (`ops::host`, what CPU devices run) against the
//! same CPU references as the Vulkan kernels, on fresh random data: products
//! of every weight format (one token through the fused dots, several
//! through the decoded tiles, chunked weights, bias, accumulation, the
//! folded norm, rope and gate, f16 input), RMS norm, rope, gated
//! activation, embedding rows, attention over paged caches with windows
//! and soft-caps, soft-cap, llama.cpp's input rounding. The host kernels'
//! tolerance is f32 arithmetic in another order (1e-5 relative).

mod common;

use std::sync::Arc;

use combs::gpu::{Buffer, GpuContext, MemoryKind, Recording, Uploader, upload_new};
use combs::ops::act_round::{ActRounding, act_round_ref};
use combs::ops::attention::{
    AttentionCall, AttentionOptions, AttentionShape, NewKv, NewRows, attention_ref,
};
use combs::ops::backend::{GetRowsCall, Kernels};
use combs::ops::glu::{Activation, GluCall, GluInput, act_ref};
use combs::ops::host::HOST;
use combs::ops::kv_store::{CacheAddressing, LayerKv};
use combs::ops::linear::{FoldedRope, Input, LinearCall, Output, linear_ref};
use combs::ops::rms_norm::{NormFlavor, NormOut, NormWeight, RmsNorm, RmsNormCall, rms_norm_ref};
use combs::ops::rope::{Rope, RopeCall, RopeScaling, RopeStyle, inv_freq, rope_ref};
use combs::ops::softcap::softcap_ref;
use combs::ops::{AnyMat, Mat};
use combs::quant::{QuantType, QuantWeight, TensorBytes, dequantize_vec};
use common::{Rng, gpu, random_weight, rel_err};
use half::f16;

fn device_f32(ctx: &Arc<GpuContext>, v: &[f32]) -> Arc<Buffer> {
    upload_new(ctx, bytemuck::cast_slice(v), "test input").expect("upload")
}

fn host_i32(ctx: &Arc<GpuContext>, v: &[i32]) -> Arc<Buffer> {
    let b =
        Buffer::new(ctx, (4 * v.len().max(1)) as u64, MemoryKind::Upload, "ints").expect("buffer");
    b.write_slice(0, v).expect("write");
    b
}

fn readback(ctx: &Arc<GpuContext>, floats: usize, init: &[f32]) -> Arc<Buffer> {
    let b = Buffer::new(ctx, (4 * floats) as u64, MemoryKind::Readback, "out").expect("buffer");
    b.write_slice(0, init).expect("init");
    b
}

fn read(b: &Arc<Buffer>, n: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; n];
    b.read_slice(0, &mut v).expect("read");
    v
}

fn run(ctx: &Arc<GpuContext>, f: impl FnOnce(&mut Recording)) {
    let mut rec = Recording::new(ctx, false).expect("recording");
    f(&mut rec);
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
    assert_eq!(
        rec.n_dispatches(),
        0,
        "a host kernel dispatched Vulkan work"
    );
}

/// A weight of `t` on the device (in chunks of at most `max_chunk` bytes)
/// and its reference dequantization.
fn weight(
    rng: &mut Rng,
    t: QuantType,
    rows: usize,
    cols: usize,
    max_chunk: usize,
) -> (QuantWeight, Vec<f32>) {
    let ctx = gpu();
    let bytes = random_weight(rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let tensor = TensorBytes {
        name: "w",
        qtype: t,
        rows,
        cols,
        bytes: &bytes,
    };
    let w = QuantWeight::from_gguf_bytes_chunked(&ctx, &mut up, tensor, max_chunk).expect("upload");
    up.flush().expect("flush");
    (w, dequantize_vec(t, &bytes, rows * cols).expect("dequant"))
}

fn check_product(t: QuantType, rows: usize, cols: usize, n: usize, chunk: usize) {
    let ctx = gpu();
    let mut rng = Rng::fresh(&format!("host_linear_{t}_{rows}x{cols}_{n}"));
    let (w, wf) = weight(&mut rng, t, rows, cols, chunk);
    let (ldx, ldo) = (cols + 4, rows + 8);
    let x = rng.normals(n * ldx, 1.0);
    let b = rng.normals(rows, 1.0);
    let init = rng.normals(n * ldo, 1.0);
    let (xb, bb) = (device_f32(&ctx, &x), device_f32(&ctx, &b));
    for (bias, accumulate) in [(false, false), (true, true)] {
        let out = readback(&ctx, n * ldo, &init);
        run(&ctx, |rec| {
            let xm = Mat::new(&xb, n, cols).with_ld(ldx);
            let om = Mat::new(&out, n, rows).with_ld(ldo);
            let output = if accumulate {
                Output::Accumulate(om)
            } else {
                Output::Store(om)
            };
            let call = LinearCall::new(&w, bias.then_some(&bb), Input::F32(xm), output);
            HOST.linear(rec, &call).expect("record");
        });
        let got = read(&out, n * ldo);
        for tk in 0..n {
            let mut want = linear_ref(&wf, rows, cols, &x[tk * ldx..tk * ldx + cols], 1);
            for (r, v) in want.iter_mut().enumerate() {
                *v += if bias { b[r] } else { 0.0 }
                    + if accumulate { init[tk * ldo + r] } else { 0.0 };
            }
            let row = &got[tk * ldo..tk * ldo + rows];
            let e = rel_err(row, &want);
            assert!(
                e < 1e-5,
                "{t} {rows}x{cols} n={n} token {tk} bias {bias}: {e}"
            );
            assert_eq!(
                &got[tk * ldo + rows..(tk + 1) * ldo],
                &init[tk * ldo + rows..(tk + 1) * ldo]
            );
        }
    }
}

#[test]
fn host_products_of_every_type_match_ref() {
    for t in QuantType::ALL {
        for n in [1, 3, 37] {
            check_product(t, 67, 512, n, usize::MAX);
        }
    }
}

#[test]
fn host_row_decoding_is_bit_exact() {
    // Every format's rows from the device layout, any first row and count,
    // equal the reference dequantizer's values bit for bit.
    for t in QuantType::ALL {
        let mut rng = Rng::fresh(&format!("host_dequant_rows_{t}"));
        let (rows, cols) = (13, 2 * t.block_size().max(256));
        let bytes = random_weight(&mut rng, t, rows * cols);
        let want = dequantize_vec(t, &bytes, rows * cols).expect("dequant");
        let nb = rows * cols / t.block_size();
        let mut device = vec![0u8; combs::quant::device_bytes(t, nb)];
        combs::quant::repack(t, &bytes, &mut device);
        for _ in 0..8 {
            let r0 = rng.below(rows);
            let n = 1 + rng.below(rows - r0);
            let mut got = vec![0.0f32; n * cols];
            combs::ops::host::dequant_rows(t, &device, rows, cols, r0, n, &mut got)
                .expect("decode");
            let expect = &want[r0 * cols..(r0 + n) * cols];
            for (i, (g, w)) in got.iter().zip(expect).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{t}: rows {r0}+{n}, element {i}");
            }
        }
    }
}

#[test]
fn host_products_of_chunked_weights_match_ref() {
    // Chunks of a few rows each: rows split across chunks and tiles.
    for t in [
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::F16,
    ] {
        let row = combs::quant::device_bytes(t, 1024 / t.block_size());
        for n in [1, 4] {
            check_product(t, 301, 1024, n, 37 * row);
        }
    }
}

/// The folded steps: the norm of the input, the rope and the gate of the
/// output, and f16 input, against the chains of references they replace.
#[test]
fn host_products_fold_norm_rope_gate_and_take_f16() {
    let ctx = gpu();
    let mut rng = Rng::fresh("host_folds");
    let (hd, n_rot, cols, n) = (64, 48, 512, 3);
    let rows = 6 * hd;
    for t in [QuantType::Q4_0, QuantType::Q5_1, QuantType::Q6K] {
        let (w, wf) = weight(&mut rng, t, rows, cols, usize::MAX);
        let x = rng.normals(n * cols, 2.0);
        let nw = rng.normals(cols, 1.0);
        let pos: Vec<i32> = (0..n).map(|_| rng.below(3000) as i32).collect();
        let f = inv_freq(n_rot, 10000.0, &RopeScaling::None);
        let (xb, nb, fb, pb) = (
            device_f32(&ctx, &x),
            device_f32(&ctx, &nw),
            device_f32(&ctx, &f),
            host_i32(&ctx, &pos),
        );
        let norm = NormWeight {
            weight: &nb,
            flavor: NormFlavor::ZeroCentred,
            eps: 1e-6,
        };
        let xn: Vec<f32> = x
            .chunks(cols)
            .flat_map(|r| rms_norm_ref(r, Some(&nw), NormFlavor::ZeroCentred, 1e-6))
            .collect();
        // norm in, rope out
        let out = readback(&ctx, n * rows, &vec![0.0; n * rows]);
        run(&ctx, |rec| {
            let rope = Rope {
                style: RopeStyle::Normal,
                head_dim: hd,
                n_rot,
                positions: &pb,
                inv_freq: &fb,
                attn_factor: 0.8,
            };
            let input = Input::Normed {
                x: Mat::new(&xb, n, cols),
                norm,
            };
            let output = Output::Roped {
                out: Mat::new(&out, n, rows),
                rope: FoldedRope::adjacent(rope, 4 * hd).expect("adjacent"),
            };
            HOST.linear(rec, &LinearCall::new(&w, None, input, output))
                .expect("record");
        });
        let mut want = linear_ref(&wf, rows, cols, &xn, n);
        for (tk, &p) in pos.iter().enumerate() {
            for h in 0..4 {
                let at = tk * rows + h * hd;
                rope_ref(&mut want[at..at + hd], p, &f, n_rot, RopeStyle::Normal, 0.8);
            }
        }
        let e = rel_err(&read(&out, n * rows), &want);
        assert!(e < 1e-5, "{t} norm + rope: {e}");
        // f16 in, gate out
        let (xh, xr): (Vec<u16>, Vec<f32>) = x
            .iter()
            .map(|&v| (f16::from_f32(v).to_bits(), f16::from_f32(v).to_f32()))
            .unzip();
        let xhb = upload_new(&ctx, bytemuck::cast_slice(&xh), "x f16").expect("upload");
        let out = readback(&ctx, n * rows / 2, &vec![0.0; n * rows / 2]);
        run(&ctx, |rec| {
            let input = Input::F16(Mat::new(&xhb, n, cols));
            let output = Output::Gated {
                out: AnyMat::F32(Mat::new(&out, n, rows / 2)),
                act: Activation::GeluTanh,
            };
            HOST.linear(rec, &LinearCall::new(&w, None, input, output))
                .expect("record");
        });
        let y = linear_ref(&wf, rows, cols, &xr, n);
        let want: Vec<f32> = y
            .chunks(2)
            .map(|p| act_ref(Activation::GeluTanh, p[0]) * p[1])
            .collect();
        let e = rel_err(&read(&out, n * rows / 2), &want);
        assert!(e < 1e-5, "{t} f16 in, gate out: {e}");
    }
}

#[test]
fn host_rms_norm_rope_glu_softcap_match_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("host_elementwise");
    let (n, cols, hd) = (5, 320, 64);
    let x = rng.normals(n * cols, 3.0);
    let w = rng.normals(cols, 1.0);
    let (xb, wb) = (device_f32(&ctx, &x), device_f32(&ctx, &w));
    // a norm added into rows, and per-head norms in place
    let prev = rng.normals(n * cols, 1.0);
    let out = readback(&ctx, n * cols, &prev);
    let inplace = readback(&ctx, n * cols, &x);
    run(&ctx, |rec| {
        let norm = RmsNorm {
            weight: Some(&wb),
            flavor: NormFlavor::Plain,
            eps: 1e-5,
        };
        let call = RmsNormCall {
            x: Mat::new(&xb, n, cols),
            norm,
            out: NormOut::Add(Mat::new(&out, n, cols)),
            head_dim: None,
        };
        HOST.rms_norm(rec, &call).expect("norm");
        let heads = Mat::new(&inplace, n, cols);
        let call = RmsNormCall {
            x: heads,
            norm: RmsNorm {
                weight: None,
                ..norm
            },
            out: NormOut::Store(AnyMat::F32(heads)),
            head_dim: Some(hd),
        };
        HOST.rms_norm(rec, &call).expect("heads");
    });
    let want: Vec<f32> = x
        .chunks(cols)
        .flat_map(|r| rms_norm_ref(r, Some(&w), NormFlavor::Plain, 1e-5))
        .zip(&prev)
        .map(|(a, b)| a + b)
        .collect();
    assert!(rel_err(&read(&out, n * cols), &want) < 1e-6, "norm added");
    let want: Vec<f32> = x
        .chunks(hd)
        .flat_map(|r| rms_norm_ref(r, None, NormFlavor::Plain, 1e-5))
        .collect();
    assert!(
        rel_err(&read(&inplace, n * cols), &want) < 1e-6,
        "norm of heads"
    );
    // rope of both styles in place
    let pos: Vec<i32> = (0..n).map(|_| rng.below(4000) as i32).collect();
    let pb = host_i32(&ctx, &pos);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        let f = inv_freq(32, 10000.0, &RopeScaling::Linear { factor: 2.0 });
        let fb = device_f32(&ctx, &f);
        let xr = readback(&ctx, n * cols, &x);
        run(&ctx, |rec| {
            let rope = Rope {
                style,
                head_dim: hd,
                n_rot: 32,
                positions: &pb,
                inv_freq: &fb,
                attn_factor: 1.0,
            };
            let call = RopeCall {
                x: Mat::new(&xr, n, cols),
                rope,
            };
            HOST.rope(rec, &call).expect("rope");
        });
        let mut want = x.clone();
        for (t, &p) in pos.iter().enumerate() {
            for h in want[t * cols..(t + 1) * cols].chunks_mut(hd) {
                rope_ref(h, p, &f, 32, style, 1.0);
            }
        }
        assert!(
            rel_err(&read(&xr, n * cols), &want) < 1e-6,
            "rope {style:?}"
        );
    }
    // gated activations, separate and interleaved; soft-cap in place
    let g = rng.normals(n * cols, 2.0);
    let gb = device_f32(&ctx, &g);
    let out = readback(&ctx, n * cols / 2, &vec![0.0; n * cols / 2]);
    let capped = readback(&ctx, n * cols, &g);
    run(&ctx, |rec| {
        let call = GluCall {
            act: Activation::Silu,
            input: GluInput::Interleaved(Mat::new(&gb, n, cols)),
            out: Mat::new(&out, n, cols / 2),
        };
        HOST.glu(rec, &call).expect("glu");
        HOST.softcap(rec, Mat::new(&capped, n, cols), 7.5)
            .expect("softcap");
    });
    let want: Vec<f32> = g
        .chunks(2)
        .map(|p| act_ref(Activation::Silu, p[0]) * p[1])
        .collect();
    assert!(rel_err(&read(&out, n * cols / 2), &want) < 1e-6, "glu");
    let want: Vec<f32> = g.iter().map(|&v| softcap_ref(v, 7.5)).collect();
    assert!(rel_err(&read(&capped, n * cols), &want) < 1e-6, "softcap");
}

#[test]
fn host_embedding_rows_and_rounding_match_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("host_get_rows");
    let (rows, cols) = (50, 256);
    for t in QuantType::ALL {
        let (w, wf) = weight(&mut rng, t, rows, cols, usize::MAX);
        let ids: Vec<i32> = (0..9).map(|_| rng.below(rows) as i32).collect();
        let idb = host_i32(&ctx, &ids);
        let out = readback(&ctx, ids.len() * cols, &vec![0.0; ids.len() * cols]);
        run(&ctx, |rec| {
            let call = GetRowsCall {
                table: &w,
                ids: &idb,
                out: Mat::new(&out, ids.len(), cols),
                scale: 1.5,
            };
            HOST.get_rows(rec, &call).expect("record");
        });
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                wf[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .map(|v| v * 1.5)
            })
            .collect();
        assert_eq!(read(&out, want.len()), want, "get_rows {t}");
    }
    let x = rng.normals(3 * 512, 2.0);
    let xb = device_f32(&ctx, &x);
    for mode in [
        ActRounding::Q8_0,
        ActRounding::Q8K,
        ActRounding::F16,
        ActRounding::Bf16,
    ] {
        let out = readback(&ctx, 3 * 512, &vec![0.0; 3 * 512]);
        run(&ctx, |rec| {
            let (xm, om) = (Mat::new(&xb, 3, 512), Mat::new(&out, 3, 512));
            HOST.act_round(rec, mode, xm, om).expect("round");
        });
        let want: Vec<f32> = x.chunks(512).flat_map(|r| act_round_ref(mode, r)).collect();
        assert_eq!(read(&out, 3 * 512), want, "act_round {mode:?}");
    }
}

/// Prompts of several sequences through paged caches (pages out of order),
/// the new rows stored by the step, windows and soft-caps, against the f64
/// reference over the f16-rounded keys and values.
#[test]
fn host_attention_over_pages_matches_ref() {
    let ctx = gpu();
    let mut rng = Rng::fresh("host_attention");
    let shape = AttentionShape {
        n_head: 6,
        n_head_kv: 2,
        head_dim: 64,
    };
    let (page, n_pages) = (8usize, 32usize);
    let (width, qw) = (
        shape.n_head_kv * shape.head_dim,
        shape.n_head * shape.head_dim,
    );
    let seqs = [(0usize, 7usize), (5, 1), (12, 9)];
    let mut free: Vec<i32> = (0..n_pages as i32).collect();
    free.swap(0, 20);
    let (mut table, mut base_of) = (Vec::new(), Vec::new());
    for &(past, new) in &seqs {
        base_of.push(table.len() as i32);
        for _ in 0..(past + new).div_ceil(page) {
            table.push(free.pop().expect("pages"));
        }
    }
    for (window, softcap) in [(0usize, 0.0f32), (6, 20.0)] {
        let opts = AttentionOptions {
            scale: 0.125,
            softcap,
            window,
        };
        let bytes = (n_pages * page * width * 2) as u64;
        let kc = Buffer::new(&ctx, bytes, MemoryKind::Device, "k").expect("k");
        let vc = Buffer::new(&ctx, bytes, MemoryKind::Device, "v").expect("v");
        // Every sequence's rows, old and new, each stored by a call of its own.
        let mut keys = Vec::new();
        let mut values = Vec::new();
        let (mut pos, mut base) = (Vec::new(), Vec::new());
        let mut q = Vec::new();
        for (i, &(past, new)) in seqs.iter().enumerate() {
            let k = rng.normals((past + new) * width, 1.0);
            let v = rng.normals((past + new) * width, 1.0);
            for j in 0..past + new {
                pos.push(j as i32);
                base.push(base_of[i]);
            }
            q.extend(rng.normals((past + new) * qw, 1.0));
            keys.push(k);
            values.push(v);
        }
        let n = pos.len();
        let (kb, vb) = (
            device_f32(&ctx, &keys.concat()),
            device_f32(&ctx, &values.concat()),
        );
        let (qb, tb, pb, bb) = (
            device_f32(&ctx, &q),
            host_i32(&ctx, &table),
            host_i32(&ctx, &pos),
            host_i32(&ctx, &base),
        );
        let out = readback(&ctx, n * qw, &vec![0.0; n * qw]);
        run(&ctx, |rec| {
            let call = AttentionCall {
                q: Mat::new(&qb, n, qw),
                out: AnyMat::F32(Mat::new(&out, n, qw)),
                kv: LayerKv {
                    k: &kc,
                    v: &vc,
                    at: CacheAddressing {
                        positions: &pb,
                        page_table: &tb,
                        seq_base: &bb,
                        page_size: page,
                        ring: 0,
                    },
                },
                new: NewKv::Store(NewRows {
                    k: Mat::new(&kb, n, width),
                    v: Mat::new(&vb, n, width),
                }),
                shape,
                opts,
                variant: None,
                split: None,
            };
            HOST.attention(rec, &call).expect("attention");
        });
        let got = read(&out, n * qw);
        let round = |v: &[f32]| {
            v.iter()
                .map(|&x| f16::from_f32(x).to_f32())
                .collect::<Vec<_>>()
        };
        let hd = shape.head_dim;
        let group = shape.n_head / shape.n_head_kv;
        let mut want = Vec::new();
        let mut t = 0;
        for (i, &(past, new)) in seqs.iter().enumerate() {
            let (kh, vh) = (round(&keys[i]), round(&values[i]));
            for j in 0..past + new {
                for h in 0..shape.n_head {
                    let kvh = h / group;
                    let ks: Vec<&[f32]> = (0..=j)
                        .map(|p| &kh[p * width + kvh * hd..p * width + (kvh + 1) * hd])
                        .collect();
                    let vs: Vec<&[f32]> = (0..=j)
                        .map(|p| &vh[p * width + kvh * hd..p * width + (kvh + 1) * hd])
                        .collect();
                    want.extend(attention_ref(
                        &q[t * qw + h * hd..t * qw + (h + 1) * hd],
                        &ks,
                        &vs,
                        j,
                        opts,
                    ));
                }
                t += 1;
            }
        }
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "window {window} softcap {softcap}: {e}");
    }
}
