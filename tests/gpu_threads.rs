//! One context shared by threads that create pipelines while others submit
//! work: every submission completes and computes what it should. On an
//! NVIDIA H200, creating pipelines during a `vkQueueSubmit` sometimes left
//! the queue stalled for good (see `PipelineCache::gate`); this test
//! stalled there in 1 of 8 runs without the gate (the first, with the
//! driver's shader cache cold). Lavapipe never stalled: there it checks
//! that the threads do not deadlock each other.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

use combs::gpu::pipeline::get_pipeline;
use combs::gpu::{
    Binding, Buffer, DeviceClass, GpuContext, Kernel, MemoryKind, Recording, upload_new,
};
use combs::ops::params::CopyParams;
use common::{Rng, gpu};

/// Tells the test thread that a worker ended, by returning or by panicking.
struct Done(Sender<&'static str>, &'static str);

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.0.send(self.1);
    }
}

/// Workgroup size of the submitters' copy kernel.
const COPY_WG: u32 = 64;

/// Copies `src` (holding `want`) to a fresh readback buffer with the copy
/// kernel and checks the words.
fn copy_and_check(ctx: &Arc<GpuContext>, src: &Arc<Buffer>, want: &[u32]) {
    let dst = Buffer::new(ctx, 4 * want.len() as u64, MemoryKind::Readback, "dst").expect("buffer");
    let params = CopyParams {
        n_words: (want.len() / 4) as u32,
    };
    let mut rec = Recording::new(ctx, false).expect("recording");
    rec.dispatch(
        Kernel::CopyU32x4,
        &[COPY_WG],
        &[Binding::read(src), Binding::write(&dst)],
        bytemuck::bytes_of(&params),
        [8, 1, 1],
    )
    .expect("dispatch");
    rec.finish().expect("finish");
    rec.submit_and_wait().expect("submit");
    let mut got = vec![0u32; want.len()];
    dst.read_slice(0, &mut got).expect("read");
    assert!(got == want, "the copy kernel returned other words");
}

#[test]
fn pipelines_created_while_other_threads_submit() {
    let ctx = gpu();
    let mut rng = Rng::fresh("gpu_threads");
    // Distinct specializations are distinct pipelines: the integer matvec
    // (a large kernel, with a required subgroup size) at distinct numbers of
    // x's 32-blocks, which size its shared memory. A CPU device compiles
    // each in a fraction of a second, a GPU's driver in milliseconds.
    let per_thread: u32 = if ctx.caps().class() == DeviceClass::Cpu {
        6
    } else {
        200
    };
    let sg = ctx.caps().subgroup_size;
    let first = 1 + rng.below(64) as u32;
    let words: Vec<u32> = (0..4096).map(|_| rng.next_u64() as u32).collect();
    let src = upload_new(&ctx, bytemuck::cast_slice(&words), "src").expect("upload");
    // The submitters' pipeline exists before the creators start.
    get_pipeline(&ctx, Kernel::CopyU32x4, &[COPY_WG], 2, None).expect("pipeline");

    let creating = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    let (done_tx, done_rx) = channel::<&'static str>();
    let creators: Vec<_> = (0..2u32)
        .map(|t| {
            let (ctx, tx) = (ctx.clone(), done_tx.clone());
            std::thread::spawn(move || {
                let _done = Done(tx, "creator");
                for i in 0..per_thread {
                    // Thread t takes every other block count from `first` on.
                    let units = (first + 2 * i + t - 1) % 512 + 1;
                    let spec = [128, sg, 32, 2, 1, 1, units];
                    get_pipeline(&ctx, Kernel::MatvecQ40Q81Xf32, &spec, 7, Some(sg))
                        .expect("pipeline");
                }
            })
        })
        .collect();
    let submitters: Vec<_> = (0..3)
        .map(|_| {
            let (ctx, src, words) = (ctx.clone(), src.clone(), words.clone());
            let (creating, tx) = (creating.clone(), done_tx.clone());
            std::thread::spawn(move || {
                let _done = Done(tx, "submitter");
                let mut n = 0u32;
                while creating.load(Ordering::Relaxed) || n < 4 {
                    copy_and_check(&ctx, &src, &words);
                    n += 1;
                }
            })
        })
        .collect();
    drop(done_tx);

    // A stalled queue never returns from the fence waits: fail after a
    // bound instead of hanging the suite. The submitters stop once both
    // creators are done (or have panicked, which the joins report).
    let limit = Duration::from_secs(300);
    let (mut creators_left, mut left) = (creators.len(), creators.len() + submitters.len());
    while left > 0 {
        let wait = limit.saturating_sub(started.elapsed());
        let who = done_rx.recv_timeout(wait).unwrap_or_else(|_| {
            panic!("{left} threads still running after {limit:?}: the queue stalled")
        });
        left -= 1;
        if who == "creator" {
            creators_left -= 1;
            if creators_left == 0 {
                creating.store(false, Ordering::Relaxed);
            }
        }
    }
    for h in creators.into_iter().chain(submitters) {
        h.join().expect("thread panicked");
    }
}
