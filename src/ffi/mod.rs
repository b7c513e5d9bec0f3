//! The C API: opaque handles, status codes, a thread-local last error and
//! `catch_unwind` at every entry point. Nothing else lives here.

/// The library version as a NUL-terminated string, e.g. `"0.1.0"`.
#[unsafe(no_mangle)]
pub extern "C" fn combs_version() -> *const std::ffi::c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
