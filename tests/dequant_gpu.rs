//! GPU dequantization of every weight format against the CPU reference, bit
//! for bit, on fresh random blocks (valid scales) and several shapes,
//! including row counts that are not multiples of the workgroup and tensors
//! that need more than one storage-buffer descriptor; and the same through
//! the spec's named dequantizers (`dequantize_q4_0_gpu`, ...) on typed weights;
//! and the bytes both upload paths (staging ring, in place) leave on the device.

mod common;

use std::sync::Arc;

use combs::gpu::{GpuContext, Uploader, download_vec};
use combs::ops::dequant::dequantize_gpu;
use combs::quant::{
    DeviceLayout, QuantType, QuantWeight, RowSource, TensorBytes, dequantize_vec, repack_vec,
};
use combs::{
    Q4KWeight, Q5KWeight, Q6KWeight, Q40Weight, Q50Weight, Q80Weight, dequantize_q4_0_gpu,
    dequantize_q4_k_gpu, dequantize_q5_0_gpu, dequantize_q5_k_gpu, dequantize_q6_k_gpu,
    dequantize_q8_0_gpu,
};
use common::{Rng, gpu};
use half::{bf16, f16};

/// Random GGUF bytes for `n` weights of `t`: random quants, finite random scales.
fn random_tensor(rng: &mut Rng, t: QuantType, n: usize) -> Vec<u8> {
    let nb = n / t.block_size();
    let mut bytes = vec![0u8; nb * t.block_bytes()];
    match t {
        QuantType::F32 => {
            for c in bytes.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.normal() * 3.0).to_le_bytes());
            }
        }
        QuantType::F16 | QuantType::BF16 => {
            for c in bytes.chunks_exact_mut(2) {
                // Any finite bit pattern, subnormals included.
                loop {
                    let bits = rng.next_u64() as u16;
                    let finite = if t == QuantType::F16 {
                        f16::from_bits(bits).is_finite()
                    } else {
                        bf16::from_bits(bits).is_finite()
                    };
                    if finite {
                        c.copy_from_slice(&bits.to_le_bytes());
                        break;
                    }
                }
            }
        }
        _ => {
            rng.fill(&mut bytes);
            let layout = DeviceLayout::of(t).expect("quantized type");
            for block in bytes.chunks_exact_mut(t.block_bytes()) {
                for &off in layout.scales {
                    let mag = 2f32.powf(rng.range(-12.0, 1.0));
                    let v = if rng.below(2) == 0 { mag } else { -mag };
                    block[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
        }
    }
    bytes
}

fn check_type(t: QuantType, shapes: &[(usize, usize)]) {
    check_type_with(t, shapes, |ctx, bytes, rows, cols| {
        let mut up = Uploader::new(ctx)?;
        let w = QuantWeight::from_gguf_bytes(ctx, &mut up, "w", t, rows, cols, bytes)?;
        up.flush()?;
        dequantize_gpu(ctx, &w)
    });
}

/// Checks `run` (an upload of `[rows, cols]` GGUF bytes of `t` and its
/// dequantization on the GPU) against the CPU reference on each shape.
fn check_type_with(
    t: QuantType,
    shapes: &[(usize, usize)],
    run: impl Fn(&Arc<GpuContext>, &[u8], usize, usize) -> combs::Result<Vec<f32>>,
) {
    let ctx = gpu();
    let mut rng = Rng::fresh(&format!("dequant_{}", t.name()));
    for &(rows, cols) in shapes {
        let bytes = random_tensor(&mut rng, t, rows * cols);
        let gpu_out = run(&ctx, &bytes, rows, cols).expect("gpu dequant");
        let cpu_out = dequantize_vec(t, &bytes, rows * cols).expect("cpu dequant");
        let mismatches: Vec<usize> = (0..cpu_out.len())
            .filter(|&i| gpu_out[i].to_bits() != cpu_out[i].to_bits())
            .collect();
        if let Some(&i) = mismatches.first() {
            panic!(
                "{t} [{rows}x{cols}]: {} of {} weights differ; first at {i}: gpu {} cpu {}",
                mismatches.len(),
                cpu_out.len(),
                gpu_out[i],
                cpu_out[i]
            );
        }
    }
}

fn shapes_for(t: QuantType) -> Vec<(usize, usize)> {
    let qk = t.block_size().max(32);
    vec![(1, qk), (3, qk * 2), (17, qk * 3), (129, qk), (7, qk * 11)]
}

macro_rules! dequant_tests {
    ($($name:ident => $t:expr;)*) => {$(
        #[test]
        fn $name() {
            check_type($t, &shapes_for($t));
        }
    )*};
}

dequant_tests! {
    dequant_f32_matches_ref_bit_exact => QuantType::F32;
    dequant_f16_matches_ref_bit_exact => QuantType::F16;
    dequant_bf16_matches_ref_bit_exact => QuantType::BF16;
    dequant_q4_0_matches_ref_bit_exact => QuantType::Q4_0;
    dequant_q4_1_matches_ref_bit_exact => QuantType::Q4_1;
    dequant_q5_0_matches_ref_bit_exact => QuantType::Q5_0;
    dequant_q5_1_matches_ref_bit_exact => QuantType::Q5_1;
    dequant_q8_0_matches_ref_bit_exact => QuantType::Q8_0;
    dequant_q2_k_matches_ref_bit_exact => QuantType::Q2K;
    dequant_q3_k_matches_ref_bit_exact => QuantType::Q3K;
    dequant_q4_k_matches_ref_bit_exact => QuantType::Q4K;
    dequant_q5_k_matches_ref_bit_exact => QuantType::Q5K;
    dequant_q6_k_matches_ref_bit_exact => QuantType::Q6K;
}

/// The spec's named dequantizers, each on its typed weight, reach the same
/// kernels: bit for bit the reference too.
macro_rules! named_dequant_tests {
    ($($name:ident => $t:expr, $weight:ident, $dequant:ident;)*) => {$(
        #[test]
        fn $name() {
            check_type_with($t, &shapes_for($t), |ctx, bytes, rows, cols| {
                let w = $weight::from_gguf_bytes(ctx, bytes, rows, cols)?;
                $dequant(ctx, &w)
            });
        }
    )*};
}

named_dequant_tests! {
    dequantize_q4_0_gpu_matches_ref_bit_exact => QuantType::Q4_0, Q40Weight, dequantize_q4_0_gpu;
    dequantize_q5_0_gpu_matches_ref_bit_exact => QuantType::Q5_0, Q50Weight, dequantize_q5_0_gpu;
    dequantize_q8_0_gpu_matches_ref_bit_exact => QuantType::Q8_0, Q80Weight, dequantize_q8_0_gpu;
    dequantize_q4_k_gpu_matches_ref_bit_exact => QuantType::Q4K, Q4KWeight, dequantize_q4_k_gpu;
    dequantize_q5_k_gpu_matches_ref_bit_exact => QuantType::Q5K, Q5KWeight, dequantize_q5_k_gpu;
    dequantize_q6_k_gpu_matches_ref_bit_exact => QuantType::Q6K, Q6KWeight, dequantize_q6_k_gpu;
}

#[test]
fn dequant_f16_odd_columns_matches_ref_bit_exact() {
    check_type(QuantType::F16, &[(5, 33), (3, 1)]);
}

#[test]
fn dequant_tensor_larger_than_one_descriptor_matches_ref() {
    // One row more than a storage-buffer range holds (the device's range, at
    // most lavapipe's 128 MiB so GPUs with 4 GiB ranges take the same path):
    // the weight is split into chunks, each bound separately.
    let ctx = gpu();
    let t = QuantType::Q8_0;
    let cols = 4096;
    let device_row = combs::quant::device_bytes(t, cols / 32);
    let limit = (ctx.caps().max_binding_bytes(4) as usize).min(128 << 20);
    let rows = limit / device_row + 1;
    let mut rng = Rng::fresh("dequant_big");
    let bytes = random_tensor(&mut rng, t, rows * cols);
    let mut up = Uploader::new(&ctx).expect("staging");
    let big = TensorBytes {
        name: "big",
        qtype: t,
        rows,
        cols,
        bytes: &bytes,
    };
    let w = QuantWeight::from_gguf_bytes_chunked(&ctx, &mut up, big, limit).expect("upload");
    up.flush().expect("flush");
    assert!(w.chunks().len() >= 2, "expected a split weight");
    let gpu_out = dequantize_gpu(&ctx, &w).expect("gpu");
    let cpu_out = dequantize_vec(t, &bytes, rows * cols).expect("cpu");
    assert!(
        gpu_out
            .iter()
            .zip(&cpu_out)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "split tensor differs from reference"
    );
}

#[test]
fn uploads_write_repacked_bytes_through_staging_and_in_place() {
    // Several weights (stacked and interleaved from three parts) through one
    // ring of small halves, so pieces straddle halves and halves hold pieces
    // of several buffers; then the device bytes read back against `repack`.
    let ctx = gpu();
    let mut rng = Rng::fresh("upload_paths");
    let types = [
        QuantType::F16,
        QuantType::Q4_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q3K,
        QuantType::Q4K,
        QuantType::Q6K,
    ];
    for in_place in [false, true] {
        let mut up = if in_place {
            Uploader::for_new_buffers(&ctx, 4096).expect("ring")
        } else {
            Uploader::with_half_size(&ctx, 4096).expect("ring")
        };
        let mut uploaded = Vec::new();
        for t in types {
            let cols = 2 * t.block_size().max(256);
            let row_bytes = t.row_bytes(cols).expect("whole blocks");
            let rows = 5 + rng.below(20);
            let parts: Vec<Vec<u8>> = (0..3)
                .map(|_| {
                    let mut p = vec![0u8; rows * row_bytes];
                    rng.fill(&mut p);
                    p
                })
                .collect();
            for interleave in [false, true] {
                let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                let src = RowSource::new(refs, row_bytes, interleave).expect("rows");
                let stacked: Vec<u8> = (0..src.rows()).flat_map(|r| src.row(r)).copied().collect();
                let w =
                    QuantWeight::from_rows(&ctx, &mut up, "w", t, cols, &src, 1).expect("upload");
                uploaded.push((t, interleave, stacked, w));
            }
        }
        up.flush().expect("flush");
        for (t, interleave, stacked, w) in uploaded {
            let row_bytes = t.row_bytes(w.cols()).expect("whole blocks");
            for c in w.chunks() {
                let rows = &stacked[c.row_start * row_bytes..(c.row_start + c.n_rows) * row_bytes];
                let want = repack_vec(t, rows).expect("whole blocks");
                let got = download_vec(&ctx, &c.buffer).expect("download");
                assert_eq!(
                    &got[..want.len()],
                    &want[..],
                    "{t} interleave {interleave} in place {in_place}"
                );
            }
        }
    }
}
