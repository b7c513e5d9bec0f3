//! `combs_sampler`: picks the next token from logits — repetition penalty,
//! top-k, top-p, min-p, temperature and a seeded draw, in llama.cpp's
//! default order; greedy when the temperature is 0.

use super::args::{array, guard_create, guard_free, handle_mut, invalid, options};
use super::combs_token;
use super::guard::{guard, guard_const, guard_value};
use super::status::combs_status;
use crate::runtime::{Sampler, SamplerOptions};

/// Sampling parameters; start from `combs_sampler_default_options()`.
/// Fields may be appended, never reordered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_sampler_options {
    /// 0: greedy (argmax); otherwise logits are divided by it. Must be finite and >= 0.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 or less: all).
    pub top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches p; in [0, 1] (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one; in [0, 1] (0: none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this; > 0 (1: off).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at (0: none, -1: all).
    pub repeat_last_n: i32,
    /// Seed of the random draw: the same seed and inputs give the same tokens.
    pub seed: u64,
}

impl From<combs_sampler_options> for SamplerOptions {
    fn from(o: combs_sampler_options) -> Self {
        SamplerOptions {
            temperature: o.temperature,
            top_k: o.top_k,
            top_p: o.top_p,
            min_p: o.min_p,
            repeat_penalty: o.repeat_penalty,
            repeat_last_n: o.repeat_last_n,
            seed: o.seed,
        }
    }
}

/// A sampler: options, random state and the recent tokens the penalty sees.
pub struct combs_sampler {
    pub(crate) sampler: Sampler,
}

/// The default sampling options (llama.cpp's): temperature 0.8, top_k 40,
/// top_p 0.95, min_p 0.05, repeat_penalty 1 (off), repeat_last_n 64, a fixed seed.
#[unsafe(no_mangle)]
pub extern "C" fn combs_sampler_default_options() -> combs_sampler_options {
    let s = SamplerOptions::default();
    let d = combs_sampler_options {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        min_p: s.min_p,
        repeat_penalty: s.repeat_penalty,
        repeat_last_n: s.repeat_last_n,
        seed: s.seed,
    };
    guard_const("combs_sampler_default_options", d)
}

/// Creates a sampler. `opts` may be NULL for the defaults. On failure `*out`
/// is set to NULL.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `out`, or an option out of range (the
/// message names it): a negative or non-finite temperature, top_p or min_p
/// outside [0, 1], repeat_penalty not positive, repeat_last_n below -1.
///
/// # Safety
/// `opts` is NULL or points to a `combs_sampler_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_sampler_create(
    opts: *const combs_sampler_options,
    out: *mut *mut combs_sampler,
) -> combs_status {
    let make = || {
        // SAFETY: opts is NULL or a valid options struct (plain numbers only).
        let o = unsafe { options(opts, combs_sampler_default_options()) };
        let sampler = Sampler::new(o.into())?;
        Ok(combs_sampler { sampler })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_sampler_create", out, make) }
}

/// Releases a sampler (NULL: no-op).
///
/// # Safety
/// `smp` is NULL or a sampler from `combs_sampler_create()` not freed before
/// and not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_sampler_free(smp: *mut combs_sampler) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_sampler_free", smp) }
}

/// Draws a token from `n_vocab` logits (usually `combs_session_logits`) and
/// remembers it for the repetition penalty. Returns -1 (with
/// `combs_last_error()` set) when `smp` or `logits` is NULL or `n_vocab` is
/// 0 or above `INT32_MAX`.
///
/// # Safety
/// `smp` is NULL or a live sampler used by no other thread; `logits` is valid
/// for `n_vocab` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_sampler_sample(
    smp: *mut combs_sampler,
    logits: *const f32,
    n_vocab: usize,
) -> combs_token {
    guard_value(
        "combs_sampler_sample",
        -1,
        |_| -1,
        || {
            // SAFETY: per this function's contract.
            let smp = unsafe { handle_mut(smp, "smp") }?;
            if logits.is_null() {
                return Err(invalid("logits", "is NULL"));
            }
            if n_vocab == 0 || n_vocab > i32::MAX as usize {
                return Err(invalid(
                    "n_vocab",
                    format!("{n_vocab} is not in 1 ..= INT32_MAX"),
                ));
            }
            // SAFETY: non-NULL, and valid for n_vocab reads per the contract.
            let logits = unsafe { array(logits, n_vocab, "logits") }?;
            Ok(smp.sampler.sample(logits) as combs_token)
        },
    )
}

/// Tells the sampler about a token it did not draw (a prompt token, say), so
/// that the repetition penalty sees it.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `smp` or a negative `t`.
///
/// # Safety
/// `smp` is NULL or a live sampler used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_sampler_accept(
    smp: *mut combs_sampler,
    t: combs_token,
) -> combs_status {
    guard("combs_sampler_accept", || {
        // SAFETY: per this function's contract.
        let smp = unsafe { handle_mut(smp, "smp") }?;
        let t = u32::try_from(t).map_err(|_| invalid("t", format!("{t} is negative")))?;
        smp.sampler.accept(t);
        Ok(())
    })
}

/// Forgets the recent tokens and restarts the random draw from the seed.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `smp`.
///
/// # Safety
/// `smp` is NULL or a live sampler used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_sampler_reset(smp: *mut combs_sampler) -> combs_status {
    guard("combs_sampler_reset", || {
        // SAFETY: per this function's contract.
        unsafe { handle_mut(smp, "smp") }?.sampler.reset();
        Ok(())
    })
}
