//! Text to tokens and back: `combs_tokenize` (llama.cpp's `llama_tokenize`)
//! and `combs_token_to_piece` (its `llama_token_to_piece` with control
//! tokens rendered).

use std::ffi::c_char;

use super::args::{array, handle, invalid, token, too_small, utf8, write_text};
use super::combs_token;
use super::guard::{FfiResult, guard};
use super::model::combs_model;
use super::status::combs_status;

/// Where the tokenize entry points write: up to `cap` ids at `out`, and
/// their number at `n_out`.
#[derive(Clone, Copy)]
struct IdsOut {
    out: *mut combs_token,
    cap: usize,
    n_out: *mut usize,
}

/// Tokenizes `len` bytes at `text` into `ids`. Shared by both entry points.
///
/// # Safety
/// As `combs_tokenize_ex()`.
unsafe fn tokenize(
    m: *const combs_model,
    text: *const c_char,
    len: usize,
    add_special: bool,
    parse_special: bool,
    ids: &IdsOut,
) -> FfiResult<()> {
    let IdsOut { out, cap, n_out } = *ids;
    // SAFETY: per the caller's contract.
    let m = unsafe { handle(m, "m") }?;
    if n_out.is_null() {
        return Err(invalid("n_out", "is NULL"));
    }
    if out.is_null() && cap > 0 {
        return Err(invalid("out", format!("is NULL but cap is {cap}")));
    }
    // SAFETY: text is valid for len bytes per the caller's contract.
    let bytes = unsafe { array(text.cast::<u8>(), len, "text") }?;
    let text = utf8(bytes, "text")?;
    let ids = m
        .model
        .tokenizer()
        .encode(text, add_special, parse_special)?;
    // SAFETY: n_out is non-NULL and writable per the caller's contract.
    unsafe { n_out.write(ids.len()) };
    if ids.len() > cap {
        return Err(too_small(ids.len(), cap));
    }
    for (i, &id) in ids.iter().enumerate() {
        // SAFETY: out holds cap >= ids.len() elements.
        unsafe { out.add(i).write(id as combs_token) };
    }
    Ok(())
}

/// Tokenizes `len` bytes of UTF-8 `text` (no NUL needed) into `out`, which
/// holds `cap` tokens. `add_special` adds BOS/EOS as the model's metadata asks
/// (what a prompt at the start of a session wants). Control tokens written in
/// the text, such as `<|im_start|>` in the output of
/// `combs_chat_apply_template()`, become those tokens; use
/// `combs_tokenize_ex()` to tokenize untrusted text as plain text. On success
/// `*n_out` is the number of tokens written.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m` or `n_out`, NULL `text` with a
/// positive `len`, NULL `out` with a positive `cap`, text that is not UTF-8),
/// `COMBS_ERR_BUFFER_TOO_SMALL` (nothing written; `*n_out` is the number of
/// tokens needed — call with `cap` 0 to ask for it).
///
/// # Safety
/// `m` is NULL or a live model; `text` is valid for `len` bytes; `out` is
/// NULL or valid for `cap` writes; `n_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_tokenize(
    m: *const combs_model,
    text: *const c_char,
    len: usize,
    add_special: bool,
    out: *mut combs_token,
    cap: usize,
    n_out: *mut usize,
) -> combs_status {
    let ids = IdsOut { out, cap, n_out };
    // SAFETY: same contract.
    guard("combs_tokenize", || unsafe {
        tokenize(m, text, len, add_special, true, &ids)
    })
}

/// `combs_tokenize()` with the choice of whether control tokens written in
/// the text are parsed (`parse_special` true, what `combs_tokenize` does) or
/// tokenized as plain text (false: for text from users, so that it cannot
/// forge `<|im_end|>` and the like).
///
/// # Errors
/// As `combs_tokenize()`.
///
/// # Safety
/// As `combs_tokenize()`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_tokenize_ex(
    m: *const combs_model,
    text: *const c_char,
    len: usize,
    add_special: bool,
    parse_special: bool,
    out: *mut combs_token,
    cap: usize,
    n_out: *mut usize,
) -> combs_status {
    let ids = IdsOut { out, cap, n_out };
    // SAFETY: same contract.
    guard("combs_tokenize_ex", || unsafe {
        tokenize(m, text, len, add_special, parse_special, &ids)
    })
}

/// Writes the text of token `t` into `buf` (`cap` bytes) followed by a NUL;
/// `*len_out` is the piece's length in bytes. Control tokens render as their
/// text (`<|im_end|>`). A piece may hold part of a UTF-8 character (byte
/// tokens); `combs_generate()` joins them for you.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m` or `len_out`, NULL `buf` with
/// `cap` > 0, `t` outside `0 .. n_vocab - 1`), `COMBS_ERR_BUFFER_TOO_SMALL`
/// (nothing written; `*len_out` is the capacity needed, NUL included).
///
/// # Safety
/// `m` is NULL or a live model; `buf` is NULL or valid for `cap` bytes;
/// `len_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_token_to_piece(
    m: *const combs_model,
    t: combs_token,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> combs_status {
    guard("combs_token_to_piece", || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        let tok = m.model.tokenizer();
        let id = token(t, tok.n_vocab())?;
        let piece = tok.token_to_piece(id)?;
        // SAFETY: per this function's contract.
        unsafe { write_text(&piece, buf, cap, len_out) }
    })
}
