//! The vision entry points of the C API on the tiny random SmolVLM of
//! `tests/fixtures/vlm/`: a chat turn with an image prefilled through
//! `combs_session_prefill_multimodal` gives the logits the runtime gives
//! (and transformers' greedy tokens), `combs_session_prefill_image` equals
//! the same image as a marker; misuse gives its status and a message.
//! (examples/c/describe_image.c does the same from C.)

mod ffi_support;

use std::ffi::{CString, c_char};
use std::path::Path;
use std::ptr;

use combs::ffi::*;
use ffi_support::last_error;

use combs_status::*;

fn fixture(name: &str) -> CString {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vlm")
        .join(name);
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

#[track_caller]
fn expect(got: combs_status, want: combs_status, text: &str) {
    let msg = last_error();
    assert_eq!(got, want, "last error: {msg}");
    assert!(msg.contains(text), "`{msg}` lacks `{text}`");
}

struct Handles {
    rt: *mut combs_runtime,
    model: *mut combs_model,
    mmproj: *mut combs_mmproj,
    image: *mut combs_image,
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: each is NULL or a live handle made below, freed once.
        unsafe {
            combs_image_free(self.image);
            combs_mmproj_free(self.mmproj);
            combs_model_free(self.model);
            combs_runtime_free(self.rt);
        }
    }
}

fn load() -> Handles {
    let mut h = Handles {
        rt: ptr::null_mut(),
        model: ptr::null_mut(),
        mmproj: ptr::null_mut(),
        image: ptr::null_mut(),
    };
    // SAFETY: valid out-pointers and NUL-terminated paths.
    unsafe {
        assert_eq!(combs_runtime_create(ptr::null(), &mut h.rt), COMBS_OK);
        let text = fixture("smolvlm-tiny.gguf");
        assert_eq!(
            combs_model_load(h.rt, text.as_ptr(), ptr::null(), &mut h.model),
            COMBS_OK
        );
        let mm = fixture("mmproj-smolvlm-tiny.gguf");
        assert_eq!(
            combs_mmproj_load(h.model, mm.as_ptr(), &mut h.mmproj),
            COMBS_OK,
            "{}",
            last_error()
        );
        let img = fixture("images/tall_300x900.png");
        assert_eq!(combs_image_load(img.as_ptr(), &mut h.image), COMBS_OK);
    }
    h
}

fn session(model: *mut combs_model) -> *mut combs_session {
    let mut s = ptr::null_mut();
    // SAFETY: a live model and a valid out-pointer.
    assert_eq!(
        unsafe { combs_session_create(model, ptr::null(), &mut s) },
        COMBS_OK
    );
    s
}

/// The argmax of a session's logits.
fn argmax(s: *mut combs_session, n_vocab: usize) -> usize {
    // SAFETY: a live session with logits of n_vocab values.
    let l = unsafe { std::slice::from_raw_parts(combs_session_logits(s), n_vocab) };
    (0..n_vocab).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

#[test]
fn chat_turn_with_an_image_generates_transformers_tokens() {
    let h = load();
    let refs: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vlm/transformers.json"),
        )
        .expect("fixture"),
    )
    .expect("json");
    let g = &refs["generation"]["chat"];
    let turn = CString::new(g["text"].as_str().unwrap()).unwrap();
    // SAFETY: live handles; the image array holds one live image.
    unsafe {
        let n_vocab = combs_model_n_vocab(h.model) as usize;
        let s = session(h.model);
        let images = [h.image.cast_const()];
        let st =
            combs_session_prefill_multimodal(s, h.mmproj, turn.as_ptr(), images.as_ptr(), 1, true);
        assert_eq!(st, COMBS_OK, "{}", last_error());
        assert_eq!(
            combs_session_len(s),
            g["n_prompt_tokens"].as_u64().unwrap() as usize
        );
        let want: Vec<usize> = g["greedy_f32"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as usize)
            .collect();
        for &w in &want {
            let t = argmax(s, n_vocab);
            assert_eq!(t, w);
            assert_eq!(combs_session_decode(s, t as i32), COMBS_OK);
        }
        combs_session_free(s);

        // The image alone equals "<image>" through the multimodal call.
        let (a, b) = (session(h.model), session(h.model));
        let (w, ht) = (combs_image_width(h.image), combs_image_height(h.image));
        assert_eq!((w, ht), (300, 900));
        let st = combs_session_prefill_image(a, h.mmproj, combs_image_data(h.image), w, ht);
        assert_eq!(st, COMBS_OK, "{}", last_error());
        let marker = CString::new("<image>").unwrap();
        let st = combs_session_prefill_multimodal(
            b,
            h.mmproj,
            marker.as_ptr(),
            images.as_ptr(),
            1,
            false,
        );
        assert_eq!(st, COMBS_OK, "{}", last_error());
        assert_eq!(combs_session_len(a), combs_session_len(b));
        let la = std::slice::from_raw_parts(combs_session_logits(a), n_vocab);
        let lb = std::slice::from_raw_parts(combs_session_logits(b), n_vocab);
        assert_eq!(la, lb);
        combs_session_free(a);
        combs_session_free(b);
    }
}

#[test]
fn misuse_is_refused_with_a_message() {
    let h = load();
    // SAFETY: every pointer is NULL, a live handle, or valid for what it promises.
    unsafe {
        let s = session(h.model);
        let mut out: *mut combs_mmproj = ptr::dangling_mut();
        expect(
            combs_mmproj_load(ptr::null(), fixture("x").as_ptr(), &mut out),
            COMBS_ERR_INVALID_ARGUMENT,
            "m",
        );
        assert!(out.is_null());
        let text = fixture("smolvlm-tiny.gguf");
        expect(
            combs_mmproj_load(h.model, text.as_ptr(), &mut out),
            COMBS_ERR_UNSUPPORTED,
            "clip",
        );
        expect(
            combs_mmproj_load(h.model, fixture("missing.gguf").as_ptr(), &mut out),
            COMBS_ERR_IO,
            "missing.gguf",
        );
        let mut img: *mut combs_image = ptr::dangling_mut();
        expect(
            combs_image_load(ptr::null(), &mut img),
            COMBS_ERR_INVALID_ARGUMENT,
            "path",
        );
        assert!(img.is_null());
        let junk = b"GIF89a....";
        expect(
            combs_image_decode(junk.as_ptr(), junk.len(), &mut img),
            COMBS_ERR_FORMAT,
            "image",
        );
        expect(
            combs_image_decode(ptr::null(), 10, &mut img),
            COMBS_ERR_INVALID_ARGUMENT,
            "bytes",
        );
        let px = [7u8; 3];
        expect(
            combs_image_from_rgb(px.as_ptr(), 0, 5, &mut img),
            COMBS_ERR_INVALID_ARGUMENT,
            "image",
        );
        // A size whose bytes the caller cannot have: refused before any read.
        expect(
            combs_image_from_rgb(px.as_ptr(), 100_000, 100_000, &mut img),
            COMBS_ERR_INVALID_ARGUMENT,
            "image",
        );
        assert_eq!(combs_image_from_rgb(px.as_ptr(), 1, 1, &mut img), COMBS_OK);
        assert_eq!((combs_image_width(img), combs_image_height(img)), (1, 1));
        combs_image_free(img);
        assert_eq!(combs_image_width(ptr::null()), 0);
        assert!(combs_image_data(ptr::null()).is_null());

        expect(
            combs_session_prefill_image(ptr::null_mut(), h.mmproj, px.as_ptr(), 1, 1),
            COMBS_ERR_INVALID_ARGUMENT,
            "s",
        );
        expect(
            combs_session_prefill_image(s, ptr::null(), px.as_ptr(), 1, 1),
            COMBS_ERR_INVALID_ARGUMENT,
            "p",
        );
        expect(
            combs_session_prefill_image(s, h.mmproj, ptr::null(), 1, 1),
            COMBS_ERR_INVALID_ARGUMENT,
            "rgb",
        );
        let marker = CString::new("<image>").unwrap();
        let images = [h.image.cast_const(), ptr::null()];
        expect(
            combs_session_prefill_multimodal(
                s,
                ptr::null(),
                marker.as_ptr(),
                images.as_ptr(),
                1,
                false,
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            "p",
        );
        expect(
            combs_session_prefill_multimodal(
                s,
                h.mmproj,
                marker.as_ptr(),
                images.as_ptr(),
                2,
                false,
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            "images[1]",
        );
        expect(
            combs_session_prefill_multimodal(s, h.mmproj, marker.as_ptr(), ptr::null(), 1, false),
            COMBS_ERR_INVALID_ARGUMENT,
            "images",
        );
        expect(
            combs_session_prefill_multimodal(
                s,
                h.mmproj,
                marker.as_ptr(),
                images.as_ptr(),
                0,
                false,
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            "markers",
        );
        let bad_utf8 = [0xffu8 as c_char, 0];
        expect(
            combs_session_prefill_multimodal(s, h.mmproj, bad_utf8.as_ptr(), ptr::null(), 0, false),
            COMBS_ERR_INVALID_ARGUMENT,
            "UTF-8",
        );
        assert_eq!(combs_session_len(s), 0);
        // Text alone, without a projector, is a plain prefill.
        let hello = CString::new("hello").unwrap();
        assert_eq!(
            combs_session_prefill_multimodal(s, ptr::null(), hello.as_ptr(), ptr::null(), 0, false),
            COMBS_OK
        );
        assert!(combs_session_len(s) > 0);
        combs_session_free(s);
        combs_mmproj_free(ptr::null_mut());
        combs_image_free(ptr::null_mut());
    }
}
