//! `combs_batch_decode` and `combs_batch_prefill`: many sessions of one
//! model advanced in shared forward passes (one read of the weights serves
//! every sequence). The sessions must be paged and share one page size.

use std::sync::Arc;

use super::args::{array, handle, invalid, tokens};
use super::combs_token;
use super::guard::{FfiResult, guard};
use super::model::combs_model;
use super::session::{combs_session, leaves_session_unchanged};
use super::status::combs_status;
use crate::error::ModelError;
use crate::runtime::Session;

/// The model and the array of session pointers of a batch call, checked for
/// NULL (the sessions themselves are checked by [`batch_sessions`]).
///
/// # Safety
/// `m` is NULL or a live model; `sessions` is NULL or valid for `n` reads.
unsafe fn batch_args<'a>(
    m: *mut combs_model,
    sessions: *const *mut combs_session,
    n: usize,
) -> FfiResult<(&'a combs_model, &'a [*mut combs_session])> {
    // SAFETY: per this function's contract.
    let m = unsafe { handle(m, "m") }?;
    // SAFETY: per this function's contract.
    Ok((m, unsafe { array(sessions, n, "sessions") }?))
}

/// Checks the session pointers of a batch call and borrows the sessions.
///
/// # Safety
/// Each pointer is NULL or a live session used by no other thread.
unsafe fn batch_sessions<'a>(
    m: &combs_model,
    ptrs: &[*mut combs_session],
) -> FfiResult<Vec<&'a mut combs_session>> {
    let mut out = Vec::with_capacity(ptrs.len());
    for (i, &sp) in ptrs.iter().enumerate() {
        if sp.is_null() {
            return Err(invalid("sessions", format!("sessions[{i}] is NULL")));
        }
        if ptrs[..i].contains(&sp) {
            return Err(invalid(
                "sessions",
                format!("sessions[{i}] is listed twice"),
            ));
        }
        // SAFETY: non-NULL, live and unaliased (checked above) per the contract.
        let s = unsafe { &mut *sp };
        if !Arc::ptr_eq(&s.model, &m.model) {
            return Err(invalid(
                "sessions",
                format!("sessions[{i}] belongs to another model"),
            ));
        }
        out.push(s);
    }
    Ok(out)
}

/// Runs a batched call and records its outcome in every session's logits flag.
fn run_batch(
    sessions: &mut [&mut combs_session],
    f: impl FnOnce(&mut [&mut Session]) -> Result<(), ModelError>,
) -> FfiResult<()> {
    let mut inner: Vec<&mut Session> = sessions.iter_mut().map(|s| &mut s.session).collect();
    let r = f(&mut inner);
    let valid = match &r {
        Ok(()) => Some(true),
        Err(e) if leaves_session_unchanged(e) => None,
        Err(_) => Some(false),
    };
    if let Some(v) = valid {
        for s in sessions.iter_mut() {
            s.logits_valid = v;
        }
    }
    r.map_err(Into::into)
}

/// Evaluates `tokens[i]` after what `sessions[i]` holds, for `n` sessions of
/// model `m`, in one forward pass (a few, for very large `n`): the weights
/// are read once for all of them, so throughput grows with `n`. Sessions
/// must be created with `COMBS_KV_PAGED` and one page size, each listed at
/// most once. Afterwards `combs_session_logits(sessions[i])` gives the
/// logits of `tokens[i]`. `n` 0 does nothing.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m`, NULL `sessions` or `tokens` with
/// `n` > 0, a NULL session, a session of another model, listed twice, with a
/// contiguous cache or another page size, a token out of range — the
/// message gives the index), `COMBS_ERR_CONTEXT_FULL` (a session holds its
/// `n_ctx` tokens), `COMBS_ERR_OUT_OF_MEMORY` (the page pool has no free
/// page left for some session). After these nothing was evaluated and every
/// session is unchanged. `COMBS_ERR_DEVICE`: the device failed.
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
        let (m, ptrs) = unsafe { batch_args(m, sessions, n) }?;
        // SAFETY: per this function's contract.
        let ts = unsafe { array(tokens, n, "tokens") }?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract.
        let mut ss = unsafe { batch_sessions(m, ptrs) }?;
        let ids = self::tokens(ts, m.model.spec().n_vocab, "tokens")?;
        run_batch(&mut ss, |inner| m.model.decode_batch(inner, &ids))
    })
}

/// Evaluates prompt `i` (`n_tokens[i]` tokens at `tokens[i]`) after what
/// `sessions[i]` holds, for `n` paged sessions of model `m`, packing the
/// prompts into shared forward passes. Afterwards each session's logits are
/// those of its prompt's last token; a session with an empty prompt is left
/// as it was. Same session rules as `combs_batch_decode`.
///
/// # Errors
/// As `combs_batch_decode` (`tokens[i]` may be NULL only when `n_tokens[i]`
/// is 0).
///
/// # Safety
/// `m` is NULL or a live model; `sessions`, `tokens` and `n_tokens` are valid
/// for `n` reads and each `tokens[i]` for `n_tokens[i]` reads; each session is
/// NULL or live and used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_batch_prefill(
    m: *mut combs_model,
    sessions: *const *mut combs_session,
    tokens: *const *const combs_token,
    n_tokens: *const usize,
    n: usize,
) -> combs_status {
    guard("combs_batch_prefill", || {
        // SAFETY: per this function's contract.
        let (m, ptrs) = unsafe { batch_args(m, sessions, n) }?;
        // SAFETY: per this function's contract.
        let lists = unsafe { array(tokens, n, "tokens") }?;
        // SAFETY: per this function's contract.
        let lens = unsafe { array(n_tokens, n, "n_tokens") }?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract.
        let mut ss = unsafe { batch_sessions(m, ptrs) }?;
        let n_vocab = m.model.spec().n_vocab;
        let mut prompts = Vec::with_capacity(n);
        for (i, (&p, &len)) in lists.iter().zip(lens).enumerate() {
            // SAFETY: valid for `len` reads per the contract.
            let ts = unsafe { array(p, len, "tokens") }
                .map_err(|e| e.context(format!("tokens[{i}]")))?;
            prompts.push(
                self::tokens(ts, n_vocab, "tokens")
                    .map_err(|e| e.context(format!("tokens[{i}]")))?,
            );
        }
        let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        run_batch(&mut ss, |inner| m.model.prefill_batch(inner, &views))
    })
}
