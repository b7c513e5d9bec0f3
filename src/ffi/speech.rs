//! `combs_speech_model`: a speech-to-text model (a whisper.cpp `.bin` file)
//! on a runtime's device. Only read after loading, so one model may serve
//! several threads' `combs_transcribe()` calls at once.

use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::args::{c_str, guard_create, guard_free, handle};
use super::guard::file_failure;
use super::guard::guard_const;
use super::runtime::combs_runtime;
use super::status::combs_status;
use crate::models::LoadOptions;
use crate::models::speech::SpeechToTextModel;

/// A speech-to-text model: weights on a device, mel filterbank and
/// vocabulary.
pub struct combs_speech_model {
    pub(crate) model: Arc<dyn SpeechToTextModel>,
}

/// Options of `combs_speech_model_load()`; start from
/// `combs_speech_model_default_options()`. Fields may be appended, never
/// reordered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_speech_model_options {
    /// Draw a progress bar on stderr while the weights upload (only when
    /// stderr is a terminal).
    pub show_progress: bool,
}

/// The struct as read from C memory (a `bool` byte other than 0 or 1 must
/// not become a Rust `bool`).
#[repr(C)]
struct RawSpeechModelOptions {
    show_progress: u8,
}
const _: () =
    assert!(size_of::<RawSpeechModelOptions>() == size_of::<combs_speech_model_options>());

/// The default speech model options (no progress bar).
#[unsafe(no_mangle)]
pub extern "C" fn combs_speech_model_default_options() -> combs_speech_model_options {
    let d = combs_speech_model_options {
        show_progress: false,
    };
    guard_const("combs_speech_model_default_options", d)
}

/// Loads a whisper.cpp model file (`ggml-tiny.en.bin`, or one written by
/// `combs convert`) onto the runtime's device. `opts` may be NULL for the
/// defaults. On success `*out` receives a model to release with
/// `combs_speech_model_free()`; on failure it is set to NULL and
/// `combs_last_error()` names the file and what is wrong with it.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `rt`, `path` or `out`), `COMBS_ERR_IO`
/// (missing or unreadable file), `COMBS_ERR_FORMAT` (not a whisper.cpp
/// model — a GGUF text model, say —, truncated, inconsistent),
/// `COMBS_ERR_UNSUPPORTED` (a tensor type the device cannot run),
/// `COMBS_ERR_OUT_OF_MEMORY`, `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `path` is NULL or a NUL-terminated
/// string; `opts` is NULL or points to a `combs_speech_model_options`;
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_speech_model_load(
    rt: *mut combs_runtime,
    path: *const c_char,
    opts: *const combs_speech_model_options,
    out: *mut *mut combs_speech_model,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let rt = unsafe { handle(rt, "rt") }?;
        // SAFETY: per this function's contract.
        let path: &CStr = unsafe { c_str(path, "path") }?;
        let path = Path::new(OsStr::from_bytes(path.to_bytes()));
        // SAFETY: opts is NULL or points to a combs_speech_model_options,
        // whose layout RawSpeechModelOptions mirrors.
        let raw = unsafe { opts.cast::<RawSpeechModelOptions>().as_ref() };
        let load = LoadOptions {
            show_progress: raw.is_some_and(|o| o.show_progress != 0),
            ..LoadOptions::default()
        };
        let model = crate::models::load_speech_model(&rt.ctx, path, &load)
            .map_err(|e| file_failure(path, e))?;
        Ok(combs_speech_model { model })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_speech_model_load", out, make) }
}

/// Releases a speech model (NULL: no-op).
///
/// # Safety
/// `m` is NULL or a model from `combs_speech_model_load()` not freed before
/// and not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_speech_model_free(m: *mut combs_speech_model) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_speech_model_free", m) }
}

/// Whether the model knows languages other than English (and so detects
/// the language and can translate); false when `m` is NULL.
///
/// # Safety
/// `m` is NULL or a live speech model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_speech_model_is_multilingual(m: *const combs_speech_model) -> bool {
    // SAFETY: per this function's contract.
    unsafe {
        super::args::guard_get("combs_speech_model_is_multilingual", m, "m", false, |m| {
            Ok(m.model.vocab().n_languages > 0)
        })
    }
}
