//! Checked conversions of C arguments: NULL checks that name the argument,
//! C strings and arrays to Rust slices, object out-parameters, and the
//! "needed size + `COMBS_ERR_BUFFER_TOO_SMALL`" output-buffer convention.

use std::ffi::{CStr, c_char};

use super::guard::{Failure, FfiResult};
use super::status::combs_status;
use crate::error::ModelError;

/// `COMBS_ERR_INVALID_ARGUMENT` for argument `name`.
pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Failure {
    Failure::from(ModelError::invalid(name, reason))
}

/// Sets an object out-parameter to NULL (so it is NULL on every failure path)
/// and returns it checked.
///
/// # Safety
/// `out` is NULL or valid for a pointer-sized write.
pub(crate) unsafe fn clear_out<T>(out: *mut *mut T) -> FfiResult<*mut *mut T> {
    if out.is_null() {
        return Err(invalid("out", "is NULL"));
    }
    // SAFETY: non-NULL and, per the caller's contract, writable.
    unsafe { out.write(std::ptr::null_mut()) };
    Ok(out)
}

/// Hands `value` to C through an out-parameter checked by [`clear_out`].
///
/// # Safety
/// `out` came from [`clear_out`].
pub(crate) unsafe fn set_out<T>(out: *mut *mut T, value: T) {
    // SAFETY: out is non-NULL and writable (checked by clear_out).
    unsafe { out.write(Box::into_raw(Box::new(value))) };
}

/// A handle passed by const pointer.
///
/// # Safety
/// `p` is NULL or a live handle that no other thread is mutating.
pub(crate) unsafe fn handle<'a, T>(p: *const T, name: &'static str) -> FfiResult<&'a T> {
    // SAFETY: per the caller's contract.
    unsafe { p.as_ref() }.ok_or_else(|| invalid(name, "is NULL"))
}

/// A handle passed by mutable pointer.
///
/// # Safety
/// `p` is NULL or a live handle that no other thread is using.
pub(crate) unsafe fn handle_mut<'a, T>(p: *mut T, name: &'static str) -> FfiResult<&'a mut T> {
    // SAFETY: per the caller's contract.
    unsafe { p.as_mut() }.ok_or_else(|| invalid(name, "is NULL"))
}

/// An array of `n` elements; NULL is accepted when `n` is 0.
///
/// # Safety
/// `p` is NULL or valid for reads of `n` elements.
pub(crate) unsafe fn array<'a, T>(p: *const T, n: usize, name: &'static str) -> FfiResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(
            name,
            format!("is NULL but {n} elements were promised"),
        ));
    }
    // SAFETY: non-NULL and, per the caller's contract, valid for n reads.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A NUL-terminated C string.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, name: &'static str) -> FfiResult<&'a CStr> {
    if p.is_null() {
        return Err(invalid(name, "is NULL"));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    Ok(unsafe { CStr::from_ptr(p) })
}

/// Bytes that must be UTF-8 text.
pub(crate) fn utf8<'a>(bytes: &'a [u8], name: &'static str) -> FfiResult<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| {
        invalid(
            name,
            format!("is not valid UTF-8 (at byte {})", e.valid_up_to()),
        )
    })
}

/// `COMBS_ERR_BUFFER_TOO_SMALL` with the standard message.
pub(crate) fn too_small(needed: usize, got: usize) -> Failure {
    Failure::from(ModelError::BufferTooSmall { needed, got })
}

/// Copies `bytes` plus a terminating NUL into `buf` of `cap` bytes. On
/// success `*len_out` is `bytes.len()` (the NUL not counted); when `cap` is
/// smaller than `bytes.len() + 1`, nothing is written to `buf`, `*len_out`
/// is the capacity needed (NUL included) and the status is
/// `COMBS_ERR_BUFFER_TOO_SMALL`.
///
/// # Safety
/// `buf` is NULL or valid for `cap` byte writes; `len_out` is NULL or writable.
pub(crate) unsafe fn write_text(
    bytes: &[u8],
    buf: *mut c_char,
    cap: usize,
    len_out: *mut usize,
) -> FfiResult<()> {
    if len_out.is_null() {
        return Err(invalid("len_out", "is NULL"));
    }
    if buf.is_null() && cap > 0 {
        return Err(invalid("buf", format!("is NULL but cap is {cap}")));
    }
    let needed = bytes.len() + 1;
    if cap < needed {
        // SAFETY: len_out is non-NULL and writable per the caller's contract.
        unsafe { len_out.write(needed) };
        return Err(too_small(needed, cap));
    }
    // SAFETY: buf holds cap >= bytes.len() + 1 bytes; the regions cannot overlap
    // (bytes is owned by combs).
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        buf.add(bytes.len()).write(0);
        len_out.write(bytes.len());
    }
    Ok(())
}

/// A status's failure with a custom message (for checks that have no
/// [`ModelError`] of their own).
pub(crate) fn failure(status: combs_status, message: impl Into<String>) -> Failure {
    Failure {
        status,
        message: message.into(),
    }
}

/// A token id checked against the vocabulary (`0..n_vocab`).
pub(crate) fn token(t: i32, n_vocab: usize) -> FfiResult<u32> {
    match u32::try_from(t) {
        Ok(id) if (id as usize) < n_vocab => Ok(id),
        _ => Err(Failure::from(ModelError::TokenOutOfRange {
            token: i64::from(t),
            n_vocab,
        })),
    }
}

/// Every token of `tokens` checked; the message names the first bad index.
pub(crate) fn tokens(ts: &[i32], n_vocab: usize, name: &str) -> FfiResult<Vec<u32>> {
    ts.iter()
        .enumerate()
        .map(|(i, &t)| token(t, n_vocab).map_err(|e| e.context(format!("{name}[{i}]"))))
        .collect()
}
