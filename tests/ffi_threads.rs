//! The C API under threads (issue 21, item 3): eight threads share one
//! model (the tiny SmolVLM text model of `tests/fixtures/vlm/`), each
//! running its own seeded random schedule of session calls — create
//! (contiguous or paged), prefill, greedy decode, fork, rewind, free — while
//! a ninth thread runs batched prefill and decode on paged sessions of the
//! same model. Every call's result (status, length, greedy token, a hash of
//! the full logits) is logged, and the logs must equal those of the same
//! nine schedules run one after another on one thread. Greedy decoding makes
//! the work deterministic, so any race in shared state (the model's weights
//! and scratch, its page pools, the tokenizer) shows as a difference.
//!
//! Leak check of the same work (about 80 s on lavapipe with 6 steps per
//! schedule, too slow for the default run): build with `cargo test
//! --release --test ffi_threads --no-run`, then
//!
//! ```text
//! COMBS_FFI_THREADS_STEPS=6 valgrind --leak-check=full \
//!   --errors-for-leak-kinds=definite --error-exitcode=9 \
//!   --suppressions=examples/c/valgrind.supp \
//!   target/release/deps/ffi_threads-<hash> --test-threads=1
//! ```
//!
//! which reports 0 errors, 0 bytes definitely or indirectly lost.

mod common;
mod ffi_support;

use std::ffi::CString;
use std::path::Path;
use std::ptr;

use combs::ffi::*;
use common::Rng;
use ffi_support::{last_error, ok};

use combs_status::*;

const THREADS: usize = 8;
const STEPS: usize = 100;
const BATCH_STEPS: usize = 24;
const N_CTX: u32 = 48;
const PAGE_SIZE: u32 = 16;
/// Sessions one thread holds at most.
const MAX_LIVE: usize = 3;

struct Model(*mut combs_runtime, *mut combs_model);

// SAFETY: a model may be used by several threads at once (combs.h); the
// runtime handle is only freed after every thread is joined.
unsafe impl Sync for Model {}

impl Model {
    fn load() -> Model {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vlm/smolvlm-tiny.gguf");
        let p = CString::new(p.to_string_lossy().into_owned()).expect("no NUL");
        let (mut rt, mut m) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: valid out-pointers, a NUL-terminated path.
        unsafe {
            ok(combs_runtime_create(ptr::null(), &mut rt));
            ok(combs_model_load(rt, p.as_ptr(), ptr::null(), &mut m));
        }
        Model(rt, m)
    }

    fn n_vocab(&self) -> usize {
        // SAFETY: a live model.
        unsafe { combs_model_n_vocab(self.1) as usize }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: from their create functions, freed once.
        unsafe {
            combs_model_free(self.1);
            combs_runtime_free(self.0);
        }
    }
}

fn session_options(paged: bool) -> combs_session_options {
    let mut o = combs_session_default_options();
    o.n_ctx = N_CTX;
    o.n_batch = 8;
    if paged {
        o.kv_kind = combs_kv_kind::COMBS_KV_PAGED;
        o.page_size = PAGE_SIZE;
        // Room for every thread's sessions at once (the first paged
        // session of this page size sizes the shared pool).
        o.pool_pages = 512;
    }
    o
}

/// One logged result.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Created(bool),
    Prefilled {
        len: usize,
        logits: u64,
    },
    Decoded {
        token: combs_token,
        len: usize,
        logits: u64,
    },
    Forked {
        len: usize,
    },
    Rewound {
        len: usize,
    },
    Freed,
    Batch {
        tokens: Vec<combs_token>,
        logits: Vec<u64>,
    },
}

/// FNV-1a over the bits of every logit.
fn hash_logits(s: *const combs_session, n_vocab: usize) -> u64 {
    // SAFETY: a live session that was just evaluated: n_vocab floats.
    let l = unsafe { combs_session_logits(s) };
    assert!(!l.is_null(), "{}", last_error());
    // SAFETY: as above.
    let l = unsafe { std::slice::from_raw_parts(l, n_vocab) };
    l.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
    })
}

fn argmax(s: *const combs_session, n_vocab: usize) -> combs_token {
    // SAFETY: as in hash_logits.
    let l = unsafe { std::slice::from_raw_parts(combs_session_logits(s), n_vocab) };
    (0..n_vocab).fold(0, |b, i| if l[i] > l[b] { i } else { b }) as combs_token
}

/// A live session of a schedule: its handle, length and whether it has logits.
struct Live {
    s: *mut combs_session,
    len: usize,
    logits: bool,
}

/// One thread's schedule, seeded by `seed`: the choice of each step depends
/// only on the generator and the sessions' lengths, never on the results,
/// so a serial and a threaded run do the same calls.
fn run_schedule(m: &Model, seed: u64) -> Vec<Event> {
    let n_vocab = m.n_vocab();
    let mut rng = Rng::seeded(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut log = Vec::new();
    for _ in 0..steps() {
        let op = if live.is_empty() { 0 } else { rng.below(8) };
        // SAFETY (this loop): every handle in `live` is this thread's own,
        // created here and freed once; the model is shared read-only.
        unsafe {
            match op {
                0 if live.len() < MAX_LIVE => {
                    let paged = rng.below(2) == 1;
                    let mut s = ptr::null_mut();
                    ok(combs_session_create(m.1, &session_options(paged), &mut s));
                    live.push(Live {
                        s,
                        len: 0,
                        logits: false,
                    });
                    log.push(Event::Created(paged));
                }
                1 if live.len() < MAX_LIVE => {
                    let i = rng.below(live.len());
                    let mut f = ptr::null_mut();
                    ok(combs_session_fork(live[i].s, &mut f));
                    let (len, logits) = (live[i].len, live[i].logits);
                    assert_eq!(combs_session_len(f), len);
                    live.push(Live { s: f, len, logits });
                    log.push(Event::Forked { len });
                }
                2 => {
                    let i = rng.below(live.len());
                    let n_keep = rng.below(live[i].len + 1);
                    ok(combs_session_rewind(live[i].s, n_keep));
                    if n_keep < live[i].len {
                        live[i].logits = false;
                    }
                    live[i].len = n_keep;
                    log.push(Event::Rewound {
                        len: combs_session_len(live[i].s),
                    });
                }
                3 => {
                    let i = rng.below(live.len());
                    combs_session_free(live.swap_remove(i).s);
                    log.push(Event::Freed);
                }
                _ => {
                    let i = rng.below(live.len());
                    let l = &mut live[i];
                    if l.logits && rng.below(3) != 0 && l.len < N_CTX as usize {
                        let t = argmax(l.s, n_vocab);
                        ok(combs_session_decode(l.s, t));
                        l.len += 1;
                        let len = combs_session_len(l.s);
                        log.push(Event::Decoded {
                            token: t,
                            len,
                            logits: hash_logits(l.s, n_vocab),
                        });
                    } else {
                        let n = 1 + rng.below(12);
                        if l.len + n > N_CTX as usize {
                            ok(combs_session_rewind(l.s, 0));
                            l.len = 0;
                        }
                        let toks: Vec<combs_token> =
                            (0..n).map(|_| rng.below(n_vocab) as combs_token).collect();
                        ok(combs_session_prefill(l.s, toks.as_ptr(), n));
                        l.len += n;
                        l.logits = true;
                        let len = combs_session_len(l.s);
                        log.push(Event::Prefilled {
                            len,
                            logits: hash_logits(l.s, n_vocab),
                        });
                    }
                }
            }
        }
    }
    for l in live {
        // SAFETY: this thread's own session, freed once.
        unsafe { combs_session_free(l.s) };
    }
    log
}

/// The batching thread: three paged sessions prefilled together with
/// prompts of different lengths, then greedy batched decode steps; one
/// session is rewound and refilled halfway.
fn run_batch(m: &Model, seed: u64) -> Vec<Event> {
    let n_vocab = m.n_vocab();
    let mut rng = Rng::seeded(seed);
    let mut ss = [ptr::null_mut(); 3];
    let mut log = Vec::new();
    // SAFETY: this thread's own sessions; the model is shared read-only.
    unsafe {
        for s in &mut ss {
            ok(combs_session_create(m.1, &session_options(true), s));
        }
        let prompts: Vec<Vec<combs_token>> = (0..3)
            .map(|i| {
                (0..3 + 4 * i)
                    .map(|_| rng.below(n_vocab) as combs_token)
                    .collect()
            })
            .collect();
        let ptrs: Vec<*const combs_token> = prompts.iter().map(|p| p.as_ptr()).collect();
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        ok(combs_batch_prefill(
            m.1,
            ss.as_ptr(),
            ptrs.as_ptr(),
            lens.as_ptr(),
            3,
        ));
        for step in 0..BATCH_STEPS {
            if step == BATCH_STEPS / 2 {
                ok(combs_session_rewind(ss[1], 2));
                ok(combs_session_prefill(ss[1], [7, 8, 9].as_ptr(), 3));
            }
            let tokens: Vec<combs_token> = ss.iter().map(|&s| argmax(s, n_vocab)).collect();
            ok(combs_batch_decode(m.1, ss.as_ptr(), tokens.as_ptr(), 3));
            let logits = ss.iter().map(|&s| hash_logits(s, n_vocab)).collect();
            log.push(Event::Batch { tokens, logits });
        }
        for s in ss {
            combs_session_free(s);
        }
    }
    log
}

/// Steps per schedule: `COMBS_FFI_THREADS_STEPS` or `STEPS` (fewer under
/// valgrind, which runs lavapipe some fifty times slower).
fn steps() -> usize {
    std::env::var("COMBS_FFI_THREADS_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STEPS)
}

/// Thread `i`'s seed: fresh every run (printed for replay), the same for
/// the serial and the threaded run of one test.
fn seed(base: u64, i: usize) -> u64 {
    base.wrapping_add(i as u64)
}

#[test]
fn ffi_eight_threads_and_a_batch_match_serial() {
    let m = Model::load();
    let base = Rng::fresh("ffi_threads").next_u64();
    let t0 = std::time::Instant::now();
    let serial: Vec<Vec<Event>> = (0..THREADS)
        .map(|i| run_schedule(&m, seed(base, i)))
        .chain([run_batch(&m, seed(base, THREADS))])
        .collect();
    let t_serial = t0.elapsed();
    let t0 = std::time::Instant::now();
    let threaded: Vec<Vec<Event>> = std::thread::scope(|scope| {
        let m = &m;
        let mut hs: Vec<_> = (0..THREADS)
            .map(|i| scope.spawn(move || run_schedule(m, seed(base, i))))
            .collect();
        hs.push(scope.spawn(move || run_batch(m, seed(base, THREADS))));
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    eprintln!(
        "serial {:.1} s, threaded {:.1} s, {} calls logged",
        t_serial.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        serial.iter().map(Vec::len).sum::<usize>()
    );
    // Every kind of call happened somewhere.
    let all: Vec<&Event> = serial.iter().flatten().collect();
    for (what, f) in [
        (
            "create paged",
            &(|e: &Event| *e == Event::Created(true)) as &dyn Fn(&Event) -> bool,
        ),
        ("create contiguous", &|e| *e == Event::Created(false)),
        ("prefill", &|e| matches!(e, Event::Prefilled { .. })),
        ("decode", &|e| matches!(e, Event::Decoded { .. })),
        ("fork", &|e| matches!(e, Event::Forked { .. })),
        ("rewind", &|e| matches!(e, Event::Rewound { .. })),
        ("free", &|e| *e == Event::Freed),
    ] {
        assert!(all.iter().any(|e| f(e)), "no {what} in the schedules");
    }
    for (i, (a, b)) in serial.iter().zip(&threaded).enumerate() {
        assert_eq!(a, b, "thread {i}: threaded results differ from serial");
    }
    // The page pool is empty again: every session was freed.
    let mut s = ptr::null_mut();
    let mut st = combs_page_stats::default();
    // SAFETY: live model, valid out-pointers; the session is freed once.
    unsafe {
        ok(combs_session_create(m.1, &session_options(true), &mut s));
        ok(combs_session_page_stats(s, &mut st));
        combs_session_free(s);
    }
    assert_eq!((st.sequences, st.pages_used), (1, 0), "{st:?}");
    let _ = COMBS_OK;
}
