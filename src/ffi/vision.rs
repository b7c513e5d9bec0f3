//! Images in prompts: `combs_mmproj` (a SmolVLM / Idefics3 projector file
//! loaded beside a text model), `combs_image` (RGB8 pixels, decoded from a
//! PNG, JPEG, WebP, GIF, BMP, TIFF or PNM file or buffer, or copied from the caller's), and the calls that
//! prefill a session with an image or with text whose `<image>` markers
//! stand for images.

use std::ffi::{OsStr, c_char};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::args::{array, c_str, guard_create, guard_free, guard_get, handle, handle_mut, utf8};
use super::guard::{FfiResult, file_failure, guard};
use super::model::combs_model;
use super::session::combs_session;
use super::status::combs_status;
use crate::models::LoadOptions;
use crate::runtime::{EncodedImage, Model, VisionModel};
use crate::vision::RgbImage;

/// A vision projector on the device of the text model it was loaded for.
/// Only read after loading: several threads may use one at once.
pub struct combs_mmproj {
    pub(crate) vision: VisionModel,
    /// Keeps the text model alive as long as the projector.
    pub(crate) _model: Arc<Model>,
}

// A C handle crosses threads: the projector must be shareable.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<combs_mmproj>();
};

/// An image: RGB8 pixels, row-major, 3 bytes per pixel, no row padding.
pub struct combs_image {
    pub(crate) rgb: RgbImage,
}

/// Loads a projector file (llama.cpp's `mmproj-*.gguf` of a SmolVLM /
/// Idefics3 model) beside the text model `m`, on its device. On success
/// `*out` receives a projector to release with `combs_mmproj_free()`; it
/// keeps `m` alive.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `m`, `path` or `out`; a text model
/// without an `<image>` token; a projector whose output width is not the
/// text model's), `COMBS_ERR_IO` (missing or unreadable file),
/// `COMBS_ERR_UNSUPPORTED` (a GGUF of another architecture than `clip` —
/// a text model's, say — or another projector type), `COMBS_ERR_FORMAT`
/// (truncated, inconsistent: the message names the key or tensor),
/// `COMBS_ERR_OUT_OF_MEMORY`, `COMBS_ERR_DEVICE`.
///
/// # Safety
/// `m` is NULL or a live model; `path` is NULL or a NUL-terminated string;
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_mmproj_load(
    m: *const combs_model,
    path: *const c_char,
    out: *mut *mut combs_mmproj,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let m = unsafe { handle(m, "m") }?;
        // SAFETY: per this function's contract.
        let path = unsafe { c_str(path, "path") }?;
        let path = Path::new(OsStr::from_bytes(path.to_bytes()));
        let vision = m
            .model
            .load_vision(path, &LoadOptions::default())
            .map_err(|e| file_failure(path, e))?;
        Ok(combs_mmproj {
            vision,
            _model: m.model.clone(),
        })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_mmproj_load", out, make) }
}

/// Releases a projector (NULL: no-op).
///
/// # Safety
/// `p` is NULL or a projector from `combs_mmproj_load()` not freed before
/// and not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_mmproj_free(p: *mut combs_mmproj) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_mmproj_free", p) }
}

/// Decodes an image file: PNG, JPEG, WebP, GIF (its first frame), BMP,
/// TIFF or PNM, told by its content. On success `*out` receives an image to
/// release with `combs_image_free()`.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `path` or `out`; an image of 0 pixels
/// or over 16384 pixels a side or 2^26 pixels, refused from its header
/// before anything is allocated), `COMBS_ERR_IO`, `COMBS_ERR_FORMAT` (none
/// of those formats, corrupt or truncated).
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_load(
    path: *const c_char,
    out: *mut *mut combs_image,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let path = unsafe { c_str(path, "path") }?;
        let path = Path::new(OsStr::from_bytes(path.to_bytes()));
        let rgb = crate::vision::load_image(path).map_err(|e| file_failure(path, e))?;
        Ok(combs_image { rgb })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_image_load", out, make) }
}

/// Decodes an image file held in memory (`len` bytes at `bytes`).
///
/// # Errors
/// As `combs_image_load()`, without `COMBS_ERR_IO`.
///
/// # Safety
/// `bytes` is NULL or valid for `len` reads; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_decode(
    bytes: *const u8,
    len: usize,
    out: *mut *mut combs_image,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let b = unsafe { array(bytes, len, "bytes") }?;
        let rgb = crate::vision::decode_image(b)?;
        Ok(combs_image { rgb })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_image_decode", out, make) }
}

/// Copies `width` × `height` RGB8 pixels (row-major, `3 * width` bytes per
/// row, no padding) into a new image.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `rgb` or `out`, a size of 0 pixels or
/// over the limits of `combs_image_load()`).
///
/// # Safety
/// `rgb` is NULL or valid for `3 * width * height` reads; `out` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_from_rgb(
    rgb: *const u8,
    width: u32,
    height: u32,
    out: *mut *mut combs_image,
) -> combs_status {
    let make = || {
        // SAFETY: per this function's contract.
        let rgb = unsafe { rgb_image(rgb, width, height) }?;
        Ok(combs_image { rgb })
    };
    // SAFETY: per this function's contract.
    unsafe { guard_create("combs_image_from_rgb", out, make) }
}

/// Checks the size before reading the pixels, so that a huge `width` ×
/// `height` is an error rather than a read past the caller's buffer.
///
/// # Safety
/// `rgb` is NULL or valid for `3 * width * height` reads.
unsafe fn rgb_image(rgb: *const u8, width: u32, height: u32) -> FfiResult<RgbImage> {
    let bytes = crate::vision::image::check_size(width, height)?;
    let len = usize::try_from(bytes)
        .map_err(|_| super::args::invalid("width", "the image does not fit in memory"))?;
    if rgb.is_null() {
        return Err(super::args::invalid("rgb", "is NULL"));
    }
    // SAFETY: per this function's contract (non-NULL, len bytes readable).
    let data = unsafe { array(rgb, len, "rgb") }?.to_vec();
    Ok(RgbImage::from_rgb8(width, height, data)?)
}

/// Width of an image in pixels (0 for NULL).
///
/// # Safety
/// `img` is NULL or a live image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_width(img: *const combs_image) -> u32 {
    // SAFETY: per this function's contract.
    unsafe { guard_get("combs_image_width", img, "img", 0, |i| Ok(i.rgb.width())) }
}

/// Height of an image in pixels (0 for NULL).
///
/// # Safety
/// `img` is NULL or a live image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_height(img: *const combs_image) -> u32 {
    // SAFETY: per this function's contract.
    unsafe { guard_get("combs_image_height", img, "img", 0, |i| Ok(i.rgb.height())) }
}

/// The pixels of an image: `3 * width * height` bytes, RGB, row-major,
/// valid until the image is freed (NULL for NULL).
///
/// # Safety
/// `img` is NULL or a live image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_data(img: *const combs_image) -> *const u8 {
    // SAFETY: per this function's contract.
    unsafe {
        guard_get("combs_image_data", img, "img", std::ptr::null(), |i| {
            Ok(i.rgb.data().as_ptr())
        })
    }
}

/// Releases an image (NULL: no-op).
///
/// # Safety
/// `img` is NULL or an image not freed before and not in use by another
/// thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_image_free(img: *mut combs_image) {
    // SAFETY: per this function's contract.
    unsafe { guard_free("combs_image_free", img) }
}

/// Evaluates an image after the tokens `s` holds: the image is resized and
/// cut into tiles as the model's processor does, encoded by the projector,
/// and its markers and embeddings (e.g. 13 tiles × 64 for a 1024×768 image
/// with SmolVLM-256M) are prefilled. `rgb` holds `width` × `height` RGB8
/// pixels, row-major, no padding. The logits are then those of the image's
/// last marker.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s`, `p` or `rgb`; a size of 0 or
/// over the limits of `combs_image_load()`; a session of another text model
/// than the projector's), `COMBS_ERR_CONTEXT_FULL`: the session is
/// unchanged. `COMBS_ERR_OUT_OF_MEMORY` / `COMBS_ERR_DEVICE` as for
/// `combs_session_prefill`.
///
/// # Safety
/// `s` is NULL or a live session used by no other thread; `p` is NULL or a
/// live projector; `rgb` is NULL or valid for `3 * width * height` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_prefill_image(
    s: *mut combs_session,
    p: *const combs_mmproj,
    rgb: *const u8,
    width: u32,
    height: u32,
) -> combs_status {
    guard("combs_session_prefill_image", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        // SAFETY: per this function's contract.
        let p = unsafe { handle(p, "p") }?;
        // SAFETY: per this function's contract.
        let image = unsafe { rgb_image(rgb, width, height) }?;
        let encoded = p.vision.encode(&image)?;
        let r = p.vision.prefill_image(&mut s.session, &encoded);
        s.after_eval(r)
    })
}

/// Evaluates `text` after the tokens `s` holds, each `<image>` in it
/// standing for the next of the `n_images` images: a chat turn rendered by
/// `combs_chat_apply_template()` from a message such as `"<image>What is
/// in this picture?"` (templates that take typed content, as SmolVLM's, get
/// an image part there), or raw text. Special tokens in `text` are parsed;
/// `add_special` adds the model's BOS where it wants one (for the first
/// text of a session). `p` may be NULL when `n_images` is 0.
///
/// # Errors
/// `COMBS_ERR_INVALID_ARGUMENT` (NULL `s` or `text`, text that is not UTF-8,
/// NULL `images` with `n_images` > 0 or a NULL entry, NULL `p` with images,
/// as many `<image>` markers as images required, a session of another text
/// model), `COMBS_ERR_CONTEXT_FULL`: the session is unchanged.
/// `COMBS_ERR_OUT_OF_MEMORY` / `COMBS_ERR_DEVICE` as for
/// `combs_session_prefill`.
///
/// # Safety
/// `s` is NULL or a live session used by no other thread; `p` is NULL or a
/// live projector; `text` is NULL or NUL-terminated; `images` is NULL or an
/// array of `n_images` pointers, each NULL or a live image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn combs_session_prefill_multimodal(
    s: *mut combs_session,
    p: *const combs_mmproj,
    text: *const c_char,
    images: *const *const combs_image,
    n_images: usize,
    add_special: bool,
) -> combs_status {
    guard("combs_session_prefill_multimodal", || {
        // SAFETY: per this function's contract.
        let s = unsafe { handle_mut(s, "s") }?;
        // SAFETY: per this function's contract.
        let text = utf8(unsafe { c_str(text, "text") }?.to_bytes(), "text")?;
        // SAFETY: per this function's contract.
        let images = unsafe { array(images, n_images, "images") }?;
        if p.is_null() && images.is_empty() {
            let tokens = s.model.tokenizer().encode(text, add_special, true)?;
            if tokens.is_empty() {
                return Ok(());
            }
            let r = s.session.prefill(&tokens);
            return s.after_eval(r);
        }
        // SAFETY: per this function's contract.
        let p = unsafe { handle(p, "p") }?;
        let mut encoded: Vec<EncodedImage> = Vec::with_capacity(images.len());
        for (i, &img) in images.iter().enumerate() {
            // SAFETY: each entry is NULL or a live image per the contract.
            let img = unsafe { img.as_ref() }
                .ok_or_else(|| super::args::invalid("images", format!("images[{i}] is NULL")))?;
            encoded.push(p.vision.encode(&img.rgb)?);
        }
        let tokens = p.vision.tokenize(text, &encoded, add_special)?;
        let r = p.vision.prefill(&mut s.session, &tokens, &encoded);
        s.after_eval(r)
    })
}
