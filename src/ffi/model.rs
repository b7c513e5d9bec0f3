//! `combs_model`: the weights of one GGUF file on a device, with its
//! tokenizer and chat template. Sessions hold a reference to it, so a model
//! may serve several sessions and may be freed before them.

use std::ffi::{CStr, OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::args::{c_enum, c_str, guard_create, guard_free, guard_get, handle};
use super::combs_token;
use super::guard::{file_failure, guard_const};
use super::runtime::combs_runtime;
use super::status::combs_status;
use crate::models::LoadOptions;
use crate::ops::act_round::Numerics;
use crate::runtime::Model;

/// Weights and tokenizer of one model file. Only read after loading, so one
/// model may be used from several threads at once.
pub struct combs_model {
    pub(crate) model: Arc<Model>,
}

// A C handle crosses threads: the model must be shareable.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Model>();
};

/// How a model's linear layers treat their inputs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum combs_numerics {
    /// f32 activations into the dequantizing kernels (closest to exact).
    COMBS_NUMERICS_EXACT = 0,
    /// Activations rounded as llama.cpp's CPU backend rounds them (8-bit
    /// blocks before quantized products), to compare outputs with it.
    COMBS_NUMERICS_LLAMA_CPP = 1,
}

/// Options of `combs_model_load()`; start from `combs_model_default_options()`.
/// Fields may be appended, never reordered.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct combs_model_options {
    /// Draw a progress bar on stderr while the weights upload (only when
    /// stderr is a terminal).
    pub show_progress: bool,
    /// Linear-layer numerics.
    pub numerics: combs_numerics,
}

/// The struct as read from C memory: a `bool` byte other than 0 or 1, or an
/// enum value outside `combs_numerics`, must not become a Rust value.
#[repr(C)]
struct RawModelOptions {
    show_progress: u8,
    numerics: i32,
}
const _: () = assert!(size_of::<RawModelOptions>() == size_of::<combs_model_options>());
const _: () = assert!(size_of::<combs_numerics>() == size_of::<i32>());

/// The default model options (no progress bar, exact numerics).
#[unsafe(no_mangle)]
pub extern "C" fn combs_model_default_options() -> combs_model_options {
    let d = combs_model_options {
        show_progress: false,
        numerics: combs_numerics::COMBS_NUMERICS_EXACT,
    };
    guard_const("combs_model_default_options", d)
}

/// Loads a GGUF model file onto the runtime's device (or devices: split by
/// layers or one replica on each, as the runtime's options say). `opts` may be NULL for
/// the defaults. On success `*out` receives a model to release with
/// `combs_model_free()`; on failure it is set to NULL and
/// `combs_last_error()` names the file and what is wrong with it (byte
/// offset, metadata key or tensor).
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `rt`, `path` or `out`, a `numerics`
/// outside `combs_numerics`), `COMBS_ERR_IO`
/// (missing or unreadable file, a directory), `COMBS_ERR_FORMAT` (not GGUF,
/// truncated, inconsistent metadata, missing tensor, bad shape),
/// `COMBS_ERR_UNSUPPORTED` (unknown architecture or tensor type),
/// `COMBS_ERR_OUT_OF_MEMORY`, `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `rt` is NULL or a live runtime; `path` is NULL or a NUL-terminated string;
/// `opts` is NULL or points to a `combs_model_options`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_load(
    rt: *mut combs_runtime,
    path: *const c_char,
    opts: *const combs_model_options,
    out: *mut *mut combs_model,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let rt = unsafe { handle(rt, "rt") }?;
        // SAFETY: per this function's contract.
        let path: &CStr = unsafe { c_str(path, "path") }?;
        let path = Path::new(OsStr::from_bytes(path.to_bytes()));
        // SAFETY: opts is NULL or points to a combs_model_options, whose layout
        // RawModelOptions mirrors.
        let raw = unsafe { opts.cast::<RawModelOptions>().as_ref() };
        let show_progress = raw.is_some_and(|o| o.show_progress != 0);
        let numerics = c_enum(
            raw.map_or(0, |o| o.numerics),
            &[Numerics::Exact, Numerics::LlamaCppCpu],
            "numerics",
            "combs_numerics (0: exact, 1: llama.cpp)",
        )?;
        let opts = rt.load_options(LoadOptions {
            show_progress,
            numerics,
            ..LoadOptions::default()
        });
        let model = Model::load_on(&rt.ctxs, path, &opts).map_err(|e| file_failure(path, e))?;
        Ok(combs_model {
            model: Arc::new(model),
        })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_model_load", out, make) }
}

/// Releases a model (NULL: no-op). Sessions created from it keep the weights
/// alive and stay usable until they are freed themselves.
///
/// # Safety
/// `m` is NULL or a model from `combs_model_load()` not freed before and not
/// in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_free(m: *mut combs_model) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_model_free", m) }
}

/// Runs a getter on a model handle; NULL gives `none` and a last error.
fn with_model<T: Copy>(
    func: &str,
    m: *const combs_model,
    none: T,
    f: impl FnOnce(&Model) -> T,
) -> T {
    // SAFETY: m is NULL or a live model (the caller's contract).
    unsafe { guard_get(func, m, "m", none, |m| Ok(f(&m.model))) }
}

/// Number of logits per position, which is also the bound of valid token ids
/// (`0 .. n_vocab - 1`); -1 when `m` is NULL.
///
/// # Safety
/// `m` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_n_vocab(m: *const combs_model) -> i32 {
    with_model("combs_model_n_vocab", m, -1, |m| {
        i32::try_from(m.spec().n_vocab).unwrap_or(i32::MAX)
    })
}

/// The context length the model was trained with (`<arch>.context_length`);
/// -1 when `m` is NULL.
///
/// # Safety
/// `m` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_n_ctx_train(m: *const combs_model) -> i32 {
    with_model("combs_model_n_ctx_train", m, -1, |m| {
        i32::try_from(m.spec().n_ctx_train).unwrap_or(i32::MAX)
    })
}

/// The beginning-of-sequence token; -1 when the vocabulary has none or `m` is NULL.
///
/// # Safety
/// `m` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_token_bos(m: *const combs_model) -> combs_token {
    with_model("combs_model_token_bos", m, -1, |m| {
        m.tokenizer().bos().map_or(-1, |t| t as i32)
    })
}

/// The end-of-sequence token; -1 when the vocabulary has none or `m` is NULL.
///
/// # Safety
/// `m` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_token_eos(m: *const combs_model) -> combs_token {
    with_model("combs_model_token_eos", m, -1, |m| {
        m.tokenizer().eos().map_or(-1, |t| t as i32)
    })
}

/// `true` when `t` ends generation (EOS, EOT, `<|im_end|>`, …); false for
/// other tokens, ids out of range, or a NULL `m`.
///
/// # Safety
/// `m` is NULL or a live model.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_model_token_is_eog(m: *const combs_model, t: combs_token) -> bool {
    with_model("combs_model_token_is_eog", m, false, |m| {
        u32::try_from(t).is_ok_and(|t| m.tokenizer().is_eog(t))
    })
}
