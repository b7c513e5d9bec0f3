//! `combs_session`: one sequence on one model — its KV cache, the tokens it
//! holds and the logits of its last position.

use std::sync::Arc;

use super::args::{
    array, c_enum, failure, guard_create, guard_free, guard_get, handle, handle_mut, invalid,
    token, tokens,
};
use super::combs_token;
use super::guard::{Failure, FfiResult, guard, guard_const};
use super::model::combs_model;
use super::sampler::combs_sampler;
use super::status::combs_status;
use crate::error::ModelError;
use crate::kv::CacheKind;
use crate::runtime::{Model, Session, SessionOptions};

/// KV cache implementation of a session.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_kv_kind {
    /// One contiguous block of `n_ctx` rows per layer.
    COMBS_KV_CONTIGUOUS = 0,
    /// Fixed-size pages from a pool shared by the model's paged sessions of
    /// one page size: needed by `combs_batch_decode`, and lets
    /// `combs_session_fork` share the prompt instead of copying it.
    COMBS_KV_PAGED = 1,
}

/// Options of `combs_session_create()`; start from
/// `combs_session_default_options()`. Fields may be appended, never reordered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_session_options {
    /// Context size in tokens; 0: the model's training context
    /// (`combs_model_n_ctx_train`).
    pub n_ctx: u32,
    /// KV cache implementation.
    pub kv_kind: combs_kv_kind,
    /// Rows per page of a paged cache (must be positive).
    pub page_size: u32,
    /// Most prompt tokens evaluated per forward pass (device memory for
    /// activations grows with it); 0: 512.
    pub n_batch: u32,
    /// Paged sessions: pages in the model's pool for `page_size`, used when
    /// this session is the first of that page size (the pool is made then
    /// and keeps its size); 0: room for max(`n_ctx`, 16384) positions within
    /// a quarter of the device's memory.
    pub pool_pages: u32,
}

/// The struct as read from C memory: an enum value outside `combs_kv_kind`
/// must not become a Rust enum.
#[repr(C)]
struct RawSessionOptions {
    n_ctx: u32,
    kv_kind: i32,
    page_size: u32,
    n_batch: u32,
    pool_pages: u32,
}
const _: () = assert!(size_of::<RawSessionOptions>() == size_of::<combs_session_options>());
const _: () = assert!(size_of::<combs_kv_kind>() == size_of::<i32>());

/// One sequence and its KV cache. Holds a reference to its model.
pub struct combs_session {
    pub(crate) session: Session,
    pub(crate) model: Arc<Model>,
    /// Whether `session.logits()` are those of the last position held.
    pub(crate) logits_valid: bool,
}

// A C handle crosses threads: the session must be movable between them.
const _: () = {
    const fn movable<T: Send>() {}
    movable::<combs_session>();
};

impl combs_session {
    /// Records the outcome of an evaluating call: errors found before any work
    /// (bad token, full context, no free KV page) leave the logits as they
    /// were; any other error leaves them unknown.
    pub(crate) fn after_eval<T>(&mut self, r: Result<T, ModelError>) -> FfiResult<T> {
        if let Err(e) = &r {
            if !leaves_session_unchanged(e) {
                self.logits_valid = false;
            }
        } else {
            self.logits_valid = true;
        }
        r.map_err(Failure::from)
    }
}

/// Whether an evaluating call that failed with `e` did so before changing anything.
pub(crate) fn leaves_session_unchanged(e: &ModelError) -> bool {
    matches!(
        e.root(),
        ModelError::InvalidArgument { .. }
            | ModelError::TokenOutOfRange { .. }
            | ModelError::ContextFull { .. }
            | ModelError::PoolExhausted { .. }
    )
}

/// The default session options: the training context, a contiguous cache,
/// pages of 256 rows, batches of 512 tokens.
#[unsafe(no_mangle)]
pub extern "C" fn combs_session_default_options() -> combs_session_options {
    let d = combs_session_options {
        n_ctx: 0,
        kv_kind: combs_kv_kind::COMBS_KV_CONTIGUOUS,
        page_size: 256,
        n_batch: 0,
        pool_pages: 0,
    };
    guard_const("combs_session_default_options", d)
}

/// Creates an empty session on `m` with its own KV cache. `opts` may be NULL
/// for the defaults. Several sessions may share one model; each keeps the
/// model alive, so `combs_model_free` may come before `combs_session_free`.
/// On failure `*out` is set to NULL.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m` or `out`, a `kv_kind` outside the
/// enum, `n_ctx` above 2^24, `page_size` 0), `COMBS_ERR_OUT_OF_MEMORY` (the
/// KV cache, or a new page pool, does not fit on the device: lower `n_ctx`
/// or `pool_pages`), `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `m` is NULL or a live model; `opts` is NULL or points to a
/// `combs_session_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_create(
    m: *mut combs_model,
    opts: *const combs_session_options,
    out: *mut *mut combs_session,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        let d = combs_session_default_options();
        let defaults = RawSessionOptions {
            n_ctx: d.n_ctx,
            kv_kind: d.kv_kind as i32,
            page_size: d.page_size,
            n_batch: d.n_batch,
            pool_pages: d.pool_pages,
        };
        // SAFETY: opts is NULL or points to a combs_session_options, whose layout
        // RawSessionOptions mirrors.
        let o = unsafe { opts.cast::<RawSessionOptions>().as_ref() }.unwrap_or(&defaults);
        let kv_kind = c_enum(
            o.kv_kind,
            &[CacheKind::Contiguous, CacheKind::Paged],
            "kv_kind",
            "combs_kv_kind (0: contiguous, 1: paged)",
        )?;
        let defaults = SessionOptions::default();
        let session = m.model.new_session(&SessionOptions {
            n_ctx: o.n_ctx as usize,
            kv_kind,
            page_size: o.page_size as usize,
            pool_pages: o.pool_pages as usize,
            n_batch: match o.n_batch {
                0 => defaults.n_batch,
                n => n as usize,
            },
            n_logit_rows: 1,
        })?;
        Ok(combs_session {
            session,
            model: m.model.clone(),
            logits_valid: false,
        })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_session_create", out, make) }
}

/// Releases a session and its KV cache (NULL: no-op).
///
/// # Safety
/// `s` is NULL or a session from `combs_session_create()` not freed before
/// and not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_free(s: *mut combs_session) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_session_free", s) }
}

/// Evaluates `n` tokens after those the session holds (a prompt, or the
/// next part of one); afterwards `combs_session_logits` gives the logits of
/// the last of them. `n` 0 does nothing.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s`, NULL `tokens` with `n` > 0, a
/// token outside `0 .. n_vocab - 1`: the message gives its index),
/// `COMBS_ERR_CONTEXT_FULL` (the tokens do not fit in `n_ctx`). After these
/// nothing was evaluated and the session is unchanged.
/// `COMBS_ERR_OUT_OF_MEMORY` / `COMBS_ERR_DEVICE`: the device failed; free
/// the session.
///
/// # Safety
/// `s` is NULL or a live session used by no other thread; `tokens` is valid
/// for `n` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_prefill(
    s: *mut combs_session,
    tokens: *const combs_token,
    n: usize,
) -> combs_status {
    guard("combs_session_prefill", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        // SAFETY: per this function's contract.
        let ts = unsafe { array(tokens, n, "tokens") }?;
        let ids = self::tokens(ts, s.model.spec().n_vocab, "tokens")?;
        if ids.is_empty() {
            return Ok(());
        }
        let r = s.session.prefill(&ids);
        s.after_eval(r)
    })
}

/// Evaluates token `t` after those the session holds and draws the next
/// token with sampler `smp` into `*out` (the sampler remembers it, as
/// `combs_sampler_sample` does). When the sampler's chain depends only on
/// the best few logits (greedy, or a top_k > 0 without a repeat penalty
/// below 1), the device selects them and the row of logits is not read
/// back: `combs_session_logits` then fails until the session's next
/// evaluation. Otherwise the row is read and sampled on the host. The token
/// is the one `combs_session_decode` + `combs_sampler_sample` would give.
///
/// # Errors
/// As `combs_session_decode`; also `COMBS_ERR_INVALID_ARGUMENT` for a NULL
/// `smp` or `out` (the session is unchanged then).
///
/// # Safety
/// `s` is NULL or a live session, `smp` NULL or a live sampler, both used by
/// no other thread; `out` is NULL or valid for one write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_decode_sample(
    s: *mut combs_session,
    t: combs_token,
    smp: *mut combs_sampler,
    out: *mut combs_token,
) -> combs_status {
    guard("combs_session_decode_sample", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        // SAFETY: per this function's contract.
        let smp = unsafe { handle_mut(smp, "smp") }?;
        if out.is_null() {
            return Err(invalid("out", "is NULL"));
        }
        let id = token(t, s.model.spec().n_vocab)?;
        let r = s.session.decode_sample(id, &mut smp.sampler);
        let next = s.after_eval(r)?;
        // SAFETY: non-NULL and valid for one write per the contract.
        unsafe { out.write(next as combs_token) };
        Ok(())
    })
}

/// Evaluates one token (the one just sampled) after those the session holds.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s`, `t` out of range),
/// `COMBS_ERR_CONTEXT_FULL` (the session holds `n_ctx` tokens): the session
/// is unchanged. `COMBS_ERR_OUT_OF_MEMORY` / `COMBS_ERR_DEVICE` as for
/// `combs_session_prefill`.
///
/// # Safety
/// `s` is NULL or a live session used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_decode(
    s: *mut combs_session,
    t: combs_token,
) -> combs_status {
    guard("combs_session_decode", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        let id = token(t, s.model.spec().n_vocab)?;
        let r = s.session.decode(id);
        s.after_eval(r)
    })
}

/// The logits of the session's last position: `combs_model_n_vocab` floats.
/// The array belongs to the session and stays valid (and unchanged) until
/// the next `combs_session_prefill`, `combs_session_decode`,
/// `combs_session_rewind`, `combs_generate` or `combs_session_free` on it,
/// or the next `combs_batch_decode` / `combs_batch_prefill` that includes
/// it (batches of other sessions leave it alone).
/// NULL (with `combs_last_error()` set) when `s` is NULL or nothing has been
/// evaluated since the session was created or rewound to fewer positions.
///
/// # Safety
/// `s` is NULL or a live session not being modified by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_logits(s: *const combs_session) -> *const f32 {
    let null = std::ptr::null();
    // SAFETY: per this function's contract.
    unsafe {
        guard_get("combs_session_logits", s, "s", null, |s| {
            if !s.logits_valid {
                return Err(failure(
                    combs_status::COMBS_ERR_INVALID_ARGUMENT,
                    "the session has no logits: nothing was evaluated since it was created or rewound",
                ));
            }
            let logits = s.session.logits();
            if logits.is_empty() {
                return Err(failure(
                    combs_status::COMBS_ERR_INVALID_ARGUMENT,
                    "the session's last step sampled on the device (combs_session_decode_sample \
                     or combs_batch_decode_sample): its logits were not read back",
                ));
            }
            Ok(logits.as_ptr())
        })
    }
}

/// Number of positions (tokens) the session holds; 0 when `s` is NULL.
///
/// # Safety
/// `s` is NULL or a live session not being modified by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_len(s: *const combs_session) -> usize {
    // SAFETY: per this function's contract.
    unsafe { guard_get("combs_session_len", s, "s", 0, |s| Ok(s.session.len())) }
}

/// The session's context size in tokens; 0 when `s` is NULL.
///
/// # Safety
/// `s` is NULL or a live session not being modified by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_n_ctx(s: *const combs_session) -> u32 {
    // SAFETY: per this function's contract.
    unsafe {
        guard_get("combs_session_n_ctx", s, "s", 0, |s| {
            Ok(u32::try_from(s.session.n_ctx()).unwrap_or(u32::MAX))
        })
    }
}

/// Keeps the first `n_keep` positions and forgets the rest (0: start over),
/// so that a conversation can branch or a prompt be re-evaluated. Rewinding
/// to fewer positions than held invalidates the logits until the next
/// evaluation.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `s`, or `n_keep` past the positions
/// held (the session is unchanged).
///
/// # Safety
/// `s` is NULL or a live session used by no other thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_rewind(
    s: *mut combs_session,
    n_keep: usize,
) -> combs_status {
    guard("combs_session_rewind", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        let len = s.session.len();
        s.session.rewind(n_keep)?;
        if n_keep < len {
            s.logits_valid = false;
        }
        Ok(())
    })
}

/// Starts a new session holding what `s` holds (its tokens and its logits),
/// to continue it differently. A paged session's fork shares its KV pages:
/// only the partially filled last page is copied, and only when one of the
/// two sessions writes into it, so forking a long prompt costs almost no
/// memory. A contiguous session's cache is copied. The two are independent
/// afterwards; either may be freed first. On failure `*out` is set to NULL.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s` or `out`), `COMBS_ERR_OUT_OF_MEMORY`,
/// `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `s` is NULL or a live session not being modified by another thread; `out`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_fork(
    s: *const combs_session,
    out: *mut *mut combs_session,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle(s, "s") }?;
        Ok(combs_session {
            session: s.session.fork()?,
            model: s.model.clone(),
            logits_valid: s.logits_valid,
        })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_session_fork", out, make) }
}

/// Usage of a KV page pool (`combs_session_page_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct combs_page_stats {
    /// Rows (positions) per page.
    pub page_size: u32,
    /// Pages of the full-attention layers in the pool.
    pub pages_total: u32,
    /// Those referenced by at least one session.
    pub pages_used: u32,
    /// Pages free to take.
    pub pages_free: u32,
    /// Pages of the sliding-window layers' rings (0 for models without such
    /// layers): each session holds at most window + 512 rows of them.
    pub window_pages_total: u32,
    /// Those referenced by at least one session.
    pub window_pages_used: u32,
    /// Live sessions drawing on the pool.
    pub sequences: u32,
    /// Positions held, summed over those sessions (a shared prompt counts
    /// once per session).
    pub tokens: u64,
    /// Device bytes of the pool (K and V, all layers).
    pub bytes_total: u64,
    /// Device bytes of the pages in use.
    pub bytes_used: u64,
}

/// Writes the usage of the page pool a paged session draws on (shared by
/// all paged sessions of its model with its page size) to `*out`.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT`: NULL `s` or `out`, or a session with a
/// contiguous cache (it has no pool).
///
/// # Safety
/// `s` is NULL or a live session; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_page_stats(
    s: *const combs_session,
    out: *mut combs_page_stats,
) -> combs_status {
    guard("combs_session_page_stats", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle(s, "s") }?;
        if out.is_null() {
            return Err(invalid("out", "is NULL"));
        }
        let st = s
            .session
            .page_stats()
            .ok_or_else(|| invalid("s", "has a contiguous KV cache, which has no page pool"))?;
        let n32 = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let stats = combs_page_stats {
            page_size: n32(st.page_size),
            pages_total: n32(st.pages_total),
            pages_used: n32(st.pages_used),
            pages_free: n32(st.pages_free),
            window_pages_total: n32(st.window_pages_total),
            window_pages_used: n32(st.window_pages_used),
            sequences: n32(st.sequences),
            tokens: st.tokens as u64,
            bytes_total: st.bytes_total,
            bytes_used: st.bytes_used,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(stats) };
        Ok(())
    })
}
