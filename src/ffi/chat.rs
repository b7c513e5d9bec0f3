//! `combs_chat_apply_template`: a conversation rendered with the model's chat
//! template (`tokenizer.chat_template`, ChatML when it has none), as
//! llama.cpp's common chat code renders it.

use std::ffi::c_char;

use super::args::{array, handle, invalid, write_text};
use super::guard::{FfiResult, guard};
use super::model::combs_model;
use super::status::combs_status;
use crate::tokenizer::ChatMessage;

/// Renders `n_messages` messages (`roles[i]`, `contents[i]`: NUL-terminated
/// UTF-8, e.g. `"system"`, `"user"`, `"assistant"`) with the model's chat
/// template into `buf` (`cap` bytes, NUL-terminated); `*len_out` is the
/// text's length. `add_generation_prompt` appends the opening of an
/// assistant turn. Tokenize the result with `combs_tokenize` (which parses
/// the template's control tokens) and `add_special` true.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m` or `len_out`, NULL `roles` or
/// `contents` with `n_messages` > 0 or a NULL entry in them, text that is not
/// UTF-8, a conversation the template refuses — e.g. roles that do not
/// alternate), `COMBS_ERR_FORMAT` (the model's template does not render),
/// `COMBS_ERR_BUFFER_TOO_SMALL` (nothing written; `*len_out` is the capacity
/// needed, NUL included).
///
/// # Safety
/// `m` is NULL or a live model; `roles` and `contents` are NULL or arrays of
/// `n_messages` pointers, each NULL or a NUL-terminated string; `buf` is NULL
/// or valid for `cap` bytes; `len_out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_chat_apply_template(
    m: *const combs_model,
    roles: *const *const c_char,
    contents: *const *const c_char,
    n_messages: usize,
    add_generation_prompt: bool,
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> combs_status {
    guard("combs_chat_apply_template", || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        // SAFETY: per this function's contract.
        let roles = unsafe { array(roles, n_messages, "roles") }?;
        // SAFETY: per this function's contract.
        let contents = unsafe { array(contents, n_messages, "contents") }?;
        let mut messages = Vec::with_capacity(n_messages);
        for (i, (&r, &c)) in roles.iter().zip(contents).enumerate() {
            // SAFETY: each entry is NULL or NUL-terminated per the contract.
            let role = unsafe { entry(r, "roles", i) }?;
            // SAFETY: as above.
            let content = unsafe { entry(c, "contents", i) }?;
            messages.push(ChatMessage::new(role, content));
        }
        let text = m
            .model
            .tokenizer()
            .apply_chat_template(&messages, add_generation_prompt)?;
        // SAFETY: per this function's contract.
        unsafe { write_text(text.as_bytes(), buf, cap, len_out) }
    })
}

/// Entry `i` of the array `name` as UTF-8 text.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn entry<'a>(p: *const c_char, name: &'static str, i: usize) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(invalid(name, format!("{name}[{i}] is NULL")));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let bytes = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
    std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            name,
            format!(
                "{name}[{i}] is not valid UTF-8 (at byte {})",
                e.valid_up_to()
            ),
        )
    })
}
