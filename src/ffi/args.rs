//! Checked conversions of C arguments: NULL checks that name the argument,
//! C strings and arrays to Rust slices, options structs, object
//! out-parameters and handles (made, read and released), and the
//! "needed size + `COMBS_ERR_BUFFER_TOO_SMALL`" output-buffer convention.

use std::ffi::{CStr, c_char};

use super::guard::{Failure, FfiResult, guard, guard_value};
use super::status::combs_status;
use crate::error::ModelError;

/// `COMBS_ERR_INVALID_ARGUMENT` for argument `name`.
pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Failure {
    Failure::from(ModelError::invalid(name, reason))
}

/// Runs the body of constructor `func`: checks the out-parameter `out` and
/// sets it to NULL first (so that it is NULL on every failure path), then
/// hands it the object `make` builds, as a handle [`guard_free`] releases.
///
/// # Safety
/// `out` is NULL or valid for a pointer-sized write.
pub(crate) unsafe fn guard_create<T>(
    func: &str,
    out: *mut *mut T,
    make: impl FnOnce() -> FfiResult<T>,
) -> combs_status {
    guard(func, || {
        if out.is_null() {
            return Err(invalid("out", "is NULL"));
        }
        // SAFETY: non-NULL and, per the caller's contract, writable.
        unsafe { out.write(std::ptr::null_mut()) };
        let value = make()?;
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(Box::new(value))) };
        Ok(())
    })
}

/// Runs the body of destructor `func`: releases a handle made by
/// [`guard_create`] (NULL: nothing to do).
///
/// # Safety
/// `p` is NULL or a handle from [`guard_create`], not released before and
/// not in use by another thread.
pub(crate) unsafe fn guard_free<T>(func: &str, p: *mut T) {
    let _ = guard(func, || {
        if !p.is_null() {
            // SAFETY: per this function's contract, p came from Box::into_raw.
            drop(unsafe { Box::from_raw(p) });
        }
        Ok(())
    });
}

/// Runs the body of getter `func` on a handle passed by const pointer (named
/// `name`): a NULL handle, an error or a panic give `none` and a last error.
///
/// # Safety
/// `p` is NULL or a live handle that no other thread is mutating.
pub(crate) unsafe fn guard_get<H, T: Copy>(
    func: &str,
    p: *const H,
    name: &'static str,
    none: T,
    f: impl FnOnce(&H) -> FfiResult<T>,
) -> T {
    guard_value(
        func,
        none,
        |_| none,
        || {
            // SAFETY: per this function's contract.
            f(unsafe { handle(p, name) }?)
        },
    )
}

/// A C enum argument read as the `i32` it is in memory (so that a value
/// outside the enum never becomes a Rust enum): `values[v]`, or an invalid
/// `name` that is not a `what` (the C enum and its values).
pub(crate) fn c_enum<T: Copy>(
    v: i32,
    values: &[T],
    name: &'static str,
    what: &str,
) -> FfiResult<T> {
    usize::try_from(v)
        .ok()
        .and_then(|i| values.get(i).copied())
        .ok_or_else(|| invalid(name, format!("{v} is not a {what}")))
}

/// The options struct `opts` points to, or `defaults` when it is NULL.
///
/// # Safety
/// `opts` is NULL or points to a `T` of which every bit pattern is a valid
/// value (plain numbers).
pub(crate) unsafe fn options<T: Copy>(opts: *const T, defaults: T) -> T {
    // SAFETY: per this function's contract.
    unsafe { opts.as_ref() }.copied().unwrap_or(defaults)
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

/// An array of `n` elements; NULL is accepted when `n` is 0. A count whose
/// bytes exceed `isize::MAX` cannot describe memory the caller owns and is
/// refused before any slice or allocation is sized by it.
///
/// # Safety
/// `p` is NULL or valid for reads of `n` elements.
pub(crate) unsafe fn array<'a, T>(p: *const T, n: usize, name: &'static str) -> FfiResult<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if n.checked_mul(size_of::<T>().max(1))
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(invalid(
            name,
            format!("{n} elements cannot be in memory (the count is corrupt)"),
        ));
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
