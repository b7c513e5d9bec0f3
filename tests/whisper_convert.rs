//! CTranslate2 Whisper to whisper.cpp: the CTranslate2 reader on synthetic
//! `model.bin` files (round trip, every truncation and corruption an error),
//! the converter (openai names, fused QKV and KV split by rows, F16 copied bit
//! for bit, quantized types within their error, whisper.cpp's type per
//! tensor), `combs convert` as a user runs it, the mel filterbank against
//! openai-whisper's `mel_filters.npz` (fixture from
//! `scripts/make-whisper-mel-fixture.py`), and, with the real models from
//! `scripts/fetch-models.sh --whisper` (ignored tests), the converted tiny.en.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use combs::ModelError;
use combs::formats::ctranslate2::{Ct2Directory, Ct2Dtype, Ct2Model};
use combs::formats::whisper_bin::{TensorRole, WhisperFile, expected_tensors, mel_filters};
use combs::models::speech::N_FFT;
use combs::quant::whisper_convert::{from_ct2, requantize_bin, tensor_type};
use combs::quant::{QuantType, dequantize_vec};
use common::Rng;
use half::f16;

/// One variable of a synthetic `model.bin`: name, shape, dtype id, bytes.
type Var = (String, Vec<usize>, u8, Vec<u8>);

fn ct2_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&((s.len() + 1) as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// `ModelSpec._serialize`, binary version 6.
fn ct2_bytes(vars: &[Var], aliases: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&6u32.to_le_bytes());
    ct2_string(&mut out, "WhisperSpec");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(vars.len() as u32).to_le_bytes());
    for (name, shape, dtype, bytes) in vars {
        ct2_string(&mut out, name);
        out.push(shape.len() as u8);
        for &d in shape {
            out.extend_from_slice(&(d as u32).to_le_bytes());
        }
        out.push(*dtype);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&(aliases.len() as u32).to_le_bytes());
    for (a, t) in aliases {
        ct2_string(&mut out, a);
        ct2_string(&mut out, t);
    }
    out
}

const F32_ID: u8 = 0;
const I16_ID: u8 = 2;
const F16_ID: u8 = 4;

fn f16_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    rng.normals(n, 0.3)
        .into_iter()
        .flat_map(|v| f16::from_f32(v).to_le_bytes())
        .collect()
}

struct Dims {
    n_state: usize,
    n_mels: usize,
    n_audio_ctx: usize,
    n_text_ctx: usize,
    n_vocab: usize,
    layers: usize,
}

/// The variables CTranslate2's Whisper converter writes, random F16 (the
/// norms F32 in some layers, as a float32 model would have them).
fn whisper_vars(rng: &mut Rng, d: &Dims) -> Vec<Var> {
    let n = d.n_state;
    let mut v: Vec<Var> = Vec::new();
    let mut put = |rng: &mut Rng, name: String, shape: Vec<usize>| {
        let count: usize = shape.iter().product();
        if name.ends_with("gamma") && rng.below(2) == 0 {
            let b = rng
                .normals(count, 1.0)
                .into_iter()
                .flat_map(f32::to_le_bytes)
                .collect();
            v.push((name, shape, F32_ID, b));
        } else {
            let b = f16_bytes(rng, count);
            v.push((name, shape, F16_ID, b));
        }
    };
    put(rng, "encoder/conv1/weight".into(), vec![n, d.n_mels, 3]);
    put(rng, "encoder/conv1/bias".into(), vec![n]);
    put(rng, "encoder/conv2/weight".into(), vec![n, n, 3]);
    put(rng, "encoder/conv2/bias".into(), vec![n]);
    put(
        rng,
        "encoder/position_encodings/encodings".into(),
        vec![d.n_audio_ctx, n],
    );
    put(
        rng,
        "decoder/position_encodings/encodings".into(),
        vec![d.n_text_ctx, n],
    );
    put(rng, "decoder/embeddings/weight".into(), vec![d.n_vocab, n]);
    for side in ["encoder", "decoder"] {
        put(rng, format!("{side}/layer_norm/gamma"), vec![n]);
        put(rng, format!("{side}/layer_norm/beta"), vec![n]);
        for i in 0..d.layers {
            let p = format!("{side}/layer_{i}");
            let mut attn = |rng: &mut Rng, a: &str, linears: &[usize]| {
                put(rng, format!("{p}/{a}/layer_norm/gamma"), vec![n]);
                put(rng, format!("{p}/{a}/layer_norm/beta"), vec![n]);
                for (k, &rows) in linears.iter().enumerate() {
                    put(rng, format!("{p}/{a}/linear_{k}/weight"), vec![rows * n, n]);
                    put(rng, format!("{p}/{a}/linear_{k}/bias"), vec![rows * n]);
                }
            };
            attn(rng, "self_attention", &[3, 1]);
            if side == "decoder" {
                attn(rng, "attention", &[1, 2, 1]);
            }
            put(rng, format!("{p}/ffn/layer_norm/gamma"), vec![n]);
            put(rng, format!("{p}/ffn/layer_norm/beta"), vec![n]);
            put(rng, format!("{p}/ffn/linear_0/weight"), vec![4 * n, n]);
            put(rng, format!("{p}/ffn/linear_0/bias"), vec![4 * n]);
            put(rng, format!("{p}/ffn/linear_1/weight"), vec![n, 4 * n]);
            put(rng, format!("{p}/ffn/linear_1/bias"), vec![n]);
        }
    }
    for side in ["encoder", "decoder"] {
        v.push((
            format!("{side}/num_heads"),
            vec![],
            I16_ID,
            2i16.to_le_bytes().to_vec(),
        ));
    }
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// A vocabulary of GPT-2 pieces, `<|endoftext|>` at the end-of-text id, then specials.
fn vocabulary(rng: &mut Rng, n_vocab: usize) -> (Vec<String>, Vec<Vec<u8>>) {
    let eot = if n_vocab >= 51865 { 50257 } else { 50256 };
    let alphabet: Vec<char> = "abcdefghijklmnopqrstuvwxyzĠĊÃ©!~".chars().collect();
    let byte_of = |c: char| -> Vec<u8> {
        match c {
            'Ġ' => b" ".to_vec(),
            'Ċ' => b"\n".to_vec(),
            'Ã' => vec![0xc3],
            '©' => vec![0xa9],
            c => vec![c as u8],
        }
    };
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut bytes = Vec::with_capacity(eot);
    for _ in 0..eot {
        let chars: Vec<char> = (0..1 + rng.below(6))
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect();
        bytes.push(chars.iter().flat_map(|&c| byte_of(c)).collect());
        tokens.push(chars.into_iter().collect::<String>());
    }
    tokens.push("<|endoftext|>".into());
    while tokens.len() < n_vocab {
        tokens.push(format!("<|special_{}|>", tokens.len()));
    }
    (tokens, bytes)
}

fn scratch_dir(label: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("whisper_convert_{}_{label}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A CTranslate2 Whisper directory of random weights; returns its variables and token bytes.
fn write_ct2_dir(rng: &mut Rng, dir: &Path, d: &Dims) -> (Vec<Var>, Vec<Vec<u8>>) {
    let vars = whisper_vars(rng, d);
    let bytes = ct2_bytes(
        &vars,
        &[("decoder/projection/weight", "decoder/embeddings/weight")],
    );
    std::fs::write(dir.join("model.bin"), bytes).expect("model.bin");
    std::fs::write(dir.join("config.json"), "{\"lang_ids\": []}\n").expect("config");
    let (tokens, words) = vocabulary(rng, d.n_vocab);
    let mut text = tokens.join("\n");
    text.push('\n');
    std::fs::write(dir.join("vocabulary.txt"), text).expect("vocabulary");
    (vars, words)
}

fn small_dims(rng: &mut Rng) -> Dims {
    Dims {
        n_state: 64,
        n_mels: 8,
        n_audio_ctx: 6,
        n_text_ctx: 5,
        n_vocab: if rng.below(2) == 0 { 51864 } else { 51865 },
        layers: 1 + rng.below(2),
    }
}

fn var<'a>(vars: &'a [Var], name: &str) -> &'a Var {
    vars.iter().find(|v| v.0 == name).expect(name)
}

fn as_f32(v: &Var) -> Vec<f32> {
    match v.2 {
        F32_ID => {
            v.3.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }
        F16_ID => {
            v.3.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()
        }
        _ => panic!("not a float variable"),
    }
}

#[test]
fn ct2_reader_round_trips_variables_and_aliases() {
    let mut rng = Rng::fresh("ct2_reader_round_trips_variables_and_aliases");
    let d = small_dims(&mut rng);
    let vars = whisper_vars(&mut rng, &d);
    let m = Ct2Model::from_bytes(ct2_bytes(
        &vars,
        &[("decoder/projection/weight", "decoder/embeddings/weight")],
    ))
    .expect("model.bin reads");
    assert_eq!(
        (m.binary_version, m.spec.as_str(), m.revision),
        (6, "WhisperSpec", 3)
    );
    assert_eq!(m.variables().len(), vars.len());
    for ((name, shape, dtype, bytes), v) in vars.iter().zip(m.variables()) {
        assert_eq!(v.name, name);
        assert_eq!(v.shape, shape.as_slice());
        assert_eq!(v.bytes, bytes.as_slice());
        let want = match *dtype {
            F32_ID => Ct2Dtype::F32,
            F16_ID => Ct2Dtype::F16,
            _ => Ct2Dtype::I16,
        };
        assert_eq!(v.dtype, want);
    }
    let proj = m
        .variable("decoder/projection/weight")
        .expect("alias resolves");
    assert_eq!(proj.name, "decoder/embeddings/weight");
    assert_eq!(
        m.variable("encoder/num_heads").and_then(|v| v.scalar_int()),
        Some(2)
    );
    assert!(m.variable("no/such/variable").is_none());
}

#[test]
fn ct2_reader_truncated_or_corrupt_is_an_error() {
    let mut rng = Rng::fresh("ct2_reader_truncated_or_corrupt_is_an_error");
    let d = Dims {
        n_state: 32,
        n_mels: 4,
        n_audio_ctx: 3,
        n_text_ctx: 2,
        n_vocab: 50,
        layers: 1,
    };
    let vars = whisper_vars(&mut rng, &d);
    let bytes = ct2_bytes(&vars, &[("a/b", "c/d")]);
    // every byte position up to the first variable's data, then random cuts
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((0..300).map(|_| rng.below(bytes.len())));
    for cut in cuts {
        assert!(
            Ct2Model::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut at {cut}"
        );
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(Ct2Model::from_bytes(long).is_err(), "trailing byte");
    let poke = |at: usize, v: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + v.len()].copy_from_slice(v);
        Ct2Model::from_bytes(b)
    };
    assert!(
        poke(0, &7u32.to_le_bytes()).is_err(),
        "future binary version"
    );
    assert!(poke(0, &0u32.to_le_bytes()).is_err(), "version 0");
    assert!(poke(4, &0u16.to_le_bytes()).is_err(), "zero-length string");
    assert!(
        poke(4, &u16::MAX.to_le_bytes()).is_err(),
        "string past the end"
    );
    let count_at = 4 + 2 + 12 + 4;
    assert!(
        poke(count_at, &u32::MAX.to_le_bytes()).is_err(),
        "absurd variable count"
    );
    // first variable: name, rank, dims, dtype, n_bytes
    let name_len = vars[0].0.len() + 1;
    let rank_at = count_at + 4 + 2 + name_len;
    assert!(poke(rank_at, &[9]).is_err(), "rank changes the layout");
    assert!(
        poke(rank_at + 1, &u32::MAX.to_le_bytes()).is_err(),
        "absurd dimension"
    );
    let dtype_at = rank_at + 1 + 4 * vars[0].1.len();
    assert!(poke(dtype_at, &[6]).is_err(), "unknown dtype");
    assert!(
        poke(dtype_at, &[F32_ID]).is_err(),
        "payload size disagrees with dtype"
    );
    assert!(
        poke(dtype_at + 1, &1u32.to_le_bytes()).is_err(),
        "payload size disagrees with shape"
    );
    let dup = ct2_bytes(&[vars[0].clone(), vars[0].clone()], &[]);
    assert!(matches!(
        Ct2Model::from_bytes(dup),
        Err(ModelError::Format { .. })
    ));
}

#[test]
fn ct2_whisper_converts_to_whisper_cpp_layout() {
    let mut rng = Rng::fresh("ct2_whisper_converts_to_whisper_cpp_layout");
    let d = small_dims(&mut rng);
    let dir = scratch_dir("layout");
    let (vars, words) = write_ct2_dir(&mut rng, &dir, &d);
    let ct2 = Ct2Directory::open(&dir).expect("directory opens");
    let n = d.n_state;
    for wt in [
        QuantType::F16,
        QuantType::F32,
        QuantType::Q8_0,
        QuantType::Q4_1,
    ] {
        let mut seen = 0;
        let w = from_ct2(&ct2, wt, |_| seen += 1).expect("converts");
        let f = WhisperFile::from_bytes(w.to_bytes()).expect("whisper.cpp file reads back");
        assert_eq!(seen, f.tensors().len());
        let h = f.hparams;
        assert_eq!(
            (
                h.n_vocab,
                h.n_audio_ctx,
                h.n_audio_state,
                h.n_audio_head,
                h.n_audio_layer
            ),
            (d.n_vocab, d.n_audio_ctx, n, 2, d.layers)
        );
        assert_eq!(
            (
                h.n_text_ctx,
                h.n_text_state,
                h.n_text_head,
                h.n_text_layer,
                h.n_mels
            ),
            (d.n_text_ctx, n, 2, d.layers, d.n_mels)
        );
        assert_eq!(f.weight_type, wt);
        assert_eq!(f.mel_filters, mel_filters(d.n_mels));
        assert_eq!(f.vocab.pieces, words);
        // whisper.cpp's type for each role
        for e in expected_tensors(&h) {
            let t = f.require_tensor(&e.name).expect("present");
            assert_eq!(t.qtype, tensor_type(e.role, wt), "{}", e.name);
            let want = match (e.role, wt) {
                (_, QuantType::F32) | (TensorRole::Small, _) => QuantType::F32,
                (TensorRole::Conv, _) => QuantType::F16,
                (TensorRole::Matrix, t) => t,
            };
            assert_eq!(t.qtype, want, "{}", e.name);
        }
        // Values: (whisper.cpp name, CTranslate2 variable, first row of the slice, rows)
        let mut checks: Vec<(String, String, usize, usize)> = vec![
            (
                "encoder.conv1.weight".into(),
                "encoder/conv1/weight".into(),
                0,
                n,
            ),
            (
                "encoder.conv2.bias".into(),
                "encoder/conv2/bias".into(),
                0,
                1,
            ),
            (
                "encoder.positional_embedding".into(),
                "encoder/position_encodings/encodings".into(),
                0,
                d.n_audio_ctx,
            ),
            (
                "decoder.token_embedding.weight".into(),
                "decoder/embeddings/weight".into(),
                0,
                d.n_vocab,
            ),
            (
                "encoder.ln_post.weight".into(),
                "encoder/layer_norm/gamma".into(),
                0,
                1,
            ),
            (
                "decoder.ln.bias".into(),
                "decoder/layer_norm/beta".into(),
                0,
                1,
            ),
        ];
        for i in 0..d.layers {
            for side in ["encoder", "decoder"] {
                let (o, c) = (format!("{side}.blocks.{i}"), format!("{side}/layer_{i}"));
                let qkv = format!("{c}/self_attention/linear_0");
                checks.push((
                    format!("{o}.attn.query.weight"),
                    format!("{qkv}/weight"),
                    0,
                    n,
                ));
                checks.push((
                    format!("{o}.attn.key.weight"),
                    format!("{qkv}/weight"),
                    n,
                    n,
                ));
                checks.push((
                    format!("{o}.attn.value.weight"),
                    format!("{qkv}/weight"),
                    2 * n,
                    n,
                ));
                checks.push((
                    format!("{o}.attn.value.bias"),
                    format!("{qkv}/bias"),
                    2 * n,
                    n,
                ));
                checks.push((
                    format!("{o}.attn.out.weight"),
                    format!("{c}/self_attention/linear_1/weight"),
                    0,
                    n,
                ));
                checks.push((
                    format!("{o}.attn_ln.weight"),
                    format!("{c}/self_attention/layer_norm/gamma"),
                    0,
                    1,
                ));
                checks.push((
                    format!("{o}.mlp.0.weight"),
                    format!("{c}/ffn/linear_0/weight"),
                    0,
                    4 * n,
                ));
                checks.push((
                    format!("{o}.mlp.2.weight"),
                    format!("{c}/ffn/linear_1/weight"),
                    0,
                    n,
                ));
                checks.push((
                    format!("{o}.mlp_ln.bias"),
                    format!("{c}/ffn/layer_norm/beta"),
                    0,
                    1,
                ));
            }
            let (o, c) = (
                format!("decoder.blocks.{i}.cross_attn"),
                format!("decoder/layer_{i}/attention"),
            );
            checks.push((
                format!("{o}.query.bias"),
                format!("{c}/linear_0/bias"),
                0,
                n,
            ));
            checks.push((
                format!("{o}.key.weight"),
                format!("{c}/linear_1/weight"),
                0,
                n,
            ));
            checks.push((
                format!("{o}.value.weight"),
                format!("{c}/linear_1/weight"),
                n,
                n,
            ));
            checks.push((
                format!("{o}.value.bias"),
                format!("{c}/linear_1/bias"),
                n,
                n,
            ));
            checks.push((
                format!("{o}.out.weight"),
                format!("{c}/linear_2/weight"),
                0,
                n,
            ));
            checks.push((
                format!("{o}_ln.weight"),
                format!("{c}/layer_norm/gamma"),
                0,
                1,
            ));
        }
        for (name, src, row0, rows) in checks {
            let t = f.require_tensor(&name).expect("present");
            let v = var(&vars, &src);
            // 1-D: `row0` counts elements; else rows of the trailing dimensions
            let (start, len) = if v.1.len() == 1 {
                (row0, t.n_elements())
            } else {
                let cols: usize = v.1[1..].iter().product();
                (row0 * cols, rows * cols)
            };
            assert_eq!(t.n_elements(), len, "{name}");
            let want = &as_f32(v)[start..start + len];
            let got = dequantize_vec(t.qtype, t.bytes, len).expect("dequantize");
            if t.qtype == QuantType::F16 && v.2 == F16_ID {
                // copied bit for bit
                assert_eq!(t.bytes, &v.3[start * 2..(start + len) * 2], "{name}");
            }
            let tol = match t.qtype {
                QuantType::F32 | QuantType::F16 => 0.0,
                _ => 0.08,
            };
            let max_abs = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs()
                        <= tol * max_abs.max(1e-6)
                            + if t.qtype == QuantType::F16 {
                                1e-3 * w.abs()
                            } else {
                                0.0
                            },
                    "{name}: {g} vs {w}"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn whisper_bin_requantize_matches_direct_conversion() {
    let mut rng = Rng::fresh("whisper_bin_requantize_matches_direct_conversion");
    let d = small_dims(&mut rng);
    let dir = scratch_dir("requant");
    write_ct2_dir(&mut rng, &dir, &d);
    let ct2 = Ct2Directory::open(&dir).expect("directory opens");
    let f16 = WhisperFile::from_bytes(
        from_ct2(&ct2, QuantType::F16, |_| {})
            .expect("f16")
            .to_bytes(),
    )
    .expect("reads");
    for wt in [QuantType::Q8_0, QuantType::Q5_0, QuantType::F32] {
        let direct = from_ct2(&ct2, wt, |_| {}).expect("direct").to_bytes();
        let via_f16 = requantize_bin(&f16, wt, |_| {})
            .expect("requantize")
            .to_bytes();
        assert!(
            direct == via_f16,
            "{wt}: CTranslate2 -> {wt} differs from CTranslate2 -> f16 -> {wt}"
        );
    }
    // a type whose blocks straddle rows of 64 is refused, naming the tensor
    let err = requantize_bin(&f16, QuantType::Q4K, |_| {})
        .err()
        .expect("q4_k refused");
    assert!(err.to_string().contains("tensor `"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ct2_directory_errors() {
    let mut rng = Rng::fresh("ct2_directory_errors");
    let d = small_dims(&mut rng);
    let dir = scratch_dir("errors");
    let (vars, _) = write_ct2_dir(&mut rng, &dir, &d);
    // no vocabulary at all
    std::fs::rename(dir.join("vocabulary.txt"), dir.join("vocab.bak")).expect("rename");
    assert!(matches!(
        Ct2Directory::open(&dir),
        Err(ModelError::Format { .. })
    ));
    // a vocabulary without <|endoftext|> where Whisper has it
    std::fs::write(dir.join("vocabulary.txt"), "a\nb\n").expect("vocab");
    let ct2 = Ct2Directory::open(&dir).expect("opens");
    assert!(from_ct2(&ct2, QuantType::F16, |_| {}).is_err());
    std::fs::rename(dir.join("vocab.bak"), dir.join("vocabulary.txt")).expect("rename");
    // a missing variable
    let fewer: Vec<Var> = vars
        .iter()
        .filter(|v| v.0 != "decoder/layer_0/attention/linear_1/bias")
        .cloned()
        .collect();
    std::fs::write(dir.join("model.bin"), ct2_bytes(&fewer, &[])).expect("model.bin");
    let ct2 = Ct2Directory::open(&dir).expect("opens");
    assert!(matches!(
        from_ct2(&ct2, QuantType::F16, |_| {}),
        Err(ModelError::MissingTensor { .. })
    ));
    // a fused projection of the wrong size
    let mut wrong = vars.clone();
    let k = wrong
        .iter()
        .position(|v| v.0 == "encoder/layer_0/self_attention/linear_0/weight")
        .expect("qkv");
    wrong[k].1 = vec![2 * d.n_state, d.n_state];
    wrong[k].3.truncate(2 * d.n_state * d.n_state * 2);
    std::fs::write(dir.join("model.bin"), ct2_bytes(&wrong, &[])).expect("model.bin");
    let ct2 = Ct2Directory::open(&dir).expect("opens");
    assert!(matches!(
        from_ct2(&ct2, QuantType::F16, |_| {}),
        Err(ModelError::Shape { .. })
    ));
    // broken config.json
    std::fs::write(dir.join("config.json"), "{").expect("config");
    assert!(matches!(
        Ct2Directory::open(&dir),
        Err(ModelError::Format { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn combs_convert_cli_writes_a_loadable_file_and_refuses_bad_input() {
    let mut rng = Rng::fresh("combs_convert_cli_writes_a_loadable_file_and_refuses_bad_input");
    let d = small_dims(&mut rng);
    let dir = scratch_dir("cli");
    write_ct2_dir(&mut rng, &dir, &d);
    let out = dir.join("ggml-test-q5_1.bin");
    let run = |args: &[&Path]| {
        Command::new(env!("CARGO_BIN_EXE_combs"))
            .args(args)
            .output()
            .expect("combs runs")
    };
    let o = run(&[
        Path::new("convert"),
        &dir,
        Path::new("-o"),
        &out,
        Path::new("--type"),
        Path::new("q5_1"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let f = WhisperFile::open(&out).expect("converted file opens");
    assert_eq!(f.weight_type, QuantType::Q5_1);
    // requantize the .bin in place
    let o = run(&[
        Path::new("convert"),
        &out,
        Path::new("-o"),
        &out,
        Path::new("--type"),
        Path::new("q8_0"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        WhisperFile::open(&out).expect("opens").weight_type,
        QuantType::Q8_0
    );
    // bad inputs: exit 1 with a message, no panic
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, b"not a model").expect("junk");
    for (input, ty) in [
        (junk.as_path(), "f16"),
        (dir.as_path(), "q9_9"),
        (Path::new("/nonexistent/x"), "f16"),
    ] {
        let o = run(&[
            Path::new("convert"),
            input,
            Path::new("-o"),
            &dir.join("x.bin"),
            Path::new("--type"),
            Path::new(ty),
        ]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("error") && !err.contains("panicked"), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mel_filters_match_openai_whisper_npz() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper/mel_filters.json");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    let n_bins = N_FFT / 2 + 1;
    for n_mels in [80usize, 128] {
        let bank = &fx["banks"][format!("mel_{n_mels}")];
        assert_eq!(bank["rows"].as_u64(), Some(n_mels as u64));
        assert_eq!(bank["cols"].as_u64(), Some(n_bins as u64));
        let mut want = vec![0f32; n_mels * n_bins];
        for e in bank["nonzero"].as_array().expect("nonzero list") {
            let (r, c, v) = (
                e[0].as_u64().expect("row") as usize,
                e[1].as_u64().expect("col") as usize,
                e[2].as_f64().expect("value"),
            );
            want[r * n_bins + c] = v as f32;
        }
        let got = mel_filters(n_mels);
        let max_diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let exact = got
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        eprintln!(
            "mel_{n_mels}: max |diff| {max_diff:e}, {exact} of {} bit-identical",
            got.len()
        );
        assert!(max_diff <= 1e-7, "mel_{n_mels}: max |diff| {max_diff}");
    }
}

fn cache(file: &str) -> PathBuf {
    let dir = std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/combs/models")
        });
    let p = dir.join(file);
    assert!(
        p.exists(),
        "{} missing: scripts/fetch-models.sh --whisper makes it",
        p.display()
    );
    p
}

#[test]
#[ignore = "needs scripts/fetch-models.sh --whisper"]
fn converted_tiny_en_has_its_hparams_and_ct2_f16_weights() {
    let ct2 = Ct2Directory::open(&cache("whisper-tiny.en")).expect("CTranslate2 tiny.en");
    let f = WhisperFile::open(&cache("ggml-tiny.en.bin")).expect("ggml-tiny.en.bin");
    let h = f.hparams;
    assert_eq!(
        (
            h.n_vocab,
            h.n_audio_ctx,
            h.n_audio_state,
            h.n_audio_head,
            h.n_audio_layer
        ),
        (51864, 1500, 384, 6, 4)
    );
    assert_eq!(
        (
            h.n_text_ctx,
            h.n_text_state,
            h.n_text_head,
            h.n_text_layer,
            h.n_mels
        ),
        (448, 384, 6, 4, 80)
    );
    assert_eq!((f.ftype, f.weight_type), (1, QuantType::F16));
    assert!(!h.is_multilingual());
    assert_eq!(f.vocab.pieces.len(), 50256);
    assert_eq!(f.vocab.pieces[1169], b"the"); // GPT-2's "the"
    assert_eq!(f.vocab.pieces[262], b" the");
    assert_eq!(f.mel_filters, mel_filters(80));
    let m = &ct2.model;
    let f16_of = |name: &str| m.require(name).expect(name).bytes.to_vec();
    // Hand-written map of a few tensors, the fused ones by row ranges.
    let n = 384 * 384 * 2;
    let qkv = f16_of("encoder/layer_2/self_attention/linear_0/weight");
    assert_eq!(
        f.require_tensor("encoder.blocks.2.attn.query.weight")
            .expect("q")
            .bytes,
        &qkv[..n]
    );
    assert_eq!(
        f.require_tensor("encoder.blocks.2.attn.key.weight")
            .expect("k")
            .bytes,
        &qkv[n..2 * n]
    );
    assert_eq!(
        f.require_tensor("encoder.blocks.2.attn.value.weight")
            .expect("v")
            .bytes,
        &qkv[2 * n..]
    );
    let kv = f16_of("decoder/layer_3/attention/linear_1/weight");
    assert_eq!(
        f.require_tensor("decoder.blocks.3.cross_attn.key.weight")
            .expect("k")
            .bytes,
        &kv[..n]
    );
    assert_eq!(
        f.require_tensor("decoder.blocks.3.cross_attn.value.weight")
            .expect("v")
            .bytes,
        &kv[n..]
    );
    assert_eq!(
        f.require_tensor("decoder.token_embedding.weight")
            .expect("emb")
            .bytes,
        f16_of("decoder/embeddings/weight").as_slice()
    );
    assert_eq!(
        f.require_tensor("encoder.conv1.weight")
            .expect("conv1")
            .bytes,
        f16_of("encoder/conv1/weight").as_slice()
    );
    assert_eq!(
        f.require_tensor("decoder.blocks.0.mlp.2.weight")
            .expect("mlp")
            .bytes,
        f16_of("decoder/layer_0/ffn/linear_1/weight").as_slice()
    );
    // the key rows of the fused biases, dropped, are zeros
    let bias = m
        .require("encoder/layer_0/self_attention/linear_0/bias")
        .expect("bias")
        .to_f32()
        .expect("f16");
    assert!(bias[384..768].iter().all(|&b| b == 0.0));
    // every F16 tensor equals its CTranslate2 source bit for bit; the F32 ones widen it exactly
    let conv = ct2
        .model
        .require("encoder/conv2/bias")
        .expect("bias")
        .to_f32()
        .expect("f16");
    let got = dequantize_vec(
        QuantType::F32,
        f.require_tensor("encoder.conv2.bias").expect("b").bytes,
        384,
    )
    .expect("f32");
    assert_eq!(got, conv);
}

#[test]
#[ignore = "needs scripts/fetch-models.sh --whisper"]
fn converted_base_is_multilingual_with_an_empty_token() {
    let f = WhisperFile::open(&cache("ggml-base.bin")).expect("ggml-base.bin");
    let h = f.hparams;
    assert_eq!(
        (
            h.n_vocab,
            h.n_audio_state,
            h.n_audio_head,
            h.n_audio_layer,
            h.n_text_layer
        ),
        (51865, 512, 8, 6, 6)
    );
    assert!(h.is_multilingual());
    assert_eq!(f.vocab.n_languages, 99);
    // multilingual.tiktoken's id 50256 is the empty token whisper.cpp warns about
    assert_eq!(f.vocab.pieces.len(), 50257);
    assert!(f.vocab.pieces[50256].is_empty());
    let q8 = WhisperFile::open(&cache("ggml-base-q8_0.bin")).expect("ggml-base-q8_0.bin");
    assert_eq!(
        (q8.ftype, q8.qntvr, q8.weight_type),
        (7, 2, QuantType::Q8_0)
    );
    assert_eq!(
        q8.require_tensor("encoder.conv1.weight")
            .expect("conv")
            .qtype,
        QuantType::F16
    );
    assert_eq!(
        q8.require_tensor("decoder.token_embedding.weight")
            .expect("emb")
            .qtype,
        QuantType::Q8_0
    );
}

/// SHA-256 of `bytes` as lowercase hex, from coreutils' `sha256sum`.
fn sha256_hex(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(bytes)
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum output");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
#[ignore = "needs scripts/fetch-models.sh --whisper"]
fn converted_vocabularies_are_the_tiktoken_files_whisper_cpp_converts() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/whisper/tiktoken_vocab.json");
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    for (file, kind) in [
        ("ggml-tiny.en.bin", "gpt2"),
        ("ggml-base-q8_0.bin", "multilingual"),
    ] {
        let f = WhisperFile::open(&cache(file)).expect(file);
        let want = &fx["vocab"][kind];
        assert_eq!(
            Some(f.vocab.pieces.len() as u64),
            want["n_tokens"].as_u64(),
            "{file}"
        );
        let section: Vec<u8> = f
            .vocab
            .pieces
            .iter()
            .flat_map(|p| {
                (p.len() as u32)
                    .to_le_bytes()
                    .into_iter()
                    .chain(p.iter().copied())
            })
            .collect();
        assert_eq!(
            Some(sha256_hex(&section).as_str()),
            want["sha256_len_prefixed"].as_str(),
            "{file}"
        );
    }
}
