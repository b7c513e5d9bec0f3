//! llama.cpp's KL-divergence base files and statistics (`combs perplexity
//! --kl-divergence-base / --kl-divergence`), both ways against llama.cpp's
//! own outputs (`tests/fixtures/kld/`, written by
//! `scripts/make-kld-fixtures.py`):
//!
//! * on models whose logits every engine computes exactly (`combs synth
//!   --preset exact`, made here again and checked against the sha256 of the
//!   files llama.cpp ran), the base file combs writes is byte for byte the
//!   one `llama-perplexity --kl-divergence-base` wrote, and combs reading
//!   llama.cpp's file prints every line `llama-perplexity --kl-divergence`
//!   printed (chunk lines and final statistics, character for character);
//! * the format round-trips fresh random logits, the statistics agree with
//!   a plain f64 computation, and malformed or mismatched files are clear
//!   errors (library and command line).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use combs::ModelError;
use combs::models::synth::exact_gguf;
use combs::quant::QuantType;
use combs::runtime::kld::KldStats;
use combs::runtime::kld_file::{
    KldHeader, KldReader, KldWriter, quantize_row, row_len, row_scale, rows_per_chunk,
};
use common::Rng;

const GPL3: &str = "/usr/share/common-licenses/GPL-3";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kld")
        .join(name)
}

fn meta() -> serde_json::Value {
    let path = fixture("exact.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (written by scripts/make-kld-fixtures.py)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("exact.json parses")
}

/// A path in the test scratch directory, unique to this process and `label`.
fn scratch(label: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kld_{}_{label}", std::process::id()))
}

fn combs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_combs"))
        .args(args)
        .output()
        .expect("the combs binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exact model `variant` (0: base, 1: the compared one) written to the
/// scratch directory for test `who`, after checking it is the file
/// llama.cpp ran.
fn exact_model(variant: u64, who: &str) -> PathBuf {
    let name = if variant == 0 { "base" } else { "variant" };
    let path = scratch(&format!("{who}-exact-{name}.gguf"));
    exact_gguf(QuantType::F16, variant)
        .expect("exact model")
        .write_file(&path)
        .expect("write exact model");
    let want = meta()["models"][name]["sha256"]
        .as_str()
        .expect("sha256")
        .to_string();
    let out = Command::new("sha256sum")
        .arg(&path)
        .output()
        .expect("sha256sum");
    let got = stdout(&out)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string();
    assert_eq!(
        got, want,
        "combs synth --preset exact no longer writes the model llama.cpp ran: \
         re-run scripts/make-kld-fixtures.py"
    );
    path
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

// ---------------------------------------------------------------- both ways against llama.cpp

#[test]
fn kld_base_written_by_combs_is_llama_cpp_bytes() {
    let m = meta();
    let model = exact_model(0, "write");
    let out = scratch("combs-exact.kld");
    let (ctx, chunks) = (m["n_ctx"].to_string(), m["n_chunk"].to_string());
    let o = combs(&[
        "perplexity",
        "-m",
        s(&model),
        "-f",
        GPL3,
        "-c",
        &ctx,
        "--chunks",
        &chunks,
        "--kl-divergence-base",
        s(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ours = std::fs::read(&out).expect("combs wrote the base file");
    let theirs = std::fs::read(fixture("exact-llama.kld")).expect("llama.cpp's base file");
    assert_eq!(ours.len(), theirs.len(), "file sizes");
    let first = ours.iter().zip(&theirs).position(|(a, b)| a != b);
    assert!(
        first.is_none(),
        "combs' base file differs from llama.cpp's at byte {first:?} ({})",
        m["base_tool"]
    );
    eprintln!(
        "RESULT combs' base file equals llama.cpp's, {} bytes",
        ours.len()
    );
}

#[test]
fn kld_statistics_from_llama_cpp_base_print_as_llama_cpp() {
    let model = exact_model(1, "stats");
    let o = combs(&[
        "perplexity",
        "-m",
        s(&model),
        "--kl-divergence-base",
        s(&fixture("exact-llama.kld")),
        "--kl-divergence",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let theirs = std::fs::read_to_string(fixture("exact-llama-stats.txt")).expect("llama.cpp");
    let lines = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let (ours, theirs) = (lines(&stdout(&o)), lines(&theirs));
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "combs vs llama-perplexity --kl-divergence");
    }
    assert_eq!(ours.len(), theirs.len(), "lines printed");
    assert!(theirs.iter().any(|l| l.starts_with("Same top p:")));
    eprintln!(
        "RESULT all {} lines equal llama.cpp's ({})",
        ours.len(),
        meta()["stats_tool"]
    );
}

// ---------------------------------------------------------------- the format on fresh data

/// Random logits with a spread like a model's (a few large, most small).
fn random_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u = rng.f32();
            let v = rng.f32() * 2.0 - 1.0;
            if u < 0.02 { 8.0 + 6.0 * v } else { 4.0 * v }
        })
        .collect()
}

#[test]
fn kld_base_round_trips_fresh_random_logits() {
    let mut rng = Rng::fresh("kld_round_trip");
    // an odd vocabulary exercises the row's padding value
    let n_vocab = 33 + 2 * (rng.next_u64() % 200) as usize;
    let (n_ctx, n_chunk) = (16, 3);
    let tokens: Vec<u32> = (0..n_ctx * n_chunk)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect();
    let path = scratch("round-trip.kld");
    let header = KldHeader {
        n_ctx,
        n_vocab,
        n_chunk,
        tokens: tokens.clone(),
    };
    let mut w = KldWriter::create(&path, header.clone()).expect("create");
    let rows = rows_per_chunk(n_ctx);
    let chunks: Vec<Vec<f32>> = (0..n_chunk)
        .map(|_| random_logits(&mut rng, rows * n_vocab))
        .collect();
    for c in &chunks {
        w.write_chunk(c).expect("write chunk");
    }
    w.finish().expect("finish");
    let len = std::fs::metadata(&path).expect("file").len();
    assert_eq!(
        len as usize,
        20 + 4 * n_ctx * n_chunk + 2 * n_chunk * rows * row_len(n_vocab)
    );
    let mut r = KldReader::open(&path).expect("open");
    assert_eq!(r.header(), &header);
    let mut stats = KldStats::new();
    let mut stored = Vec::new();
    let nv = row_len(n_vocab);
    for (c, logits) in chunks.iter().enumerate() {
        r.read_chunk(&mut stored).expect("read chunk");
        for (j, row) in logits.chunks_exact(n_vocab).enumerate() {
            let target = tokens[c * n_ctx + n_ctx / 2 + j + 1] as usize;
            let mut want = vec![0u16; nv];
            quantize_row(row, target, &mut want);
            let got = &stored[j * nv..(j + 1) * nv];
            assert_eq!(got, &want[..], "chunk {c} row {j}");
            assert_eq!(got[nv - 1], 0, "padding");
            // the stored log-probabilities are the row's log-softmax to half a step
            let (scale, min_lp) = row_scale(got);
            let max = row.iter().copied().fold(f32::MIN, f32::max);
            let lse = f64::from(max)
                + row
                    .iter()
                    .map(|&l| (f64::from(l) - f64::from(max)).exp())
                    .sum::<f64>()
                    .ln();
            for (i, &l) in row.iter().enumerate() {
                if l > max - 16.0 {
                    let lp = f64::from(scale) * f64::from(got[4 + i]) + f64::from(min_lp);
                    let err = (lp - (f64::from(l) - lse)).abs();
                    assert!(err < 0.6 * f64::from(scale) + 1e-5, "{err}");
                }
            }
        }
        let targets = &tokens[c * n_ctx + n_ctx / 2 + 1..(c + 1) * n_ctx];
        stats.add_chunk(logits, &stored, targets);
    }
    let e = stats.report();
    assert!(e.is_none(), "fewer than 100 positions: no final statistics");
    let line = stats.chunk_line(n_chunk);
    eprintln!("{line}");
    assert!(line.contains("100.000 ±"), "same top p: {line}");
    r.read_chunk(&mut stored)
        .expect_err("no chunk past the header's count");
}

#[test]
fn kld_statistics_match_an_f64_computation_on_fresh_logits() {
    let mut rng = Rng::fresh("kld_f64");
    let n_vocab = 257;
    let n = 150;
    let (mut stats, mut kld_sum, mut same) = (KldStats::new(), 0.0f64, 0usize);
    for _ in 0..n {
        let base = random_logits(&mut rng, n_vocab);
        let other: Vec<f32> = base.iter().map(|&l| l + 0.3 * (rng.f32() - 0.5)).collect();
        let target = (rng.next_u64() % n_vocab as u64) as usize;
        let mut row = vec![0u16; row_len(n_vocab)];
        quantize_row(&base, target, &mut row);
        stats.add(&other, &row, target);
        // plain f64: the stored base distribution against other's log-softmax
        let (scale, min_lp) = row_scale(&row);
        let lse = |v: &[f32]| {
            let m = v.iter().copied().fold(f32::MIN, f32::max) as f64;
            m + v.iter().map(|&l| (l as f64 - m).exp()).sum::<f64>().ln()
        };
        let lq_norm = lse(&other);
        let mut kld = 0.0;
        for (i, &q) in row[4..4 + n_vocab].iter().enumerate() {
            let lp = f64::from(scale) * f64::from(q) + f64::from(min_lp);
            if lp > -16.0 {
                kld += lp.exp() * (lp - (f64::from(other[i]) - lq_norm));
            }
        }
        kld_sum += kld;
        let top = |v: &[f32]| {
            (0..v.len())
                .max_by(|&a, &b| v[a].total_cmp(&v[b]).then(b.cmp(&a)))
                .unwrap_or(0)
        };
        same += usize::from(top(&other) == top(&base));
    }
    let r = stats.report().expect("150 positions: statistics");
    let want = kld_sum / n as f64;
    eprintln!(
        "mean KLD {} (f64: {want}), same top {}",
        r.kld.0, r.same_top.0
    );
    assert!(
        (r.kld.0 - want).abs() < 1e-6 + 1e-4 * want,
        "{} vs {want}",
        r.kld.0
    );
    // the quantized base can tie or swap near-equal maxima
    assert!((r.same_top.0 * n as f64 - same as f64).abs() <= 2.0);
    assert!(r.kld_at("99.0%   KLD").expect("99%") >= r.kld_at("Median  KLD").expect("median"));
}

// ---------------------------------------------------------------- malformed and mismatched files

/// A valid base file of `n_chunk` chunks of 8 for a vocabulary of `n_vocab`.
fn small_base(label: &str, n_vocab: usize, n_chunk: usize) -> (PathBuf, Vec<u8>) {
    let mut rng = Rng::fresh(label);
    let n_ctx = 8;
    let tokens = (0..n_ctx * n_chunk)
        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
        .collect();
    let path = scratch(&format!("{label}.kld"));
    let mut w = KldWriter::create(
        &path,
        KldHeader {
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
        },
    )
    .expect("create");
    for _ in 0..n_chunk {
        w.write_chunk(&random_logits(&mut rng, rows_per_chunk(n_ctx) * n_vocab))
            .expect("chunk");
    }
    w.finish().expect("finish");
    let bytes = std::fs::read(&path).expect("read back");
    (path, bytes)
}

fn open_err(label: &str, bytes: &[u8]) -> ModelError {
    let path = scratch(&format!("{label}.kld"));
    std::fs::write(&path, bytes).expect("write");
    match KldReader::open(&path) {
        Ok(_) => panic!("{label}: a malformed file was accepted"),
        Err(e) => e,
    }
}

fn assert_format_err(e: &ModelError, needle: &str) {
    match e {
        ModelError::Format { reason, .. } => {
            assert!(reason.contains(needle), "{needle:?} not in {reason:?}")
        }
        other => panic!("not a format error: {other}"),
    }
}

#[test]
fn kld_base_rejects_bad_magic() {
    let (_, mut b) = small_base("magic", 40, 2);
    b[0] = b'X';
    assert_format_err(&open_err("magic-bad", &b), "not \"_logits_\"");
    assert_format_err(&open_err("magic-short", &b[..6]), "shorter than");
}

#[test]
fn kld_base_rejects_truncated_file() {
    let (_, b) = small_base("trunc", 40, 2);
    let mut rng = Rng::fresh("kld_trunc_cut");
    let cut = 20 + (rng.next_u64() as usize % (b.len() - 20));
    assert_format_err(&open_err("trunc-cut", &b[..cut]), "truncated");
}

#[test]
fn kld_base_rejects_trailing_bytes() {
    let (_, mut b) = small_base("long", 40, 2);
    b.extend_from_slice(&[0, 0]);
    assert_format_err(&open_err("long-2", &b), "too long");
}

#[test]
fn kld_base_rejects_impossible_header_and_tokens() {
    let (_, b) = small_base("hdr", 40, 2);
    let mut neg = b.clone();
    neg[12..16].copy_from_slice(&(-5i32).to_le_bytes());
    assert_format_err(&open_err("hdr-neg-vocab", &neg), "n_vocab -5");
    let mut small = b.clone();
    small[8..12].copy_from_slice(&2i32.to_le_bytes());
    assert_format_err(&open_err("hdr-ctx-2", &small), "n_ctx 2");
    let mut huge = b.clone();
    huge[16..20].copy_from_slice(&i32::MAX.to_le_bytes());
    huge[12..16].copy_from_slice(&i32::MAX.to_le_bytes());
    assert!(matches!(
        open_err("hdr-huge", &huge),
        ModelError::Format { .. }
    ));
    let mut tok = b;
    tok[20 + 4 * 3..20 + 4 * 4].copy_from_slice(&40i32.to_le_bytes());
    assert_format_err(&open_err("hdr-token", &tok), "token 3 is 40");
}

#[test]
fn perplexity_kld_rejects_mismatched_or_malformed_base() {
    let model = exact_model(1, "cli");
    // the exact model has 320 tokens
    let (other_vocab, _) = small_base("cli-vocab", 321, 1);
    let (ok_vocab, bytes) = small_base("cli-ok", 320, 2);
    let truncated = scratch("cli-trunc.kld");
    std::fs::write(&truncated, &bytes[..bytes.len() - 1]).expect("write");
    let cases: [(&[&str], &str); 4] = [
        (
            &["--kl-divergence-base", s(&other_vocab)],
            "vocabulary of 321",
        ),
        (
            &["--kl-divergence-base", s(&ok_vocab), "-c", "16"],
            "n_ctx 8, --ctx is 16",
        ),
        (&["--kl-divergence-base", s(&truncated)], "truncated"),
        (&["--kl-divergence-base", s(&model)], "not \"_logits_\""),
    ];
    for (args, needle) in cases {
        let mut all = vec!["perplexity", "-m", s(&model), "--kl-divergence"];
        all.extend_from_slice(args);
        let o = combs(&all);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("error:") && err.contains(needle) && !err.contains("panicked"),
            "{args:?}: {needle:?} not in {err}"
        );
    }
    // the good one is read
    let o = combs(&[
        "perplexity",
        "-m",
        s(&model),
        "--kl-divergence-base",
        s(&ok_vocab),
        "--kl-divergence",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("too few for the final statistics"));
}
