//! `combs_batch_decode` and `combs_batch_prefill`: many sessions of one
//! model advanced in shared forward passes (one read of the weights serves
//! every sequence). The sessions must be paged and share one page size.

use std::sync::Arc;

use super::args::{array, handle, invalid, tokens};
use super::combs_token;
use super::guard::{FfiResult, guard};
use super::model::combs_model;
use super::sampler::combs_sampler;
use super::session::{combs_session, leaves_session_unchanged};
use super::status::combs_status;
use crate::error::ModelError;
use crate::runtime::{Sampler, Session};

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

/// Checks that no pointer of the array `name` is NULL or listed twice.
fn distinct_handles<T>(ptrs: &[*mut T], name: &'static str) -> FfiResult<()> {
    for (i, &p) in ptrs.iter().enumerate() {
        if p.is_null() {
            return Err(invalid(name, format!("{name}[{i}] is NULL")));
        }
        if ptrs[..i].contains(&p) {
            return Err(invalid(name, format!("{name}[{i}] is listed twice")));
        }
    }
    Ok(())
}

/// Checks the session pointers of a batch call and borrows the sessions.
///
/// # Safety
/// Each pointer is NULL or a live session used by no other thread.
unsafe fn batch_sessions<'a>(
    m: &combs_model,
    ptrs: &[*mut combs_session],
) -> FfiResult<Vec<&'a mut combs_session>> {
    distinct_handles(ptrs, "sessions")?;
    let mut out = Vec::with_capacity(ptrs.len());
    for (i, &sp) in ptrs.iter().enumerate() {
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

/// `combs_batch_decode`, then draws each session's next token with
/// `samplers[i]` into `out[i]` (each sampler remembers its token, as
/// `combs_sampler_sample` does). When every sampler's chain depends only on
/// the best few logits (greedy, or a top_k > 0 without a repeat penalty
/// below 1), the device selects them and the rows of logits are not read
/// back (for 64 sequences of a 128k vocabulary, 32 MB a step):
/// `combs_session_logits` then fails for these sessions until their next
/// evaluation. Otherwise the rows are read and sampled on the host. The
/// tokens are those `combs_batch_decode` + `combs_sampler_sample` would
/// give. Each sampler may be listed once. `out` may be `tokens` (a loop
/// feeding each step's draws to the next).
///
/// # Errors
/// As `combs_batch_decode`; also `COMBS_ERR_INVALID_ARGUMENT` for NULL
/// `samplers` or `out` with `n` > 0, a NULL sampler or one listed twice
/// (nothing is evaluated then).
///
/// # Safety
/// As `combs_batch_decode`; `samplers` is valid for `n` reads, each sampler
/// NULL or live and used by no other thread; `out` is valid for `n` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_batch_decode_sample(
    m: *mut combs_model,
    sessions: *const *mut combs_session,
    samplers: *const *mut combs_sampler,
    tokens: *const combs_token,
    n: usize,
    out: *mut combs_token,
) -> combs_status {
    guard("combs_batch_decode_sample", || {
        // SAFETY: per this function's contract.
        let (m, ptrs) = unsafe { batch_args(m, sessions, n) }?;
        // SAFETY: per this function's contract.
        let ts = unsafe { array(tokens, n, "tokens") }?;
        // SAFETY: per this function's contract.
        let sps = unsafe { array(samplers, n, "samplers") }?;
        if n == 0 {
            return Ok(());
        }
        if out.is_null() {
            return Err(invalid("out", format!("is NULL but {n} tokens are drawn")));
        }
        distinct_handles(sps, "samplers")?;
        let mut smps: Vec<&mut Sampler> = sps
            .iter()
            // SAFETY: non-NULL, live and unaliased (checked above) per the contract.
            .map(|&sp| unsafe { &mut (*sp).sampler })
            .collect();
        // SAFETY: per this function's contract.
        let mut ss = unsafe { batch_sessions(m, ptrs) }?;
        let ids = self::tokens(ts, m.model.spec().n_vocab, "tokens")?;
        let mut drawn = Vec::new();
        run_batch(&mut ss, |inner| {
            drawn = m.model.decode_batch_sample(inner, &ids, &mut smps)?;
            Ok(())
        })?;
        for (i, &t) in drawn.iter().enumerate().take(n) {
            // SAFETY: non-NULL and valid for n writes per the contract; raw
            // writes, as `out` may be `tokens` (read and copied above).
            unsafe { out.add(i).write(t as combs_token) };
        }
        Ok(())
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
