//! Error paths of the C API, called as C calls them: each gives its status,
//! a `combs_last_error()` naming the function and what is wrong, NULL object
//! out-parameters, and no crash. (examples/c/errors.c covers the same list
//! from C.)

mod ffi_support;

use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::ptr;

use combs::ModelError;
use combs::ffi::*;
use ffi_support::{Loaded, greedy, last_error, model_path, ok};

use combs_status::*;

/// Asserts the status and that the last error contains every piece of text.
#[track_caller]
fn expect(got: combs_status, want: combs_status, texts: &[&str]) {
    let msg = last_error();
    assert_eq!(got, want, "last error: {msg}");
    for t in texts {
        assert!(msg.contains(t), "`{msg}` lacks `{t}`");
    }
}

/// A fresh directory for this test's files.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("combs-ffi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn c_path(p: &std::path::Path) -> CString {
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

fn poison<T>() -> *mut T {
    ptr::NonNull::dangling().as_ptr()
}

#[test]
fn ffi_status_names_every_status() {
    for s in combs_status::ALL {
        // SAFETY: returns a static NUL-terminated string.
        let name = unsafe { CStr::from_ptr(combs_status_str(s.into())) };
        assert_eq!(name.to_str().expect("ASCII"), format!("{s:?}"));
    }
    // SAFETY: as above; any int is accepted.
    let unknown = unsafe { CStr::from_ptr(combs_status_str(StatusArg(42))) };
    assert_eq!(unknown.to_str().expect("ASCII"), "COMBS_ERR_UNKNOWN");
}

#[test]
fn ffi_vulkan_out_of_memory_maps_to_out_of_memory() {
    use ash::vk::Result as R;
    for r in [R::ERROR_OUT_OF_DEVICE_MEMORY, R::ERROR_OUT_OF_HOST_MEMORY] {
        assert_eq!(
            combs_status::from(&ModelError::vk("vkAllocateMemory", r)),
            COMBS_ERR_OUT_OF_MEMORY
        );
    }
    assert_eq!(
        combs_status::from(&ModelError::vk("vkQueueSubmit", R::ERROR_DEVICE_LOST)),
        COMBS_ERR_DEVICE
    );
}

#[test]
fn ffi_null_arguments_are_invalid_argument() {
    // SAFETY: every pointer is NULL or valid; the calls must reject the NULLs.
    unsafe {
        expect(
            combs_runtime_create(ptr::null(), ptr::null_mut()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_runtime_create", "`out`"],
        );
        let mut m: *mut combs_model = poison();
        let path = model_path();
        expect(
            combs_model_load(ptr::null_mut(), path.as_ptr(), ptr::null(), &mut m),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_model_load", "`rt`"],
        );
        assert!(m.is_null(), "out-parameter is NULL on failure");
        let mut n = 0usize;
        expect(
            combs_tokenize(
                ptr::null(),
                c"hi".as_ptr(),
                2,
                true,
                ptr::null_mut(),
                0,
                &mut n,
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_tokenize", "`m`"],
        );
        let mut s: *mut combs_session = poison();
        expect(
            combs_session_create(ptr::null_mut(), ptr::null(), &mut s),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`m`"],
        );
        assert!(s.is_null());
        expect(
            combs_session_prefill(ptr::null_mut(), ptr::null(), 0),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`s`"],
        );
        expect(
            combs_session_decode(ptr::null_mut(), 0),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`s`"],
        );
        expect(
            combs_session_rewind(ptr::null_mut(), 0),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`s`"],
        );
        assert!(combs_session_logits(ptr::null()).is_null());
        assert_eq!(combs_session_len(ptr::null()), 0);
        assert_eq!(combs_model_n_vocab(ptr::null()), -1);
        assert!(last_error().contains("combs_model_n_vocab"));
        assert_eq!(combs_sampler_sample(ptr::null_mut(), ptr::null(), 0), -1);
        expect(
            combs_generate(ptr::null_mut(), ptr::null_mut(), 1, None, ptr::null_mut()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_generate", "`s`"],
        );
        expect(
            combs_batch_decode(ptr::null_mut(), ptr::null(), ptr::null(), 0),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`m`"],
        );
        combs_runtime_free(ptr::null_mut());
        combs_model_free(ptr::null_mut());
        combs_session_free(ptr::null_mut());
        combs_sampler_free(ptr::null_mut());
    }
}

#[test]
fn ffi_bad_model_files_give_status_and_path() {
    let dir = temp_dir("files");
    let real = std::fs::read(combs::runtime::model::default_model_path())
        .expect("model (scripts/fetch-models.sh)");
    std::fs::write(dir.join("empty.gguf"), b"").expect("write");
    std::fs::write(dir.join("text.gguf"), b"hello, not a model\n").expect("write");
    std::fs::write(dir.join("cut-header.gguf"), &real[..1000]).expect("write");
    std::fs::write(dir.join("cut-data.gguf"), &real[..real.len() / 2]).expect("write");
    let key = b"general.architecture";
    let at = real
        .windows(key.len())
        .position(|w| w == key)
        .expect("architecture key")
        + key.len()
        + 12;
    assert_eq!(&real[at..at + 5], b"llama");
    let mut patched = real.clone();
    patched[at + 4] = b'x';
    std::fs::write(dir.join("arch.gguf"), &patched).expect("write");

    let l = Loaded::new();
    let cases: [(&str, combs_status, &[&str]); 7] = [
        (
            "missing.gguf",
            COMBS_ERR_IO,
            &["missing.gguf", "No such file"],
        ),
        ("", COMBS_ERR_IO, &["directory"]),
        ("empty.gguf", COMBS_ERR_FORMAT, &["empty.gguf", "offset 0"]),
        ("text.gguf", COMBS_ERR_FORMAT, &["text.gguf", "magic"]),
        (
            "cut-header.gguf",
            COMBS_ERR_FORMAT,
            &["cut-header.gguf", "offset"],
        ),
        (
            "cut-data.gguf",
            COMBS_ERR_FORMAT,
            &["cut-data.gguf", "tensor `", "past the end"],
        ),
        (
            "arch.gguf",
            COMBS_ERR_UNSUPPORTED,
            &["arch.gguf", "architecture `llamx`"],
        ),
    ];
    for (name, want, texts) in cases {
        let path = c_path(&dir.join(name));
        let mut m: *mut combs_model = poison();
        // SAFETY: live runtime, NUL-terminated path, writable out.
        let s = unsafe { combs_model_load(l.rt, path.as_ptr(), ptr::null(), &mut m) };
        expect(s, want, texts);
        assert!(last_error().starts_with("combs_model_load: "));
        assert!(m.is_null(), "{name}: out-parameter is NULL on failure");
    }

    // options: a numerics value outside the enum, then llama.cpp numerics
    #[repr(C)]
    struct RawOptions {
        show_progress: bool,
        numerics: i32,
    }
    let real_path = c_path(&combs::runtime::model::default_model_path());
    let bad = RawOptions {
        show_progress: false,
        numerics: 7,
    };
    let mut m: *mut combs_model = poison();
    // SAFETY: RawOptions has combs_model_options' layout; live runtime.
    let s = unsafe {
        combs_model_load(
            l.rt,
            real_path.as_ptr(),
            (&raw const bad).cast::<combs_model_options>(),
            &mut m,
        )
    };
    expect(s, COMBS_ERR_INVALID_ARGUMENT, &["numerics", "7"]);
    assert!(m.is_null());
    let mut opts = combs_model_default_options();
    assert_eq!(opts.numerics, combs_numerics::COMBS_NUMERICS_EXACT);
    opts.numerics = combs_numerics::COMBS_NUMERICS_LLAMA_CPP;
    // SAFETY: as above, with a real options struct.
    let s = unsafe { combs_model_load(l.rt, real_path.as_ptr(), &opts, &mut m) };
    assert_eq!(s, COMBS_OK, "{}", last_error());
    // SAFETY: a model from combs_model_load.
    unsafe { combs_model_free(m) };
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ffi_small_buffers_report_needed_size() {
    let l = Loaded::new();
    let text = "Hello world, how are you?";
    let mut n = 0usize;
    let mut toks = [0 as combs_token; 2];
    // SAFETY: toks holds 2 tokens; n is writable.
    let s = unsafe {
        combs_tokenize(
            l.m,
            text.as_ptr().cast(),
            text.len(),
            false,
            toks.as_mut_ptr(),
            2,
            &mut n,
        )
    };
    expect(
        s,
        COMBS_ERR_BUFFER_TOO_SMALL,
        &["combs_tokenize", "2 given"],
    );
    assert_eq!(n, l.tokenize(text).len());

    let t = l.tokenize(text)[1];
    let mut buf = [0 as c_char; 64];
    let mut len = 0usize;
    // SAFETY: buf holds 1 byte (as cap says); len is writable.
    let s = unsafe { combs_token_to_piece(l.m, t, buf.as_mut_ptr(), 1, &mut len) };
    expect(
        s,
        COMBS_ERR_BUFFER_TOO_SMALL,
        &["combs_token_to_piece", "1 given"],
    );
    let needed = len;
    // SAFETY: buf holds 64 >= needed bytes.
    ok(unsafe { combs_token_to_piece(l.m, t, buf.as_mut_ptr(), needed, &mut len) });
    assert_eq!(len + 1, needed);
    // SAFETY: NUL-terminated by the call.
    assert_eq!(
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_bytes().len(),
        len
    );

    let roles = [c"user".as_ptr()];
    let contents = [c"Hi!".as_ptr()];
    // SAFETY: one message; buf holds 8 bytes as cap says.
    let s = unsafe {
        combs_chat_apply_template(
            l.m,
            roles.as_ptr(),
            contents.as_ptr(),
            1,
            true,
            buf.as_mut_ptr(),
            8,
            &mut len,
        )
    };
    expect(
        s,
        COMBS_ERR_BUFFER_TOO_SMALL,
        &["combs_chat_apply_template", "8 given"],
    );
    let mut big = vec![0 as c_char; len];
    // SAFETY: big holds len bytes.
    ok(unsafe {
        combs_chat_apply_template(
            l.m,
            roles.as_ptr(),
            contents.as_ptr(),
            1,
            true,
            big.as_mut_ptr(),
            big.len(),
            &mut len,
        )
    });
    // SAFETY: NUL-terminated by the call.
    let rendered = unsafe { CStr::from_ptr(big.as_ptr()) }
        .to_str()
        .expect("UTF-8");
    assert_eq!(rendered.len(), len);
    assert!(
        rendered.contains("Hi!") && rendered.contains("<|im_start|>assistant"),
        "{rendered}"
    );
}

#[test]
fn ffi_session_errors_leave_it_unchanged() {
    let l = Loaded::new();
    let n_vocab = l.n_vocab() as combs_token;
    let toks = l.tokenize("The quick brown fox jumps over");
    assert!(toks.len() >= 6);
    let s = l.session(8);
    // SAFETY: live session; arrays hold the lengths passed.
    unsafe {
        assert!(combs_session_logits(s).is_null());
        let nine = [1 as combs_token; 9];
        expect(
            combs_session_prefill(s, nine.as_ptr(), 9),
            COMBS_ERR_CONTEXT_FULL,
            &[
                "combs_session_prefill",
                "context is full: 8 positions, 9 requested",
            ],
        );
        let bad = [toks[0], n_vocab, toks[1]];
        expect(
            combs_session_prefill(s, bad.as_ptr(), 3),
            COMBS_ERR_INVALID_ARGUMENT,
            &["tokens[1]", &format!("token id {n_vocab} is out of range")],
        );
        expect(
            combs_session_decode(s, -1),
            COMBS_ERR_INVALID_ARGUMENT,
            &["token id -1"],
        );
        assert_eq!(combs_session_len(s), 0);
        ok(combs_session_prefill(s, toks.as_ptr(), 4));
        expect(
            combs_session_rewind(s, 5),
            COMBS_ERR_INVALID_ARGUMENT,
            &["n_keep", "past the 4 positions"],
        );
        assert_eq!(combs_session_len(s), 4);
        ok(combs_session_rewind(s, 3));
        assert!(
            combs_session_logits(s).is_null(),
            "rewinding invalidates the logits"
        );
        ok(combs_session_prefill(s, toks.as_ptr(), 5));
        assert_eq!(combs_session_len(s), 8);
        expect(
            combs_session_decode(s, toks[0]),
            COMBS_ERR_CONTEXT_FULL,
            &["combs_session_decode"],
        );
        let smp = greedy();
        expect(
            combs_generate(s, smp, 4, None, ptr::null_mut()),
            COMBS_ERR_CONTEXT_FULL,
            &["after 1 generated tokens"],
        );
        assert_eq!(combs_session_len(s), 8);
        combs_sampler_free(smp);
        let mut opts = combs_session_default_options();
        opts.page_size = 0;
        let mut s2: *mut combs_session = poison();
        expect(
            combs_session_create(l.m, &opts, &mut s2),
            COMBS_ERR_INVALID_ARGUMENT,
            &["page_size"],
        );
        assert!(s2.is_null());
        combs_session_free(s);
    }
}

#[test]
fn ffi_sampler_invalid_options_are_invalid_argument() {
    let d = combs_sampler_default_options();
    let cases = [
        (
            combs_sampler_options {
                temperature: -1.0,
                ..d
            },
            "temperature",
        ),
        (
            combs_sampler_options {
                temperature: f32::INFINITY,
                ..d
            },
            "temperature",
        ),
        (combs_sampler_options { top_p: 1.5, ..d }, "top_p"),
        (combs_sampler_options { min_p: -0.5, ..d }, "min_p"),
        (
            combs_sampler_options {
                repeat_penalty: 0.0,
                ..d
            },
            "repeat_penalty",
        ),
        (
            combs_sampler_options {
                repeat_last_n: -3,
                ..d
            },
            "repeat_last_n",
        ),
    ];
    for (opts, field) in cases {
        let mut smp: *mut combs_sampler = poison();
        // SAFETY: valid options struct and out-pointer.
        let s = unsafe { combs_sampler_create(&opts, &mut smp) };
        expect(
            s,
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_sampler_create", &format!("`{field}`")],
        );
        assert!(smp.is_null());
    }
    let mut smp = ptr::null_mut();
    // SAFETY: NULL options are the defaults.
    ok(unsafe { combs_sampler_create(ptr::null(), &mut smp) });
    // SAFETY: live sampler; NULL logits must be refused.
    assert_eq!(unsafe { combs_sampler_sample(smp, ptr::null(), 10) }, -1);
    assert!(last_error().contains("`logits`"));
    // SAFETY: created above.
    unsafe { combs_sampler_free(smp) };
}

#[test]
fn ffi_batch_decode_validates_its_arguments() {
    let l = Loaded::new();
    let s = l.session(16);
    let mut opts = combs_session_default_options();
    opts.n_ctx = 32;
    opts.kv_kind = combs_kv_kind::COMBS_KV_PAGED;
    opts.page_size = 8;
    let (mut p, mut q) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: live model and sessions; arrays hold n elements.
    unsafe {
        ok(combs_session_create(l.m, &opts, &mut p));
        opts.page_size = 4;
        ok(combs_session_create(l.m, &opts, &mut q));
        ok(combs_batch_decode(l.m, ptr::null(), ptr::null(), 0));
        let sessions = [s, ptr::null_mut()];
        let toks = [1, 2];
        expect(
            combs_batch_decode(l.m, sessions.as_ptr(), toks.as_ptr(), 2),
            COMBS_ERR_INVALID_ARGUMENT,
            &["sessions[1] is NULL"],
        );
        let sessions = [s, s];
        expect(
            combs_batch_decode(l.m, sessions.as_ptr(), toks.as_ptr(), 2),
            COMBS_ERR_INVALID_ARGUMENT,
            &["listed twice"],
        );
        let bad = [-1];
        expect(
            combs_batch_decode(l.m, sessions.as_ptr(), bad.as_ptr(), 1),
            COMBS_ERR_INVALID_ARGUMENT,
            &["tokens[0]"],
        );
        expect(
            combs_batch_decode(l.m, sessions.as_ptr(), toks.as_ptr(), 1),
            COMBS_ERR_INVALID_ARGUMENT,
            &["session 0", "contiguous"],
        );
        let mixed = [p, q];
        expect(
            combs_batch_decode(l.m, mixed.as_ptr(), toks.as_ptr(), 2),
            COMBS_ERR_INVALID_ARGUMENT,
            &["session 1", "page pool"],
        );
        let mut stats = combs_page_stats::default();
        expect(
            combs_session_page_stats(s, &mut stats),
            COMBS_ERR_INVALID_ARGUMENT,
            &["contiguous"],
        );
        ok(combs_batch_decode(l.m, [p].as_ptr(), toks.as_ptr(), 1));
        assert_eq!(combs_session_len(p), 1);
        assert!(!combs_session_logits(p).is_null());
        ok(combs_session_page_stats(p, &mut stats));
        assert_eq!((stats.page_size, stats.pages_used, stats.tokens), (8, 1, 1));
        let empty: [*const combs_token; 1] = [ptr::null()];
        let zero = [0usize];
        ok(combs_batch_prefill(
            l.m,
            [p].as_ptr(),
            empty.as_ptr(),
            zero.as_ptr(),
            1,
        ));
        let one = [2usize];
        expect(
            combs_batch_prefill(l.m, [p].as_ptr(), empty.as_ptr(), one.as_ptr(), 1),
            COMBS_ERR_INVALID_ARGUMENT,
            &["tokens[0]"],
        );
        assert_eq!(combs_session_len(p), 1);
        let mut f = ptr::null_mut();
        ok(combs_session_fork(p, &mut f));
        assert_eq!(combs_session_len(f), 1);
        ok(combs_session_page_stats(f, &mut stats));
        assert_eq!((stats.sequences, stats.pages_used, stats.tokens), (2, 1, 2));
        combs_session_free(f);
        combs_session_free(q);
        combs_session_free(p);
        combs_session_free(s);
    }
}

/// `combs_session_decode_sample` and `combs_batch_decode_sample` refuse
/// NULL and repeated arguments before evaluating anything, and after a step
/// sampled on the device `combs_session_logits` says why it has no row.
#[test]
fn ffi_decode_sample_validates_its_arguments() {
    let l = Loaded::new();
    let mut opts = combs_session_default_options();
    opts.n_ctx = 32;
    opts.kv_kind = combs_kv_kind::COMBS_KV_PAGED;
    opts.page_size = 8;
    let (mut p, mut q) = (ptr::null_mut(), ptr::null_mut());
    let (a, b) = (greedy(), greedy());
    let mut out = [0 as combs_token; 2];
    // SAFETY: live model, sessions and samplers; arrays hold n elements.
    unsafe {
        ok(combs_session_create(l.m, &opts, &mut p));
        ok(combs_session_create(l.m, &opts, &mut q));
        expect(
            combs_session_decode_sample(p, 1, ptr::null_mut(), out.as_mut_ptr()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["combs_session_decode_sample", "`smp`"],
        );
        expect(
            combs_session_decode_sample(p, 1, a, ptr::null_mut()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`out`"],
        );
        expect(
            combs_session_decode_sample(ptr::null_mut(), 1, a, out.as_mut_ptr()),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`s`"],
        );
        assert_eq!(combs_session_len(p), 0);
        let sessions = [p, q];
        let toks = [1, 2];
        ok(combs_batch_decode_sample(
            l.m,
            ptr::null(),
            ptr::null(),
            ptr::null(),
            0,
            ptr::null_mut(),
        ));
        expect(
            combs_batch_decode_sample(
                l.m,
                sessions.as_ptr(),
                [a, a].as_ptr(),
                toks.as_ptr(),
                2,
                out.as_mut_ptr(),
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            &["samplers[1] is listed twice"],
        );
        expect(
            combs_batch_decode_sample(
                l.m,
                sessions.as_ptr(),
                [a, ptr::null_mut()].as_ptr(),
                toks.as_ptr(),
                2,
                out.as_mut_ptr(),
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            &["samplers[1] is NULL"],
        );
        expect(
            combs_batch_decode_sample(
                l.m,
                sessions.as_ptr(),
                [a, b].as_ptr(),
                toks.as_ptr(),
                2,
                ptr::null_mut(),
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`out`"],
        );
        expect(
            combs_batch_decode_sample(
                l.m,
                sessions.as_ptr(),
                ptr::null(),
                toks.as_ptr(),
                2,
                out.as_mut_ptr(),
            ),
            COMBS_ERR_INVALID_ARGUMENT,
            &["`samplers`"],
        );
        assert_eq!((combs_session_len(p), combs_session_len(q)), (0, 0));
        ok(combs_batch_decode_sample(
            l.m,
            sessions.as_ptr(),
            [a, b].as_ptr(),
            toks.as_ptr(),
            2,
            out.as_mut_ptr(),
        ));
        assert_eq!((combs_session_len(p), combs_session_len(q)), (1, 1));
        let n_vocab = l.n_vocab() as combs_token;
        assert!(out.iter().all(|&t| (0..n_vocab).contains(&t)), "{out:?}");
        assert!(combs_session_logits(p).is_null());
        assert!(last_error().contains("sampled on the device"));
        // A plain step brings the logits back.
        ok(combs_session_decode(p, out[0]));
        assert!(!combs_session_logits(p).is_null());
        combs_sampler_free(a);
        combs_sampler_free(b);
        combs_session_free(q);
        combs_session_free(p);
    }
}

#[test]
fn ffi_last_error_is_per_thread() {
    // SAFETY: NULL out is refused.
    let _ = unsafe { combs_sampler_create(ptr::null(), ptr::null_mut()) };
    assert!(last_error().contains("combs_sampler_create"));
    let other = std::thread::spawn(last_error).join().expect("thread");
    assert_eq!(other, "");
    assert!(last_error().contains("combs_sampler_create"));
}
