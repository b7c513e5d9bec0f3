//! The C API (`include/combs.h`, generated from this module by cbindgen):
//! opaque handles, status codes, a thread-local last error and
//! `catch_unwind` at every entry point. Nothing else lives here; the
//! contract (names, signatures, semantics) is DESIGN.md's "C API contract".
//!
//! Conventions every function follows:
//! - every fallible call returns a `combs_status`; on failure
//!   `combs_last_error()` says which call failed and why;
//! - NULL handles and NULL required pointers are `COMBS_ERR_INVALID_ARGUMENT`;
//!   an options pointer may be NULL (the defaults);
//! - object out-parameters are set to NULL on failure;
//! - text out-buffers are NUL-terminated: on success `*len_out` is the text
//!   length (NUL not counted); when the buffer is too small nothing is
//!   written, `*len_out` is the capacity needed (NUL counted) and the status
//!   is `COMBS_ERR_BUFFER_TOO_SMALL`;
//! - `*_free(NULL)` does nothing;
//! - handles may move between threads; a model may be used by several threads
//!   at once, a session or a sampler by one thread at a time.

#![allow(non_camel_case_types)]

mod args;
pub mod guard;
pub mod status;

// One module per handle, in the order include/combs.h presents them (cbindgen
// follows declaration order; blank lines keep rustfmt from sorting them).
pub mod runtime;

pub mod model;

pub mod tokenize;

pub mod chat;

pub mod session;

pub mod vision;

pub mod sampler;

pub mod generate;

pub mod batch;

pub mod speech;

pub mod transcribe;

pub use batch::*;
pub use chat::*;
pub use generate::*;
pub use model::*;
pub use runtime::*;
pub use sampler::*;
pub use session::*;
pub use speech::*;
pub use status::*;
pub use tokenize::*;
pub use transcribe::*;
pub use vision::*;

use std::ffi::c_char;

/// A token id: an index into the model's vocabulary.
pub type combs_token = i32;

/// The library version as a NUL-terminated static string, e.g. `"0.1.0"`.
#[unsafe(no_mangle)]
pub extern "C" fn combs_version() -> *const c_char {
    let v: *const c_char = concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast();
    guard::guard_const("combs_version", v)
}

/// The message of the last failed call on this thread: which function failed
/// and why (the file, byte offset, tensor, argument or position involved);
/// `""` before any failure. Never NULL. The string belongs to combs and stays
/// valid until the next failing call on this thread; successful calls leave
/// it unchanged.
#[unsafe(no_mangle)]
pub extern "C" fn combs_last_error() -> *const c_char {
    let empty = c"".as_ptr();
    guard::guard_value(
        "combs_last_error",
        empty,
        |_| empty,
        || Ok(guard::last_error_ptr()),
    )
}
