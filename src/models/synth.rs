//! `combs synth`: GGUF files of real model shapes with random weights, laid
//! out exactly as llama.cpp's converter writes them (tensor names, dims,
//! metadata keys and a SentencePiece-style vocabulary), so both engines load
//! the same file for speed comparisons, and tiny ones for tests.
//!
//! Quantized tensors are random blocks with valid, moderate scales (no
//! NaN/Inf): weights spread like a trained layer's (std ≈ 1/√fan_in) without
//! spending minutes quantizing billions of floats.

use half::{bf16, f16};

use crate::error::{ModelError, Result};
use crate::formats::gguf::MetaArray;
use crate::formats::gguf_writer::GgufWriter;
use crate::quant::{DeviceLayout, QuantType};

/// The shape of a synthetic model.
#[derive(Clone, Debug, PartialEq)]
pub struct SynthConfig {
    /// `general.architecture` (`llama`, `qwen2`, `qwen3`, `gemma3`).
    pub arch: String,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// FFN inner size.
    pub n_ff: usize,
    /// Training context written to metadata.
    pub n_ctx: usize,
    /// Output head tied to the embedding.
    pub tied: bool,
    /// Storage type of the 2-D weights (norms stay f32).
    pub qtype: QuantType,
    /// Random seed.
    pub seed: u64,
    /// `attention.sliding_window` (0: not written). Sliding on every layer
    /// for `mistral`, on the local layers for `gemma3`.
    pub sliding_window: usize,
}

impl SynthConfig {
    /// A named preset: `tiny` (2 layers, n_embd 64), `smollm2-135m`, `llama-1b`, `llama-8b`.
    ///
    /// # Errors
    /// An unknown preset name.
    pub fn preset(name: &str, qtype: QuantType) -> Result<Self> {
        let base = |arch: &str, v, e, l, h, kv, ff, tied| SynthConfig {
            arch: arch.to_string(),
            n_vocab: v,
            n_embd: e,
            n_layer: l,
            n_head: h,
            n_head_kv: kv,
            head_dim: e / h,
            n_ff: ff,
            n_ctx: 8192,
            tied,
            qtype,
            seed: 1,
            sliding_window: 0,
        };
        Ok(match name {
            "tiny" => SynthConfig {
                n_ctx: 256,
                ..base("llama", 320, 64, 2, 4, 2, 128, false)
            },
            "smollm2-135m" => base("llama", 49152, 576, 30, 9, 3, 1536, true),
            "llama-1b" => base("llama", 128256, 2048, 16, 32, 8, 8192, true),
            "llama-8b" => base("llama", 128256, 4096, 32, 32, 8, 14336, false),
            other => {
                return Err(ModelError::invalid(
                    "preset",
                    format!("unknown preset `{other}` (tiny, smollm2-135m, llama-1b, llama-8b)"),
                ));
            }
        })
    }
}

/// SplitMix64: fast, seedable random bits for weights.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately normal (sum of four uniforms), cheap enough for billions of draws.
    fn normal(&mut self) -> f32 {
        let s: f32 = (0..4).map(|_| self.unit()).sum();
        (s - 2.0) * 1.732_050_8
    }

    fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// Random GGUF bytes for `n` weights of type `t` whose values have roughly standard deviation `std`.
fn random_tensor(bits: &mut Bits, t: QuantType, n: usize, std: f32) -> Vec<u8> {
    match t {
        QuantType::F32 => (0..n)
            .flat_map(|_| (bits.normal() * std).to_le_bytes())
            .collect(),
        QuantType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(bits.normal() * std).to_le_bytes())
            .collect(),
        QuantType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(bits.normal() * std).to_le_bytes())
            .collect(),
        _ => {
            let nb = n / t.block_size();
            let mut bytes = vec![0u8; nb * t.block_bytes()];
            bits.fill(&mut bytes);
            let layout = DeviceLayout::of(t).expect("quantized types have a device layout");
            // Uniform quants of b bits have std ≈ 2^b / √12 quant steps; pick the
            // scale so the weights' std is about `std` (K-quant sub-scales add a factor).
            let step = match t {
                QuantType::Q8_0 => std / 73.9,
                QuantType::Q4_0 | QuantType::Q4_1 => std / 4.6,
                QuantType::Q5_0 | QuantType::Q5_1 => std / 9.2,
                QuantType::Q2K => std / 1.2 / 8.0,
                QuantType::Q3K => std / 2.3 / 16.0,
                QuantType::Q4K | QuantType::Q5K => std / 4.6 / 32.0,
                QuantType::Q6K => std / 18.5 / 64.0,
                _ => std,
            };
            for block in bytes.chunks_exact_mut(t.block_bytes()) {
                for (k, &off) in layout.scales.iter().enumerate() {
                    // Mins (second scale of the K types and Q4_1/Q5_1) stay small.
                    let v = if k == 0 { step } else { step * 0.5 };
                    let v = v * (0.75 + 0.5 * bits.unit());
                    block[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            bytes
        }
    }
}

fn vocab(n_vocab: usize) -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2, 3, 3];
    for b in 0..256 {
        if tokens.len() >= n_vocab {
            break;
        }
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let letters = "abcdefghijklmnopqrstuvwxyz";
    while tokens.len() < n_vocab {
        let i = tokens.len();
        let c = letters.as_bytes()[i % 26] as char;
        tokens.push(format!("\u{2581}{c}{i}"));
        types.push(1);
    }
    let scores = (0..n_vocab).map(|i| -(i as f32)).collect();
    (tokens, scores, types)
}

/// The metadata of a synthetic model: hyperparameters and a
/// SentencePiece-style vocabulary (byte tokens, then made-up pieces).
fn write_metadata(w: &mut GgufWriter, cfg: &SynthConfig, norm_eps: f32) -> Result<()> {
    let (a, t) = (cfg.arch.as_str(), cfg.qtype);
    let k = |s: &str| format!("{a}.{s}");
    w.add("general.architecture", a)?;
    w.add("general.name", format!("combs-synth-{a}-{}", t.name()))?;
    w.add(k("context_length"), cfg.n_ctx as u32)?;
    if cfg.sliding_window > 0 {
        w.add(k("attention.sliding_window"), cfg.sliding_window as u32)?;
    }
    w.add(k("embedding_length"), cfg.n_embd as u32)?;
    w.add(k("block_count"), cfg.n_layer as u32)?;
    w.add(k("feed_forward_length"), cfg.n_ff as u32)?;
    w.add(k("attention.head_count"), cfg.n_head as u32)?;
    w.add(k("attention.head_count_kv"), cfg.n_head_kv as u32)?;
    w.add(k("attention.key_length"), cfg.head_dim as u32)?;
    w.add(k("attention.value_length"), cfg.head_dim as u32)?;
    w.add(k("rope.dimension_count"), cfg.head_dim as u32)?;
    w.add(k("rope.freq_base"), 10000.0f32)?;
    w.add(k("attention.layer_norm_rms_epsilon"), norm_eps)?;
    w.add(k("vocab_size"), cfg.n_vocab as u32)?;
    let (tokens, scores, types) = vocab(cfg.n_vocab);
    w.add("tokenizer.ggml.model", "llama")?;
    w.add("tokenizer.ggml.pre", "default")?;
    w.add("tokenizer.ggml.tokens", MetaArray::Str(tokens))?;
    w.add("tokenizer.ggml.scores", MetaArray::F32(scores))?;
    w.add("tokenizer.ggml.token_type", MetaArray::I32(types))?;
    w.add("tokenizer.ggml.unknown_token_id", 0u32)?;
    w.add("tokenizer.ggml.bos_token_id", 1u32)?;
    w.add("tokenizer.ggml.eos_token_id", 2u32)?;
    w.add("tokenizer.ggml.add_bos_token", true)?;
    w.add("tokenizer.ggml.add_eos_token", false)?;
    Ok(())
}

/// Builds the GGUF of a synthetic model.
///
/// # Errors
/// Shapes that do not fit the chosen type's blocks.
pub fn synth_gguf(cfg: &SynthConfig) -> Result<GgufWriter> {
    let t = cfg.qtype;
    if !cfg.n_embd.is_multiple_of(t.block_size()) || !cfg.n_ff.is_multiple_of(t.block_size()) {
        return Err(ModelError::invalid(
            "qtype",
            format!(
                "{t} needs dimensions that are multiples of {}",
                t.block_size()
            ),
        ));
    }
    if cfg.n_vocab < 3 || cfg.n_head_kv == 0 || !cfg.n_head.is_multiple_of(cfg.n_head_kv) {
        return Err(ModelError::invalid("shape", format!("{cfg:?}")));
    }
    let a = cfg.arch.as_str();
    let mut w = GgufWriter::new();
    write_metadata(&mut w, cfg, 1e-5)?;
    let mut bits = Bits(cfg.seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xC0B5);
    let mut bits2 = Bits(cfg.seed ^ 0x9E37_79B9);
    let (e, ff, nq, nkv) = (
        cfg.n_embd,
        cfg.n_ff,
        cfg.n_head * cfg.head_dim,
        cfg.n_head_kv * cfg.head_dim,
    );
    let f32_id = QuantType::F32 as u32;
    let mut mat = |w: &mut GgufWriter, name: String, cols: usize, rows: usize, std: f32| {
        let data = random_tensor(&mut bits, t, rows * cols, std);
        w.add_tensor(name, t as u32, &[cols as u64, rows as u64], data)
            .map(|_| ())
    };
    mat(&mut w, "token_embd.weight".into(), e, cfg.n_vocab, 1.0)?;
    let ones = |n: usize| -> Vec<u8> { (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect() };
    w.add_tensor("output_norm.weight", f32_id, &[e as u64], ones(e))?;
    if !cfg.tied {
        mat(
            &mut w,
            "output.weight".into(),
            e,
            cfg.n_vocab,
            1.0 / (e as f32).sqrt(),
        )?;
    }
    for il in 0..cfg.n_layer {
        let p = format!("blk.{il}");
        let is = |n: usize| 1.0 / (n as f32).sqrt();
        w.add_tensor(
            format!("{p}.attn_norm.weight"),
            f32_id,
            &[e as u64],
            ones(e),
        )?;
        mat(&mut w, format!("{p}.attn_q.weight"), e, nq, is(e))?;
        mat(&mut w, format!("{p}.attn_k.weight"), e, nkv, is(e))?;
        mat(&mut w, format!("{p}.attn_v.weight"), e, nkv, is(e))?;
        mat(&mut w, format!("{p}.attn_output.weight"), nq, e, is(nq))?;
        let mut vec_f32 = |w: &mut GgufWriter, name: String, n: usize, mean: f32, std: f32| {
            let data: Vec<u8> = (0..n)
                .flat_map(|_| (mean + bits2.normal() * std).to_le_bytes())
                .collect();
            w.add_tensor(name, f32_id, &[n as u64], data).map(|_| ())
        };
        if a == "qwen2" {
            vec_f32(&mut w, format!("{p}.attn_q.bias"), nq, 0.0, 0.5)?;
            vec_f32(&mut w, format!("{p}.attn_k.bias"), nkv, 0.0, 0.5)?;
            vec_f32(&mut w, format!("{p}.attn_v.bias"), nkv, 0.0, 0.5)?;
        }
        if a == "qwen3" || a == "gemma3" {
            vec_f32(
                &mut w,
                format!("{p}.attn_q_norm.weight"),
                cfg.head_dim,
                1.0,
                0.2,
            )?;
            vec_f32(
                &mut w,
                format!("{p}.attn_k_norm.weight"),
                cfg.head_dim,
                1.0,
                0.2,
            )?;
        }
        if a == "gemma3" {
            vec_f32(
                &mut w,
                format!("{p}.post_attention_norm.weight"),
                e,
                1.0,
                0.2,
            )?;
            vec_f32(&mut w, format!("{p}.post_ffw_norm.weight"), e, 1.0, 0.2)?;
        }
        w.add_tensor(format!("{p}.ffn_norm.weight"), f32_id, &[e as u64], ones(e))?;
        mat(&mut w, format!("{p}.ffn_gate.weight"), e, ff, is(e))?;
        mat(&mut w, format!("{p}.ffn_up.weight"), e, ff, is(e))?;
        mat(&mut w, format!("{p}.ffn_down.weight"), ff, e, is(ff))?;
    }
    Ok(w)
}

/// A tiny llama model whose logits every engine computes exactly, for
/// byte-level comparisons of what is derived from logits (llama.cpp's
/// KL-divergence base files): the `tiny` preset's shape and vocabulary with
/// one block whose weights are all zero (its attention and FFN add exactly
/// 0), RMS-norm epsilon 0, token embeddings of ±1 (so every norm scales by
/// exactly 1) and output weights that are multiples of 1/32 below 1/2 in
/// magnitude, so each logit is a sum of 64 such numbers, exact in f32 (and
/// in f16) in any order. `variant` 0 is the base; another variant adds ±1/32
/// to about a fifth of the output weights (drawn from `variant`), a model
/// close to the base for KL-divergence statistics. `qtype` is F16 or F32.
///
/// # Errors
/// Another `qtype`.
pub fn exact_gguf(qtype: QuantType, variant: u64) -> Result<GgufWriter> {
    if !matches!(qtype, QuantType::F16 | QuantType::F32) {
        return Err(ModelError::invalid(
            "qtype",
            format!("the exact preset is written in f16 or f32, not {qtype}"),
        ));
    }
    let cfg = SynthConfig {
        n_layer: 1,
        ..SynthConfig::preset("tiny", qtype)?
    };
    let (e, ff, v) = (cfg.n_embd, cfg.n_ff, cfg.n_vocab);
    let (nq, nkv) = (cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim);
    let mut w = GgufWriter::new();
    write_metadata(&mut w, &cfg, 0.0)?;
    let bytes = |vals: &[f32]| -> Vec<u8> {
        match qtype {
            QuantType::F16 => vals
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect(),
            _ => vals.iter().flat_map(|&x| x.to_le_bytes()).collect(),
        }
    };
    let f32_id = QuantType::F32 as u32;
    let ones: Vec<u8> = (0..e).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let add = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize, vals: &[f32]| {
        w.add_tensor(name, qtype as u32, &[cols as u64, rows as u64], bytes(vals))
            .map(|_| ())
    };
    // the base's draws come from fixed seeds, the variant's change from its own
    let mut bits = Bits(0xE4AC_7000);
    let embd: Vec<f32> = (0..v * e)
        .map(|_| if bits.next() & 1 == 0 { 1.0 } else { -1.0 })
        .collect();
    let mut out: Vec<f32> = (0..v * e)
        .map(|_| (bits.next() % 31) as f32 / 32.0 - 15.0 / 32.0)
        .collect();
    if variant != 0 {
        let mut change = Bits(variant.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0xE4AC_7001);
        for x in &mut out {
            match change.next() % 10 {
                0 if *x < 15.0 / 32.0 => *x += 1.0 / 32.0,
                1 if *x > -15.0 / 32.0 => *x -= 1.0 / 32.0,
                _ => {}
            }
        }
    }
    add(&mut w, "token_embd.weight", e, v, &embd)?;
    w.add_tensor("output_norm.weight", f32_id, &[e as u64], ones.clone())?;
    add(&mut w, "output.weight", e, v, &out)?;
    let zeros = |n: usize| vec![0.0f32; n];
    w.add_tensor("blk.0.attn_norm.weight", f32_id, &[e as u64], ones.clone())?;
    add(&mut w, "blk.0.attn_q.weight", e, nq, &zeros(e * nq))?;
    add(&mut w, "blk.0.attn_k.weight", e, nkv, &zeros(e * nkv))?;
    add(&mut w, "blk.0.attn_v.weight", e, nkv, &zeros(e * nkv))?;
    add(&mut w, "blk.0.attn_output.weight", nq, e, &zeros(nq * e))?;
    w.add_tensor("blk.0.ffn_norm.weight", f32_id, &[e as u64], ones)?;
    add(&mut w, "blk.0.ffn_gate.weight", e, ff, &zeros(e * ff))?;
    add(&mut w, "blk.0.ffn_up.weight", e, ff, &zeros(e * ff))?;
    add(&mut w, "blk.0.ffn_down.weight", ff, e, &zeros(ff * e))?;
    Ok(w)
}

/// Random GGUF bytes for a `rows × cols` weight of type `t` (weights of
/// standard deviation about 1/√cols, valid scales), drawn from `seed`: what
/// kernel benchmarks multiply without building a whole model.
pub fn random_weight_bytes(t: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut bits = Bits(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5EED);
    random_tensor(&mut bits, t, rows * cols, 1.0 / (cols.max(1) as f32).sqrt())
}
