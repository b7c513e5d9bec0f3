//! Times linear (matvec / matmul) per weight type on the default device (development aid).
use combs::gpu::{Buffer, MemoryKind, Recording, Uploader, upload_new};
use combs::ops::Mat;
use combs::ops::linear::{Input, LinearCall, Output, record_linear};
use combs::quant::{QuantType, QuantWeight};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = combs::gpu::GpuContext::new(None)?;
    {
        // Calibration: a plain copy through the dequant kernel (f32 in, f32 out).
        let n = 8 << 20;
        let src = upload_new(&ctx, bytemuck::cast_slice(&vec![1.0f32; n]), "src")?;
        let dst = Buffer::new(&ctx, 4 * n as u64, MemoryKind::Device, "dst")?;
        let mut rec = Recording::new(&ctx, false)?;
        combs::ops::dequant::record_dequant(&mut rec, QuantType::F32, &src, n, 0, n, &dst)?;
        rec.finish()?;
        rec.submit_and_wait()?;
        let t0 = Instant::now();
        rec.submit_and_wait()?;
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "copy 32 MiB: {:.1} ms = {:.2} GB/s",
            dt * 1e3,
            2.0 * 4.0 * n as f64 / dt / 1e9
        );
        // Dispatch overhead: 500 tiny dispatches.
        let mut rec = Recording::new(&ctx, false)?;
        for _ in 0..500 {
            combs::ops::dequant::record_dequant(&mut rec, QuantType::F32, &src, 64, 0, 64, &dst)?;
        }
        rec.finish()?;
        rec.submit_and_wait()?;
        let t0 = Instant::now();
        rec.submit_and_wait()?;
        println!(
            "tiny dispatch: {:.1} us each",
            t0.elapsed().as_secs_f64() * 1e6 / 500.0
        );
    }
    let rows: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1536);
    let cols: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(576);
    let types: Vec<QuantType> = std::env::args()
        .nth(3)
        .map(|s| s.split(',').filter_map(QuantType::from_name).collect())
        .unwrap_or(vec![
            QuantType::F32,
            QuantType::Q4_0,
            QuantType::Q4_1,
            QuantType::Q8_0,
            QuantType::Q4K,
        ]);
    for t in types {
        let nbytes = rows * cols / t.block_size() * t.block_bytes();
        let mut bytes = vec![0u8; nbytes];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        if let Some(l) = combs::quant::DeviceLayout::of(t) {
            for block in bytes.chunks_exact_mut(t.block_bytes()) {
                for &o in l.scales {
                    block[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
        } else if t == QuantType::F32 {
            for c in bytes.chunks_exact_mut(4) {
                c.copy_from_slice(&0.01f32.to_le_bytes());
            }
        }
        let mut up = Uploader::new(&ctx)?;
        let w = QuantWeight::from_gguf_bytes(&ctx, &mut up, "w", t, rows, cols, &bytes)?;
        up.flush()?;
        for n in [1usize, 64] {
            let x = upload_new(&ctx, bytemuck::cast_slice(&vec![0.5f32; n * cols]), "x")?;
            let out = Buffer::new(&ctx, (4 * n * rows) as u64, MemoryKind::Device, "o")?;
            let reps = 20;
            let mut rec = Recording::new(&ctx, false)?;
            for _ in 0..reps {
                let input = Input::F32(Mat::new(&x, n, cols));
                let output = Output::Store(Mat::new(&out, n, rows));
                record_linear(&mut rec, &LinearCall::new(&w, None, input, output))?;
            }
            rec.finish()?;
            rec.submit_and_wait()?;
            let t0 = Instant::now();
            rec.submit_and_wait()?;
            let dt = t0.elapsed().as_secs_f64() / reps as f64;
            let gflops = 2.0 * (rows * cols * n) as f64 / dt / 1e9;
            println!(
                "{t:5} {rows}x{cols} n={n:3}: {:8.3} ms  {gflops:6.2} GFLOP/s",
                dt * 1e3
            );
        }
    }
    Ok(())
}

#[allow(dead_code)]
fn calibrate() {}
