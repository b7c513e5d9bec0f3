//! The top-k of logit rows (`glsl/topk.comp` and the host step CPU devices
//! run) against the CPU reference, on fresh random rows: one chunk and many
//! (a 128k vocabulary), k from 1 to the most, ties broken by index, NaN
//! skipped, -inf kept, rows with fewer candidates than k, a strided view.

mod common;

use std::sync::Arc;

use combs::gpu::{Buffer, GpuContext, MemoryKind, Recording, upload_new};
use combs::ops::Mat;
use combs::ops::backend::Kernels;
use combs::ops::host::HOST;
use combs::ops::topk::{
    MAX_TOP_K, TopKCall, decode_top_k, record_top_k, top_k_bucket, top_k_ref, top_k_scratch_bytes,
};
use common::{Rng, gpu};

/// Which implementation runs the call.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Vulkan,
    Host,
}

fn buffer(ctx: &Arc<GpuContext>, bytes: usize, kind: MemoryKind) -> Arc<Buffer> {
    Buffer::new(ctx, bytes.max(4) as u64, kind, "top-k test").expect("buffer")
}

/// Runs the top-k of `rows` rows of `cols` values held at `offset` with
/// stride `ld` in `data`, and returns each row's decoded list.
fn run_top_k(
    backend: Backend,
    data: &[f32],
    (rows, cols, ld, offset): (usize, usize, usize, usize),
    k: usize,
) -> Vec<Vec<(u32, f32)>> {
    let ctx = gpu();
    let x = match backend {
        Backend::Vulkan => upload_new(&ctx, bytemuck::cast_slice(data), "logits").expect("upload"),
        Backend::Host => {
            let b = buffer(&ctx, 4 * data.len(), MemoryKind::Readback);
            b.write_slice(0, data).expect("write");
            b
        }
    };
    let scratch = buffer(
        &ctx,
        top_k_scratch_bytes(&ctx, rows, cols, k) as usize,
        MemoryKind::Device,
    );
    let out = buffer(&ctx, rows * k * 8, MemoryKind::Readback);
    let mut rec = Recording::new(&ctx, false).expect("recording");
    // Columns offset.. of an ld-wide matrix: row r starts at offset + r * ld.
    let logits = Mat::new(&x, rows, ld).cols_at(offset, cols);
    let call = TopKCall {
        logits,
        k,
        scratch: &scratch,
        out: &out,
    };
    match backend {
        Backend::Vulkan => record_top_k(&mut rec, &call).expect("record"),
        Backend::Host => HOST.top_k(&mut rec, &call).expect("record"),
    }
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
    let mut words = vec![0u32; rows * k * 2];
    out.read_slice(0, &mut words).expect("read");
    words.chunks(k * 2).map(decode_top_k).collect()
}

/// Rows of logits: normal values, some rows drawn from a handful of levels
/// (many ties), with NaN, -inf and -0 sprinkled in.
fn logits(rng: &mut Rng, n: usize, ties: bool) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v = if ties {
                (rng.below(6) as f32) * 0.5
            } else {
                rng.normal() * 4.0
            };
            match rng.below(200) {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                2 => -0.0,
                _ => v,
            }
        })
        .collect()
}

fn check(backend: Backend, rng: &mut Rng, rows: usize, cols: usize, k: usize, ties: bool) {
    let ld = cols + rng.below(5);
    let offset = rng.below(ld - cols + 1);
    let data = logits(rng, rows * ld, ties);
    let got = run_top_k(backend, &data, (rows, cols, ld, offset), k);
    for (r, list) in got.iter().enumerate() {
        let row = &data[offset + r * ld..offset + r * ld + cols];
        let want = top_k_ref(row, k);
        let same = list.len() == want.len()
            && list
                .iter()
                .zip(&want)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1);
        assert!(
            same,
            "{backend:?} rows {rows} cols {cols} k {k} ties {ties}, row {r}:\n got {:?}\nwant {:?}",
            &list[..list.len().min(8)],
            &want[..want.len().min(8)]
        );
    }
}

#[test]
fn top_k_matches_ref() {
    let mut rng = Rng::fresh("top_k");
    for backend in [Backend::Vulkan, Backend::Host] {
        for (rows, cols, k) in [
            (3, 1000, 1),
            (5, 1000, 40),
            (2, 4096, 7),
            (4, 5000, 64),
            (2, 20_000, MAX_TOP_K),
            (3, 128_256, 40),
            (1, 128_256, 1),
        ] {
            for ties in [false, true] {
                check(backend, &mut rng, rows, cols, k, ties);
            }
        }
    }
}

/// A row with fewer candidates than k (short, or mostly NaN) ends its list
/// early; a row of NaN only has none.
#[test]
fn top_k_short_rows_end_early() {
    let mut rng = Rng::fresh("top_k_short");
    for backend in [Backend::Vulkan, Backend::Host] {
        check(backend, &mut rng, 2, 30, 64, false);
        let mut data = vec![f32::NAN; 3 * 9000];
        for i in 0..20 {
            data[9000 + rng.below(9000)] = i as f32;
        }
        data[2 * 9000 + 8999] = f32::NEG_INFINITY;
        let got = run_top_k(backend, &data, (3, 9000, 9000, 0), 32);
        assert!(got[0].is_empty(), "{backend:?}: {:?}", got[0]);
        assert_eq!(got[1], top_k_ref(&data[9000..18000], 32), "{backend:?}");
        assert_eq!(got[2], vec![(8999, f32::NEG_INFINITY)], "{backend:?}");
    }
}

/// Greedy draws select one candidate; more are rounded up (exact either
/// way), none past the most a step selects.
#[test]
fn top_k_buckets() {
    assert_eq!(top_k_bucket(1), Some(1));
    assert_eq!(top_k_bucket(2), Some(16));
    assert_eq!(top_k_bucket(40), Some(48));
    assert_eq!(top_k_bucket(MAX_TOP_K), Some(MAX_TOP_K));
    assert_eq!(top_k_bucket(MAX_TOP_K + 1), None);
}
