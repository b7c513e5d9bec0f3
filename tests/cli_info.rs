//! `combs info` as a user runs it: the built binary on a good file, on
//! corrupted files (exit code 1, `error:` on stderr, never a panic), on the
//! real models from `scripts/fetch-models.sh`, and `--devices`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use combs::formats::gguf::GgufFile;
use combs::formats::gguf_writer::GgufWriter;
use common::Rng;

const F32: u32 = 0;
const Q8_0: u32 = 8;
const IQ2_XXS: u32 = 16;

fn combs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_combs"))
        .args(args)
        .output()
        .expect("the combs binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A file in the test scratch directory, unique to this process and `label`.
fn scratch(label: &str, bytes: &[u8]) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli_info_{}_{label}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn sample(rng: &mut Rng) -> Vec<u8> {
    let mut data = |n: usize| {
        let mut v = vec![0u8; n];
        rng.fill(&mut v);
        v
    };
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("llama.block_count", 1u32).unwrap();
    w.add("tokenizer.chat_template", "x".repeat(500).as_str())
        .unwrap();
    w.add(
        "tokenizer.ggml.tokens",
        (0..1000).map(|i| format!("tok{i}")).collect::<Vec<_>>(),
    )
    .unwrap();
    let (a, b, k, c, d) = (data(2 * 34), data(4 * 64), data(4 * 16), data(66), data(32));
    w.add_tensor("token_embd.weight", Q8_0, &[32, 2], a)
        .unwrap();
    w.add_tensor("blk.0.attn_q.weight", F32, &[8, 8], b)
        .unwrap();
    w.add_tensor("blk.0.attn_k.weight", F32, &[8, 2], k)
        .unwrap();
    w.add_tensor("blk.0.odd.weight", IQ2_XXS, &[256], c)
        .unwrap();
    w.add_tensor("output_norm.weight", F32, &[8], d).unwrap();
    w.to_bytes()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in file")
}

/// Offset of a tensor's field: 0 = n_dims, then first dim, type, offset.
fn tensor_field(b: &[u8], name: &str, field: usize) -> usize {
    let n_dims_at = find(b, name.as_bytes()) + name.len();
    let n_dims = u32::from_le_bytes(b[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    [
        n_dims_at,
        n_dims_at + 4,
        n_dims_at + 4 + 8 * n_dims,
        n_dims_at + 8 + 8 * n_dims,
    ][field]
}

fn assert_clean_failure(out: &Output, context: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{context}: stderr {stderr}");
    assert!(
        stderr.starts_with("error: "),
        "{context}: stderr {stderr:?}"
    );
    assert!(!stderr.contains("panicked"), "{context}: {stderr}");
}

#[test]
fn cli_info_prints_good_file() {
    let b = sample(&mut Rng::fresh("cli_info_prints_good_file"));
    let path = scratch("good", &b);
    let out = combs(&["info", "-m", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert!(stdout.contains("GGUF version 3"), "{stdout}");
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.odd.weight",
        "output_norm.weight",
        "general.architecture",
        "\"llama\"",
        "(500 bytes)",
        "[str; 1000]",
        "IQ2_XXS*",
        "total: 5 tensors",
        "Q8_0: 1 tensor,",
    ] {
        assert!(stdout.contains(name), "{name:?} missing from:\n{stdout}");
    }
    assert!(
        !stdout.contains(&"x".repeat(200)),
        "long string not truncated"
    );
    let full = combs(&["info", "--full", "-m", path.to_str().unwrap()]);
    assert!(text(&full.stdout).contains(&"x".repeat(500)));
    assert!(text(&full.stdout).contains("\"tok999\""));
    let _ = std::fs::remove_file(path);
}

#[test]
fn cli_info_rejects_corrupted_files() {
    let good = sample(&mut Rng::fresh("cli_info_rejects_corrupted_files"));
    type Patch = fn(&mut Vec<u8>);
    let cases: Vec<(&str, Patch)> = vec![
        ("bad_magic", |b| b[0] = b'X'),
        ("version_1", |b| {
            b[4..8].copy_from_slice(&1u32.to_le_bytes())
        }),
        ("version_99", |b| {
            b[4..8].copy_from_slice(&99u32.to_le_bytes())
        }),
        ("tensor_count", |b| {
            b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes())
        }),
        ("kv_count", |b| {
            b[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes())
        }),
        ("key_length", |b| {
            b[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes())
        }),
        ("truncated_header", |b| b.truncate(100)),
        ("truncated_data", |b| {
            let n = b.len() - 40;
            b.truncate(n)
        }),
        ("unknown_type", |b| {
            let at = tensor_field(b, "blk.0.attn_q.weight", 2);
            b[at..at + 4].copy_from_slice(&999u32.to_le_bytes());
        }),
        ("offset_past_end", |b| {
            let at = tensor_field(b, "output_norm.weight", 3);
            b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        }),
        ("misaligned", |b| {
            let at = tensor_field(b, "output_norm.weight", 3);
            b[at] += 1;
        }),
        ("overflowing_dims", |b| {
            let at = tensor_field(b, "blk.0.attn_q.weight", 1);
            b[at..at + 16].copy_from_slice(&[0xff; 16]);
        }),
        ("duplicate_name", |b| {
            let at = find(b, b"blk.0.attn_k.weight") + "blk.0.attn_".len();
            b[at] = b'q';
        }),
    ];
    for (label, patch) in cases {
        let mut b = good.clone();
        patch(&mut b);
        let path = scratch(label, &b);
        assert_clean_failure(&combs(&["info", "-m", path.to_str().unwrap()]), label);
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn cli_info_rejects_sampled_truncations() {
    let mut rng = Rng::fresh("cli_info_rejects_sampled_truncations");
    let b = sample(&mut rng);
    let g = GgufFile::from_bytes(b.clone()).unwrap();
    let need = g
        .tensors()
        .iter()
        .map(|t| (t.offset + t.n_bytes) as usize)
        .max()
        .unwrap();
    for i in 0..24 {
        let len = rng.below(need);
        let path = scratch(&format!("trunc{i}"), &b[..len]);
        assert_clean_failure(
            &combs(&["info", "-m", path.to_str().unwrap()]),
            &format!("truncated to {len} bytes"),
        );
        let _ = std::fs::remove_file(path);
    }
}

/// A Hugging Face directory is described as the GGUF combs converts it to;
/// a directory without config.json is an error naming it.
#[test]
fn cli_info_describes_hf_directories() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2_tiny");
    let out = combs(&["info", "-m", dir.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("\"qwen2\""), "{stdout}");
    assert!(stdout.contains("qwen2.block_count"), "{stdout}");
    let empty = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli_info_{}_emptydir", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = combs(&["info", "-m", empty.to_str().unwrap()]);
    assert_clean_failure(&out, "directory without config.json");
    assert!(
        text(&out.stderr).contains("config.json"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn cli_info_missing_file_is_error() {
    let out = combs(&["info", "-m", "/nonexistent/combs/model.gguf"]);
    assert_clean_failure(&out, "missing file");
    assert!(text(&out.stderr).contains("/nonexistent/combs/model.gguf"));
}

#[test]
fn cli_info_without_target_is_usage_error() {
    let out = combs(&["info"]);
    assert!(!out.status.success());
    assert!(!text(&out.stderr).contains("panicked"));
}

#[test]
fn cli_info_lists_devices() {
    let out = combs(&["info", "--devices"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "`combs info --devices` failed: {}\ninstall a Vulkan driver, e.g. \
         `apt-get install -y libvulkan1 mesa-vulkan-drivers` (lavapipe)",
        text(&out.stderr)
    );
    for field in [
        "device 0:",
        "subgroup size",
        "maxStorageBufferRange",
        "shared memory",
        "usable:",
    ] {
        assert!(stdout.contains(field), "{field:?} missing from:\n{stdout}");
    }
}

fn real_model(file: &str) -> PathBuf {
    let dir = std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/combs/models")))
        .expect("neither COMBS_MODELS nor HOME is set");
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/fetch-models.sh` to download the test models",
        path.display()
    );
    path
}

fn info_real(path: &Path, expect: &[&str]) {
    let out = combs(&["info", "-m", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for e in expect {
        assert!(
            stdout.contains(e),
            "{e:?} missing from `combs info` of {}",
            path.display()
        );
    }
}

#[test]
fn cli_info_real_models() {
    info_real(
        &real_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        &[
            "\"llama\"",
            "[str; 49152]",
            "token_embd.weight",
            "total: 272 tensors",
        ],
    );
    info_real(
        &real_model("gemma-3-270m-q4_k_m.gguf"),
        &[
            "\"gemma3\"",
            "[str; 262144]",
            "[f32; 262144]",
            "Q6_K",
            "total: 236 tensors",
        ],
    );
}

/// `combs info` on the transformers-made fixtures (`tests/fixtures/hf/`)
/// shows the spec combs resolved: LongRoPE with its two factor sets and
/// attention factor, fused tensors, partial rotary, sliding windows, Q/K norm.
#[test]
fn cli_info_prints_resolved_qwen3_and_phi3_specs() {
    let fixture = |name: &str| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hf")
            .join(name)
    };
    info_real(
        &fixture("phi3_longrope.gguf"),
        &[
            "resolved architecture: phi3 (Phi3 family)",
            "heads 4 (KV 2), head dim 16",
            "rope Neox over 12 dims, base 10000",
            "scaling LongRoPE (short: 6 factors in 1..4; long: 6 factors in 1..24; \
             long past 32 positions of context), attn factor 1.183",
            "fused QKV yes, fused gate/up yes, tied output yes",
            "every layer attends to the full context",
        ],
    );
    info_real(
        &fixture("phi3_swa.gguf"),
        &[
            "resolved architecture: phi3 (Phi3 family)",
            "scaling none, attn factor 1",
            "tied output no",
            "sliding-window layers (layer:window) 0:16 1:16 2:16",
        ],
    );
    info_real(
        &fixture("qwen3_tiny.gguf"),
        &[
            "resolved architecture: qwen3 (Qwen3 family)",
            "heads 4 (KV 2), head dim 32",
            "QKV bias no, Q/K norm yes",
        ],
    );
}
