//! `combs_generate`: the generation loop (`runtime::generate`) with each
//! token's text streamed to a C callback.

use std::ffi::{c_char, c_void};

use super::args::{handle_mut, invalid};
use super::combs_token;
use super::guard::{Failure, guard};
use super::sampler::combs_sampler;
use super::session::combs_session;
use super::status::combs_status;
use crate::error::ModelError;
use crate::runtime::{StopReason, generate};

/// Receives each generated token `t` and the text it completes: `len` bytes
/// of UTF-8 at `piece`, followed by a NUL (the text may be empty when `t`
/// holds only part of a character; it arrives with the token that completes
/// it). `piece` is valid only during the call. Return true to go on, false
/// to stop. The callback must not unwind (no C++ exception, no longjmp)
/// through combs and must not use the session or sampler being generated with.
pub type combs_token_callback = Option<
    unsafe extern "C" fn(
        t: combs_token,
        piece: *const c_char,
        len: usize,
        user_data: *mut c_void,
    ) -> bool,
>;

/// Generates up to `max_tokens` tokens after what the session holds (prefill
/// a prompt first): samples from the session's logits with `smp`, stops at an
/// end-of-generation token (which is neither passed to `cb` nor added to the
/// session), passes each other token and its text to `cb` (NULL: no
/// callback), and evaluates it so the session holds it. When `cb` returns
/// false, generation stops and that token is not evaluated (the session ends
/// with the token before it). The tokens of the prompt are not shown to the
/// sampler's repetition penalty; use `combs_sampler_accept` for that.
/// Each step draws the next token as `combs_session_decode_sample` does (on
/// the device when the chain needs only the best logits), so after a stop
/// at an end token or by `cb` the session's logits may not have been read
/// back (`combs_session_logits` says so); another `combs_generate` with a
/// sampler of the same top_k continues from the step's kept candidates.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s` or `smp`, a session without
/// logits, a session whose last step sampled on the device with a sampler
/// that needs more of the row than it kept), `COMBS_ERR_CONTEXT_FULL` (the context filled up: every token
/// made so far was passed to `cb`, the last one was not evaluated),
/// `COMBS_ERR_OUT_OF_MEMORY` / `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `s` and `smp` are NULL or live handles used by no other thread; `cb` is
/// NULL or a function as `combs_token_callback` describes; `user_data` is
/// passed through untouched.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_generate(
    s: *mut combs_session,
    smp: *mut combs_sampler,
    max_tokens: usize,
    cb: combs_token_callback,
    user_data: *mut c_void,
) -> combs_status {
    guard("combs_generate", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        // SAFETY: per this function's contract.
        let smp = unsafe { handle_mut(smp, "smp") }?;
        if !s.logits_valid {
            return Err(invalid(
                "s",
                "the session has no logits to sample from: prefill a prompt first",
            ));
        }
        let tokenizer = s.model.tokenizer().clone();
        let mut text_buf: Vec<u8> = Vec::new();
        let r = generate(
            &mut s.session,
            &tokenizer,
            &mut smp.sampler,
            max_tokens,
            |t, text| match cb {
                None => true,
                Some(f) => {
                    text_buf.clear();
                    text_buf.extend_from_slice(text.as_bytes());
                    text_buf.push(0);
                    // SAFETY: f is a valid callback per the contract; the piece
                    // is NUL-terminated and outlives the call.
                    unsafe {
                        f(
                            t as combs_token,
                            text_buf.as_ptr().cast(),
                            text.len(),
                            user_data,
                        )
                    }
                }
            },
        );
        let stats = s.after_eval(r)?;
        if stats.stop == StopReason::ContextFull {
            let n_ctx = s.session.n_ctx();
            return Err(Failure::from(ModelError::ContextFull {
                n_ctx,
                requested: n_ctx + 1,
            })
            .context(format!("after {} generated tokens", stats.n_tokens)));
        }
        Ok(())
    })
}
