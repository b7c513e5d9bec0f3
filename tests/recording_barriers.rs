//! The recording's hazard tracking: barriers before dispatches order
//! dispatches only, so a later copy of a buffer written before such a
//! barrier must still get one of its own, and the data it copies must be
//! what the dispatch wrote. A streaming recording submits pieces while it
//! records, and its barriers still order them.

mod common;

use std::sync::Arc;

use combs::gpu::{Binding, Buffer, HostStep, Kernel, MemoryKind, Recording, upload_new};
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

/// A ping-pong of copies between two buffers, `links` dispatches long,
/// starting from `a`: each link reads what the one before wrote, so the
/// result is `a`'s values only if every link ran after its predecessor.
fn ping_pong(
    rec: &mut Recording,
    a: &Arc<Buffer>,
    bufs: &[Arc<Buffer>; 2],
    links: usize,
    words: usize,
) {
    copy_dispatch(rec, a, &bufs[0], words);
    for i in 0..links {
        copy_dispatch(rec, &bufs[i % 2], &bufs[(i + 1) % 2], words);
    }
}

/// Fresh random values of `n` floats, uploaded, and the two buffers of a
/// ping-pong of them.
fn chain_buffers(
    ctx: &Arc<combs::gpu::GpuContext>,
    rng: &mut Rng,
    n: usize,
) -> (Vec<f32>, Arc<Buffer>, [Arc<Buffer>; 2]) {
    let vals: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let a = upload_new(ctx, bytemuck::cast_slice(&vals), "a").expect("upload");
    let bytes = (4 * n) as u64;
    let bufs = [0, 1].map(|_| Buffer::new(ctx, bytes, MemoryKind::Device, "x").expect("buffer"));
    (vals, a, bufs)
}

#[test]
fn streamed_pieces_run_in_order_and_replay() {
    let ctx = gpu();
    let mut rng = Rng::fresh("streamed");
    let n = 4096usize;
    let bytes = (4 * n) as u64;
    let links = 150 + (rng.normal().abs() * 20.0) as usize;
    let out = Buffer::new(&ctx, bytes, MemoryKind::Readback, "out").expect("buffer");
    let (vals, a, bufs) = chain_buffers(&ctx, &mut rng, n);
    let mut rec = Recording::streaming(&ctx).expect("recording");
    ping_pong(&mut rec, &a, &bufs, links, n / 4);
    rec.copy(&bufs[links % 2], 0, &out, 0, bytes).expect("copy");
    rec.finish().expect("finish");
    for pass in 0..2 {
        // The second pass is a replay, which submits every piece again.
        out.write_slice(0, &vec![0.0f32; n]).expect("clear");
        rec.submit_and_wait().expect("submit");
        let mut got = vec![0.0f32; n];
        out.read_slice(0, &mut got).expect("read");
        assert_eq!(got, vals, "pass {pass}, {links} links");
    }
}

#[test]
fn streaming_starts_the_gpu_before_the_recording_ends() {
    let ctx = gpu();
    let n = 1024usize;
    let vals: Vec<f32> = (0..n).map(|i| 1.0 + i as f32).collect();
    let a = upload_new(&ctx, bytemuck::cast_slice(&vals), "a").expect("upload");
    let early = Buffer::new(&ctx, (4 * n) as u64, MemoryKind::Readback, "early").expect("buffer");
    early.write_slice(0, &vec![0.0f32; n]).expect("clear");
    let mut rec = Recording::streaming(&ctx).expect("recording");
    // Enough dispatches for the first piece, the first of them writing
    // memory the host sees.
    copy_dispatch(&mut rec, &a, &early, n / 4);
    for _ in 0..8 {
        copy_dispatch(&mut rec, &a, &a, n / 4);
    }
    // Not finished, not submitted by the caller: the piece runs anyway.
    let t0 = std::time::Instant::now();
    let mut got = vec![0.0f32; n];
    loop {
        early.read_slice(0, &mut got).expect("read");
        if got == vals {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 30,
            "the first piece did not run before finish()"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
}

#[test]
fn a_host_step_after_streamed_pieces_sees_their_results() {
    let ctx = gpu();
    let mut rng = Rng::fresh("streamed host");
    let n = 2048usize;
    let bytes = (4 * n) as u64;
    let (vals, a, bufs) = chain_buffers(&ctx, &mut rng, n);
    let out = Buffer::new(&ctx, bytes, MemoryKind::Readback, "out").expect("buffer");
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut rec = Recording::streaming(&ctx).expect("recording");
    ping_pong(&mut rec, &a, &bufs, 40, n / 4);
    rec.copy(&bufs[0], 0, &out, 0, bytes).expect("copy");
    let (o, s) = (out.clone(), seen.clone());
    rec.host(HostStep::new("read", move |_| {
        let mut got = vec![0.0f32; n];
        o.read_slice(0, &mut got)?;
        *s.lock().expect("lock") = got;
        Ok(())
    }))
    .expect("host step");
    // Recorded after the host step: submitted at submit_and_wait.
    ping_pong(&mut rec, &a, &bufs, 9, n / 4);
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
    assert_eq!(*seen.lock().expect("lock"), vals);
}

#[test]
fn a_streaming_recording_dropped_unsubmitted_waits_for_its_pieces() {
    let ctx = gpu();
    let n = 1 << 16;
    let bytes = (4 * n) as u64;
    let a = upload_new(&ctx, &vec![7u8; 4 * n], "a").expect("upload");
    let bufs = [0, 1].map(|_| Buffer::new(&ctx, bytes, MemoryKind::Device, "x").expect("buffer"));
    for links in [3, 4, 40, 41] {
        let mut rec = Recording::streaming(&ctx).expect("recording");
        ping_pong(&mut rec, &a, &bufs, links, n / 4);
        // Dropped as an error part way through a call would drop it; the
        // validation layer fails the run if a pending buffer is freed.
        drop(rec);
    }
    // The device is still usable.
    let out = Buffer::new(&ctx, bytes, MemoryKind::Readback, "out").expect("buffer");
    let mut rec = Recording::streaming(&ctx).expect("recording");
    rec.copy(&a, 0, &out, 0, bytes).expect("copy");
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
    let mut got = vec![0u8; 4 * n];
    out.read_slice(0, &mut got).expect("read");
    assert!(got.iter().all(|&b| b == 7));
}
