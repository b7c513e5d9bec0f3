//! The kernel families Whisper adds — layer norm with weight and bias, the
//! exact and tanh GELUs and the adding copy (`unary`), a 1-D convolution's patch rows
//! (`im2col`) — on both backends (the Vulkan kernels on whatever device
//! runs the tests, lavapipe here, and the native host kernels where that
//! device is the CPU) against
//! their CPU references on fresh random data.

mod common;

use std::sync::Arc;

use combs::gpu::{Buffer, GpuContext, MemoryKind, Recording, upload_new};
use combs::ops::Mat;
use combs::ops::backend::{Kernels, VULKAN};
use combs::ops::host::HOST;
use combs::ops::im2col::{Conv1d, ConvInput, Im2colCall, im2col_ref};
use combs::ops::layer_norm::{LayerNorm, LayerNormCall, layer_norm_ref};
use combs::ops::unary::{UnaryCall, UnaryOp, unary_ref};
use common::{Rng, gpu, host_kernels_run_here, max_rel};

fn device_f32(ctx: &Arc<GpuContext>, v: &[f32]) -> Arc<Buffer> {
    upload_new(ctx, bytemuck::cast_slice(v), "test input").expect("upload")
}

fn readback(ctx: &Arc<GpuContext>, init: &[f32]) -> Arc<Buffer> {
    let b = Buffer::new(ctx, (4 * init.len()) as u64, MemoryKind::Readback, "out").expect("buffer");
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
}

/// The Vulkan kernels, and the native host kernels where they can run on
/// the test device (a CPU device's buffers, which they read in place).
fn backends() -> Vec<(&'static str, &'static dyn Kernels)> {
    let mut b: Vec<(&'static str, &'static dyn Kernels)> = vec![("vulkan", &VULKAN)];
    if host_kernels_run_here() {
        b.push(("host", &HOST));
    }
    b
}

#[test]
fn layer_norm_matches_reference() {
    let ctx = gpu();
    let mut rng = Rng::fresh("layer_norm");
    for (rows, cols, ld) in [(1, 64, 64), (7, 384, 400), (33, 1000, 1000)] {
        // Rows off zero: the variance must not lose them to cancellation.
        let x: Vec<f32> = (0..rows * ld).map(|_| 3.0 + rng.normal() * 2.0).collect();
        let w = rng.normals(cols, 1.0);
        let b = rng.normals(cols, 0.5);
        let want: Vec<f32> = (0..rows)
            .flat_map(|r| layer_norm_ref(&x[r * ld..r * ld + cols], &w, &b, 1e-5))
            .collect();
        for (name, k) in backends() {
            let (xb, wb, bb) = (
                device_f32(&ctx, &x),
                device_f32(&ctx, &w),
                device_f32(&ctx, &b),
            );
            let out = readback(&ctx, &vec![0.0; rows * cols]);
            run(&ctx, |rec| {
                let call = LayerNormCall {
                    x: Mat::new(&xb, rows, cols).with_ld(ld),
                    norm: LayerNorm {
                        weight: &wb,
                        bias: &bb,
                        eps: 1e-5,
                    },
                    out: Mat::new(&out, rows, cols),
                };
                k.layer_norm(rec, &call).expect("layer_norm");
            });
            let err = max_rel(&read(&out, rows * cols), &want);
            assert!(err < 1e-5, "{name} {rows}x{cols}: {err}");
        }
    }
}

#[test]
fn unary_matches_reference() {
    let ctx = gpu();
    let mut rng = Rng::fresh("unary");
    for op in [UnaryOp::GeluErf, UnaryOp::GeluTanh, UnaryOp::Copy] {
        for add in [false, true] {
            let (rows, cols, ld) = (13, 300, 320);
            let x: Vec<f32> = rng.normals(rows * ld, 3.0);
            let init = rng.normals(rows * cols, 1.0);
            let want: Vec<f32> = (0..rows * cols)
                .map(|i| {
                    let v = unary_ref(op, x[(i / cols) * ld + i % cols]);
                    if add { v + init[i] } else { v }
                })
                .collect();
            for (name, k) in backends() {
                let xb = device_f32(&ctx, &x);
                let out = readback(&ctx, &init);
                run(&ctx, |rec| {
                    let call = UnaryCall {
                        op,
                        x: Mat::new(&xb, rows, cols).with_ld(ld),
                        out: Mat::new(&out, rows, cols),
                        add,
                    };
                    k.unary(rec, &call).expect("unary");
                });
                let err = max_rel(&read(&out, rows * cols), &want);
                assert!(err < 1e-6, "{name} {op:?} add {add}: {err}");
            }
        }
    }
}

#[test]
fn gelu_in_place() {
    let ctx = gpu();
    let mut rng = Rng::fresh("gelu in place");
    let x = rng.normals(5 * 96, 2.0);
    let want: Vec<f32> = x.iter().map(|&v| unary_ref(UnaryOp::GeluErf, v)).collect();
    for (name, k) in backends() {
        let b = readback(&ctx, &x);
        run(&ctx, |rec| {
            let m = Mat::new(&b, 5, 96);
            let call = UnaryCall {
                op: UnaryOp::GeluErf,
                x: m,
                out: m,
                add: false,
            };
            k.unary(rec, &call).expect("gelu");
        });
        let err = max_rel(&read(&b, x.len()), &want);
        assert!(err < 1e-6, "{name}: {err}");
    }
}

#[test]
fn im2col_matches_reference() {
    let ctx = gpu();
    let mut rng = Rng::fresh("im2col");
    for (channels, n_in, stride, channel_rows) in
        [(80, 100, 1, true), (13, 57, 2, false), (24, 64, 2, true)]
    {
        let conv = Conv1d {
            channels,
            kernel: 3,
            stride,
            pad: 1,
        };
        let x = rng.normals(channels * n_in, 1.0);
        let (sc, st) = if channel_rows {
            (n_in, 1)
        } else {
            (1, channels)
        };
        let want = im2col_ref(conv, &x, n_in, sc, st);
        let (n_out, width) = (conv.n_out(n_in), conv.width());
        assert_eq!(want.len(), n_out * width);
        for (name, k) in backends() {
            let xb = device_f32(&ctx, &x);
            let out = readback(&ctx, &rng.normals(n_out * width, 1.0));
            run(&ctx, |rec| {
                let input = if channel_rows {
                    ConvInput::ChannelRows(Mat::new(&xb, channels, n_in))
                } else {
                    ConvInput::PositionRows(Mat::new(&xb, n_in, channels))
                };
                let call = Im2colCall {
                    conv,
                    input,
                    out: Mat::new(&out, n_out, width),
                };
                k.im2col(rec, &call).expect("im2col");
            });
            assert_eq!(read(&out, n_out * width), want, "{name} {conv:?}");
        }
    }
}

#[test]
fn im2col_rejects_a_wrong_output() {
    let ctx = gpu();
    let xb = device_f32(&ctx, &[0.0; 64]);
    let out = readback(&ctx, &[0.0; 64]);
    let conv = Conv1d {
        channels: 4,
        kernel: 3,
        stride: 1,
        pad: 1,
    };
    for (_, k) in backends() {
        let mut rec = Recording::new(&ctx, false).expect("recording");
        let call = Im2colCall {
            conv,
            input: ConvInput::ChannelRows(Mat::new(&xb, 4, 16)),
            out: Mat::new(&out, 2, 32),
        };
        assert!(k.im2col(&mut rec, &call).is_err());
    }
}
