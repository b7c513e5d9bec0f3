//! Requantization (`combs::quant::requantize`, `combs quantize`): the type
//! rules of llama.cpp's `llama_tensor_get_type` on small synthetic models,
//! round trips, and byte-exact parity with `llama-quantize --allow-requantize`
//! on the real SmolLM2 and Gemma 3 files, through sha256 values of
//! llama-quantize's outputs recorded here (CI has no llama.cpp to compare with).

use std::path::PathBuf;

use combs::ModelError;
use combs::formats::gguf::{GgufFile, MetaValue};
use combs::formats::gguf_writer::GgufWriter;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::quant::requantize::{FileType, RequantizeOptions, plan, requantize};
use combs::quant::{QuantType, dequantize_vec, quantize};

// ---- helpers -----------------------------------------------------------------------------

/// A small llama-shaped model with f32 weights.
fn synth(n_embd: usize, n_ff: usize, n_layer: usize, tied: bool) -> GgufFile {
    let cfg = SynthConfig {
        arch: "llama".into(),
        n_vocab: 300,
        n_embd,
        n_layer,
        n_head: 4,
        n_head_kv: 2,
        head_dim: n_embd / 4,
        n_ff,
        n_ctx: 256,
        tied,
        qtype: QuantType::F32,
        seed: 7,
        sliding_window: 0,
    };
    let w = synth_gguf(&cfg).expect("synthetic model");
    GgufFile::from_bytes(w.to_bytes()).expect("synthetic model parses")
}

fn requant(f: &GgufFile, t: FileType) -> GgufFile {
    let w = requantize(f, t, &RequantizeOptions::default()).expect("requantize");
    GgufFile::from_bytes(w.to_bytes()).expect("output parses")
}

/// The output type of tensor `name`.
fn type_of(f: &GgufFile, name: &str) -> QuantType {
    let t = f.tensor(name).unwrap_or_else(|| panic!("no tensor {name}"));
    t.qtype
        .unwrap_or_else(|| panic!("{name}: unexpected type {}", t.type_name()))
}

fn f32_weights(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).expect("tensor");
    let qt = t.qtype.expect("known type");
    dequantize_vec(qt, f.tensor_data(t), t.n_elements as usize).expect("dequantize")
}

// ---- type selection ------------------------------------------------------------------------

#[test]
fn requantize_q8_0_writes_llama_cpp_metadata_and_order() {
    let f = synth(64, 128, 2, false);
    let out = requant(&f, FileType::Q8_0);

    // Input keys in order, then the two llama-quantize sets.
    let keys: Vec<&str> = out.metadata().iter().map(|(k, _)| k.as_str()).collect();
    let mut want: Vec<&str> = f.metadata().iter().map(|(k, _)| k.as_str()).collect();
    want.extend(["general.quantization_version", "general.file_type"]);
    assert_eq!(keys, want);
    assert_eq!(out.get("general.file_type"), Some(&MetaValue::U32(7)));
    assert_eq!(
        out.get("general.quantization_version"),
        Some(&MetaValue::U32(2))
    );

    let names: Vec<&str> = out.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["output.weight", "output_norm.weight", "token_embd.weight"]
    );
    assert_eq!(
        &names[3..12],
        [
            "blk.0.attn_k.weight",
            "blk.0.attn_norm.weight",
            "blk.0.attn_output.weight",
            "blk.0.attn_q.weight",
            "blk.0.attn_v.weight",
            "blk.0.ffn_down.weight",
            "blk.0.ffn_gate.weight",
            "blk.0.ffn_norm.weight",
            "blk.0.ffn_up.weight",
        ]
    );
    for t in out.tensors() {
        let want = if t.dims.len() == 1 {
            QuantType::F32
        } else {
            QuantType::Q8_0
        };
        assert_eq!(t.qtype, Some(want), "{}", t.name);
    }
    // 1-D tensors are copied byte for byte.
    let norm = |g: &GgufFile| {
        g.tensor_data(g.tensor("blk.1.ffn_norm.weight").expect("norm"))
            .to_vec()
    };
    assert_eq!(norm(&out), norm(&f));
}

#[test]
fn requantize_q4_k_m_gives_more_bits_to_attn_v_and_ffn_down_layers() {
    // 8 layers: use_more_bits picks layers 0, 3, 6 and 7.
    let f = synth(256, 512, 8, false);
    let out = requant(&f, FileType::Q4KM);
    assert_eq!(type_of(&out, "output.weight"), QuantType::Q6K);
    assert_eq!(type_of(&out, "token_embd.weight"), QuantType::Q4K);
    for il in 0..8 {
        let more = [0, 3, 6, 7].contains(&il);
        let want = if more { QuantType::Q6K } else { QuantType::Q4K };
        assert_eq!(
            type_of(&out, &format!("blk.{il}.attn_v.weight")),
            want,
            "layer {il}"
        );
        assert_eq!(
            type_of(&out, &format!("blk.{il}.ffn_down.weight")),
            want,
            "layer {il}"
        );
        for n in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
            assert_eq!(
                type_of(&out, &format!("blk.{il}.{n}.weight")),
                QuantType::Q4K
            );
        }
        assert_eq!(
            type_of(&out, &format!("blk.{il}.attn_norm.weight")),
            QuantType::F32
        );
    }
    assert_eq!(out.get("general.file_type"), Some(&MetaValue::U32(15)));
}

#[test]
fn requantize_q3_k_m_and_q2_k_follow_llama_cpp_mixes() {
    let f = synth(256, 512, 8, false);
    let q3 = requant(&f, FileType::Q3KM);
    for il in 0..8 {
        let v = if il < 2 {
            QuantType::Q5K
        } else {
            QuantType::Q4K
        };
        assert_eq!(type_of(&q3, &format!("blk.{il}.attn_v.weight")), v);
        assert_eq!(
            type_of(&q3, &format!("blk.{il}.ffn_down.weight")),
            QuantType::Q4K
        );
        assert_eq!(
            type_of(&q3, &format!("blk.{il}.attn_output.weight")),
            QuantType::Q4K
        );
        assert_eq!(
            type_of(&q3, &format!("blk.{il}.ffn_up.weight")),
            QuantType::Q3K
        );
    }
    let q2 = requant(&f, FileType::Q2K);
    // n_head / n_head_kv = 2 < 4, so attn_v gets Q3_K.
    assert_eq!(type_of(&q2, "blk.0.attn_v.weight"), QuantType::Q3K);
    assert_eq!(type_of(&q2, "blk.0.ffn_down.weight"), QuantType::Q3K);
    assert_eq!(type_of(&q2, "blk.0.attn_output.weight"), QuantType::Q3K);
    assert_eq!(type_of(&q2, "blk.0.attn_q.weight"), QuantType::Q2K);
    assert_eq!(type_of(&q2, "output.weight"), QuantType::Q6K);
}

#[test]
fn requantize_falls_back_when_rows_do_not_fit_the_block() {
    // Rows of 64 (not a multiple of 256) and 48 (not even of 32).
    let f = synth(64, 48, 2, true);
    let out = requant(&f, FileType::Q4KM);
    assert_eq!(type_of(&out, "blk.0.attn_q.weight"), QuantType::Q5_0);
    assert_eq!(type_of(&out, "blk.0.ffn_up.weight"), QuantType::Q5_0);
    // With 2 layers use_more_bits picks layer 1 only: Q6_K, whose fallback is Q8_0.
    assert_eq!(type_of(&out, "blk.0.attn_v.weight"), QuantType::Q5_0);
    assert_eq!(type_of(&out, "blk.1.attn_v.weight"), QuantType::Q8_0);
    // Neither Q5_0 nor Q8_0 fits rows of 48: f16.
    assert_eq!(type_of(&out, "blk.0.ffn_down.weight"), QuantType::F16);
    assert_eq!(type_of(&out, "blk.1.ffn_down.weight"), QuantType::F16);
    // Tied embeddings take the output's rule: Q6_K does not fit 64, so Q8_0.
    assert!(out.tensor("output.weight").is_none());
    assert_eq!(type_of(&out, "token_embd.weight"), QuantType::Q8_0);

    let plans = plan(&f, FileType::Q4KM).expect("plan");
    let fallback_from = |name: &str| {
        plans
            .iter()
            .find(|p| p.name == name)
            .expect("planned")
            .fallback_from
    };
    assert_eq!(fallback_from("blk.0.ffn_down.weight"), Some(QuantType::Q4K));
    assert_eq!(fallback_from("blk.1.ffn_down.weight"), Some(QuantType::Q6K));
    assert_eq!(fallback_from("blk.0.attn_norm.weight"), None);
}

#[test]
fn requantize_q4_0_tied_embedding_gets_q6_k_or_q8_0() {
    let f = synth(256, 512, 2, true);
    assert_eq!(
        type_of(&requant(&f, FileType::Q4_0), "token_embd.weight"),
        QuantType::Q6K
    );
    assert_eq!(
        type_of(&requant(&f, FileType::Q8_0), "token_embd.weight"),
        QuantType::Q8_0
    );
    let g = synth(64, 128, 2, true);
    assert_eq!(
        type_of(&requant(&g, FileType::Q5_0), "token_embd.weight"),
        QuantType::Q8_0
    );
}

#[test]
fn requantize_dense_targets_convert_every_matrix() {
    let f = synth(64, 96, 2, false);
    for (ft, qt) in [
        (FileType::F16, QuantType::F16),
        (FileType::BF16, QuantType::BF16),
        (FileType::F32, QuantType::F32),
    ] {
        let out = requant(&f, ft);
        for t in out.tensors() {
            let want = if t.dims.len() == 1 {
                QuantType::F32
            } else {
                qt
            };
            assert_eq!(t.qtype, Some(want), "{ft}: {}", t.name);
        }
    }
}

// ---- round trips -------------------------------------------------------------------------

#[test]
fn requantize_round_trip_error_is_small() {
    let f = synth(256, 512, 2, false);
    for (ft, bound) in [
        (FileType::F16, 1e-3),
        (FileType::Q8_0, 1e-2),
        (FileType::Q6K, 2e-2),
        (FileType::Q4KM, 0.12),
        (FileType::Q4_0, 0.15),
    ] {
        let out = requant(&f, ft);
        for name in [
            "blk.1.attn_q.weight",
            "blk.1.ffn_down.weight",
            "output.weight",
        ] {
            let (x, y) = (f32_weights(&f, name), f32_weights(&out, name));
            let err: f64 = x
                .iter()
                .zip(&y)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum();
            let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
            let rel = (err / norm).sqrt();
            assert!(rel < bound, "{ft} {name}: relative RMSE {rel}");
        }
    }
}

#[test]
fn requantize_to_own_type_is_identity_and_f32_is_exact_dequantization() {
    let f = synth(256, 512, 2, false);
    let q = requantize(&f, FileType::Q4KM, &RequantizeOptions::default()).expect("q4_k_m");
    let q_bytes = q.to_bytes();
    let qf = GgufFile::from_bytes(q_bytes.clone()).expect("parses");
    let again = requantize(&qf, FileType::Q4KM, &RequantizeOptions::default()).expect("again");
    assert_eq!(again.to_bytes(), q_bytes);

    let back = requant(&qf, FileType::F32);
    for t in qf.tensors() {
        assert_eq!(
            f32_weights(&back, &t.name),
            f32_weights(&qf, &t.name),
            "{}",
            t.name
        );
    }
}

#[test]
fn requantize_output_does_not_depend_on_thread_count() {
    let f = synth(256, 512, 2, false);
    let run = |threads| {
        requantize(&f, FileType::Q5KM, &RequantizeOptions { threads })
            .expect("requantize")
            .to_bytes()
    };
    assert_eq!(run(1), run(3));
}

#[test]
fn requantize_without_block_count_is_metadata_error() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").expect("key");
    w.add_tensor("blk.0.attn_q.weight", 0, &[32, 2], vec![0u8; 256])
        .expect("tensor");
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parses");
    match requantize(&f, FileType::Q8_0, &RequantizeOptions::default()) {
        Err(ModelError::Metadata { key, .. }) => assert_eq!(key, "llama.block_count"),
        other => panic!("expected a metadata error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn file_type_parses_llama_quantize_names() {
    assert_eq!(FileType::parse("q4_k_m").ok(), Some(FileType::Q4KM));
    assert_eq!(FileType::parse("Q4_K").ok(), Some(FileType::Q4KM));
    assert_eq!(FileType::parse("q8_0").ok(), Some(FileType::Q8_0));
    assert_eq!(FileType::parse("bf16").ok(), Some(FileType::BF16));
    assert_eq!(FileType::parse("7").ok(), Some(FileType::Q8_0));
    assert!(matches!(
        FileType::parse("IQ2_XXS"),
        Err(ModelError::InvalidArgument { .. })
    ));
}

#[test]
fn quantize_legacy_tiny_block_matches_x86_conversion() {
    // max |x| ~ 1e-38: 1/d overflows to inf, and llama.cpp's (int8_t) casts of
    // inf and NaN give 0 on x86, not Rust's saturated 127 / -128.
    let x: Vec<f32> = (0..32).map(|j| (j as f32 - 15.5) * 1e-39).collect();
    let quant_bytes = |t: QuantType, skip: usize| -> Vec<u8> {
        quantize(t, &x).expect("quantize")[skip..].to_vec()
    };
    assert!(quant_bytes(QuantType::Q4_0, 2).iter().all(|&b| b == 0));
    assert!(quant_bytes(QuantType::Q5_0, 2).iter().all(|&b| b == 0));
    assert!(quant_bytes(QuantType::Q8_0, 2).iter().all(|&b| b == 0));
    assert!(quant_bytes(QuantType::Q4_1, 4).iter().all(|&b| b == 0));
    assert!(quant_bytes(QuantType::Q5_1, 4).iter().all(|&b| b == 0));
}

// ---- real models against llama-quantize ----------------------------------------------------

fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/combs/models")
        });
    let p = dir.join(file);
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-models.sh to download the test models",
        p.display()
    );
    p
}

/// Requantizes `file` to each target and compares the sha256 of the output
/// with that of `llama-quantize --allow-requantize` (build 0c1e570).
fn check_against_llama_quantize(file: &str, cases: &[(FileType, &str)]) {
    let input = GgufFile::open(&model_path(file)).expect("open model");
    let mut failures = Vec::new();
    for &(ft, want) in cases {
        let start = std::time::Instant::now();
        let out = requantize(&input, ft, &RequantizeOptions::default()).expect("requantize");
        let got = sha256_hex(&out.to_bytes());
        eprintln!("{file} -> {ft}: {got} ({:.2?})", start.elapsed());
        if got != want {
            failures.push(format!("{ft}: sha256 {got}, llama-quantize gives {want}"));
        }
    }
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
}

#[test]
fn requantize_smollm2_matches_llama_quantize() {
    check_against_llama_quantize(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        &[
            (
                FileType::Q8_0,
                "7b46609d11703c058397e5cfe4cc6e4b2508cb1eb4c80ddc472a5d421fbdb508",
            ),
            (
                FileType::Q4_0,
                "aa4256f3b46eb4add75ece1c0eeac1c6e4f1ec0c93e6fbe64fe1770f4ad09ae8",
            ),
            (
                FileType::Q5_0,
                "2f90a7511cf340144dda963a9fd73f708601517f0f8038d31c9069654526be44",
            ),
            (
                FileType::Q4KM,
                "dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1",
            ),
        ],
    );
}

#[test]
fn requantize_gemma3_matches_llama_quantize() {
    check_against_llama_quantize(
        "gemma-3-270m-q4_k_m.gguf",
        &[
            (
                FileType::Q8_0,
                "d3d21138dcca83884e329b4cd6939b905c15e06022a930ce13d6db4d9e67290a",
            ),
            (
                FileType::Q4_0,
                "8b90dc09855b7fc6fe7d3bec8afbe0e27541fa3ed72eb0b3b2ea0e56f3b47d88",
            ),
        ],
    );
}

// ---- sha256 (FIPS 180-4), so the test needs no extra dependency ----------------------------

const SHA256_K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// One SHA-256 compression of a 64-byte block into the state `h`.
fn sha256_block(h: &mut [u32; 8], block: &[u8; 64]) {
    let mut w = [0u32; 64];
    for (wi, c) in w.iter_mut().zip(block.as_chunks::<4>().0) {
        *wi = u32::from_be_bytes(*c);
    }
    for i in 16..64 {
        let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
        let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16]
            .wrapping_add(s0)
            .wrapping_add(w[i - 7])
            .wrapping_add(s1);
    }
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut hh] = *h;
    for (k, wi) in SHA256_K.iter().zip(w) {
        let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
        let ch = (e & f) ^ (!e & g);
        let t1 = hh
            .wrapping_add(s1)
            .wrapping_add(ch)
            .wrapping_add(*k)
            .wrapping_add(wi);
        let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
        let maj = (a & b) ^ (a & c) ^ (b & c);
        hh = g;
        g = f;
        f = e;
        e = d.wrapping_add(t1);
        d = c;
        c = b;
        b = a;
        a = t1.wrapping_add(s0.wrapping_add(maj));
    }
    for (x, y) in h.iter_mut().zip([a, b, c, d, e, f, g, hh]) {
        *x = x.wrapping_add(y);
    }
}

/// SHA-256 of `data` as lower-case hex.
fn sha256_hex(data: &[u8]) -> String {
    let mut h: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
        0x5be0cd19,
    ];
    let (blocks, rest) = data.as_chunks::<64>();
    for b in blocks {
        sha256_block(&mut h, b);
    }
    let mut tail = rest.to_vec();
    tail.push(0x80);
    while tail.len() % 64 != 56 {
        tail.push(0);
    }
    tail.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for b in tail.as_chunks::<64>().0 {
        sha256_block(&mut h, b);
    }
    h.iter().map(|x| format!("{x:08x}")).collect()
}

#[test]
fn sha256_matches_known_vectors() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        sha256_hex(b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let long = vec![b'a'; 1000];
    assert_eq!(
        sha256_hex(&long),
        "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
    );
}
