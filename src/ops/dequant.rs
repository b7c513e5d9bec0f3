//! `dequant`: expands a GPU-resident weight to f32 on the GPU. A validation
//! path (the fused matvec/matmul kernels never materialize f32 weights); its
//! output must equal [`crate::quant::dequantize`] bit for bit. The spec's
//! named forms (`dequantize_q4_0_gpu` ... `dequantize_q6_k_gpu`) are
//! [`dequantize_gpu`] on a weight of that format.

use std::sync::Arc;

use super::params::DequantParams;
use super::pc_u32;
use crate::error::Result;
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, MemoryKind, Recording};
use crate::quant::weight::{Q4KWeight, Q5KWeight, Q6KWeight, Q40Weight, Q50Weight, Q80Weight};
use crate::quant::{QuantType, QuantWeight};

/// Records expansion of `n` weights starting at weight `first` of `chunk_buffer`
/// (a chunk of `nb` blocks of `t`) into `out` (f32, at least `4 * n` bytes).
///
/// # Errors
/// A binding that does not fit the device's limits, or a value beyond 32 bits.
pub fn record_dequant(
    rec: &mut Recording,
    t: QuantType,
    chunk_buffer: &Arc<Buffer>,
    nb: usize,
    first: usize,
    n: usize,
    out: &Arc<Buffer>,
) -> Result<()> {
    let params = DequantParams {
        n: pc_u32("n", n)?,
        nb: pc_u32("nb", nb)?,
        first: pc_u32("first", first)?,
    };
    rec.dispatch_elementwise(
        Kernel::dequant(t),
        &[
            Binding::read(chunk_buffer),
            Binding::write(out).range(0, (4 * n as u64).next_multiple_of(4)),
        ],
        &params,
        params.n,
    )
}

/// Dequantizes a whole weight on the GPU and returns it row-major (`rows * cols` f32).
///
/// # Errors
/// Out of memory or a failing Vulkan call.
pub fn dequantize_gpu(ctx: &Arc<GpuContext>, w: &QuantWeight) -> Result<Vec<f32>> {
    let cols = w.cols();
    let qk = w.qtype().block_size();
    let mut out = vec![0.0f32; w.rows() * cols];
    // Output pieces are bounded by one descriptor's range and kept to a
    // modest host-visible staging size.
    let max_elems = (ctx.caps().max_binding_bytes(4).min(64 << 20) / 4) as usize;
    let rows_per_piece = (max_elems / cols).max(1);
    let piece_bytes = (rows_per_piece * cols * 4) as u64;
    let readback = Buffer::new(ctx, piece_bytes, MemoryKind::Readback, "dequant readback")?;
    for chunk in w.chunks() {
        let nb = chunk.n_rows * cols / qk;
        let mut r = 0;
        while r < chunk.n_rows {
            let nr = rows_per_piece.min(chunk.n_rows - r);
            let n = nr * cols;
            let mut rec = Recording::new(ctx, false)?;
            record_dequant(
                &mut rec,
                w.qtype(),
                &chunk.buffer,
                nb,
                r * cols,
                n,
                &readback,
            )?;
            rec.finish()?;
            rec.submit_and_wait()?;
            let start = (chunk.row_start + r) * cols;
            readback.read_slice(0, &mut out[start..start + n])?;
            r += nr;
        }
    }
    Ok(out)
}

/// Declares the spec's dequantizer of one weight format: [`dequantize_gpu`]
/// on a weight whose format the type fixes, with a doc example that checks
/// it bit for bit against the CPU reference.
macro_rules! named_dequant {
    ($($name:ident, $weight:ident, $upper:literal, $t:ident, $n:literal, $k:literal;)*) => {$(
        #[doc = concat!(
            "Expands a [`", stringify!($weight), "`] to f32 on the GPU with the ", $upper,
            " dequant-only kernel (row-major, `n_out * k` floats): a validation path, bit for \
             bit the CPU reference [`crate::quant::dequantize`].\n\n",
            "```\n",
            "use combs::gpu::GpuContext;\n",
            "use combs::quant::{QuantType, dequantize_vec, quantize};\n",
            "use combs::{", stringify!($weight), ", ", stringify!($name), "};\n\n",
            "fn main() -> combs::Result<()> {\n",
            "    let ctx = GpuContext::new(None)?;\n",
            "    let (n_out, k) = (", stringify!($n), ", ", stringify!($k), ");\n",
            "    let w: Vec<f32> = (0..n_out * k).map(|i| (i as f32 * 0.3).sin()).collect();\n",
            "    let bytes = quantize(QuantType::", stringify!($t), ", &w)?;\n",
            "    let weight = ", stringify!($weight),
            "::from_gguf_bytes(&ctx, &bytes, n_out, k)?;\n",
            "    let gpu = ", stringify!($name), "(&ctx, &weight)?;\n",
            "    let cpu = dequantize_vec(QuantType::", stringify!($t),
            ", &bytes, n_out * k)?;\n",
            "    assert!(gpu.iter().zip(&cpu).all(|(a, b)| a.to_bits() == b.to_bits()));\n",
            "    Ok(())\n",
            "}\n",
            "```\n\n",
            "# Errors\n",
            "Out of memory or a failing Vulkan call."
        )]
        pub fn $name(ctx: &Arc<GpuContext>, w: &$weight) -> Result<Vec<f32>> {
            dequantize_gpu(ctx, w.as_weight())
        }
    )*};
}

named_dequant! {
    dequantize_q4_0_gpu, Q40Weight, "Q4_0", Q4_0, 2, 64;
    dequantize_q5_0_gpu, Q50Weight, "Q5_0", Q5_0, 2, 64;
    dequantize_q8_0_gpu, Q80Weight, "Q8_0", Q8_0, 2, 64;
    dequantize_q4_k_gpu, Q4KWeight, "Q4_K", Q4K, 2, 256;
    dequantize_q5_k_gpu, Q5KWeight, "Q5_K", Q5K, 2, 256;
    dequantize_q6_k_gpu, Q6KWeight, "Q6_K", Q6K, 2, 256;
}
