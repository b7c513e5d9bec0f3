//! whisper.cpp model files: the writer and reader round-trip random models
//! with every tensor type, and every malformed file (truncated at any
//! section boundary or random point, corrupted counts, dimensions, types and
//! names, duplicate, missing and unknown tensors) is an error, never a panic.

mod common;

use combs::ModelError;
use combs::formats::whisper_bin::{
    TensorRole, WhisperBinWriter, WhisperFile, expected_tensors, ftype_of_weight_type,
};
use combs::models::speech::{N_FFT, WhisperHparams};
use combs::quant::{QuantType, quantize};
use common::Rng;

const N_BINS: usize = N_FFT / 2 + 1;

/// Small dimensions with a real vocabulary size (multilingual or not).
fn small_hparams(rng: &mut Rng) -> WhisperHparams {
    let n_state = 64;
    WhisperHparams {
        n_vocab: if rng.below(2) == 0 { 51864 } else { 51865 },
        n_audio_ctx: 6,
        n_audio_state: n_state,
        n_audio_head: 4,
        n_audio_layer: 1 + rng.below(2),
        n_text_ctx: 5,
        n_text_state: n_state,
        n_text_head: 2,
        n_text_layer: 1 + rng.below(2),
        n_mels: 8,
    }
}

const MATRIX_TYPES: [QuantType; 7] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
];

/// What was written, to compare with what is read.
struct Written {
    hparams: WhisperHparams,
    weight_type: QuantType,
    filters: Vec<f32>,
    words: Vec<Vec<u8>>,
    tensors: Vec<(String, QuantType, Vec<usize>, Vec<u8>)>,
}

/// A random model: matrices cycle through every type (starting at a random
/// one), conv kernels F16 or F32, the rest F32.
fn random_model(rng: &mut Rng, weight_type: QuantType) -> Written {
    let hparams = small_hparams(rng);
    let filters: Vec<f32> = (0..hparams.n_mels * N_BINS).map(|_| rng.f32()).collect();
    let n_words = 1 + rng.below(300);
    let words: Vec<Vec<u8>> = (0..n_words)
        .map(|_| {
            let mut w = vec![0u8; rng.below(12)];
            rng.fill(&mut w);
            w
        })
        .collect();
    let mut k = rng.below(MATRIX_TYPES.len());
    let tensors = expected_tensors(&hparams)
        .into_iter()
        .map(|e| {
            let qtype = match e.role {
                TensorRole::Small => QuantType::F32,
                TensorRole::Conv => [QuantType::F16, QuantType::F32][rng.below(2)],
                TensorRole::Matrix => {
                    k += 1;
                    MATRIX_TYPES[k % MATRIX_TYPES.len()]
                }
            };
            let n: usize = e.ne.iter().product();
            let bytes = quantize(qtype, &rng.normals(n, 0.5)).expect("quantize");
            (e.name, qtype, e.ne, bytes)
        })
        .collect();
    Written {
        hparams,
        weight_type,
        filters,
        words,
        tensors,
    }
}

fn write(m: &Written) -> Vec<u8> {
    let mut w = WhisperBinWriter::new(m.hparams, m.weight_type, m.filters.clone(), m.words.clone())
        .expect("writer");
    for (name, qtype, ne, bytes) in &m.tensors {
        w.add_tensor(name, *qtype, ne, bytes.clone())
            .expect("add tensor");
    }
    w.to_bytes()
}

#[test]
fn whisper_bin_round_trip_every_type() {
    let mut rng = Rng::fresh("whisper_bin_round_trip_every_type");
    for wt in MATRIX_TYPES {
        let m = random_model(&mut rng, wt);
        let f = WhisperFile::from_bytes(write(&m)).expect("written file reads back");
        assert_eq!(f.hparams, m.hparams);
        assert_eq!(f.weight_type, wt);
        assert_eq!(f.ftype, ftype_of_weight_type(wt));
        assert_eq!(f.qntvr, if wt.is_dense() { 0 } else { 2 });
        assert_eq!(f.mel_filters, m.filters);
        assert_eq!(f.vocab.pieces, m.words);
        assert_eq!(f.vocab.n_vocab, m.hparams.n_vocab);
        assert_eq!(f.tensors().len(), m.tensors.len());
        for ((name, qtype, ne, bytes), t) in m.tensors.iter().zip(f.tensors()) {
            assert_eq!(t.name, name);
            assert_eq!(t.qtype, *qtype, "{name}");
            assert_eq!(t.ne, ne.as_slice(), "{name}");
            assert_eq!(t.bytes, bytes.as_slice(), "{name}");
            let by_name = f.tensor(name).expect("lookup by name");
            assert_eq!(by_name, t);
        }
        assert!(f.tensor("no.such.tensor").is_none());
        assert!(matches!(
            f.require_tensor("no.such.tensor"),
            Err(ModelError::MissingTensor { .. })
        ));
    }
}

#[test]
fn whisper_bin_open_reads_a_file_on_disk() {
    let mut rng = Rng::fresh("whisper_bin_open_reads_a_file_on_disk");
    let m = random_model(&mut rng, QuantType::Q8_0);
    let dir = std::env::temp_dir().join(format!("combs-wbin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("model.bin");
    let mut w = WhisperBinWriter::new(m.hparams, m.weight_type, m.filters.clone(), m.words.clone())
        .expect("writer");
    for (name, qtype, ne, bytes) in &m.tensors {
        w.add_tensor(name, *qtype, ne, bytes.clone()).expect("add");
    }
    w.write_file(&path).expect("write file");
    let f = WhisperFile::open(&path).expect("open");
    assert_eq!(f.data(), write(&m).as_slice());
    std::fs::write(&path, b"").expect("truncate");
    assert!(matches!(
        WhisperFile::open(&path),
        Err(ModelError::Format { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(
        WhisperFile::open(&path),
        Err(ModelError::Io { .. })
    ));
}

/// Byte offsets where one part of the file ends and the next begins.
fn section_boundaries(m: &Written) -> Vec<usize> {
    let mut b = vec![0, 4, 4 + 40, 4 + 44];
    let mut at = 4 + 44 + 8;
    b.push(at);
    at += m.filters.len() * 4;
    b.push(at);
    at += 4;
    b.push(at);
    for w in &m.words {
        at += 4;
        b.push(at);
        at += w.len();
        b.push(at);
    }
    for (name, _, ne, bytes) in &m.tensors {
        at += 12;
        b.push(at);
        at += 4 * ne.len();
        b.push(at);
        at += name.len();
        b.push(at);
        at += bytes.len();
        b.push(at);
    }
    b
}

#[test]
fn whisper_bin_truncated_anywhere_is_an_error() {
    let mut rng = Rng::fresh("whisper_bin_truncated_anywhere_is_an_error");
    let m = random_model(&mut rng, QuantType::Q4_0);
    let bytes = write(&m);
    let boundaries = section_boundaries(&m);
    assert_eq!(boundaries.last(), Some(&bytes.len()));
    let mut cuts: Vec<usize> = boundaries
        .iter()
        .flat_map(|&b| [b.saturating_sub(1), b, b + 1])
        .filter(|&c| c < bytes.len())
        .collect();
    cuts.extend((0..200).map(|_| rng.below(bytes.len())));
    for cut in cuts {
        let r = WhisperFile::from_bytes(bytes[..cut].to_vec());
        assert!(
            r.is_err(),
            "file cut at {cut} of {} was accepted",
            bytes.len()
        );
    }
    // and a few bytes too many: half a tensor header
    let mut long = bytes.clone();
    long.extend_from_slice(&[1, 0, 0, 0, 5]);
    assert!(WhisperFile::from_bytes(long).is_err());
}

/// Rewrites the i32 at `at`.
fn poke(bytes: &[u8], at: usize, v: i32) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    b
}

fn is_format(r: Result<WhisperFile, ModelError>) -> bool {
    matches!(
        r,
        Err(ModelError::Format { .. }
            | ModelError::Shape { .. }
            | ModelError::MissingTensor { .. }
            | ModelError::UnsupportedTensorType { .. })
    )
}

#[test]
fn whisper_bin_corrupt_header_fields_are_errors() {
    let mut rng = Rng::fresh("whisper_bin_corrupt_header_fields_are_errors");
    let m = random_model(&mut rng, QuantType::F16);
    let bytes = write(&m);
    let bad = |b: Vec<u8>, what: &str| assert!(is_format(WhisperFile::from_bytes(b)), "{what}");
    bad(poke(&bytes, 0, 0x6767_6d6d), "bad magic");
    // hparams: negative, zero, absurd, inconsistent
    for field in 0..10 {
        let at = 4 + 4 * field;
        bad(poke(&bytes, at, -1), "negative hparam");
        bad(poke(&bytes, at, 0), "zero hparam");
        bad(poke(&bytes, at, i32::MAX), "absurd hparam");
    }
    bad(
        poke(&bytes, 4, 50000),
        "n_vocab below any Whisper vocabulary",
    );
    bad(poke(&bytes, 4 + 4 * 6, 96), "n_text_state != n_audio_state");
    bad(poke(&bytes, 4 + 4 * 3, 5), "heads do not divide the width");
    bad(
        poke(&bytes, 4 + 4 * 4, 1000),
        "more layers than the file holds",
    );
    // ftype: unknown, negative, Q4_1_SOME_F16 (whisper.cpp refuses it too)
    for ftype in [-1, 5, 4, 99, 2005] {
        bad(poke(&bytes, 44, ftype), "bad ftype");
    }
    // filters of the wrong shape
    bad(poke(&bytes, 48, m.hparams.n_mels as i32 + 1), "filter rows");
    bad(poke(&bytes, 52, 200), "filter columns");
    // vocabulary: more words than n_vocab, more than the file, negative, a huge token
    let vocab_at = 56 + m.filters.len() * 4;
    bad(poke(&bytes, vocab_at, 60000), "more words than n_vocab");
    bad(poke(&bytes, vocab_at, -3), "negative word count");
    bad(poke(&bytes, vocab_at + 4, 0x7fff_ffff), "huge token");
    bad(poke(&bytes, vocab_at + 4, -1), "token length past the end");
}

/// Offset of the first tensor header.
fn tensors_at(m: &Written) -> usize {
    56 + m.filters.len() * 4 + 4 + m.words.iter().map(|w| 4 + w.len()).sum::<usize>()
}

#[test]
fn whisper_bin_corrupt_tensor_headers_are_errors() {
    let mut rng = Rng::fresh("whisper_bin_corrupt_tensor_headers_are_errors");
    let m = random_model(&mut rng, QuantType::Q8_0);
    let bytes = write(&m);
    let t0 = tensors_at(&m);
    let bad = |b: Vec<u8>, what: &str| assert!(is_format(WhisperFile::from_bytes(b)), "{what}");
    bad(poke(&bytes, t0, 5), "n_dims 5");
    bad(poke(&bytes, t0, -1), "n_dims negative");
    bad(poke(&bytes, t0, 3), "n_dims 3 for a 2-D tensor");
    bad(poke(&bytes, t0 + 4, 0), "empty name");
    bad(poke(&bytes, t0 + 4, 1 << 30), "name longer than the file");
    bad(poke(&bytes, t0 + 4, 27), "name length off by one");
    for ttype in [-1, 4, 9, 16, 99, 1 << 20] {
        bad(poke(&bytes, t0 + 8, ttype), "bad tensor type");
    }
    bad(poke(&bytes, t0 + 8, 1), "F16 positional embedding");
    bad(poke(&bytes, t0 + 12, 0), "zero dimension");
    bad(poke(&bytes, t0 + 12, -64), "negative dimension");
    bad(poke(&bytes, t0 + 12, 65), "wrong dimension");
    let mut renamed = bytes.clone();
    renamed[t0 + 20] = b'X'; // "encoder.positional_embedding" -> "Xncoder..."
    bad(renamed, "unknown tensor name");
    let mut non_utf8 = bytes.clone();
    non_utf8[t0 + 20] = 0xff;
    bad(non_utf8, "tensor name not UTF-8");
}

fn rewrite(
    m: &Written,
    edit: impl FnOnce(&mut Vec<(String, QuantType, Vec<usize>, Vec<u8>)>),
) -> Vec<u8> {
    let mut tensors = m.tensors.clone();
    edit(&mut tensors);
    let mut w = WhisperBinWriter::new(m.hparams, m.weight_type, m.filters.clone(), m.words.clone())
        .expect("writer");
    for (name, qtype, ne, bytes) in tensors {
        w.add_tensor(&name, qtype, &ne, bytes).expect("add");
    }
    w.to_bytes()
}

#[test]
fn whisper_bin_tensor_table_errors() {
    let mut rng = Rng::fresh("whisper_bin_tensor_table_errors");
    let m = random_model(&mut rng, QuantType::F16);
    let n = m.tensors.len();
    let missing = rewrite(&m, |t| {
        t.remove(rng.below(n));
    });
    assert!(matches!(
        WhisperFile::from_bytes(missing),
        Err(ModelError::MissingTensor { .. })
    ));
    let i = rng.below(n);
    let duplicate = rewrite(&m, |t| t.push(t[i].clone()));
    assert!(matches!(
        WhisperFile::from_bytes(duplicate),
        Err(ModelError::Format { .. })
    ));
    let extra = rewrite(&m, |t| {
        t.push((
            "decoder.blocks.99.attn.query.weight".into(),
            QuantType::F32,
            vec![1],
            vec![0; 4],
        ))
    });
    assert!(is_format(WhisperFile::from_bytes(extra)));
    // a norm stored as F16, which whisper.cpp's size check refuses
    let f16_norm = rewrite(&m, |t| {
        let k = t
            .iter()
            .position(|x| x.0 == "encoder.ln_post.weight")
            .expect("ln_post");
        let n = t[k].2[0];
        t[k].1 = QuantType::F16;
        t[k].3 = quantize(QuantType::F16, &vec![1.0; n]).expect("f16");
    });
    assert!(is_format(WhisperFile::from_bytes(f16_norm)));
    // transposed matrix
    let transposed = rewrite(&m, |t| {
        let k = t
            .iter()
            .position(|x| x.0 == "encoder.blocks.0.mlp.0.weight")
            .expect("mlp");
        t[k].2.reverse();
        let n: usize = t[k].2.iter().product();
        t[k].1 = QuantType::F32;
        t[k].3 = vec![0; 4 * n];
    });
    assert!(matches!(
        WhisperFile::from_bytes(transposed),
        Err(ModelError::Shape { .. })
    ));
    // reordering is fine: whisper.cpp looks tensors up by name
    let shuffled = rewrite(&m, |t| t.reverse());
    let f = WhisperFile::from_bytes(shuffled).expect("any tensor order");
    assert_eq!(
        f.tensors().next().map(|t| t.name),
        m.tensors.last().map(|t| t.0.as_str())
    );
}

#[test]
fn whisper_bin_random_byte_flips_never_panic() {
    let mut rng = Rng::fresh("whisper_bin_random_byte_flips_never_panic");
    let m = random_model(&mut rng, QuantType::Q5_1);
    let bytes = write(&m);
    let head = tensors_at(&m) + 2000;
    for _ in 0..300 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(head.min(b.len()));
            b[at] = rng.next_u64() as u8;
        }
        // Either outcome is fine; what matters is no panic and, when it
        // opens, views that stay inside the file.
        if let Ok(f) = WhisperFile::from_bytes(b) {
            let total: usize = f.tensors().map(|t| t.bytes.len()).sum();
            assert!(total <= f.data().len());
        }
    }
}
