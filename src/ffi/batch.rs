//! `combs_batch_decode`: one decode step for many sequences in one forward
//! pass. It needs the paged KV cache, which is not implemented yet: the
//! arguments are validated and the call reports `COMBS_ERR_UNSUPPORTED`.

use std::sync::Arc;

use super::args::{array, failure, handle, invalid, token};
use super::combs_token;
use super::guard::guard;
use super::model::combs_model;
use super::session::combs_session;
use super::status::combs_status;

/// Evaluates `tokens[i]` after what `sessions[i]` holds, for `n` sessions of
/// model `m` at once (sessions created with `COMBS_KV_PAGED`, each at most
/// once per call). **Not available yet**: after validating its arguments it
/// returns `COMBS_ERR_UNSUPPORTED` (also for `n` 0, so
/// `combs_batch_decode(m, NULL, NULL, 0)` probes for support). Use one
/// `combs_session_decode` per session meanwhile.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m`, NULL `sessions` or `tokens` with
/// `n` > 0, a NULL session, a session of another model or listed twice, a
/// token out of range — the message gives the index),
/// `COMBS_ERR_UNSUPPORTED` (this build has no batched decoding).
///
/// # Safety
/// `m` is NULL or a live model; `sessions` and `tokens` are valid for `n`
/// reads; each session is NULL or live and used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_batch_decode(
    m: *mut combs_model,
    sessions: *const *mut combs_session,
    tokens: *const combs_token,
    n: usize,
) -> combs_status {
    guard("combs_batch_decode", || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        // SAFETY: per this function's contract.
        let sessions = unsafe { array(sessions, n, "sessions") }?;
        // SAFETY: per this function's contract.
        let tokens = unsafe { array(tokens, n, "tokens") }?;
        let n_vocab = m.model.spec().n_vocab;
        for (i, (&sp, &t)) in sessions.iter().zip(tokens).enumerate() {
            if sp.is_null() {
                return Err(invalid("sessions", format!("sessions[{i}] is NULL")));
            }
            if sessions[..i].contains(&sp) {
                return Err(invalid(
                    "sessions",
                    format!("sessions[{i}] is listed twice"),
                ));
            }
            // SAFETY: non-NULL and live per the contract.
            let s = unsafe { &*sp };
            if !Arc::ptr_eq(&s.model, &m.model) {
                return Err(invalid(
                    "sessions",
                    format!("sessions[{i}] belongs to another model"),
                ));
            }
            token(t, n_vocab).map_err(|e| e.context(format!("tokens[{i}]")))?;
        }
        Err(failure(
            combs_status::COMBS_ERR_UNSUPPORTED,
            "batched decoding needs the paged KV cache (COMBS_KV_PAGED), which this build \
             does not implement yet; call combs_session_decode for each session instead",
        ))
    })
}
