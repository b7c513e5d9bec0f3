//! The CPU reference quantizers and dequantizers of `src/quant/` against
//! expectations that come from outside combs, plus round-trip properties on
//! fresh random data.
//!
//! Fixtures (tests/fixtures/quant/, written by scripts/make-quant-fixtures.py;
//! its header and the README beside the fixtures give the byte format):
//! - `dequant_<type>.bin`: random raw blocks and what the `gguf` Python
//!   package's `gguf.quants.dequantize` makes of them. gguf-py evaluates the
//!   same float expressions in the same order as ggml's `dequantize_row_*`
//!   (`d * q`, `(d * q) + m`, `(d * sc) * q`, `dl * q - ml`, each rounded to
//!   f32 between steps), and the script checks that llama.cpp agrees with it
//!   bit for bit, so the comparison here is exact for every type.
//! - `quant_<type>.bin`: the rows of `quant_input.bin` quantized by
//!   `gguf.quants.quantize` (legacy types) or by llama.cpp's
//!   `quantize_row_q*_K_ref` built without FMA contraction (K types); compared
//!   byte for byte.

mod common;

use combs::quant::{self, QuantType};
use common::Rng;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quant");

fn read_fixture(name: &str) -> Vec<u8> {
    let path = format!("{FIXTURES}/{name}");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{path}: {e} (run `python3 scripts/make-quant-fixtures.py` to rebuild the fixtures)")
    })
}

/// Splits a fixture into its `n_header` u32 header words (after the 4-byte magic) and payload.
fn parse_header<'a>(bytes: &'a [u8], magic: &[u8; 4], n_header: usize) -> (Vec<u32>, &'a [u8]) {
    assert_eq!(&bytes[..4], magic, "bad fixture magic");
    let end = 4 + 4 * n_header;
    let words = bytes[4..end]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect::<Vec<_>>();
    assert_eq!(words[0], 1, "unknown fixture version");
    (words, &bytes[end..])
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn check_dequant_fixture(t: QuantType) {
    let bytes = read_fixture(&format!("dequant_{}.bin", t.name()));
    let (header, payload) = parse_header(&bytes, b"CQDQ", 3);
    assert_eq!(header[1], t as u32, "fixture holds another type");
    let n = header[2] as usize;
    let n_raw = t.row_bytes(n).unwrap();
    assert_eq!(payload.len(), n_raw + 4 * n, "fixture length");
    let (raw, want) = payload.split_at(n_raw);
    let want = f32s(want);
    let got = quant::dequantize_vec(t, raw, n).unwrap();
    let bad: Vec<usize> = (0..n)
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    if let Some(&i) = bad.first() {
        panic!(
            "{t}: {} of {n} values differ from gguf; first at {i} (block {}): got {:e} ({:#010x}), want {:e} ({:#010x})",
            bad.len(),
            i / t.block_size(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

fn check_quant_fixture(t: QuantType) {
    let input = read_fixture("quant_input.bin");
    let (in_header, in_payload) = parse_header(&input, b"CQIN", 3);
    let x = f32s(in_payload);
    let bytes = read_fixture(&format!("quant_{}.bin", t.name()));
    let (header, want) = parse_header(&bytes, b"CQQU", 4);
    assert_eq!(header[1], t as u32, "fixture holds another type");
    let (n_rows, row_len) = (header[2] as usize, header[3] as usize);
    assert_eq!(
        (n_rows, row_len),
        (in_header[1] as usize, in_header[2] as usize)
    );
    assert_eq!(x.len(), n_rows * row_len);
    let row_bytes = t.row_bytes(row_len).unwrap();
    assert_eq!(want.len(), n_rows * row_bytes, "fixture length");
    let mut failures = Vec::new();
    for r in 0..n_rows {
        let got = quant::quantize(t, &x[r * row_len..(r + 1) * row_len]).unwrap();
        let want = &want[r * row_bytes..(r + 1) * row_bytes];
        if let Some(k) = (0..row_bytes).find(|&k| got[k] != want[k]) {
            failures.push(format!(
                "row {r}: block {} byte {} got {:#04x} want {:#04x}",
                k / t.block_bytes(),
                k % t.block_bytes(),
                got[k],
                want[k]
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{t}: {} of {n_rows} rows differ (rows are described in tests/fixtures/quant/README.md):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

macro_rules! fixture_tests {
    ($check:ident: $($name:ident => $t:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $check(QuantType::$t);
            }
        )*
    };
}

fixture_tests! { check_dequant_fixture:
    dequantize_f32_matches_gguf => F32,
    dequantize_f16_matches_gguf => F16,
    dequantize_bf16_matches_gguf => BF16,
    dequantize_q4_0_matches_gguf => Q4_0,
    dequantize_q4_1_matches_gguf => Q4_1,
    dequantize_q5_0_matches_gguf => Q5_0,
    dequantize_q5_1_matches_gguf => Q5_1,
    dequantize_q8_0_matches_gguf => Q8_0,
    dequantize_q2_k_matches_gguf => Q2K,
    dequantize_q3_k_matches_gguf => Q3K,
    dequantize_q4_k_matches_gguf => Q4K,
    dequantize_q5_k_matches_gguf => Q5K,
    dequantize_q6_k_matches_gguf => Q6K,
}

fixture_tests! { check_quant_fixture:
    quantize_q4_0_matches_gguf => Q4_0,
    quantize_q4_1_matches_gguf => Q4_1,
    quantize_q5_0_matches_gguf => Q5_0,
    quantize_q5_1_matches_gguf => Q5_1,
    quantize_q8_0_matches_gguf => Q8_0,
    quantize_q2_k_matches_llama_cpp => Q2K,
    quantize_q3_k_matches_llama_cpp => Q3K,
    quantize_q4_k_matches_llama_cpp => Q4K,
    quantize_q5_k_matches_llama_cpp => Q5K,
    quantize_q6_k_matches_llama_cpp => Q6K,
}

/// Largest relative RMSE (‖x − deq(q(x))‖ / ‖x‖ per 256-weight row) a type
/// may show in the round trip: `(dense, half_zeros)`, for rows of nonzero
/// values and for rows where half the weights are exactly zero. Each is about
/// 1.25× the worst of 2000 Gaussian rows (seed 42), so a broken scale search
/// fails while sampling noise does not. Zeros cost the types with a min
/// (Q4_1, Q5_1, Q2_K) most: their levels sit at `d·q − m`, which need not hit
/// 0. Q2_K's Gaussian worst case is 0.356 (mean 0.30), hence 0.45, not 0.35.
fn rmse_bounds(t: QuantType) -> (f64, f64) {
    match t {
        QuantType::F32 => (0.0, 0.0),
        QuantType::F16 => (1e-3, 1e-3),
        QuantType::BF16 => (6e-3, 6e-3),
        QuantType::Q8_0 => (0.01, 0.01),
        QuantType::Q6K => (0.03, 0.03),
        QuantType::Q5K => (0.06, 0.07),
        QuantType::Q5_0 => (0.07, 0.07),
        QuantType::Q5_1 => (0.07, 0.09),
        QuantType::Q4K => (0.1, 0.12),
        QuantType::Q4_0 => (0.14, 0.14),
        QuantType::Q4_1 => (0.13, 0.18),
        QuantType::Q3K => (0.25, 0.25),
        QuantType::Q2K => (0.45, 0.75),
    }
}

fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let err: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let sig: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    if sig == 0.0 {
        if err == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        (err / sig).sqrt()
    }
}

/// Rows the round trip must reproduce within the type's bound, each with
/// whether it is half zeros.
fn round_trip_rows(rng: &mut Rng) -> Vec<(String, bool, Vec<f32>)> {
    const N: usize = 256;
    let mut rows = Vec::new();
    for k in 0..8 {
        let scale = 10f32.powf(rng.range(-3.0, 2.0));
        rows.push((
            format!("gaussian #{k} (σ {scale:e})"),
            false,
            rng.normals(N, scale),
        ));
    }
    for v in [0.37f32, -1.25, 1e-3, 1000.0] {
        rows.push((format!("all equal {v}"), false, vec![v; N]));
    }
    let mut r = rng.normals(N, 0.01);
    let at = rng.below(N);
    r[at] = 50.0;
    rows.push((format!("outlier +50 at {at}"), false, r));
    let mut r = rng.normals(N, 0.01);
    let at = rng.below(N);
    r[at] = -30.0;
    rows.push((format!("outlier -30 at {at}"), false, r));
    for k in 0..4 {
        let mut r = rng.normals(N, 1.0);
        for v in r.iter_mut() {
            if rng.below(2) == 0 {
                *v = 0.0;
            }
        }
        rows.push((format!("half zeros #{k}"), true, r));
    }
    rows.push(("all zeros".to_string(), false, vec![0.0; N]));
    rows
}

fn check_round_trip(t: QuantType) {
    let mut rng = Rng::fresh(&format!("round_trip_{}", t.name()));
    let (dense_bound, zeros_bound) = rmse_bounds(t);
    let mut failures = Vec::new();
    for (label, half_zeros, x) in round_trip_rows(&mut rng) {
        let bound = if half_zeros { zeros_bound } else { dense_bound };
        let q = quant::quantize(t, &x).unwrap();
        let y = quant::dequantize_vec(t, &q, x.len()).unwrap();
        let e = rel_rmse(&x, &y);
        if y.iter().any(|v| !v.is_finite()) || e.is_nan() || e > bound {
            failures.push(format!("{label}: relative RMSE {e:.4} (bound {bound})"));
        }
    }
    // Magnitudes around 1e-30 are far below f16's smallest subnormal, so the
    // block scales underflow to zero and everything dequantizes to (about)
    // zero: the bound cannot hold, but the result must stay finite and never
    // be further from the input than zero is.
    let x: Vec<f32> = rng.normals(256, 1e-30);
    let q = quant::quantize(t, &x).unwrap();
    let y = quant::dequantize_vec(t, &q, x.len()).unwrap();
    let e = rel_rmse(&x, &y);
    if y.iter().any(|v| !v.is_finite()) || e.is_nan() || e > 1.0 + 1e-6 {
        failures.push(format!("tiny 1e-30: relative RMSE {e:.4} or not finite"));
    }
    assert!(
        failures.is_empty(),
        "{t} round trip:\n{}",
        failures.join("\n")
    );
}

fixture_tests! { check_round_trip:
    round_trip_f32_error_is_bounded => F32,
    round_trip_f16_error_is_bounded => F16,
    round_trip_bf16_error_is_bounded => BF16,
    round_trip_q4_0_error_is_bounded => Q4_0,
    round_trip_q4_1_error_is_bounded => Q4_1,
    round_trip_q5_0_error_is_bounded => Q5_0,
    round_trip_q5_1_error_is_bounded => Q5_1,
    round_trip_q8_0_error_is_bounded => Q8_0,
    round_trip_q2_k_error_is_bounded => Q2K,
    round_trip_q3_k_error_is_bounded => Q3K,
    round_trip_q4_k_error_is_bounded => Q4K,
    round_trip_q5_k_error_is_bounded => Q5K,
    round_trip_q6_k_error_is_bounded => Q6K,
}

#[test]
fn quantize_partial_block_is_error() {
    for t in QuantType::ALL {
        if t.block_size() > 1 {
            assert!(
                quant::quantize(t, &vec![1.0; t.block_size() + 1]).is_err(),
                "{t}"
            );
        }
    }
}

#[test]
fn quantize_output_has_row_bytes() {
    let x = Rng::fresh("quantize_output_has_row_bytes").normals(512, 1.0);
    for t in QuantType::ALL {
        assert_eq!(
            quant::quantize(t, &x).unwrap().len(),
            t.row_bytes(512).unwrap(),
            "{t}"
        );
    }
}
