//! The guard every `extern "C"` body runs in: panics become
//! `COMBS_ERR_INTERNAL`, errors become their status, and either way the
//! message — prefixed with the entry point's name — is stored as this
//! thread's `combs_last_error()`.

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

/// A failed call: its status and the message `combs_last_error()` will give.
#[derive(Debug)]
pub(crate) struct Failure {
    /// The status the entry point returns.
    pub status: combs_status,
    /// What failed and why (without the entry point's name).
    pub message: String,
}

impl Failure {
    /// Prefixes the message with what the call was working on (a file path, say).
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl From<ModelError> for Failure {
    fn from(e: ModelError) -> Self {
        Failure {
            status: combs_status::from(&e),
            message: e.to_string(),
        }
    }
}

/// Result type of entry-point bodies.
pub(crate) type FfiResult<T> = Result<T, Failure>;

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// An error while reading the file at `path`: I/O errors already name the
/// file, any other gets its path in front.
pub(crate) fn file_failure(path: &std::path::Path, e: crate::error::ModelError) -> Failure {
    match e {
        crate::error::ModelError::Io { .. } => Failure::from(e),
        e => Failure::from(e).context(path.display()),
    }
}

/// Runs the body of entry point `func`, turning an error or a panic into a
/// status and a last-error message `"<func>: <what failed>"`.
pub(crate) fn guard(func: &str, f: impl FnOnce() -> FfiResult<()>) -> combs_status {
    guard_value(
        func,
        combs_status::COMBS_ERR_INTERNAL,
        |e| e.status,
        || f().map(|()| combs_status::COMBS_OK),
    )
}

/// Runs the body of an entry point that returns a constant (a version
/// string, the default options): `value`, whatever happens.
pub(crate) fn guard_const<T: Copy>(func: &str, value: T) -> T {
    guard_value(func, value, |_| value, || Ok(value))
}

/// Runs the body of an entry point that returns a value rather than a
/// status: an error yields `on_error(&failure)`, a panic yields `fallback`;
/// both record the message.
pub(crate) fn guard_value<T>(
    func: &str,
    fallback: T,
    on_error: impl FnOnce(&Failure) -> T,
    f: impl FnOnce() -> FfiResult<T>,
) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&format!("{func}: {}", e.message));
            on_error(&e)
        }
        Err(p) => {
            set_last_error(&format!(
                "{func}: internal error (panic): {}",
                panic_message(p.as_ref())
            ));
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's NUL-terminated message.
        unsafe { std::ffi::CStr::from_ptr(last_error_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn guard_panic_is_internal_with_message() {
        let s = guard("combs_test", || panic!("boom"));
        assert_eq!(s, combs_status::COMBS_ERR_INTERNAL);
        assert_eq!(last_error(), "combs_test: internal error (panic): boom");
    }

    #[test]
    fn guard_error_maps_status_and_prefixes_name() {
        let s = guard("combs_test", || {
            Err(Failure::from(ModelError::ContextFull {
                n_ctx: 8,
                requested: 9,
            }))
        });
        assert_eq!(s, combs_status::COMBS_ERR_CONTEXT_FULL);
        assert_eq!(
            last_error(),
            "combs_test: context is full: 8 positions, 9 requested"
        );
    }

    #[test]
    fn guard_value_panic_gives_fallback() {
        let v = guard_value(
            "combs_test",
            -1,
            |_| -2,
            || -> FfiResult<i32> { panic!("x") },
        );
        assert_eq!(v, -1);
    }
}
