//! A small program written against the crate root's re-exports only — the
//! names the specification gives the Rust API — run on the test device:
//! every name resolves with the signature the spec gives it, and a
//! quantized weight, a layer, a norm, a rope and a tiny model run through
//! them end to end.

mod common;

use std::sync::Arc;

use combs::gpu::{Buffer, GpuContext, MemoryKind, Recording, run_once};
use combs::models::Loaded;
use combs::ops::Mat;
use combs::quant::{QuantType, TensorBytes, dequantize_vec, quantize};
use combs::{
    CacheConfig, CacheKind, GenerativeModel, LayerKind, Linear, LlamaModel, LoadOptions,
    ModelRegistry, NormFlavor, PageStats, Q4KWeight, Q5KWeight, Q6KWeight, Q40Weight, Q50Weight,
    Q80Weight, QuantLinearOp, Result, RotaryEmbedding, dequantize_q4_0_gpu, dequantize_q4_k_gpu,
    dequantize_q5_0_gpu, dequantize_q5_k_gpu, dequantize_q6_k_gpu, dequantize_q8_0_gpu,
    repack_q4_0, repack_q4_k, repack_q5_0, repack_q5_k, repack_q6_k, repack_q8_0, rms_norm,
    try_quant_linear,
};
use common::{Rng, gpu, max_rel};

/// The spec's signatures, checked by the compiler.
#[test]
fn spec_names_have_their_signatures() {
    type Upload<W> = fn(&Arc<GpuContext>, &[u8], usize, usize) -> Result<W>;
    type Dequant<W> = fn(&Arc<GpuContext>, &W) -> Result<Vec<f32>>;
    type Repack = fn(&[u8]) -> Result<Vec<u8>>;
    let _: (Upload<Q40Weight>, Dequant<Q40Weight>) =
        (Q40Weight::from_gguf_bytes, dequantize_q4_0_gpu);
    let _: (Upload<Q50Weight>, Dequant<Q50Weight>) =
        (Q50Weight::from_gguf_bytes, dequantize_q5_0_gpu);
    let _: (Upload<Q80Weight>, Dequant<Q80Weight>) =
        (Q80Weight::from_gguf_bytes, dequantize_q8_0_gpu);
    let _: (Upload<Q4KWeight>, Dequant<Q4KWeight>) =
        (Q4KWeight::from_gguf_bytes, dequantize_q4_k_gpu);
    let _: (Upload<Q5KWeight>, Dequant<Q5KWeight>) =
        (Q5KWeight::from_gguf_bytes, dequantize_q5_k_gpu);
    let _: (Upload<Q6KWeight>, Dequant<Q6KWeight>) =
        (Q6KWeight::from_gguf_bytes, dequantize_q6_k_gpu);
    let _: [Repack; 6] = [
        repack_q4_0,
        repack_q5_0,
        repack_q8_0,
        repack_q4_k,
        repack_q5_k,
        repack_q6_k,
    ];
    type RmsNorm =
        fn(&mut Recording, Mat<'_>, &Arc<Buffer>, NormFlavor, f32, Mat<'_>) -> Result<()>;
    type Build = fn(&Arc<GpuContext>, TensorBytes<'_>, Option<&[f32]>) -> Result<Linear>;
    let _: (RmsNorm, Build) = (rms_norm, try_quant_linear);
    // `Linear::Quant` holds a boxed op.
    let _: fn(Box<dyn QuantLinearOp>) -> Linear = Linear::Quant;
    let _ = (CacheKind::Contiguous, LayerKind::Full, PageStats::default());
}

/// A Q4_K matrix from its file bytes: repacked at the file's size,
/// dequantized bit for bit, and multiplied through the fused layer and the
/// dense one, both as the CPU reference computes.
#[test]
fn q4_k_weight_layer_and_dequant_run_through_the_root_names() -> Result<()> {
    let ctx = gpu();
    let mut rng = Rng::fresh("api_q4_k");
    let (n_out, k, n) = (6, 512, 3);
    let w = rng.normals(n_out * k, 0.5);
    let bytes = quantize(QuantType::Q4K, &w)?;
    assert_eq!(repack_q4_k(&bytes)?.len(), bytes.len());

    let weight = Q4KWeight::from_gguf_bytes(&ctx, &bytes, n_out, k)?;
    let cpu = dequantize_vec(QuantType::Q4K, &bytes, n_out * k)?;
    let gpu_w = dequantize_q4_k_gpu(&ctx, &weight)?;
    assert!(
        gpu_w
            .iter()
            .zip(&cpu)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );

    let bias: Vec<f32> = rng.normals(n_out, 1.0);
    let tensor = TensorBytes {
        name: "w",
        qtype: QuantType::Q4K,
        rows: n_out,
        cols: k,
        bytes: &bytes,
    };
    let quant = try_quant_linear(&ctx, tensor, Some(&bias))?;
    let dense = Linear::dense(&ctx, tensor, Some(&bias))?;
    assert!(quant.is_quant() && !dense.is_quant());
    assert_eq!((quant.n_in(), quant.n_out()), (k, n_out));
    assert_eq!(dense.device_bytes(), (4 * n_out * k + 4 * n_out) as u64);
    let x = rng.normals(n * k, 1.0);
    let mut want = combs::ops::linear::linear_ref(&cpu, n_out, k, &x, n);
    for (i, v) in want.iter_mut().enumerate() {
        *v += bias[i % n_out];
    }
    for layer in [&quant, &dense] {
        let e = max_rel(&layer.forward(&ctx, &x)?, &want);
        assert!(e < 1e-5, "{layer:?}: {e}");
    }
    // The typed weight makes the same layer, without a bias.
    let product = combs::ops::linear::linear_ref(&cpu, n_out, k, &x, n);
    let e = max_rel(&Linear::from(weight).forward(&ctx, &x)?, &product);
    assert!(e < 1e-5, "from the typed weight: {e}");
    Ok(())
}

/// Every named weight type uploads its file bytes unchanged in size and
/// dequantizes bit for bit through its named function.
#[test]
fn named_weights_keep_the_file_size() -> Result<()> {
    let ctx = gpu();
    let mut rng = Rng::fresh("api_weights");
    let w = rng.normals(2 * 256, 1.0);
    let check = |t: QuantType, dev: u64, out: Vec<f32>| -> Result<()> {
        let bytes = quantize(t, &w)?;
        assert_eq!(dev, bytes.len() as u64, "{t}");
        let cpu = dequantize_vec(t, &bytes, w.len())?;
        assert!(
            out.iter()
                .zip(&cpu)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{t}"
        );
        Ok(())
    };
    let b = |t| quantize(t, &w);
    let q = Q40Weight::from_gguf_bytes(&ctx, &b(QuantType::Q4_0)?, 2, 256)?;
    check(
        QuantType::Q4_0,
        q.device_bytes(),
        dequantize_q4_0_gpu(&ctx, &q)?,
    )?;
    let q = Q50Weight::from_gguf_bytes(&ctx, &b(QuantType::Q5_0)?, 2, 256)?;
    check(
        QuantType::Q5_0,
        q.device_bytes(),
        dequantize_q5_0_gpu(&ctx, &q)?,
    )?;
    let q = Q80Weight::from_gguf_bytes(&ctx, &b(QuantType::Q8_0)?, 2, 256)?;
    check(
        QuantType::Q8_0,
        q.device_bytes(),
        dequantize_q8_0_gpu(&ctx, &q)?,
    )?;
    let q = Q5KWeight::from_gguf_bytes(&ctx, &b(QuantType::Q5K)?, 2, 256)?;
    check(
        QuantType::Q5K,
        q.device_bytes(),
        dequantize_q5_k_gpu(&ctx, &q)?,
    )?;
    let q = Q6KWeight::from_gguf_bytes(&ctx, &b(QuantType::Q6K)?, 2, 256)?;
    check(
        QuantType::Q6K,
        q.device_bytes(),
        dequantize_q6_k_gpu(&ctx, &q)?,
    )?;
    // Bytes that are not the shape's are refused, not read past.
    let short = &b(QuantType::Q6K)?[1..];
    assert!(Q6KWeight::from_gguf_bytes(&ctx, short, 2, 256).is_err());
    assert!(repack_q6_k(short).is_err());
    Ok(())
}

/// `rms_norm` on the device against the reference, both flavours.
#[test]
fn rms_norm_matches_ref() -> Result<()> {
    let ctx = gpu();
    let mut rng = Rng::fresh("api_rms_norm");
    let (rows, cols) = (3, 96);
    let x = rng.normals(rows * cols, 2.0);
    let w = rng.normals(cols, 1.0);
    let xb = Buffer::new(&ctx, (4 * x.len()) as u64, MemoryKind::Upload, "x")?;
    let wb = Buffer::new(&ctx, (4 * cols) as u64, MemoryKind::Upload, "w")?;
    let yb = Buffer::new(&ctx, (4 * x.len()) as u64, MemoryKind::Readback, "y")?;
    xb.write_slice(0, &x)?;
    wb.write_slice(0, &w)?;
    for flavor in [NormFlavor::Plain, NormFlavor::ZeroCentred] {
        run_once(&ctx, |rec| {
            let (xm, ym) = (Mat::new(&xb, rows, cols), Mat::new(&yb, rows, cols));
            rms_norm(rec, xm, &wb, flavor, 1e-5, ym)
        })?;
        let mut y = vec![0.0f32; x.len()];
        yb.read_slice(0, &mut y)?;
        let want: Vec<f32> = x
            .chunks(cols)
            .flat_map(|r| combs::ops::rms_norm::rms_norm_ref(r, Some(&w), flavor, 1e-5))
            .collect();
        let e = max_rel(&y, &want);
        assert!(e < 1e-5, "{flavor:?}: {e}");
    }
    // A weight shorter than a row is refused.
    let r = run_once(&ctx, |rec| {
        let (xm, ym) = (Mat::new(&xb, 1, 2 * cols), Mat::new(&yb, 1, 2 * cols));
        rms_norm(rec, xm, &wb, NormFlavor::Plain, 1e-5, ym)
    });
    assert!(r.is_err());
    Ok(())
}

/// A tiny model through the registry and through `LlamaModel` by hand,
/// driven step by step: the same logits both ways, the rope tables of its
/// spec, a paged cache's page statistics.
#[test]
fn tiny_model_runs_through_the_root_names() -> Result<()> {
    let ctx = gpu();
    let mut cfg = combs::models::synth::SynthConfig::preset("tiny", QuantType::Q8_0)?;
    cfg.seed = Rng::fresh("api_model").next_u64();
    let bytes = combs::models::synth::synth_gguf(&cfg)?.to_bytes();
    let gguf = combs::formats::gguf::GgufFile::from_bytes(bytes)?;
    let opts = LoadOptions::default();
    let registry = ModelRegistry::new();
    let model = registry.load(&ctx, &gguf, &opts)?;
    let spec = registry.resolve(&gguf)?;
    let by_hand = Loaded::new(
        LlamaModel::load(&ctx, &gguf, spec.clone(), &opts)?,
        opts.planner_for(&ctx)?,
    );
    assert!(spec.layers.iter().all(|l| *l == LayerKind::Full));
    assert_eq!(spec.norm_flavor, NormFlavor::Plain);

    let rope = RotaryEmbedding::for_layer(&spec, 1, 64);
    let (cos, sin) = rope.cos_sin(&[0, 1, 2]);
    assert_eq!(cos.len(), 3 * spec.n_rot / 2);
    assert!(
        cos.iter()
            .zip(&sin)
            .all(|(c, s)| (c * c + s * s - 1.0).abs() < 1e-5)
    );

    let prompt = [1u32, 17, 4, 99, 250];
    let paged = CacheConfig {
        pool_pages: 4,
        ..CacheConfig::paged(64, 16)
    };
    let mut a = model.create_kv_cache(&paged)?;
    let mut b = by_hand.create_kv_cache(&CacheConfig::contiguous(64))?;
    assert_eq!(
        (a.kind(), b.kind()),
        (CacheKind::Paged, CacheKind::Contiguous)
    );
    let la = model.prefill(&model.embed(&prompt)?, a.as_mut())?;
    let lb = by_hand.prefill(&by_hand.embed(&prompt)?, b.as_mut())?;
    assert!(max_rel(&la, &lb) < 1e-5);
    let la = model.decode(&model.embed(&[3])?, a.as_mut())?;
    let lb = by_hand.decode(&by_hand.embed(&[3])?, b.as_mut())?;
    assert!(max_rel(&la, &lb) < 1e-5);
    let stats: PageStats = a.page_stats().unwrap_or_default();
    assert_eq!(
        (stats.page_size, stats.pages_used, stats.tokens),
        (16, 1, 6)
    );
    Ok(())
}
