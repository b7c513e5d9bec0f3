//! Device loss (issue 21, item 5), through the gpu layer's fault-injection
//! switch (`GpuContext::inject_fault`): a model decoding when a submission
//! fails with `VK_ERROR_DEVICE_LOST` gets `ModelError::DeviceLost`
//! (`COMBS_ERR_DEVICE`) from that call, and so does every later call that
//! would touch the device — prefill, decode, a batch, a fork, a new session,
//! loading another model — at once, with no hang and no panic; tokenizing
//! (host only) still works; freeing everything afterwards is clean and gives
//! back every byte. Through the Rust API on both kernel back ends (the host's
//! native kernels, where a run of host steps stands in for a submission, and
//! Vulkan dispatches) and through the C API.

mod common;
mod ffi_support;

use std::ffi::CString;
use std::path::Path;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combs::ModelError;
use combs::ffi::*;
use combs::gpu::{Fault, GpuContext};
use combs::kv::CacheKind;
use combs::models::LoadOptions;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::ops::plan::Backend;
use combs::quant::QuantType;
use combs::runtime::sampler::argmax;
use combs::runtime::{Model, Session, SessionOptions};
use common::TempFile;
use ffi_support::{last_error, ok};

const PROMPT: [u32; 4] = [1, 5, 9, 13];

fn fresh_gpu() -> Arc<GpuContext> {
    GpuContext::new(None).unwrap_or_else(|e| {
        panic!(
            "no Vulkan device: {e}\ninstall one, e.g. `apt-get install -y libvulkan1 \
             mesa-vulkan-drivers` (lavapipe)"
        )
    })
}

fn write_model(name: &str) -> TempFile {
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.seed = 5;
    TempFile::write(
        &format!("device-lost-{name}.gguf"),
        &synth_gguf(&cfg).expect("synth").to_bytes(),
    )
}

/// Asserts `r` failed with the device-loss error, whose message says what
/// to do.
#[track_caller]
fn assert_lost<T>(r: combs::Result<T>, what: &str) {
    let e = r
        .err()
        .unwrap_or_else(|| panic!("{what}: succeeded on a lost device"));
    assert!(
        matches!(e.root(), ModelError::DeviceLost { .. }),
        "{what}: {e}"
    );
    assert_eq!(combs_status::from(&e), combs_status::COMBS_ERR_DEVICE);
    let msg = e.to_string();
    assert!(
        msg.contains("device was lost") && msg.contains("create a new runtime"),
        "{what}: {msg}"
    );
}

fn paged() -> SessionOptions {
    SessionOptions {
        n_ctx: 64,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        ..SessionOptions::default()
    }
}

fn lose_mid_decode(backend: Backend) {
    let path = write_model(&format!("{backend:?}"));
    let ctx = fresh_gpu();
    let opts = LoadOptions {
        backend: Some(backend),
        ..LoadOptions::default()
    };
    let model = Model::load(&ctx, &path, &opts).expect("load");
    let mut s = model.new_session(&paged()).expect("session");
    let mut others: Vec<Session> = (0..2)
        .map(|_| model.new_session(&paged()).expect("session"))
        .collect();
    for o in &mut others {
        o.prefill(&PROMPT).expect("prefill");
    }
    s.prefill(&PROMPT).expect("prefill");
    let mut t = argmax(s.logits()) as u32;
    for _ in 0..2 {
        s.decode(t).expect("decode before the fault");
        t = argmax(s.logits()) as u32;
    }

    let t0 = Instant::now();
    ctx.inject_fault(Fault::DeviceLostAfter(1));
    assert_lost(s.decode(t), "the decode that meets the fault");
    assert!(ctx.is_lost());
    assert_lost(s.decode(t), "decode");
    assert_lost(s.prefill(&PROMPT), "prefill");
    assert_lost(s.fork(), "fork");
    assert_lost(model.new_session(&paged()), "new session");
    {
        let mut batch: Vec<&mut Session> = others.iter_mut().collect();
        assert_lost(model.decode_batch(&mut batch, &[t, t]), "batch decode");
        assert_lost(
            model.prefill_batch(&mut batch, &[&PROMPT, &PROMPT]),
            "batch prefill",
        );
    }
    assert_lost(Model::load(&ctx, &path, &opts), "loading another model");
    // Host only: still answers.
    let ids = model.tokenizer().encode("hello", true, false);
    assert!(
        ids.is_ok_and(|v| !v.is_empty()),
        "tokenize on a lost device"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "calls on a lost device must fail fast"
    );

    drop(others);
    drop(s);
    drop(model);
    assert_eq!(ctx.memory_in_use(), 0, "every buffer is freed after a loss");
    assert_eq!(ctx.memory_host_visible(), 0);
}

#[test]
fn device_lost_mid_decode_vulkan_kernels_fails_every_later_call() {
    lose_mid_decode(Backend::Vulkan);
}

#[test]
fn device_lost_mid_decode_host_kernels_fails_every_later_call() {
    if GpuContext::new(None).is_ok_and(|c| c.caps().class() != combs::gpu::DeviceClass::Cpu) {
        // The host's kernels need a CPU device; the Vulkan case covers a GPU.
        return;
    }
    lose_mid_decode(Backend::Host);
}

/// A fault armed for a later submission fires during a model load: the load
/// fails with the loss and frees what it had allocated.
#[test]
fn device_lost_during_load_frees_what_it_allocated() {
    let path = write_model("load");
    let ctx = fresh_gpu();
    // Where device memory is host-visible (lavapipe) the weights are
    // written in place without a submission: the loss meets an allocation.
    ctx.inject_fault(Fault::DeviceLostAtAllocation(5));
    assert_lost(
        Model::load(&ctx, &path, &LoadOptions::default()),
        "a load meeting the fault",
    );
    assert_eq!(ctx.memory_in_use(), 0);
    assert_eq!(ctx.memory_host_visible(), 0);
    assert_lost(
        Model::load(&ctx, &path, &LoadOptions::default()),
        "the next load",
    );
}

fn c_path(p: &Path) -> CString {
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

#[track_caller]
fn assert_c_lost(s: combs_status, what: &str) {
    let msg = last_error();
    assert_eq!(s, combs_status::COMBS_ERR_DEVICE, "{what}: {msg}");
    assert!(msg.contains("device was lost"), "{what}: {msg}");
}

#[test]
fn ffi_device_lost_mid_decode_fails_every_later_call_and_frees_cleanly() {
    let file = write_model("ffi");
    let path = c_path(&file);
    let mut rt = ptr::null_mut();
    // SAFETY: NULL options, valid out-pointer.
    ok(unsafe { combs_runtime_create(ptr::null(), &mut rt) });
    // SAFETY: rt is live.
    let ctx = unsafe { runtime_context(rt) }.expect("runtime");
    let mut m = ptr::null_mut();
    // SAFETY: live runtime, NUL-terminated path, valid out-pointer.
    ok(unsafe { combs_model_load(rt, path.as_ptr(), ptr::null(), &mut m) });
    let mut sopts = combs_session_default_options();
    sopts.n_ctx = 64;
    sopts.kv_kind = combs_kv_kind::COMBS_KV_PAGED;
    sopts.page_size = 16;
    let prompt: Vec<combs_token> = PROMPT.iter().map(|&t| t as combs_token).collect();
    let mut ss = [ptr::null_mut(); 3];
    for s in &mut ss {
        // SAFETY: live model, valid options and out-pointer; prompt holds its length.
        unsafe {
            ok(combs_session_create(m, &sopts, s));
            ok(combs_session_prefill(*s, prompt.as_ptr(), prompt.len()));
        }
    }
    let smp = ffi_support::greedy();
    // SAFETY: live model.
    let n_vocab = unsafe { combs_model_n_vocab(m) } as usize;
    let t = ffi_support::step(ss[0], smp, n_vocab);

    let t0 = Instant::now();
    ctx.inject_fault(Fault::DeviceLostAfter(1));
    // SAFETY (this block): live handles, valid pointers and lengths.
    unsafe {
        assert_c_lost(
            combs_session_decode(ss[0], t),
            "the decode meeting the fault",
        );
        assert_c_lost(combs_session_decode(ss[0], t), "decode");
        assert_c_lost(
            combs_session_prefill(ss[0], prompt.as_ptr(), prompt.len()),
            "prefill",
        );
        let mut s = ptr::null_mut();
        assert_c_lost(combs_session_create(m, &sopts, &mut s), "session create");
        assert!(s.is_null());
        let mut f = ptr::null_mut();
        assert_c_lost(combs_session_fork(ss[1], &mut f), "fork");
        assert!(f.is_null());
        let pair = [ss[1], ss[2]];
        assert_c_lost(
            combs_batch_decode(m, pair.as_ptr(), [t, t].as_ptr(), 2),
            "batch decode",
        );
        let mut m2 = ptr::null_mut();
        assert_c_lost(
            combs_model_load(rt, path.as_ptr(), ptr::null(), &mut m2),
            "model load",
        );
        assert!(m2.is_null());
        // Host only: tokenizing still works.
        let text = "hello";
        let mut out = [0 as combs_token; 16];
        let mut n = 0usize;
        ok(combs_tokenize(
            m,
            text.as_ptr().cast(),
            text.len(),
            true,
            out.as_mut_ptr(),
            out.len(),
            &mut n,
        ));
        assert!(n > 0);
    }
    assert!(t0.elapsed() < Duration::from_secs(20), "fail fast");

    let before_free = last_error();
    // SAFETY: each handle freed once.
    unsafe {
        combs_sampler_free(smp);
        for s in ss {
            combs_session_free(s);
        }
        combs_model_free(m);
        combs_runtime_free(rt);
    }
    // A panic caught in a destructor would have recorded an internal error.
    assert_eq!(last_error(), before_free, "freeing after a loss is clean");
    assert_eq!(ctx.memory_in_use(), 0);
    assert_eq!(ctx.memory_host_visible(), 0);
}

/// `COMBS_FAULT_DEVICE_LOST_AFTER` (how a C program arms the fault) read by
/// a real process: `combs run` ends with the device-loss message and a
/// failure status, not a hang or a panic.
#[test]
fn cli_run_with_fault_env_reports_device_lost() {
    let path = write_model("cli");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_combs"))
        .args(["run", "-m"])
        .arg(&*path)
        .args(["-p", "hello", "-n", "200", "--temp", "0"])
        // Past the load's submissions, inside the 200 decode steps'.
        .env(combs::gpu::FAULT_ENV, "100")
        .output()
        .expect("run combs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("device was lost"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
