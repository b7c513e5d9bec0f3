//! The guard every `extern "C"` body runs in: panics become
//! `COMBS_ERR_INTERNAL`, errors become their status, and either way the
//! message is stored as this thread's `combs_last_error()`.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::status::combs_status;
use crate::error::ModelError;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Stores `msg` as this thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Pointer to this thread's last error message (valid until the next failing call on this thread).
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Records `e` and returns its status.
pub(crate) fn fail(e: &ModelError) -> combs_status {
    set_last_error(&e.to_string());
    combs_status::from(e)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `f`, turning an error or a panic into a status and a last-error message.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), ModelError>) -> combs_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => combs_status::COMBS_OK,
        Ok(Err(e)) => fail(&e),
        Err(p) => {
            set_last_error(&format!(
                "internal error (panic): {}",
                panic_message(p.as_ref())
            ));
            combs_status::COMBS_ERR_INTERNAL
        }
    }
}

/// Runs `f` for entry points that return a value rather than a status; a
/// panic yields `fallback` and records the message.
pub(crate) fn guard_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            set_last_error(&format!(
                "internal error (panic): {}",
                panic_message(p.as_ref())
            ));
            fallback
        }
    }
}
