//! The recording's hazard tracking: barriers before dispatches order
//! dispatches only, so a later copy of a buffer written before such a
//! barrier must still get one of its own, and the data it copies must be
//! what the dispatch wrote.

mod common;

use std::sync::Arc;

use combs::gpu::{Binding, Buffer, Kernel, MemoryKind, Recording, upload_new};
use combs::ops::params::CopyParams;
use common::{Rng, gpu};

/// `dst = src` by the copy kernel (a dispatch, not a transfer).
fn copy_dispatch(rec: &mut Recording, src: &Arc<Buffer>, dst: &Arc<Buffer>, words: usize) {
    let params = CopyParams {
        n_words: words as u32,
    };
    rec.dispatch(
        Kernel::CopyU32x4,
        &[64],
        &[Binding::read(src), Binding::write(dst)],
        bytemuck::bytes_of(&params),
        [4, 1, 1],
    )
    .expect("dispatch");
}

#[test]
fn copies_after_dispatch_only_barriers_wait_for_their_writers() {
    let ctx = gpu();
    let mut rng = Rng::fresh("barriers");
    let n = 4096usize;
    let vals: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let bytes = (4 * n) as u64;
    let a = upload_new(&ctx, bytemuck::cast_slice(&vals), "a").expect("upload");
    let b = Buffer::new(&ctx, bytes, MemoryKind::Device, "b").expect("buffer");
    let c = Buffer::new(&ctx, bytes, MemoryKind::Device, "c").expect("buffer");
    let out_b = Buffer::new(&ctx, bytes, MemoryKind::Readback, "out b").expect("buffer");
    let out_c = Buffer::new(&ctx, bytes, MemoryKind::Readback, "out c").expect("buffer");

    let mut rec = Recording::new(&ctx, false).expect("recording");
    copy_dispatch(&mut rec, &a, &b, n / 4);
    assert_eq!(rec.n_barriers(), 0);
    // Reads b: a barrier for dispatches.
    copy_dispatch(&mut rec, &b, &c, n / 4);
    assert_eq!(rec.n_barriers(), 1);
    // b was written before that barrier, which did not order copies: the
    // copy needs a full barrier even though nothing wrote b since.
    rec.copy(&b, 0, &out_b, 0, bytes).expect("copy");
    assert_eq!(rec.n_barriers(), 2);
    // That full barrier ordered the writer of c too.
    rec.copy(&c, 0, &out_c, 0, bytes).expect("copy");
    assert_eq!(rec.n_barriers(), 2);
    // A dispatch writing c, which the copy reads: it waits for the copy.
    copy_dispatch(&mut rec, &a, &c, n / 4);
    assert_eq!(rec.n_barriers(), 3);
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");

    for out in [&out_b, &out_c] {
        let mut got = vec![0.0f32; n];
        out.read_slice(0, &mut got).expect("read");
        assert_eq!(got, vals);
    }
}

#[test]
fn independent_dispatches_share_a_barrier_interval() {
    let ctx = gpu();
    let n = 1024usize;
    let bytes = (4 * n) as u64;
    let a = upload_new(&ctx, &vec![0u8; 4 * n], "a").expect("upload");
    let bufs: Vec<Arc<Buffer>> = (0..3)
        .map(|_| Buffer::new(&ctx, bytes, MemoryKind::Device, "x").expect("buffer"))
        .collect();
    let mut rec = Recording::new(&ctx, false).expect("recording");
    for b in &bufs {
        copy_dispatch(&mut rec, &a, b, n / 4);
    }
    assert_eq!(rec.n_barriers(), 0);
    copy_dispatch(&mut rec, &bufs[0], &bufs[1], n / 4);
    assert_eq!(rec.n_barriers(), 1);
}
