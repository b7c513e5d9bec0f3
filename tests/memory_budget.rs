//! The device-memory budget (issue 21, item 4), on tiny synthetic models:
//! a budget that fits model A but not the larger model B refuses B with an
//! out-of-memory error naming a tensor, frees what B's load had allocated,
//! then loads A, which generates the same tokens as without a budget; a
//! session past the budget is refused naming its KV cache while the earlier
//! session keeps working; the count of bytes in use returns to its value
//! before each load after a failure and after freeing. Through the Rust API
//! and through the C API (`combs_runtime_options.memory_budget`).

mod common;
mod ffi_support;

use std::ffi::CString;
use std::path::Path;
use std::ptr;
use std::sync::Arc;

use combs::ModelError;
use combs::ffi::*;
use combs::gpu::GpuContext;
use combs::models::LoadOptions;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::quant::QuantType;
use combs::runtime::sampler::argmax;
use combs::runtime::{Model, SessionOptions};
use common::TempFile;
use ffi_support::{last_error, ok};

const PROMPT: [u32; 4] = [1, 5, 9, 13];
const N_GEN: usize = 6;
const N_CTX: usize = 64;

/// A fresh context: the counts under test belong to one context, so the
/// shared test context of the other files would not do.
fn fresh_gpu() -> Arc<GpuContext> {
    GpuContext::new(None).unwrap_or_else(|e| {
        panic!(
            "no Vulkan device: {e}\ninstall one, e.g. `apt-get install -y libvulkan1 \
             mesa-vulkan-drivers` (lavapipe)"
        )
    })
}

/// Model A (the `tiny` preset) or the larger model B (a wider vocabulary
/// and twice the layers), written to a file of this test process.
fn write_model(name: &str, large: bool) -> TempFile {
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.seed = 11;
    if large {
        cfg.n_vocab = 4096;
        cfg.n_layer = 4;
    }
    TempFile::write(
        &format!("memory-budget-{name}.gguf"),
        &synth_gguf(&cfg).expect("synth").to_bytes(),
    )
}

fn c_path(p: &Path) -> CString {
    CString::new(p.to_string_lossy().into_owned()).expect("no NUL")
}

fn session_opts() -> SessionOptions {
    SessionOptions {
        n_ctx: N_CTX,
        ..SessionOptions::default()
    }
}

/// Greedy tokens after [`PROMPT`].
fn greedy(session: &mut combs::runtime::Session) -> Vec<u32> {
    session.prefill(&PROMPT).expect("prefill");
    (0..N_GEN)
        .map(|_| {
            let t = argmax(session.logits()) as u32;
            session.decode(t).expect("decode");
            t
        })
        .collect()
}

/// Device bytes model `path` and one session of it take at their peak, and
/// the tokens it generates, on a context of its own without a budget.
fn measure(path: &Path) -> (u64, Vec<u32>) {
    let ctx = fresh_gpu();
    let model = Model::load(&ctx, path, &LoadOptions::default()).expect("load");
    let mut s = model.new_session(&session_opts()).expect("session");
    let tokens = greedy(&mut s);
    drop(s);
    drop(model);
    assert_eq!(ctx.memory_in_use(), 0, "device bytes left after freeing");
    assert_eq!(
        ctx.memory_host_visible(),
        0,
        "host bytes left after freeing"
    );
    (ctx.memory_peak(), tokens)
}

#[test]
fn memory_budget_refuses_larger_model_and_session_then_smaller_model_runs() {
    let (a, b) = (write_model("a", false), write_model("b", true));
    let (need_a, want) = measure(&a);
    let (need_b, _) = measure(&b);
    assert!(
        need_b > need_a,
        "B ({need_b} bytes) must need more than A ({need_a})"
    );

    let ctx = fresh_gpu();
    ctx.set_memory_budget(need_a);
    let e = Model::load(&ctx, &b, &LoadOptions::default())
        .err()
        .expect("B must not fit A's budget");
    assert_eq!(
        combs_status::from(&e),
        combs_status::COMBS_ERR_OUT_OF_MEMORY,
        "{e}"
    );
    match e.root() {
        ModelError::MemoryBudget {
            what,
            bytes,
            in_use,
            budget,
        } => {
            assert!(what.ends_with(".weight"), "names a tensor: {e}");
            assert_eq!(*budget, need_a);
            assert!(in_use + bytes > need_a, "{e}");
        }
        _ => panic!("not a budget error: {e}"),
    }
    let msg = e.to_string();
    assert!(msg.contains(&need_a.to_string()), "names the budget: {msg}");
    assert_eq!(
        ctx.memory_in_use(),
        0,
        "a failed load frees what it allocated"
    );
    assert_eq!(ctx.memory_host_visible(), 0, "and its staging");

    // The same context still loads A, which runs as without a budget.
    let model = Model::load(&ctx, &a, &LoadOptions::default()).expect("A fits");
    let after_load = ctx.memory_in_use();
    let mut s1 = model.new_session(&session_opts()).expect("a session fits");
    assert_eq!(greedy(&mut s1), want, "tokens under a budget");

    // Room for less than a second KV cache: the second session is refused,
    // the first keeps working.
    let in_use = ctx.memory_in_use();
    ctx.set_memory_budget(in_use + s1.cache_bytes() / 2);
    let e = model
        .new_session(&session_opts())
        .err()
        .expect("a second session must not fit");
    assert_eq!(
        combs_status::from(&e),
        combs_status::COMBS_ERR_OUT_OF_MEMORY,
        "{e}"
    );
    assert!(
        e.to_string().contains("KV cache"),
        "names the KV cache: {e}"
    );
    assert_eq!(
        ctx.memory_in_use(),
        in_use,
        "the refused session freed its bytes"
    );
    s1.rewind(0).expect("rewind");
    assert_eq!(greedy(&mut s1), want, "the first session after the refusal");

    drop(s1);
    assert_eq!(
        ctx.memory_in_use(),
        after_load,
        "a freed session gives back its bytes"
    );
    drop(model);
    assert_eq!(ctx.memory_in_use(), 0);
    assert_eq!(ctx.memory_host_visible(), 0);
}

/// The same through the C API: the budget is a runtime option, fixed at
/// creation.
#[test]
fn ffi_memory_budget_refuses_larger_model_and_session_then_smaller_model_runs() {
    let (a, b) = (write_model("ffi-a", false), write_model("ffi-b", true));
    let (need_a, want) = measure(&a);
    let want: Vec<combs_token> = want.iter().map(|&t| t as combs_token).collect();

    let mut opts = combs_runtime_default_options();
    assert_eq!(opts.memory_budget, 0, "no budget by default");
    opts.memory_budget = need_a;
    let mut rt = ptr::null_mut();
    // SAFETY: valid options and out-pointer.
    ok(unsafe { combs_runtime_create(&opts, &mut rt) });
    // SAFETY: rt is live.
    let ctx = unsafe { runtime_context(rt) }.expect("runtime");
    assert_eq!(ctx.memory_budget(), need_a);

    let mut m = ptr::null_mut();
    // SAFETY: live runtime, NUL-terminated path, NULL options, valid out.
    let s = unsafe { combs_model_load(rt, c_path(&b).as_ptr(), ptr::null(), &mut m) };
    let msg = last_error();
    assert_eq!(s, combs_status::COMBS_ERR_OUT_OF_MEMORY, "{msg}");
    assert!(m.is_null());
    assert!(msg.contains(".weight") && msg.contains("budget"), "{msg}");
    assert_eq!(
        ctx.memory_in_use(),
        0,
        "a failed load frees what it allocated"
    );

    // SAFETY: as above.
    ok(unsafe { combs_model_load(rt, c_path(&a).as_ptr(), ptr::null(), &mut m) });
    let mut sopts = combs_session_default_options();
    sopts.n_ctx = N_CTX as u32;
    let mut s1 = ptr::null_mut();
    // SAFETY: live model, valid options and out-pointer.
    ok(unsafe { combs_session_create(m, &sopts, &mut s1) });
    let run = |s: *mut combs_session| -> Vec<combs_token> {
        let prompt: Vec<combs_token> = PROMPT.iter().map(|&t| t as combs_token).collect();
        // SAFETY: live session; prompt holds its length.
        ok(unsafe { combs_session_prefill(s, prompt.as_ptr(), prompt.len()) });
        let smp = ffi_support::greedy();
        // SAFETY: live model.
        let n_vocab = unsafe { combs_model_n_vocab(m) } as usize;
        let out = (0..N_GEN)
            .map(|_| ffi_support::step(s, smp, n_vocab))
            .collect();
        // SAFETY: created above, freed once.
        unsafe { combs_sampler_free(smp) };
        out
    };
    assert_eq!(run(s1), want, "tokens under a budget");

    // A session whose KV cache is far past what is left.
    let mut big = sopts;
    big.n_ctx = 1 << 20;
    let in_use = ctx.memory_in_use();
    let mut s2 = ptr::null_mut();
    // SAFETY: as above.
    let st = unsafe { combs_session_create(m, &big, &mut s2) };
    let msg = last_error();
    assert_eq!(st, combs_status::COMBS_ERR_OUT_OF_MEMORY, "{msg}");
    assert!(s2.is_null());
    assert!(msg.contains("KV cache"), "{msg}");
    assert_eq!(ctx.memory_in_use(), in_use);
    // SAFETY: live session.
    ok(unsafe { combs_session_rewind(s1, 0) });
    assert_eq!(run(s1), want, "the first session after the refusal");

    // SAFETY: each freed once; the context Arc outlives the runtime handle.
    unsafe {
        combs_session_free(s1);
        combs_model_free(m);
        combs_runtime_free(rt);
    }
    assert_eq!(ctx.memory_in_use(), 0);
    assert_eq!(ctx.memory_host_visible(), 0);
}

/// Fills the real device memory with sessions of huge contexts until the
/// driver refuses (no budget), checks the refusal is `COMBS_ERR_OUT_OF_MEMORY`
/// naming the session's KV cache (or scratch) with nothing of the refused session left allocated,
/// then frees the sessions and loads and runs model A in the same context:
/// it generates what it generates on a fresh one. For a GPU (it fills all
/// of its memory; minutes at most); on a CPU device (lavapipe: host memory)
/// it refuses to run unless `COMBS_FILL_ANY_DEVICE=1`. Run:
/// `cargo test --release --test memory_budget -- --ignored --nocapture memory_fill`
#[test]
#[ignore = "fills the device's memory; run by hand on a GPU"]
fn memory_fill_real_device_refuses_then_small_model_runs() {
    let ctx = fresh_gpu();
    let caps = ctx.caps().clone();
    if caps.class() == combs::gpu::DeviceClass::Cpu
        && std::env::var("COMBS_FILL_ANY_DEVICE").as_deref() != Ok("1")
    {
        panic!(
            "{} is a CPU device: filling it would fill host memory (set COMBS_FILL_ANY_DEVICE=1 \
             to do it anyway)",
            caps.name
        );
    }
    let device_bytes = caps.device_local_bytes;
    eprintln!(
        "device {}: {:.1} GiB device-local",
        caps.name,
        device_bytes as f64 / f64::from(1u32 << 30)
    );
    let a = write_model("fill-a", false);
    let (_, want) = measure(&a);

    // A model whose KV rows are wide (8 layers × 8 KV heads × 128): 32 KiB
    // per position, so a session of 2^17 positions holds 4 GiB.
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.n_embd = 1024;
    cfg.n_head = 8;
    cfg.n_head_kv = 8;
    cfg.head_dim = 128;
    cfg.n_layer = 8;
    cfg.n_ff = 1024;
    let fill_path = TempFile::write(
        "memory-budget-fill.gguf",
        &synth_gguf(&cfg).expect("synth").to_bytes(),
    );
    let fill = Model::load(&ctx, &fill_path, &LoadOptions::default()).expect("load");

    let t0 = std::time::Instant::now();
    let big = SessionOptions {
        n_ctx: 1 << 17,
        ..SessionOptions::default()
    };
    let mut sessions = Vec::new();
    let refusal = loop {
        let before = ctx.memory_in_use();
        match fill.new_session(&big) {
            Ok(s) => sessions.push(s),
            Err(e) => {
                assert_eq!(
                    ctx.memory_in_use(),
                    before,
                    "the refused session left bytes allocated: {e}"
                );
                break e;
            }
        }
        assert!(
            ctx.memory_in_use() <= device_bytes + (16 << 30),
            "the driver did not refuse: {} bytes allocated on a {} byte device",
            ctx.memory_in_use(),
            device_bytes
        );
    };
    eprintln!(
        "refused after {} sessions, {:.1} GiB in use, {:.1} s: {refusal}",
        sessions.len(),
        ctx.memory_in_use() as f64 / f64::from(1u32 << 30),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        combs_status::from(&refusal),
        combs_status::COMBS_ERR_OUT_OF_MEMORY,
        "{refusal:?}"
    );
    let msg = refusal.to_string();
    assert!(
        msg.contains("KV cache") || msg.contains("scratch of a new session"),
        "names the session's KV cache or scratch: {msg}"
    );
    assert!(
        !ctx.is_lost(),
        "running out of memory must not lose the device"
    );

    // Full, the device still runs what it holds.
    let s0 = sessions.first_mut().expect("at least one session fitted");
    s0.prefill(&PROMPT)
        .expect("prefill while the device is full");
    // Loading more while full is refused the same way, or fits in what is left.
    match Model::load(&ctx, &a, &LoadOptions::default()) {
        Ok(_) => eprintln!("model A still fitted beside the full sessions"),
        Err(e) => {
            eprintln!("loading model A while full: {e}");
            assert_eq!(
                combs_status::from(&e),
                combs_status::COMBS_ERR_OUT_OF_MEMORY
            );
        }
    }

    drop(sessions);
    drop(fill);
    assert_eq!(ctx.memory_in_use(), 0);
    let model = Model::load(&ctx, &a, &LoadOptions::default()).expect("A loads after freeing");
    let mut s = model.new_session(&session_opts()).expect("session");
    assert_eq!(greedy(&mut s), want, "tokens after the device was full");
    eprintln!("model A generated {want:?} after the fill, as on a fresh context");
}

/// `combs run --memory-budget MIB`: the larger model does not fit 1 MiB and
/// the error names a tensor and the budget; the small one runs in 8 MiB.
#[test]
fn cli_run_memory_budget_refuses_larger_model() {
    let run = |model: &Path, mib: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_combs"))
            .args(["run", "-m"])
            .arg(model)
            .args([
                "-p",
                "hello",
                "-n",
                "4",
                "--temp",
                "0",
                "--memory-budget",
                mib,
            ])
            .output()
            .expect("run combs")
    };
    let out = run(&write_model("cli-b", true), "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("out of memory") && err.contains(".weight") && err.contains("1048576"),
        "{err}"
    );
    let out = run(&write_model("cli-a", false), "8");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("budget 8.0 MiB"), "{err}");
}
