//! Sessions through the C API: two sessions on one model are independent
//! (interleaved steps give each one's tokens alone), sessions on two threads
//! give the serial results, and a session outlives its model handle.

mod ffi_support;

use std::ffi::{c_char, c_void};

use combs::ffi::*;
use ffi_support::{Loaded, generate_alone, greedy, ok, step};

const PROMPTS: [&str; 2] = ["The capital of France is", "def fibonacci(n):"];
const N: usize = 6;

#[test]
fn ffi_two_sessions_interleaved_match_alone() {
    let l = Loaded::new();
    let alone: Vec<Vec<combs_token>> = PROMPTS.iter().map(|p| generate_alone(&l, p, N)).collect();
    assert_ne!(alone[0], alone[1]);

    let sessions: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let toks = l.tokenize(p);
            let s = l.session(128);
            // SAFETY: live session; toks holds its length.
            ok(unsafe { combs_session_prefill(s, toks.as_ptr(), toks.len()) });
            (s, greedy())
        })
        .collect();
    let mut got = vec![Vec::new(), Vec::new()];
    for _ in 0..N {
        for (i, &(s, smp)) in sessions.iter().enumerate() {
            got[i].push(step(s, smp, l.n_vocab()));
        }
    }
    assert_eq!(got, alone);
    for (s, smp) in sessions {
        // SAFETY: created above, freed once.
        unsafe {
            combs_sampler_free(smp);
            combs_session_free(s);
        }
    }
}

unsafe extern "C" fn collect(
    t: combs_token,
    piece: *const c_char,
    len: usize,
    user: *mut c_void,
) -> bool {
    // SAFETY: user is the Vec passed to combs_generate; piece holds len bytes and a NUL.
    unsafe {
        assert_eq!(*piece.add(len), 0, "pieces are NUL-terminated");
        (*user.cast::<Vec<combs_token>>()).push(t);
    }
    true
}

#[test]
fn ffi_two_threads_match_serial() {
    let l = Loaded::new();
    let serial: Vec<Vec<combs_token>> = PROMPTS.iter().map(|p| generate_alone(&l, p, N)).collect();
    let threaded: Vec<Vec<combs_token>> = std::thread::scope(|scope| {
        let handles: Vec<_> = PROMPTS
            .iter()
            .map(|p| {
                let l = &l;
                scope.spawn(move || {
                    let toks = l.tokenize(p);
                    let s = l.session(128);
                    let smp = greedy();
                    let mut out: Vec<combs_token> = Vec::new();
                    // SAFETY: this thread's own session and sampler; the model is shared read-only.
                    unsafe {
                        ok(combs_session_prefill(s, toks.as_ptr(), toks.len()));
                        ok(combs_generate(
                            s,
                            smp,
                            N,
                            Some(collect),
                            (&raw mut out).cast(),
                        ));
                        combs_sampler_free(smp);
                        combs_session_free(s);
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert_eq!(threaded, serial);
}

#[test]
fn ffi_session_outlives_model_handle() {
    let l = Loaded::new();
    let toks = l.tokenize(PROMPTS[0]);
    let n_vocab = l.n_vocab();
    let s = l.session(64);
    let smp = greedy();
    let want = generate_alone(&l, PROMPTS[0], 3);
    drop(l); // frees the model and the runtime handles
    // SAFETY: the session holds its own reference to the model.
    unsafe { ok(combs_session_prefill(s, toks.as_ptr(), toks.len())) };
    let got: Vec<_> = (0..3).map(|_| step(s, smp, n_vocab)).collect();
    assert_eq!(got, want);
    // SAFETY: created above, freed once.
    unsafe {
        combs_sampler_free(smp);
        combs_session_free(s);
    }
}
