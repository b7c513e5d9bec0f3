//! Helpers of the C API tests (`tests/ffi_*.rs`): the extern functions are
//! called exactly as a C program calls them, with raw pointers; these wrap
//! the repetitive parts (a runtime and model that free themselves, the last
//! error as a `String`, greedy generation of a few tokens).

#![allow(dead_code)]

use std::ffi::{CStr, CString};
use std::ptr;

use combs::ffi::*;

/// The last error of this thread.
pub fn last_error() -> String {
    // SAFETY: combs_last_error never returns NULL and the string is NUL-terminated.
    unsafe { CStr::from_ptr(combs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Panics with the status and last error unless `s` is `COMBS_OK`.
#[track_caller]
pub fn ok(s: combs_status) {
    assert_eq!(s, combs_status::COMBS_OK, "{}", last_error());
}

/// SmolLM2-135M-Instruct from the model cache; a missing file fails the test
/// with what to run.
pub fn model_path() -> CString {
    let p = combs::runtime::model::default_model_path();
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh --smollm2",
        p.display()
    );
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL in the path")
}

/// A runtime and the default model, freed on drop.
pub struct Loaded {
    pub rt: *mut combs_runtime,
    pub m: *mut combs_model,
}

// SAFETY: the handles may move between threads (the C API's contract); the
// model is only read.
unsafe impl Send for Loaded {}
// SAFETY: as above: a model may be used by several threads at once.
unsafe impl Sync for Loaded {}

impl Loaded {
    /// Opens the first device and loads the default model.
    pub fn new() -> Self {
        let mut rt = ptr::null_mut();
        let mut m = ptr::null_mut();
        // SAFETY: valid out-pointers; NULL options mean the defaults.
        unsafe {
            let s = combs_runtime_create(ptr::null(), &mut rt);
            assert_eq!(
                s,
                combs_status::COMBS_OK,
                "no Vulkan device: {} (install mesa-vulkan-drivers for lavapipe)",
                last_error()
            );
            ok(combs_model_load(
                rt,
                model_path().as_ptr(),
                ptr::null(),
                &mut m,
            ));
        }
        Loaded { rt, m }
    }

    /// Tokenizes `text` with special tokens added.
    pub fn tokenize(&self, text: &str) -> Vec<combs_token> {
        let mut n = 0usize;
        // SAFETY: text is valid for its length; cap 0 with a NULL buffer asks for the size.
        let s = unsafe {
            combs_tokenize(
                self.m,
                text.as_ptr().cast(),
                text.len(),
                true,
                ptr::null_mut(),
                0,
                &mut n,
            )
        };
        assert!(matches!(
            s,
            combs_status::COMBS_OK | combs_status::COMBS_ERR_BUFFER_TOO_SMALL
        ));
        let mut out = vec![0; n];
        // SAFETY: out holds n tokens.
        ok(unsafe {
            combs_tokenize(
                self.m,
                text.as_ptr().cast(),
                text.len(),
                true,
                out.as_mut_ptr(),
                n,
                &mut n,
            )
        });
        out.truncate(n);
        out
    }

    /// A session of `n_ctx` positions.
    pub fn session(&self, n_ctx: u32) -> *mut combs_session {
        let mut opts = combs_session_default_options();
        opts.n_ctx = n_ctx;
        let mut s = ptr::null_mut();
        // SAFETY: live model, valid options and out-pointer.
        ok(unsafe { combs_session_create(self.m, &opts, &mut s) });
        s
    }

    /// Number of logits per position.
    pub fn n_vocab(&self) -> usize {
        // SAFETY: live model.
        unsafe { combs_model_n_vocab(self.m) as usize }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: both came from their create functions and are freed once.
        unsafe {
            combs_model_free(self.m);
            combs_runtime_free(self.rt);
        }
    }
}

/// A greedy sampler.
pub fn greedy() -> *mut combs_sampler {
    let mut opts = combs_sampler_default_options();
    opts.temperature = 0.0;
    let mut smp = ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    ok(unsafe { combs_sampler_create(&opts, &mut smp) });
    smp
}

/// One greedy step on a prefilled session: sample, decode, return the token.
pub fn step(s: *mut combs_session, smp: *mut combs_sampler, n_vocab: usize) -> combs_token {
    // SAFETY: live handles; the logits hold n_vocab floats until the decode.
    unsafe {
        let logits = combs_session_logits(s);
        assert!(!logits.is_null(), "{}", last_error());
        let t = combs_sampler_sample(smp, logits, n_vocab);
        assert!(t >= 0, "{}", last_error());
        ok(combs_session_decode(s, t));
        t
    }
}

/// `n` greedy tokens after `prompt` on a fresh session of its own.
pub fn generate_alone(l: &Loaded, prompt: &str, n: usize) -> Vec<combs_token> {
    let toks = l.tokenize(prompt);
    let s = l.session(128);
    let smp = greedy();
    // SAFETY: live session; toks holds its length.
    ok(unsafe { combs_session_prefill(s, toks.as_ptr(), toks.len()) });
    let out = (0..n).map(|_| step(s, smp, l.n_vocab())).collect();
    // SAFETY: created above, freed once.
    unsafe {
        combs_sampler_free(smp);
        combs_session_free(s);
    }
    out
}
