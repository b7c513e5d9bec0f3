//! The misuse table of the C API (issue 21, item 3): every public entry
//! point called the way a careless or hostile C program calls it — NULL
//! handles and buffers, token ids out of range, zero and huge sizes, option
//! structs holding enum values outside the enum, text that is not UTF-8 or
//! ends inside a character, sessions of another model in a batch — each row
//! giving its documented status (or documented failure value) and a
//! `combs_last_error()` that names the function and the argument. Rows run
//! in order on one set of handles, and after the table the handles still
//! work (a failed call leaves them usable).
//!
//! Not covered: a handle freed twice or used after free. Handles are plain
//! heap pointers (as in sqlite3 and llama.h), so that is undefined
//! behaviour the library cannot detect; valgrind finds it in C programs.

mod ffi_support;

use std::ffi::{CString, c_char};
use std::mem::{MaybeUninit, offset_of};
use std::path::{Path, PathBuf};
use std::ptr;

use combs::ffi::*;
use combs::models::speech::WhisperHparams;
use combs::models::whisper::HostWhisper;
use combs::quant::QuantType;
use ffi_support::{last_error, ok};

use combs_status::*;

fn fixture(name: &str) -> CString {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vlm")
        .join(name);
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

fn c_path(p: &Path) -> CString {
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

/// A small random whisper.cpp file (as in tests/ffi_speech.rs).
fn write_speech_model(dir: &Path) -> PathBuf {
    let hp = WhisperHparams {
        n_vocab: 51864,
        n_audio_ctx: 1500,
        n_audio_state: 64,
        n_audio_head: 2,
        n_audio_layer: 1,
        n_text_ctx: 448,
        n_text_state: 64,
        n_text_head: 2,
        n_text_layer: 1,
        n_mels: 80,
    };
    let m = HostWhisper::random(hp, QuantType::Q8_0, 7).expect("random model");
    let w = m.to_whisper_bin(QuantType::Q8_0).expect("writer");
    let p = dir.join("speech.bin");
    std::fs::write(&p, w.to_bytes()).expect("write");
    p
}

/// `v` with the `i32` at byte `offset` replaced by `raw`: an options struct
/// whose enum field holds a value outside the enum, as C may store it.
fn with_raw_i32<T>(v: T, offset: usize, raw: i32) -> MaybeUninit<T> {
    let mut m = MaybeUninit::new(v);
    // SAFETY: offset is that of an i32-sized enum field inside T.
    unsafe {
        m.as_mut_ptr()
            .cast::<u8>()
            .add(offset)
            .cast::<i32>()
            .write(raw)
    };
    m
}

/// Every handle the rows need.
struct Fx {
    rt: *mut combs_runtime,
    m: *mut combs_model,
    /// The same file loaded again: a different model.
    other: *mut combs_model,
    mmproj: *mut combs_mmproj,
    image: *mut combs_image,
    speech: *mut combs_speech_model,
    smp: *mut combs_sampler,
    /// Contiguous, prefilled with two tokens (logits valid).
    s: *mut combs_session,
    /// Contiguous, never evaluated (no logits).
    fresh: *mut combs_session,
    /// Paged sessions of `m`, prefilled with one token.
    p1: *mut combs_session,
    p2: *mut combs_session,
    /// Paged session of `other`, prefilled with one token.
    po: *mut combs_session,
    n_vocab: i32,
    dir: PathBuf,
}

fn paged_opts() -> combs_session_options {
    let mut o = combs_session_default_options();
    o.n_ctx = 64;
    o.kv_kind = combs_kv_kind::COMBS_KV_PAGED;
    o.page_size = 16;
    o.pool_pages = 16;
    o
}

impl Fx {
    fn new() -> Fx {
        let dir = std::env::temp_dir().join(format!("combs-ffi-misuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut f = Fx {
            rt: ptr::null_mut(),
            m: ptr::null_mut(),
            other: ptr::null_mut(),
            mmproj: ptr::null_mut(),
            image: ptr::null_mut(),
            speech: ptr::null_mut(),
            smp: ffi_support::greedy(),
            s: ptr::null_mut(),
            fresh: ptr::null_mut(),
            p1: ptr::null_mut(),
            p2: ptr::null_mut(),
            po: ptr::null_mut(),
            n_vocab: 0,
            dir,
        };
        let text = fixture("smolvlm-tiny.gguf");
        // SAFETY: valid out-pointers, NUL-terminated paths, live handles.
        unsafe {
            ok(combs_runtime_create(ptr::null(), &mut f.rt));
            ok(combs_model_load(f.rt, text.as_ptr(), ptr::null(), &mut f.m));
            ok(combs_model_load(
                f.rt,
                text.as_ptr(),
                ptr::null(),
                &mut f.other,
            ));
            let mm = fixture("mmproj-smolvlm-tiny.gguf");
            ok(combs_mmproj_load(f.m, mm.as_ptr(), &mut f.mmproj));
            let img = fixture("images/tall_300x900.png");
            ok(combs_image_load(img.as_ptr(), &mut f.image));
            let sp = c_path(&write_speech_model(&f.dir));
            ok(combs_speech_model_load(
                f.rt,
                sp.as_ptr(),
                ptr::null(),
                &mut f.speech,
            ));
            f.n_vocab = combs_model_n_vocab(f.m);
            let mut o = combs_session_default_options();
            o.n_ctx = 16;
            ok(combs_session_create(f.m, &o, &mut f.s));
            ok(combs_session_prefill(f.s, [1, 2].as_ptr(), 2));
            ok(combs_session_create(f.m, &o, &mut f.fresh));
            let po = paged_opts();
            for (model, out) in [(f.m, &mut f.p1), (f.m, &mut f.p2), (f.other, &mut f.po)] {
                ok(combs_session_create(model, &po, out));
                ok(combs_session_prefill(*out, [1].as_ptr(), 1));
            }
        }
        f
    }
}

impl Drop for Fx {
    fn drop(&mut self) {
        // SAFETY: every handle came from its create function and is freed once.
        unsafe {
            for s in [self.s, self.fresh, self.p1, self.p2, self.po] {
                combs_session_free(s);
            }
            combs_sampler_free(self.smp);
            combs_image_free(self.image);
            combs_mmproj_free(self.mmproj);
            combs_speech_model_free(self.speech);
            combs_model_free(self.other);
            combs_model_free(self.m);
            combs_runtime_free(self.rt);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One row: what is wrong, the call, the status it must give, and a piece
/// of text the message must hold besides the function's name.
struct Row {
    what: &'static str,
    func: &'static str,
    want: combs_status,
    mentions: &'static str,
    call: fn(&Fx) -> combs_status,
}

/// The status of a call that reports failure by a value (NULL, -1, 0,
/// false): `COMBS_ERR_INVALID_ARGUMENT` when it returned that value.
fn failed_value(failed: bool) -> combs_status {
    if failed {
        COMBS_ERR_INVALID_ARGUMENT
    } else {
        COMBS_OK
    }
}

/// A count no memory can hold (a corrupt length).
const HUGE: usize = usize::MAX;
const NOT_UTF8: &[u8] = b"ab\xff\xfecd";
/// "é" cut after its first byte: the stated length ends inside a character.
const CUT: &[u8] = "é".as_bytes();

macro_rules! row {
    ($what:expr, $func:literal, $want:ident, $mentions:expr, |$f:ident| $body:expr) => {
        Row {
            what: $what,
            func: $func,
            want: $want,
            mentions: $mentions,
            // SAFETY (every row): the handles in `Fx` are live; every other
            // pointer is NULL, dangling only where a length of 0 or a
            // rejected length keeps it from being read, or valid for the
            // stated length.
            call: |$f: &Fx| unsafe { $body },
        }
    };
}

fn out<T>() -> *mut *mut T {
    // A fresh out-parameter slot, kept in a static list to the end of the
    // process (reachable, so valgrind does not count the rows' slots as
    // leaks) rather than freed by every row.
    static SLOTS: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    let slot = Box::into_raw(Box::new(ptr::NonNull::<T>::dangling().as_ptr()));
    if let Ok(mut slots) = SLOTS.lock() {
        slots.push(slot as usize);
    }
    slot
}

fn rows() -> Vec<Row> {
    vec![
        // --- runtime ---
        row!(
            "NULL out",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |_f| combs_runtime_create(ptr::null(), ptr::null_mut())
        ),
        row!(
            "device_index -2",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "device_index",
            |_f| {
                let mut o = combs_runtime_default_options();
                o.device_index = -2;
                combs_runtime_create(&o, out())
            }
        ),
        row!(
            "device_index i32::MIN",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "device_index",
            |_f| {
                let mut o = combs_runtime_default_options();
                o.device_index = i32::MIN;
                combs_runtime_create(&o, out())
            }
        ),
        row!(
            "device_index past the last device",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "device_index",
            |_f| {
                let mut o = combs_runtime_default_options();
                o.device_index = 9999;
                combs_runtime_create(&o, out())
            }
        ),
        row!(
            "split_mode 7",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "split_mode",
            |_f| {
                let o = with_raw_i32(
                    combs_runtime_default_options(),
                    offset_of!(combs_runtime_options, split_mode),
                    7,
                );
                combs_runtime_create(o.as_ptr(), out())
            }
        ),
        row!(
            "placement -1",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "placement",
            |_f| {
                let o = with_raw_i32(
                    combs_runtime_default_options(),
                    offset_of!(combs_runtime_options, placement),
                    -1,
                );
                combs_runtime_create(o.as_ptr(), out())
            }
        ),
        row!(
            "device_indices with a -2",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "device_indices",
            |_f| {
                static DEVICES: [i32; 2] = [0, -2];
                let mut o = combs_runtime_default_options();
                o.device_indices = DEVICES.as_ptr();
                o.n_devices = 2;
                combs_runtime_create(&o, out())
            }
        ),
        row!(
            "n_devices 65",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_devices",
            |_f| {
                static DEVICES: [i32; 65] = [0; 65];
                let mut o = combs_runtime_default_options();
                o.device_indices = DEVICES.as_ptr();
                o.n_devices = 65;
                combs_runtime_create(&o, out())
            }
        ),
        row!(
            "tensor_split with a negative share",
            "combs_runtime_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "tensor_split",
            |_f| {
                static DEVICES: [i32; 2] = [0, 0];
                static SHARES: [f32; 2] = [1.0, -1.0];
                let mut o = combs_runtime_default_options();
                o.device_indices = DEVICES.as_ptr();
                o.n_devices = 2;
                o.tensor_split = SHARES.as_ptr();
                combs_runtime_create(&o, out())
            }
        ),
        // --- model load ---
        row!(
            "NULL rt",
            "combs_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`rt`",
            |_f| combs_model_load(
                ptr::null_mut(),
                fixture("smolvlm-tiny.gguf").as_ptr(),
                ptr::null(),
                out()
            )
        ),
        row!(
            "NULL path",
            "combs_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`path`",
            |f| combs_model_load(f.rt, ptr::null(), ptr::null(), out())
        ),
        row!(
            "NULL out",
            "combs_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_model_load(
                f.rt,
                fixture("smolvlm-tiny.gguf").as_ptr(),
                ptr::null(),
                ptr::null_mut()
            )
        ),
        row!(
            "numerics 7",
            "combs_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "numerics",
            |f| {
                let o = with_raw_i32(
                    combs_model_default_options(),
                    offset_of!(combs_model_options, numerics),
                    7,
                );
                combs_model_load(
                    f.rt,
                    fixture("smolvlm-tiny.gguf").as_ptr(),
                    o.as_ptr(),
                    out(),
                )
            }
        ),
        row!(
            "numerics -1",
            "combs_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "numerics",
            |f| {
                let o = with_raw_i32(
                    combs_model_default_options(),
                    offset_of!(combs_model_options, numerics),
                    -1,
                );
                combs_model_load(
                    f.rt,
                    fixture("smolvlm-tiny.gguf").as_ptr(),
                    o.as_ptr(),
                    out(),
                )
            }
        ),
        row!("empty path", "combs_model_load", COMBS_ERR_IO, "", |f| {
            combs_model_load(f.rt, c"".as_ptr(), ptr::null(), out())
        }),
        row!(
            "path that is not UTF-8 and does not exist",
            "combs_model_load",
            COMBS_ERR_IO,
            "No such file",
            |f| combs_model_load(
                f.rt,
                c"/nonexistent/\xff\xfe.gguf".as_ptr(),
                ptr::null(),
                out()
            )
        ),
        row!("a directory", "combs_model_load", COMBS_ERR_IO, "", |f| {
            combs_model_load(f.rt, c"/tmp".as_ptr(), ptr::null(), out())
        }),
        row!(
            "a whisper file",
            "combs_model_load",
            COMBS_ERR_UNSUPPORTED,
            "combs_speech_model_load",
            |f| combs_model_load(
                f.rt,
                c_path(&f.dir.join("speech.bin")).as_ptr(),
                ptr::null(),
                out()
            )
        ),
        // --- model getters (failure values) ---
        row!(
            "NULL m",
            "combs_model_n_vocab",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(combs_model_n_vocab(ptr::null()) == -1)
        ),
        row!(
            "NULL m",
            "combs_model_n_ctx_train",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(combs_model_n_ctx_train(ptr::null()) == -1)
        ),
        row!(
            "NULL m",
            "combs_model_token_bos",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(combs_model_token_bos(ptr::null()) == -1)
        ),
        row!(
            "NULL m",
            "combs_model_token_eos",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(combs_model_token_eos(ptr::null()) == -1)
        ),
        row!(
            "NULL m",
            "combs_model_token_is_eog",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(!combs_model_token_is_eog(ptr::null(), 0))
        ),
        // --- tokenizer ---
        row!(
            "NULL m",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_tokenize(
                ptr::null(),
                c"hi".as_ptr(),
                2,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "NULL text with len 5",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "`text`",
            |f| combs_tokenize(f.m, ptr::null(), 5, true, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "NULL n_out",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "`n_out`",
            |f| combs_tokenize(
                f.m,
                c"hi".as_ptr(),
                2,
                true,
                ptr::null_mut(),
                0,
                ptr::null_mut()
            )
        ),
        row!(
            "NULL out with cap 4",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_tokenize(f.m, c"hi".as_ptr(), 2, true, ptr::null_mut(), 4, &mut 0)
        ),
        row!(
            "text not UTF-8",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "UTF-8",
            |f| combs_tokenize(
                f.m,
                NOT_UTF8.as_ptr().cast(),
                NOT_UTF8.len(),
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "len ends inside a character",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "UTF-8",
            |f| combs_tokenize(
                f.m,
                CUT.as_ptr().cast(),
                1,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "huge len",
            "combs_tokenize",
            COMBS_ERR_INVALID_ARGUMENT,
            "`text`",
            |f| combs_tokenize(f.m, c"hi".as_ptr(), HUGE, true, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "cap 0",
            "combs_tokenize",
            COMBS_ERR_BUFFER_TOO_SMALL,
            "",
            |f| combs_tokenize(f.m, c"hi".as_ptr(), 2, true, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "NULL m",
            "combs_tokenize_ex",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_tokenize_ex(
                ptr::null(),
                c"hi".as_ptr(),
                2,
                true,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "text not UTF-8",
            "combs_tokenize_ex",
            COMBS_ERR_INVALID_ARGUMENT,
            "UTF-8",
            |f| combs_tokenize_ex(
                f.m,
                NOT_UTF8.as_ptr().cast(),
                NOT_UTF8.len(),
                false,
                false,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "NULL m",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_token_to_piece(ptr::null(), 1, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "token -1",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "-1",
            |f| combs_token_to_piece(f.m, -1, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "token n_vocab",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "out of range",
            |f| combs_token_to_piece(f.m, f.n_vocab, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "token i32::MAX",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "2147483647",
            |f| combs_token_to_piece(f.m, i32::MAX, ptr::null_mut(), 0, &mut 0)
        ),
        row!(
            "NULL len_out",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "`len_out`",
            |f| combs_token_to_piece(f.m, 1, ptr::null_mut(), 0, ptr::null_mut())
        ),
        row!(
            "NULL buf with cap 8",
            "combs_token_to_piece",
            COMBS_ERR_INVALID_ARGUMENT,
            "`buf`",
            |f| combs_token_to_piece(f.m, 1, ptr::null_mut(), 8, &mut 0)
        ),
        row!(
            "cap 0",
            "combs_token_to_piece",
            COMBS_ERR_BUFFER_TOO_SMALL,
            "",
            |f| combs_token_to_piece(f.m, 1, ptr::null_mut(), 0, &mut 0)
        ),
        // --- chat template ---
        row!(
            "NULL m",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_chat_apply_template(
                ptr::null(),
                ptr::null(),
                ptr::null(),
                0,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "NULL roles with 1 message",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "`roles`",
            |f| combs_chat_apply_template(
                f.m,
                ptr::null(),
                [c"hi".as_ptr()].as_ptr(),
                1,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "NULL contents with 1 message",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "`contents`",
            |f| combs_chat_apply_template(
                f.m,
                [c"user".as_ptr()].as_ptr(),
                ptr::null(),
                1,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "roles[0] NULL",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "roles[0]",
            |f| combs_chat_apply_template(
                f.m,
                [ptr::null::<c_char>()].as_ptr(),
                [c"hi".as_ptr()].as_ptr(),
                1,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "contents[1] not UTF-8",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "contents[1]",
            |f| combs_chat_apply_template(
                f.m,
                [c"user".as_ptr(), c"user".as_ptr()].as_ptr(),
                [c"hi".as_ptr(), c"a\xffb".as_ptr()].as_ptr(),
                2,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "huge n_messages",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "`roles`",
            |f| combs_chat_apply_template(
                f.m,
                [c"user".as_ptr()].as_ptr(),
                [c"hi".as_ptr()].as_ptr(),
                HUGE,
                true,
                ptr::null_mut(),
                0,
                &mut 0
            )
        ),
        row!(
            "NULL len_out",
            "combs_chat_apply_template",
            COMBS_ERR_INVALID_ARGUMENT,
            "`len_out`",
            |f| combs_chat_apply_template(
                f.m,
                [c"user".as_ptr()].as_ptr(),
                [c"hi".as_ptr()].as_ptr(),
                1,
                true,
                ptr::null_mut(),
                0,
                ptr::null_mut()
            )
        ),
        row!(
            "cap 1",
            "combs_chat_apply_template",
            COMBS_ERR_BUFFER_TOO_SMALL,
            "",
            |f| {
                let mut b = [0 as c_char; 1];
                combs_chat_apply_template(
                    f.m,
                    [c"user".as_ptr()].as_ptr(),
                    [c"hi".as_ptr()].as_ptr(),
                    1,
                    true,
                    b.as_mut_ptr(),
                    1,
                    &mut 0,
                )
            }
        ),
        // --- session create ---
        row!(
            "NULL m",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_session_create(ptr::null_mut(), ptr::null(), out())
        ),
        row!(
            "NULL out",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_session_create(f.m, ptr::null(), ptr::null_mut())
        ),
        row!(
            "kv_kind 2",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "kv_kind",
            |f| {
                let o = with_raw_i32(
                    combs_session_default_options(),
                    offset_of!(combs_session_options, kv_kind),
                    2,
                );
                combs_session_create(f.m, o.as_ptr(), out())
            }
        ),
        row!(
            "kv_kind -1",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "kv_kind",
            |f| {
                let o = with_raw_i32(
                    combs_session_default_options(),
                    offset_of!(combs_session_options, kv_kind),
                    -1,
                );
                combs_session_create(f.m, o.as_ptr(), out())
            }
        ),
        row!(
            "paged with page_size 0",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "page_size",
            |f| {
                let mut o = paged_opts();
                o.page_size = 0;
                combs_session_create(f.m, &o, out())
            }
        ),
        row!(
            "n_ctx u32::MAX",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_ctx",
            |f| {
                let mut o = combs_session_default_options();
                o.n_ctx = u32::MAX;
                combs_session_create(f.m, &o, out())
            }
        ),
        row!(
            "paged pool_pages u32::MAX",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "4294967295 pages",
            |f| {
                let mut o = paged_opts();
                o.page_size = 32;
                o.pool_pages = u32::MAX;
                combs_session_create(f.m, &o, out())
            }
        ),
        row!(
            "paged page_size u32::MAX",
            "combs_session_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "of 4294967295 rows",
            |f| {
                let mut o = paged_opts();
                o.page_size = u32::MAX;
                combs_session_create(f.m, &o, out())
            }
        ),
        // --- session evaluation ---
        row!(
            "NULL s",
            "combs_session_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| combs_session_prefill(ptr::null_mut(), [1].as_ptr(), 1)
        ),
        row!(
            "NULL tokens with n 3",
            "combs_session_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "`tokens`",
            |f| combs_session_prefill(f.s, ptr::null(), 3)
        ),
        row!(
            "token -1",
            "combs_session_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[1]",
            |f| combs_session_prefill(f.s, [1, -1].as_ptr(), 2)
        ),
        row!(
            "token n_vocab",
            "combs_session_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[0]",
            |f| combs_session_prefill(f.s, [f.n_vocab].as_ptr(), 1)
        ),
        row!(
            "huge n",
            "combs_session_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "`tokens`",
            |f| combs_session_prefill(f.s, [1].as_ptr(), HUGE)
        ),
        row!(
            "past the context",
            "combs_session_prefill",
            COMBS_ERR_CONTEXT_FULL,
            "16",
            |f| combs_session_prefill(f.s, [1; 15].as_ptr(), 15)
        ),
        row!(
            "NULL s",
            "combs_session_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| combs_session_decode(ptr::null_mut(), 1)
        ),
        row!(
            "token -5",
            "combs_session_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "-5",
            |f| combs_session_decode(f.s, -5)
        ),
        row!(
            "token i32::MIN",
            "combs_session_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "-2147483648",
            |f| combs_session_decode(f.s, i32::MIN)
        ),
        row!(
            "NULL s",
            "combs_session_logits",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| failed_value(combs_session_logits(ptr::null()).is_null())
        ),
        row!(
            "nothing evaluated",
            "combs_session_logits",
            COMBS_ERR_INVALID_ARGUMENT,
            "no logits",
            |f| failed_value(combs_session_logits(f.fresh).is_null())
        ),
        row!(
            "NULL s",
            "combs_session_len",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| failed_value(combs_session_len(ptr::null()) == 0)
        ),
        row!(
            "NULL s",
            "combs_session_n_ctx",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| failed_value(combs_session_n_ctx(ptr::null()) == 0)
        ),
        row!(
            "NULL s",
            "combs_session_rewind",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| combs_session_rewind(ptr::null_mut(), 0)
        ),
        row!(
            "n_keep past the length",
            "combs_session_rewind",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_keep",
            |f| combs_session_rewind(f.s, 3)
        ),
        row!(
            "n_keep usize::MAX",
            "combs_session_rewind",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_keep",
            |f| combs_session_rewind(f.s, usize::MAX)
        ),
        row!(
            "NULL s",
            "combs_session_fork",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| combs_session_fork(ptr::null(), out())
        ),
        row!(
            "NULL out",
            "combs_session_fork",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_session_fork(f.s, ptr::null_mut())
        ),
        row!(
            "NULL s",
            "combs_session_page_stats",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |_f| combs_session_page_stats(ptr::null(), &mut combs_page_stats::default())
        ),
        row!(
            "NULL out",
            "combs_session_page_stats",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_session_page_stats(f.p1, ptr::null_mut())
        ),
        row!(
            "contiguous session",
            "combs_session_page_stats",
            COMBS_ERR_INVALID_ARGUMENT,
            "contiguous",
            |f| combs_session_page_stats(f.s, &mut combs_page_stats::default())
        ),
        // --- sampler ---
        row!(
            "NULL out",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |_f| combs_sampler_create(ptr::null(), ptr::null_mut())
        ),
        row!(
            "temperature -1",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "temperature",
            |_f| {
                let mut o = combs_sampler_default_options();
                o.temperature = -1.0;
                combs_sampler_create(&o, out())
            }
        ),
        row!(
            "temperature NaN",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "temperature",
            |_f| {
                let mut o = combs_sampler_default_options();
                o.temperature = f32::NAN;
                combs_sampler_create(&o, out())
            }
        ),
        row!(
            "top_p 2",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "top_p",
            |_f| {
                let mut o = combs_sampler_default_options();
                o.top_p = 2.0;
                combs_sampler_create(&o, out())
            }
        ),
        row!(
            "min_p -0.5",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "min_p",
            |_f| {
                let mut o = combs_sampler_default_options();
                o.min_p = -0.5;
                combs_sampler_create(&o, out())
            }
        ),
        row!(
            "repeat_penalty 0",
            "combs_sampler_create",
            COMBS_ERR_INVALID_ARGUMENT,
            "repeat_penalty",
            |_f| {
                let mut o = combs_sampler_default_options();
                o.repeat_penalty = 0.0;
                combs_sampler_create(&o, out())
            }
        ),
        row!(
            "NULL smp",
            "combs_sampler_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`smp`",
            |_f| failed_value(combs_sampler_sample(ptr::null_mut(), [0.0f32; 4].as_ptr(), 4) < 0)
        ),
        row!(
            "NULL logits",
            "combs_sampler_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`logits`",
            |f| failed_value(combs_sampler_sample(f.smp, ptr::null(), 4) < 0)
        ),
        row!(
            "n_vocab 0",
            "combs_sampler_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_vocab",
            |f| failed_value(combs_sampler_sample(f.smp, [0.0f32; 4].as_ptr(), 0) < 0)
        ),
        row!(
            "huge n_vocab",
            "combs_sampler_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "n_vocab",
            |f| failed_value(combs_sampler_sample(f.smp, [0.0f32; 4].as_ptr(), HUGE) < 0)
        ),
        row!(
            "NULL smp",
            "combs_sampler_accept",
            COMBS_ERR_INVALID_ARGUMENT,
            "`smp`",
            |_f| combs_sampler_accept(ptr::null_mut(), 1)
        ),
        row!(
            "token -1",
            "combs_sampler_accept",
            COMBS_ERR_INVALID_ARGUMENT,
            "-1",
            |f| combs_sampler_accept(f.smp, -1)
        ),
        row!(
            "NULL smp",
            "combs_sampler_reset",
            COMBS_ERR_INVALID_ARGUMENT,
            "`smp`",
            |_f| combs_sampler_reset(ptr::null_mut())
        ),
        row!(
            "NULL s",
            "combs_generate",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |f| combs_generate(ptr::null_mut(), f.smp, 1, None, ptr::null_mut())
        ),
        row!(
            "NULL smp",
            "combs_generate",
            COMBS_ERR_INVALID_ARGUMENT,
            "`smp`",
            |f| combs_generate(f.s, ptr::null_mut(), 1, None, ptr::null_mut())
        ),
        row!(
            "nothing evaluated",
            "combs_generate",
            COMBS_ERR_INVALID_ARGUMENT,
            "logits",
            |f| combs_generate(f.fresh, f.smp, 1, None, ptr::null_mut())
        ),
        // --- batches ---
        row!(
            "NULL m",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |f| combs_batch_decode(ptr::null_mut(), [f.p1].as_ptr(), [1].as_ptr(), 1)
        ),
        row!(
            "NULL sessions with n 1",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`sessions`",
            |f| combs_batch_decode(f.m, ptr::null(), [1].as_ptr(), 1)
        ),
        row!(
            "NULL tokens with n 1",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`tokens`",
            |f| combs_batch_decode(f.m, [f.p1].as_ptr(), ptr::null(), 1)
        ),
        row!(
            "sessions[1] NULL",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "sessions[1]",
            |f| combs_batch_decode(f.m, [f.p1, ptr::null_mut()].as_ptr(), [1, 1].as_ptr(), 2)
        ),
        row!(
            "a session listed twice",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "twice",
            |f| combs_batch_decode(f.m, [f.p1, f.p2, f.p1].as_ptr(), [1, 1, 1].as_ptr(), 3)
        ),
        row!(
            "a session of another model",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "another model",
            |f| combs_batch_decode(f.m, [f.p1, f.po].as_ptr(), [1, 1].as_ptr(), 2)
        ),
        row!(
            "a contiguous session",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "paged",
            |f| combs_batch_decode(f.m, [f.p1, f.s].as_ptr(), [1, 1].as_ptr(), 2)
        ),
        row!(
            "tokens[1] out of range",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[1]",
            |f| combs_batch_decode(f.m, [f.p1, f.p2].as_ptr(), [1, f.n_vocab].as_ptr(), 2)
        ),
        row!(
            "huge n",
            "combs_batch_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`sessions`",
            |f| combs_batch_decode(f.m, [f.p1].as_ptr(), [1].as_ptr(), HUGE)
        ),
        row!(
            "NULL m",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |f| combs_batch_decode_sample(
                ptr::null_mut(),
                [f.p1].as_ptr(),
                [f.smp].as_ptr(),
                [1].as_ptr(),
                1,
                [0].as_mut_ptr()
            )
        ),
        row!(
            "NULL samplers with n 1",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`samplers`",
            |f| combs_batch_decode_sample(
                f.m,
                [f.p1].as_ptr(),
                ptr::null(),
                [1].as_ptr(),
                1,
                [0].as_mut_ptr()
            )
        ),
        row!(
            "NULL out with n 1",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_batch_decode_sample(
                f.m,
                [f.p1].as_ptr(),
                [f.smp].as_ptr(),
                [1].as_ptr(),
                1,
                ptr::null_mut()
            )
        ),
        row!(
            "samplers[0] NULL",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "samplers[0]",
            |f| combs_batch_decode_sample(
                f.m,
                [f.p1].as_ptr(),
                [ptr::null_mut()].as_ptr(),
                [1].as_ptr(),
                1,
                [0].as_mut_ptr()
            )
        ),
        row!(
            "a sampler listed twice",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "twice",
            |f| combs_batch_decode_sample(
                f.m,
                [f.p1, f.p2].as_ptr(),
                [f.smp, f.smp].as_ptr(),
                [1, 1].as_ptr(),
                2,
                [0, 0].as_mut_ptr()
            )
        ),
        row!(
            "huge n",
            "combs_batch_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`sessions`",
            |f| combs_batch_decode_sample(
                f.m,
                [f.p1].as_ptr(),
                [f.smp].as_ptr(),
                [1].as_ptr(),
                HUGE,
                [0].as_mut_ptr()
            )
        ),
        row!(
            "NULL s",
            "combs_session_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |f| combs_session_decode_sample(ptr::null_mut(), 1, f.smp, [0].as_mut_ptr())
        ),
        row!(
            "NULL smp",
            "combs_session_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`smp`",
            |f| combs_session_decode_sample(f.s, 1, ptr::null_mut(), [0].as_mut_ptr())
        ),
        row!(
            "NULL out",
            "combs_session_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_session_decode_sample(f.s, 1, f.smp, ptr::null_mut())
        ),
        row!(
            "token out of range",
            "combs_session_decode_sample",
            COMBS_ERR_INVALID_ARGUMENT,
            "token",
            |f| combs_session_decode_sample(f.s, f.n_vocab, f.smp, [0].as_mut_ptr())
        ),
        row!(
            "NULL m",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |f| combs_batch_prefill(
                ptr::null_mut(),
                [f.p1].as_ptr(),
                [[1].as_ptr()].as_ptr(),
                [1].as_ptr(),
                1
            )
        ),
        row!(
            "NULL n_tokens with n 1",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "`n_tokens`",
            |f| combs_batch_prefill(
                f.m,
                [f.p1].as_ptr(),
                [[1].as_ptr()].as_ptr(),
                ptr::null(),
                1
            )
        ),
        row!(
            "tokens[0] NULL with length 2",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[0]",
            |f| combs_batch_prefill(
                f.m,
                [f.p1].as_ptr(),
                [ptr::null()].as_ptr(),
                [2].as_ptr(),
                1
            )
        ),
        row!(
            "tokens[0] of huge length",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[0]",
            |f| combs_batch_prefill(
                f.m,
                [f.p1].as_ptr(),
                [[1].as_ptr()].as_ptr(),
                [HUGE].as_ptr(),
                1
            )
        ),
        row!(
            "a session of another model",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "another model",
            |f| combs_batch_prefill(
                f.m,
                [f.po].as_ptr(),
                [[1].as_ptr()].as_ptr(),
                [1].as_ptr(),
                1
            )
        ),
        row!(
            "token out of range",
            "combs_batch_prefill",
            COMBS_ERR_INVALID_ARGUMENT,
            "tokens[1]",
            |f| combs_batch_prefill(
                f.m,
                [f.p1, f.p2].as_ptr(),
                [[1].as_ptr(), [-3].as_ptr()].as_ptr(),
                [1, 1].as_ptr(),
                2
            )
        ),
        // --- vision ---
        row!(
            "NULL m",
            "combs_mmproj_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_mmproj_load(
                ptr::null(),
                fixture("mmproj-smolvlm-tiny.gguf").as_ptr(),
                out()
            )
        ),
        row!(
            "NULL path",
            "combs_mmproj_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`path`",
            |f| combs_mmproj_load(f.m, ptr::null(), out())
        ),
        row!(
            "NULL out",
            "combs_mmproj_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_mmproj_load(
                f.m,
                fixture("mmproj-smolvlm-tiny.gguf").as_ptr(),
                ptr::null_mut()
            )
        ),
        row!(
            "missing file",
            "combs_mmproj_load",
            COMBS_ERR_IO,
            "nonexistent",
            |f| combs_mmproj_load(f.m, c"/nonexistent/mmproj.gguf".as_ptr(), out())
        ),
        row!(
            "NULL path",
            "combs_image_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`path`",
            |_f| combs_image_load(ptr::null(), out())
        ),
        row!(
            "missing file",
            "combs_image_load",
            COMBS_ERR_IO,
            "nonexistent",
            |_f| combs_image_load(c"/nonexistent/a.png".as_ptr(), out())
        ),
        row!(
            "NULL bytes with len 4",
            "combs_image_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`bytes`",
            |_f| combs_image_decode(ptr::null(), 4, out())
        ),
        row!("len 0", "combs_image_decode", COMBS_ERR_FORMAT, "", |_f| {
            combs_image_decode(ptr::NonNull::dangling().as_ptr(), 0, out())
        }),
        row!(
            "bytes that are no image",
            "combs_image_decode",
            COMBS_ERR_FORMAT,
            "",
            |_f| combs_image_decode(NOT_UTF8.as_ptr(), NOT_UTF8.len(), out())
        ),
        row!(
            "huge len",
            "combs_image_decode",
            COMBS_ERR_INVALID_ARGUMENT,
            "`bytes`",
            |_f| combs_image_decode(NOT_UTF8.as_ptr(), HUGE, out())
        ),
        row!(
            "NULL rgb",
            "combs_image_from_rgb",
            COMBS_ERR_INVALID_ARGUMENT,
            "`rgb`",
            |_f| combs_image_from_rgb(ptr::null(), 2, 2, out())
        ),
        row!(
            "width 0",
            "combs_image_from_rgb",
            COMBS_ERR_INVALID_ARGUMENT,
            "0x2 image has no pixels",
            |_f| combs_image_from_rgb([0u8; 12].as_ptr(), 0, 2, out())
        ),
        row!(
            "huge size",
            "combs_image_from_rgb",
            COMBS_ERR_INVALID_ARGUMENT,
            "too large",
            |_f| combs_image_from_rgb([0u8; 12].as_ptr(), u32::MAX, u32::MAX, out())
        ),
        row!(
            "NULL img",
            "combs_image_width",
            COMBS_ERR_INVALID_ARGUMENT,
            "`img`",
            |_f| failed_value(combs_image_width(ptr::null()) == 0)
        ),
        row!(
            "NULL img",
            "combs_image_height",
            COMBS_ERR_INVALID_ARGUMENT,
            "`img`",
            |_f| failed_value(combs_image_height(ptr::null()) == 0)
        ),
        row!(
            "NULL img",
            "combs_image_data",
            COMBS_ERR_INVALID_ARGUMENT,
            "`img`",
            |_f| failed_value(combs_image_data(ptr::null()).is_null())
        ),
        row!(
            "NULL s",
            "combs_session_prefill_image",
            COMBS_ERR_INVALID_ARGUMENT,
            "`s`",
            |f| combs_session_prefill_image(ptr::null_mut(), f.mmproj, [0u8; 12].as_ptr(), 2, 2)
        ),
        row!(
            "NULL p",
            "combs_session_prefill_image",
            COMBS_ERR_INVALID_ARGUMENT,
            "`p`",
            |f| combs_session_prefill_image(f.fresh, ptr::null(), [0u8; 12].as_ptr(), 2, 2)
        ),
        row!(
            "NULL rgb",
            "combs_session_prefill_image",
            COMBS_ERR_INVALID_ARGUMENT,
            "`rgb`",
            |f| combs_session_prefill_image(f.fresh, f.mmproj, ptr::null(), 2, 2)
        ),
        row!(
            "height 0",
            "combs_session_prefill_image",
            COMBS_ERR_INVALID_ARGUMENT,
            "2x0 image has no pixels",
            |f| combs_session_prefill_image(f.fresh, f.mmproj, [0u8; 12].as_ptr(), 2, 0)
        ),
        row!(
            "NULL text",
            "combs_session_prefill_multimodal",
            COMBS_ERR_INVALID_ARGUMENT,
            "`text`",
            |f| combs_session_prefill_multimodal(
                f.fresh,
                f.mmproj,
                ptr::null(),
                ptr::null(),
                0,
                true
            )
        ),
        row!(
            "text not UTF-8",
            "combs_session_prefill_multimodal",
            COMBS_ERR_INVALID_ARGUMENT,
            "UTF-8",
            |f| combs_session_prefill_multimodal(
                f.fresh,
                f.mmproj,
                c"a\xffb".as_ptr(),
                ptr::null(),
                0,
                true
            )
        ),
        row!(
            "images[0] NULL",
            "combs_session_prefill_multimodal",
            COMBS_ERR_INVALID_ARGUMENT,
            "images[0]",
            |f| combs_session_prefill_multimodal(
                f.fresh,
                f.mmproj,
                c"<image>".as_ptr(),
                [ptr::null()].as_ptr(),
                1,
                true
            )
        ),
        row!(
            "huge n_images",
            "combs_session_prefill_multimodal",
            COMBS_ERR_INVALID_ARGUMENT,
            "`images`",
            |f| combs_session_prefill_multimodal(
                f.fresh,
                f.mmproj,
                c"hi".as_ptr(),
                [f.image.cast_const()].as_ptr(),
                HUGE,
                true
            )
        ),
        // --- speech ---
        row!(
            "NULL rt",
            "combs_speech_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`rt`",
            |f| combs_speech_model_load(
                ptr::null_mut(),
                c_path(&f.dir.join("speech.bin")).as_ptr(),
                ptr::null(),
                out()
            )
        ),
        row!(
            "NULL path",
            "combs_speech_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`path`",
            |f| combs_speech_model_load(f.rt, ptr::null(), ptr::null(), out())
        ),
        row!(
            "NULL out",
            "combs_speech_model_load",
            COMBS_ERR_INVALID_ARGUMENT,
            "`out`",
            |f| combs_speech_model_load(
                f.rt,
                c_path(&f.dir.join("speech.bin")).as_ptr(),
                ptr::null(),
                ptr::null_mut()
            )
        ),
        row!(
            "missing file",
            "combs_speech_model_load",
            COMBS_ERR_IO,
            "nonexistent",
            |f| combs_speech_model_load(f.rt, c"/nonexistent/w.bin".as_ptr(), ptr::null(), out())
        ),
        row!(
            "NULL m",
            "combs_speech_model_is_multilingual",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| failed_value(!combs_speech_model_is_multilingual(ptr::null()))
        ),
        row!(
            "NULL m",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "`m`",
            |_f| combs_transcribe(
                ptr::null(),
                [0.0f32; 16].as_ptr(),
                16,
                16000,
                ptr::null(),
                None,
                ptr::null_mut()
            )
        ),
        row!(
            "NULL pcm with 16 samples",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "`pcm`",
            |f| combs_transcribe(
                f.speech,
                ptr::null(),
                16,
                16000,
                ptr::null(),
                None,
                ptr::null_mut()
            )
        ),
        row!(
            "huge n_samples",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "`pcm`",
            |f| combs_transcribe(
                f.speech,
                [0.0f32; 16].as_ptr(),
                HUGE,
                16000,
                ptr::null(),
                None,
                ptr::null_mut()
            )
        ),
        row!(
            "sample_rate 0",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "sample_rate",
            |f| combs_transcribe(
                f.speech,
                [0.0f32; 16].as_ptr(),
                16,
                0,
                ptr::null(),
                None,
                ptr::null_mut()
            )
        ),
        row!(
            "task 7",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "combs_task",
            |f| {
                let o = with_raw_i32(
                    combs_transcribe_default_options(),
                    offset_of!(combs_transcribe_options, task),
                    7,
                );
                combs_transcribe(
                    f.speech,
                    [0.0f32; 16].as_ptr(),
                    16,
                    16000,
                    o.as_ptr(),
                    None,
                    ptr::null_mut(),
                )
            }
        ),
        row!(
            "language not UTF-8",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "language",
            |f| {
                let mut o = combs_transcribe_default_options();
                o.language = c"d\xffe".as_ptr();
                combs_transcribe(
                    f.speech,
                    [0.0f32; 16].as_ptr(),
                    16,
                    16000,
                    &o,
                    None,
                    ptr::null_mut(),
                )
            }
        ),
        row!(
            "unknown language",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "klingon",
            |f| {
                let mut o = combs_transcribe_default_options();
                o.language = c"klingon".as_ptr();
                combs_transcribe(
                    f.speech,
                    [0.0f32; 3200].as_ptr(),
                    3200,
                    16000,
                    &o,
                    None,
                    ptr::null_mut(),
                )
            }
        ),
        row!(
            "beam_size 0",
            "combs_transcribe",
            COMBS_ERR_INVALID_ARGUMENT,
            "beam_size",
            |f| {
                let mut o = combs_transcribe_default_options();
                o.beam_size = 0;
                combs_transcribe(
                    f.speech,
                    [0.0f32; 16].as_ptr(),
                    16,
                    16000,
                    &o,
                    None,
                    ptr::null_mut(),
                )
            }
        ),
    ]
}

#[test]
fn ffi_misuse_table_gives_documented_status_and_message() {
    let f = Fx::new();
    let rows = rows();
    assert!(rows.len() >= 60, "{} rows", rows.len());
    let mut bad = Vec::new();
    for r in &rows {
        let got = (r.call)(&f);
        let msg = last_error();
        if got != r.want || !msg.starts_with(r.func) || !msg.contains(r.mentions) {
            bad.push(format!(
                "{} ({}): want {:?} mentioning `{}`, got {:?}: `{}`",
                r.func, r.what, r.want, r.mentions, got, msg
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} rows:\n{}",
        bad.len(),
        rows.len(),
        bad.join("\n")
    );
    // The handles still work after every failure above.
    // SAFETY: live handles, valid token arrays.
    unsafe {
        ok(combs_session_rewind(f.s, 2));
        ok(combs_session_decode(f.s, 3));
        assert!(!combs_session_logits(f.s).is_null());
        ok(combs_batch_decode(
            f.m,
            [f.p1, f.p2].as_ptr(),
            [2, 3].as_ptr(),
            2,
        ));
        assert_eq!(combs_session_len(f.p1), 2);
    }
}

#[test]
fn ffi_misuse_covers_every_entry_point() {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/combs.h"))
            .expect("include/combs.h");
    let covered: std::collections::BTreeSet<&str> = rows().iter().map(|r| r.func).collect();
    // Entry points that cannot fail: nothing to misuse.
    let infallible = [
        "combs_version",
        "combs_last_error",
        "combs_status_str",
        "combs_runtime_default_options",
        "combs_model_default_options",
        "combs_session_default_options",
        "combs_sampler_default_options",
        "combs_speech_model_default_options",
        "combs_transcribe_default_options",
        // NULL-safe destructors: NULL is a documented no-op.
        "combs_runtime_free",
        "combs_model_free",
        "combs_session_free",
        "combs_sampler_free",
        "combs_mmproj_free",
        "combs_image_free",
        "combs_speech_model_free",
    ];
    let missing: Vec<String> = header
        .lines()
        .filter(|l| !l.starts_with("//") && !l.starts_with("typedef"))
        .filter_map(|l| {
            let name = l
                .split('(')
                .next()?
                .split_whitespace()
                .last()?
                .trim_start_matches('*');
            (name.starts_with("combs_") && l.contains('(')).then(|| name.to_string())
        })
        .filter(|n| !covered.contains(n.as_str()) && !infallible.contains(&n.as_str()))
        .collect();
    assert!(missing.is_empty(), "no misuse row for {missing:?}");
}
