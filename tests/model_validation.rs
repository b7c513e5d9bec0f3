//! Semantic validation at load: files that parse as GGUF but cannot be run
//! correctly (absurd or inconsistent hyperparameters, NaN epsilons and rope
//! bases, special ids outside the vocabulary, tensors of the wrong shape or
//! type, data ranges that overlap or run past the end) are refused by
//! `Model::load` with an error naming the key or tensor at fault.
//!
//! Each case takes a small valid synthetic model, changes one key or one
//! tensor, writes it to a temporary file and loads it.

mod common;

use std::path::PathBuf;

use combs::formats::ggml_type::ggml_block_geometry;
use combs::formats::gguf::{GgufFile, MetaValue};
use combs::formats::gguf_writer::GgufWriter;
use combs::models::LoadOptions;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::quant::QuantType;
use combs::runtime::Model;
use common::gpu;

/// One change to a valid file.
enum Edit {
    /// Sets (or adds) a metadata key.
    Key(&'static str, MetaValue),
    /// Replaces (or adds) a tensor of GGML type id `.1` and dims `.2`
    /// (data all zero bytes).
    Tensor(&'static str, u32, Vec<u64>),
    /// Points tensor `.0`'s data at tensor `.1`'s (ranges overlap).
    Overlap(&'static str, &'static str),
    /// Moves tensor `.0`'s data past the end of the file.
    PastEnd(&'static str),
    /// Both edits, in turn.
    Both(Box<Edit>, Box<Edit>),
}

fn base(arch: &str) -> GgufFile {
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.arch = arch.to_string();
    let bytes = synth_gguf(&cfg).expect("synth").to_bytes();
    GgufFile::from_bytes(bytes).expect("parse")
}

/// The bytes of `g` with `edit` applied (metadata order and tensor order kept).
fn edited(g: &GgufFile, edit: &Edit) -> Vec<u8> {
    if let Edit::Both(a, b) = edit {
        let g = GgufFile::from_bytes(edited(g, a)).expect("first edit parses");
        return edited(&g, b);
    }
    let mut w = GgufWriter::new();
    let mut set = false;
    for (k, v) in g.metadata() {
        let v = match edit {
            Edit::Key(key, new) if key == k => {
                set = true;
                new.clone()
            }
            _ => v.clone(),
        };
        w.add(k.clone(), v).expect("metadata");
    }
    if let Edit::Key(key, new) = edit
        && !set
    {
        w.add(*key, new.clone()).expect("new key");
    }
    let zeros = |ggml_type: u32, dims: &[u64]| {
        let (block, block_bytes) = ggml_block_geometry(ggml_type).expect("known type");
        vec![0u8; dims.iter().product::<u64>() as usize / block * block_bytes]
    };
    for t in g.tensors() {
        match edit {
            Edit::Tensor(name, ggml_type, dims) if *name == t.name => {
                w.add_tensor(t.name.clone(), *ggml_type, dims, zeros(*ggml_type, dims))
                    .expect("tensor");
            }
            _ => {
                w.add_tensor(
                    t.name.clone(),
                    t.ggml_type,
                    &t.dims,
                    g.tensor_data(t).to_vec(),
                )
                .expect("tensor");
            }
        }
    }
    if let Edit::Tensor(name, ggml_type, dims) = edit
        && g.tensor(name).is_none()
    {
        w.add_tensor(*name, *ggml_type, dims, zeros(*ggml_type, dims))
            .expect("new tensor");
    }
    let mut bytes = w.to_bytes();
    match edit {
        Edit::Overlap(a, b) => {
            let target = offset_field(&bytes, b);
            let v = bytes[target..target + 8].to_vec();
            let at = offset_field(&bytes, a);
            bytes[at..at + 8].copy_from_slice(&v);
        }
        Edit::PastEnd(a) => {
            let at = offset_field(&bytes, a);
            let past = (bytes.len() as u64).next_multiple_of(32);
            bytes[at..at + 8].copy_from_slice(&past.to_le_bytes());
        }
        _ => {}
    }
    bytes
}

/// Byte position of the data-offset field of tensor `name`'s table entry.
fn offset_field(b: &[u8], name: &str) -> usize {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    let at = b
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor entry")
        + needle.len();
    let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize;
    at + 4 + 8 * n_dims + 4
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load_bytes(bytes: &[u8], tag: &str) -> combs::Result<Model> {
    let path = std::env::temp_dir().join(format!(
        "combs-validation-{}-{tag}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, bytes).expect("write temp file");
    let file = TempFile(path);
    Model::load(&gpu(), &file.0, &LoadOptions::default())
}

fn f32v(v: f32) -> MetaValue {
    MetaValue::F32(v)
}

fn u32v(v: u32) -> MetaValue {
    MetaValue::U32(v)
}

/// `(architecture, edit, text the error must contain)`.
fn cases() -> Vec<(&'static str, Edit, &'static str)> {
    use Edit::{Key, Overlap, PastEnd, Tensor};
    let f32t = QuantType::F32 as u32;
    // Types combs lists but does not compute with.
    let (iq4_nl, i8t) = (20, 24);
    vec![
        // block count
        (
            "llama",
            Key("llama.block_count", u32v(0)),
            "llama.block_count",
        ),
        (
            "llama",
            Key("llama.block_count", u32v(100_000)),
            "llama.block_count",
        ),
        // head counts
        (
            "llama",
            Key("llama.attention.head_count", u32v(0)),
            "llama.attention.head_count",
        ),
        (
            "llama",
            Key("llama.attention.head_count", u32v(5000)),
            "llama.attention.head_count",
        ),
        (
            "llama",
            Key("llama.attention.head_count_kv", u32v(3)),
            "llama.attention.head_count_kv",
        ),
        (
            "llama",
            Key("llama.attention.head_count_kv", u32v(8)),
            "llama.attention.head_count_kv",
        ),
        (
            "llama",
            Key("llama.attention.key_length", u32v(15)),
            "llama.attention.key_length",
        ),
        (
            "llama",
            Key("llama.attention.key_length", u32v(512)),
            "llama.attention.key_length",
        ),
        (
            "llama",
            Key("llama.attention.value_length", u32v(32)),
            "llama.attention.value_length",
        ),
        (
            "llama",
            Key("llama.rope.dimension_count", u32v(18)),
            "llama.rope.dimension_count",
        ),
        (
            "llama",
            Key("llama.rope.dimension_count", u32v(7)),
            "llama.rope.dimension_count",
        ),
        (
            "llama",
            Key("llama.embedding_length", u32v(0)),
            "llama.embedding_length",
        ),
        (
            "llama",
            Key("llama.embedding_length", u32v(1 << 30)),
            "llama.embedding_length",
        ),
        (
            "llama",
            Key("llama.feed_forward_length", u32v(0)),
            "llama.feed_forward_length",
        ),
        // epsilons, rope bases and factors
        (
            "llama",
            Key("llama.attention.layer_norm_rms_epsilon", f32v(f32::NAN)),
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "llama",
            Key("llama.attention.layer_norm_rms_epsilon", f32v(-1e-5)),
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "llama",
            Key(
                "llama.attention.layer_norm_rms_epsilon",
                f32v(f32::INFINITY),
            ),
            "llama.attention.layer_norm_rms_epsilon",
        ),
        (
            "gemma3",
            Key("gemma3.attention.layer_norm_rms_epsilon", f32v(f32::NAN)),
            "gemma3.attention.layer_norm_rms_epsilon",
        ),
        (
            "llama",
            Key("llama.rope.freq_base", f32v(0.0)),
            "llama.rope.freq_base",
        ),
        (
            "llama",
            Key("llama.rope.freq_base", f32v(-10000.0)),
            "llama.rope.freq_base",
        ),
        (
            "llama",
            Key("llama.rope.freq_base", f32v(f32::NAN)),
            "llama.rope.freq_base",
        ),
        (
            "gemma3",
            Key("gemma3.rope.freq_base_swa", f32v(0.0)),
            "gemma3.rope.freq_base_swa",
        ),
        (
            "gemma3",
            Key("gemma3.rope.freq_base_swa", f32v(f32::NAN)),
            "gemma3.rope.freq_base_swa",
        ),
        (
            "llama",
            Key("llama.rope.scaling.factor", f32v(f32::NAN)),
            "llama.rope.scaling.factor",
        ),
        (
            "llama",
            Key("llama.rope.scaling.factor", f32v(-2.0)),
            "llama.rope.scaling.factor",
        ),
        (
            "llama",
            Key("llama.rope.scaling.attn_factor", f32v(0.0)),
            "llama.rope.scaling.attn_factor",
        ),
        (
            "llama",
            Key("llama.attention.scale", f32v(f32::NAN)),
            "llama.attention.scale",
        ),
        (
            "gemma3",
            Key("gemma3.attn_logit_softcapping", f32v(f32::NAN)),
            "gemma3.attn_logit_softcapping",
        ),
        (
            "gemma3",
            Key("gemma3.final_logit_softcapping", f32v(-30.0)),
            "gemma3.final_logit_softcapping",
        ),
        // context
        (
            "llama",
            Key("llama.context_length", u32v(0)),
            "llama.context_length",
        ),
        (
            "llama",
            Key("llama.context_length", MetaValue::U64(1 << 40)),
            "llama.context_length",
        ),
        (
            "mistral",
            Key("mistral.attention.sliding_window", MetaValue::U64(1 << 40)),
            "mistral.attention.sliding_window",
        ),
        // special ids and vocabulary
        (
            "llama",
            Key("tokenizer.ggml.bos_token_id", u32v(320)),
            "tokenizer.ggml.bos_token_id",
        ),
        (
            "llama",
            Key("tokenizer.ggml.eos_token_id", u32v(100_000)),
            "tokenizer.ggml.eos_token_id",
        ),
        (
            "llama",
            Key("tokenizer.ggml.padding_token_id", u32v(u32::MAX)),
            "tokenizer.ggml.padding_token_id",
        ),
        (
            "llama",
            Key("llama.vocab_size", u32v(321)),
            "llama.vocab_size",
        ),
        (
            "llama",
            Tensor("token_embd.weight", f32t, vec![64, 300]),
            "token_embd.weight",
        ),
        (
            "llama",
            Tensor("token_embd.weight", f32t, vec![32, 320]),
            "token_embd.weight",
        ),
        // more tokens than embedding rows (`vocab_size` agreeing with the embedding)
        (
            "llama",
            Edit::Both(
                Box::new(Key("llama.vocab_size", u32v(300))),
                Box::new(Edit::Both(
                    Box::new(Tensor("token_embd.weight", f32t, vec![64, 300])),
                    Box::new(Tensor("output.weight", f32t, vec![64, 300])),
                )),
            ),
            "token_embd.weight",
        ),
        // tensor shapes and types
        (
            "llama",
            Tensor("output.weight", f32t, vec![64, 319]),
            "output.weight",
        ),
        (
            "llama",
            Tensor("blk.1.attn_q.weight", f32t, vec![64, 32]),
            "blk.1.attn_q.weight",
        ),
        (
            "llama",
            Tensor("blk.0.attn_k.weight", f32t, vec![64, 32, 2]),
            "blk.0.attn_k.weight",
        ),
        (
            "llama",
            Tensor("blk.0.ffn_down.weight", f32t, vec![64, 128]),
            "blk.0.ffn_down.weight",
        ),
        (
            "llama",
            Tensor("blk.0.attn_norm.weight", f32t, vec![32]),
            "blk.0.attn_norm.weight",
        ),
        (
            "llama",
            Tensor("output_norm.weight", f32t, vec![64, 2]),
            "output_norm.weight",
        ),
        (
            "qwen3",
            Tensor("blk.0.attn_q_norm.weight", f32t, vec![8]),
            "blk.0.attn_q_norm.weight",
        ),
        (
            "llama",
            Tensor("blk.0.ffn_up.weight", QuantType::Q4K as u32, vec![256, 128]),
            "blk.0.ffn_up.weight",
        ),
        (
            "llama",
            Tensor("blk.0.ffn_up.weight", iq4_nl, vec![64, 128]),
            "blk.0.ffn_up.weight",
        ),
        (
            "llama",
            Tensor("blk.1.ffn_norm.weight", i8t, vec![64]),
            "blk.1.ffn_norm.weight",
        ),
        (
            "llama",
            Tensor("rope_freqs.weight", f32t, vec![4]),
            "rope_freqs.weight",
        ),
        (
            "llama",
            Tensor("rope_freqs.weight", QuantType::F16 as u32, vec![8]),
            "rope_freqs.weight",
        ),
        // data ranges
        (
            "llama",
            Overlap("blk.0.ffn_up.weight", "blk.0.attn_q.weight"),
            "blk.0.ffn_up.weight",
        ),
        (
            "llama",
            PastEnd("blk.1.ffn_down.weight"),
            "blk.1.ffn_down.weight",
        ),
    ]
}

#[test]
fn base_models_load() {
    for arch in ["llama", "mistral", "qwen3", "gemma3"] {
        let g = base(arch);
        let bytes = edited(&g, &Edit::Key("general.name", "unchanged".into()));
        load_bytes(&bytes, &format!("base-{arch}"))
            .unwrap_or_else(|e| panic!("{arch}: the unmodified model must load: {e}"));
    }
}

#[test]
fn invalid_models_are_refused_naming_the_key_or_tensor() {
    let mut failures = Vec::new();
    for (i, (arch, edit, want)) in cases().iter().enumerate() {
        let g = base(arch);
        let bytes = edited(&g, edit);
        match load_bytes(&bytes, &format!("case{i}")) {
            Ok(_) => failures.push(format!("case {i} ({arch}, `{want}`): loaded")),
            Err(e) => {
                let msg = e.to_string();
                if !msg.contains(want) {
                    failures.push(format!("case {i} ({arch}): `{msg}` does not name `{want}`"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
