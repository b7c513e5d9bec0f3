//! GGUF reader and writer: round trips of every value type and of tensors,
//! the typed getters, malformed files (each must be a `ModelError`, never a
//! panic), and the two real models from `scripts/fetch-models.sh`.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use combs::ModelError;
use combs::formats::gguf::{GgufFile, MetaArray, MetaValue, TensorInfo};
use combs::formats::gguf_writer::GgufWriter;
use combs::quant::QuantType;
use common::Rng;

// ---------------------------------------------------------------- helpers

/// Q8_0 / F32 / Q4_K / IQ2_XXS type ids.
const Q8_0: u32 = 8;
const F32: u32 = 0;
const Q4_K: u32 = 12;
const IQ2_XXS: u32 = 16;

fn bytes_of(rng: &mut Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v);
    v
}

/// A small valid file whose fields the corruption tests patch.
fn sample(rng: &mut Rng) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("general.name", "tiny").unwrap();
    w.add("test.aaa", 7u32).unwrap();
    w.add("test.bbb", 8u32).unwrap();
    w.add("test.array", vec![1u32, 2, 3]).unwrap();
    w.add("test.strs", vec!["a", "bc"]).unwrap();
    w.add("test.flag", true).unwrap();
    w.add_tensor("tok_embd.weight", Q8_0, &[64, 4], bytes_of(rng, 8 * 34))
        .unwrap();
    w.add_tensor("blk.0.attn_q.weight", F32, &[8, 8], bytes_of(rng, 256))
        .unwrap();
    w.add_tensor("blk.0.attn_k.weight", F32, &[8, 2], bytes_of(rng, 64))
        .unwrap();
    w.add_tensor("blk.0.ffn_up.weight", Q4_K, &[256, 2], bytes_of(rng, 288))
        .unwrap();
    w.add_tensor("output_norm.weight", F32, &[8], bytes_of(rng, 32))
        .unwrap();
    w.to_bytes()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{:?} not in file", String::from_utf8_lossy(needle)))
}

/// Offset just past a GGUF string `s` (its u64 length then bytes) in `b`.
fn after_string(b: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(b, &needle) + needle.len()
}

/// Positions of a tensor info's fields: (n_dims, first dim, type, offset).
fn tensor_fields(b: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let n_dims_at = after_string(b, name);
    let n_dims = u32::from_le_bytes(b[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    let dims_at = n_dims_at + 4;
    let type_at = dims_at + 8 * n_dims;
    (n_dims_at, dims_at, type_at, type_at + 4)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Parses `b`, which must fail with a Format error whose reason contains `want`.
fn expect_format(b: Vec<u8>, want: &str) {
    match GgufFile::from_bytes(b) {
        Ok(_) => panic!("malformed file accepted (expected error containing {want:?})"),
        Err(ModelError::Format { format, reason, .. }) => {
            assert_eq!(format, "GGUF");
            assert!(
                reason.contains(want),
                "error {reason:?} does not mention {want:?}"
            );
        }
        Err(e) => panic!("expected a Format error containing {want:?}, got {e:?}"),
    }
}

fn assert_malformed(r: combs::Result<GgufFile>, context: &str) {
    match r {
        Ok(_) => panic!("{context}: malformed file accepted"),
        Err(ModelError::Format { .. } | ModelError::Metadata { .. }) => {}
        Err(e) => panic!("{context}: expected a Format or Metadata error, got {e:?}"),
    }
}

/// The end of the last tensor's data: cutting the file anywhere before it is an error.
fn required_len(g: &GgufFile) -> usize {
    g.tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap_or(g.data_offset()) as usize
}

// ---------------------------------------------------------------- round trips

fn every_value() -> Vec<(String, MetaValue)> {
    let nested = MetaArray::Array(vec![
        MetaArray::U32(vec![1, 2]),
        MetaArray::Str(vec!["x".into()]),
        MetaArray::Array(vec![MetaArray::F64(vec![0.5]), MetaArray::Bool(vec![])]),
        MetaArray::I8(vec![]),
    ]);
    let v: Vec<(&str, MetaValue)> = vec![
        ("v.u8", MetaValue::U8(255)),
        ("v.i8", MetaValue::I8(-128)),
        ("v.u16", MetaValue::U16(65535)),
        ("v.i16", MetaValue::I16(-32768)),
        ("v.u32", MetaValue::U32(u32::MAX)),
        ("v.i32", MetaValue::I32(i32::MIN)),
        ("v.u64", MetaValue::U64(u64::MAX)),
        ("v.i64", MetaValue::I64(i64::MIN)),
        ("v.f32", MetaValue::F32(-1.5e-7)),
        ("v.f32_inf", MetaValue::F32(f32::INFINITY)),
        ("v.f64", MetaValue::F64(std::f64::consts::PI)),
        ("v.true", MetaValue::Bool(true)),
        ("v.false", MetaValue::Bool(false)),
        ("v.str", MetaValue::Str("héllo ▁wörld\n{% if %}".into())),
        ("v.empty_str", MetaValue::Str(String::new())),
        ("v.bytes", MetaValue::Bytes(vec![0xff, 0xfe, b'a', 0x80])),
        ("a.u8", vec![0u8, 1, 255].into()),
        ("a.i8", vec![-1i8, 0, 127].into()),
        ("a.u16", vec![1u16, 65535].into()),
        ("a.i16", vec![-300i16, 300].into()),
        ("a.u32", vec![0u32, u32::MAX].into()),
        ("a.i32", vec![-5i32, 5, i32::MAX].into()),
        ("a.u64", vec![u64::MAX, 0].into()),
        ("a.i64", vec![i64::MIN, 1].into()),
        ("a.f32", vec![0.25f32, -0.0, f32::MAX].into()),
        ("a.f64", vec![1e300f64, -2.5].into()),
        ("a.bool", vec![true, false, true].into()),
        ("a.str", vec!["<s>", "", "▁the", "Ġworld"].into()),
        (
            "a.str_bytes",
            MetaArray::StrBytes(vec![b"ok".to_vec(), vec![0xe2, 0x96], vec![]]).into(),
        ),
        ("a.empty_u32", MetaArray::U32(vec![]).into()),
        ("a.empty_str", MetaArray::Str(vec![]).into()),
        ("a.nested", nested.into()),
    ];
    v.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

#[test]
fn gguf_round_trips_every_value_type() {
    let values = every_value();
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add(k.clone(), v.clone()).unwrap();
    }
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata(), values.as_slice());
    for (k, v) in &values {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    assert!(g.get("v.nope").is_none());
    assert!(g.tensors().is_empty());
}

#[test]
fn gguf_round_trips_tensors_with_data() {
    let mut rng = Rng::fresh("gguf_round_trips_tensors_with_data");
    let specs: Vec<(&str, u32, Vec<u64>)> = vec![
        ("a.f32", F32, vec![3]),
        ("b.q8_0", Q8_0, vec![64, 3, 2]),
        ("c.q4_k", Q4_K, vec![512, 1, 1, 2]),
        ("d.iq2_xxs", IQ2_XXS, vec![256, 2]),
        ("e.empty", F32, vec![0, 7]),
        ("f.scalar", F32, vec![]),
    ];
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    let mut datas = Vec::new();
    for (name, ty, dims) in &specs {
        let n: u64 = dims.iter().product();
        let (blk, bb) = combs::quant::types::ggml_block_geometry(*ty).unwrap();
        let data = bytes_of(&mut rng, (n as usize / blk) * bb);
        w.add_tensor(*name, *ty, dims, data.clone()).unwrap();
        datas.push(data);
    }
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.tensors().len(), specs.len());
    for (t, ((name, ty, dims), data)) in g.tensors().iter().zip(specs.iter().zip(&datas)) {
        assert_eq!(&t.name, name);
        assert_eq!(t.ggml_type, *ty);
        assert_eq!(&t.dims, dims);
        assert_eq!(t.n_elements, dims.iter().product::<u64>());
        assert_eq!(t.n_bytes as usize, data.len());
        assert_eq!((t.offset - g.data_offset()) % g.alignment(), 0);
        assert_eq!(g.tensor_data(t), data.as_slice(), "{name}");
        assert_eq!(g.tensor(name), Some(t));
    }
    assert_eq!(g.tensor("b.q8_0").unwrap().qtype, Some(QuantType::Q8_0));
    let iq = g.tensor("d.iq2_xxs").unwrap();
    assert_eq!(iq.qtype, None, "IQ2_XXS is listed but not runnable");
    assert_eq!(iq.type_name(), "IQ2_XXS");
    assert!(g.tensor("nope").is_none());
    assert!(matches!(
        g.require_tensor("nope"),
        Err(ModelError::MissingTensor { .. })
    ));
    // A TensorInfo that does not belong to the file yields an empty view, not a panic.
    let alien = TensorInfo {
        name: "x".into(),
        dims: vec![1],
        ggml_type: 0,
        qtype: Some(QuantType::F32),
        offset: u64::MAX - 1,
        n_bytes: 4,
        n_elements: 1,
    };
    assert!(g.tensor_data(&alien).is_empty());
}

#[test]
fn gguf_custom_alignment_round_trips() {
    let mut rng = Rng::fresh("gguf_custom_alignment_round_trips");
    for align in [1u32, 8, 64, 4096] {
        let mut w = GgufWriter::new();
        w.add("general.alignment", align).unwrap();
        w.add_tensor("a", F32, &[3], bytes_of(&mut rng, 12))
            .unwrap();
        w.add_tensor("b", F32, &[5], bytes_of(&mut rng, 20))
            .unwrap();
        let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.alignment(), u64::from(align));
        assert_eq!(g.data_offset() % u64::from(align), 0);
        for t in g.tensors() {
            assert_eq!(t.offset % u64::from(align), 0);
        }
    }
    assert!(GgufWriter::new().add("general.alignment", 0u32).is_err());
    assert!(GgufWriter::new().add("general.alignment", 48u32).is_err());
    assert!(GgufWriter::new().add("general.alignment", 32u64).is_err());
}

#[test]
fn gguf_writer_rejects_inconsistent_input() {
    let mut w = GgufWriter::new();
    w.add("k", 1u8).unwrap();
    assert!(w.add("k", 2u8).is_err(), "duplicate key");
    w.add_tensor("t", F32, &[2], vec![0; 8]).unwrap();
    assert!(
        w.add_tensor("t", F32, &[2], vec![0; 8]).is_err(),
        "duplicate name"
    );
    assert!(
        w.add_tensor("u", F32, &[2], vec![0; 7]).is_err(),
        "wrong length"
    );
    assert!(
        w.add_tensor("v", Q8_0, &[16], vec![0; 17]).is_err(),
        "partial block"
    );
    assert!(
        w.add_tensor("w", 1000, &[1], vec![0; 1]).is_err(),
        "unknown type"
    );
    assert!(
        w.add_tensor("x", F32, &[1, 1, 1, 1, 1], vec![0; 4])
            .is_err(),
        "5 dims"
    );
    assert!(
        w.add_tensor("y", F32, &[u64::MAX, 2], vec![]).is_err(),
        "overflow"
    );
}

#[test]
fn gguf_accepts_version_2() {
    let mut b = sample(&mut Rng::fresh("gguf_accepts_version_2"));
    put_u32(&mut b, 4, 2);
    let g = GgufFile::from_bytes(b).unwrap();
    assert_eq!(g.version(), 2);
    assert_eq!(g.architecture().unwrap(), "llama");
}

#[test]
fn gguf_typed_getters_coerce_and_reject() {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("u8", 200u8).unwrap();
    w.add("i8neg", -3i8).unwrap();
    w.add("u64big", u64::MAX).unwrap();
    w.add("i64", -(1i64 << 40)).unwrap();
    w.add("f32", 0.5f32).unwrap();
    w.add("f64", 0.25f64).unwrap();
    w.add("flag", false).unwrap();
    w.add("bytes", MetaValue::Bytes(vec![0xff])).unwrap();
    w.add("a.i32", vec![-1i32, 2]).unwrap();
    w.add("a.u8", vec![1u8, 2]).unwrap();
    w.add("a.u32", vec![7u32]).unwrap();
    w.add("a.f64", vec![1.5f64]).unwrap();
    w.add("a.str", vec!["x", "y"]).unwrap();
    w.add(
        "a.raw",
        MetaArray::StrBytes(vec![b"x".to_vec(), vec![0xc3]]),
    )
    .unwrap();
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();

    let is_metadata = |r: Result<(), ModelError>, what: &str| match r {
        Err(ModelError::Metadata { .. }) => {}
        other => panic!("{what}: expected a Metadata error, got {other:?}"),
    };
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.get_u32("u8").unwrap(), Some(200));
    assert_eq!(g.get_u64("u8").unwrap(), Some(200));
    assert_eq!(g.get_i64("i8neg").unwrap(), Some(-3));
    assert_eq!(g.get_i32("i8neg").unwrap(), Some(-3));
    assert_eq!(g.get_u64("u64big").unwrap(), Some(u64::MAX));
    assert_eq!(g.get_i64("i64").unwrap(), Some(-(1i64 << 40)));
    assert_eq!(g.get_f32("f32").unwrap(), Some(0.5));
    assert_eq!(g.get_f32("f64").unwrap(), Some(0.25));
    assert_eq!(g.get_f64("f32").unwrap(), Some(0.5));
    assert_eq!(g.get_bool("flag").unwrap(), Some(false));
    assert_eq!(g.get_bytes("bytes").unwrap(), Some(&[0xffu8][..]));
    assert_eq!(g.get_u32("absent").unwrap(), None);
    assert_eq!(g.get_str("absent").unwrap(), None);
    is_metadata(g.get_u64("i8neg").map(drop), "negative as u64");
    is_metadata(g.get_u32("u64big").map(drop), "u64::MAX as u32");
    is_metadata(g.get_i64("u64big").map(drop), "u64::MAX as i64");
    is_metadata(g.get_u32("f32").map(drop), "float as int");
    is_metadata(g.get_f32("u8").map(drop), "int as float");
    is_metadata(g.get_str("u8").map(drop), "int as str");
    is_metadata(g.get_str("bytes").map(drop), "bytes as str");
    is_metadata(g.get_bool("u8").map(drop), "int as bool");
    match g.require_u32("absent") {
        Err(ModelError::Metadata { key, reason }) => {
            assert_eq!(key, "absent");
            assert_eq!(reason, "missing");
        }
        other => panic!("expected missing, got {other:?}"),
    }
    is_metadata(g.require_str("absent").map(drop), "require_str");
    is_metadata(g.require_f32("absent").map(drop), "require_f32");
    is_metadata(g.require_bool("absent").map(drop), "require_bool");
    is_metadata(g.require_i64("absent").map(drop), "require_i64");
    is_metadata(g.require_u64("absent").map(drop), "require_u64");
    assert_eq!(g.require_u64("u8").unwrap(), 200);

    let i32s = g.get_arr_i32("a.i32").unwrap().unwrap();
    assert!(matches!(i32s, std::borrow::Cow::Borrowed(_)));
    assert_eq!(&*i32s, &[-1, 2]);
    assert_eq!(&*g.get_arr_i32("a.u8").unwrap().unwrap(), &[1, 2]);
    assert_eq!(&*g.get_arr_u32("a.u8").unwrap().unwrap(), &[1, 2]);
    assert_eq!(&*g.get_arr_u32("a.u32").unwrap().unwrap(), &[7]);
    is_metadata(g.get_arr_u32("a.i32").map(drop), "negative in u32 array");
    is_metadata(g.get_arr_i32("a.str").map(drop), "str array as ints");
    assert_eq!(&*g.get_arr_f32("a.f64").unwrap().unwrap(), &[1.5]);
    is_metadata(g.get_arr_f32("a.i32").map(drop), "int array as floats");
    is_metadata(g.get_arr_f32("u8").map(drop), "scalar as array");
    assert_eq!(g.get_arr_str("a.str").unwrap().unwrap(), &["x", "y"]);
    assert_eq!(g.require_arr_str("a.str").unwrap().len(), 2);
    is_metadata(g.get_arr_str("a.raw").map(drop), "non-UTF-8 array as str");
    assert_eq!(
        g.get_arr_bytes("a.str").unwrap().unwrap(),
        vec![&b"x"[..], &b"y"[..]]
    );
    assert_eq!(
        g.get_arr_bytes("a.raw").unwrap().unwrap(),
        vec![&b"x"[..], &[0xc3u8][..]]
    );
    is_metadata(g.get_arr_bytes("a.u8").map(drop), "u8 array as strings");
    assert!(g.get_arr_bytes("absent").unwrap().is_none());
}

#[test]
fn gguf_missing_architecture_is_metadata_error() {
    let g = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(matches!(g.architecture(), Err(ModelError::Metadata { .. })));
}

#[test]
fn gguf_zero_element_tensor_is_accepted() {
    let mut w = GgufWriter::new();
    w.add_tensor("empty", Q8_0, &[32, 0], vec![]).unwrap();
    w.add_tensor("next", F32, &[1], vec![1, 2, 3, 4]).unwrap();
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let t = g.tensor("empty").unwrap();
    assert_eq!((t.n_elements, t.n_bytes), (0, 0));
    assert!(g.tensor_data(t).is_empty());
    assert_eq!(g.tensor_data(g.tensor("next").unwrap()), &[1, 2, 3, 4]);
}

// ---------------------------------------------------------------- malformed headers

#[test]
fn gguf_rejects_bad_magic() {
    let mut b = sample(&mut Rng::seeded(1));
    b[0..4].copy_from_slice(b"GGML");
    expect_format(b, "bad magic");
    expect_format(b"GGU".to_vec(), "end of file");
    expect_format(Vec::new(), "end of file");
}

#[test]
fn gguf_rejects_version_1() {
    let mut b = sample(&mut Rng::seeded(1));
    put_u32(&mut b, 4, 1);
    expect_format(b, "version 1 is not supported");
}

#[test]
fn gguf_rejects_version_99() {
    let mut b = sample(&mut Rng::seeded(1));
    put_u32(&mut b, 4, 99);
    expect_format(b, "unsupported GGUF version 99");
}

#[test]
fn gguf_rejects_big_endian() {
    let mut b = sample(&mut Rng::seeded(1));
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    expect_format(b, "big-endian");
}

#[test]
fn gguf_rejects_huge_tensor_count() {
    let mut b = sample(&mut Rng::seeded(1));
    put_u64(&mut b, 8, 1 << 60);
    expect_format(b.clone(), "tensor count");
    put_u64(&mut b, 8, u64::MAX);
    expect_format(b, "tensor count");
}

#[test]
fn gguf_rejects_huge_kv_count() {
    let mut b = sample(&mut Rng::seeded(1));
    put_u64(&mut b, 16, 1 << 60);
    expect_format(b.clone(), "metadata count");
    put_u64(&mut b, 16, u64::MAX);
    expect_format(b, "metadata count");
}

#[test]
fn gguf_rejects_huge_string_length() {
    let base = sample(&mut Rng::seeded(1));
    // The first key's length.
    let mut b = base.clone();
    assert_eq!(get_u64(&b, 24), "general.architecture".len() as u64);
    put_u64(&mut b, 24, 1 << 62);
    expect_format(b, "string length");
    // A string value's length.
    let mut b = base.clone();
    let at = after_string(&b, "general.name") + 4;
    put_u64(&mut b, at, 1 << 62);
    expect_format(b, "string length");
    // A tensor name's length.
    let mut b = base;
    let at = after_string(&b, "blk.0.attn_q.weight") - "blk.0.attn_q.weight".len() - 8;
    put_u64(&mut b, at, u64::MAX);
    expect_format(b, "string length");
}

#[test]
fn gguf_rejects_huge_array_length() {
    let base = sample(&mut Rng::seeded(1));
    for (key, n) in [
        ("test.array", 1u64 << 61),
        ("test.strs", 1 << 61),
        ("test.array", u64::MAX),
    ] {
        let mut b = base.clone();
        let at = after_string(&b, key) + 4 + 4;
        assert!(get_u64(&b, at) < 10);
        put_u64(&mut b, at, n);
        expect_format(b, "cannot fit");
    }
}

#[test]
fn gguf_rejects_unknown_value_type() {
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "test.aaa");
    put_u32(&mut b, at, 13);
    expect_format(b.clone(), "unknown value type id 13");
    // Unknown element type of an array.
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "test.array") + 4;
    put_u32(&mut b, at, 77);
    expect_format(b, "unknown value type id 77");
}

#[test]
fn gguf_rejects_bool_not_0_or_1() {
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "test.flag") + 4;
    assert_eq!(b[at], 1);
    b[at] = 2;
    expect_format(b, "bool");
}

#[test]
fn gguf_rejects_non_utf8_key() {
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "test.aaa") - 1;
    b[at] = 0xff;
    expect_format(b, "not valid UTF-8");
}

#[test]
fn gguf_rejects_deeply_nested_arrays() {
    let mut a = MetaArray::U8(vec![1]);
    for _ in 0..20 {
        a = MetaArray::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.add("deep", a).unwrap();
    expect_format(w.to_bytes(), "nested deeper");
}

#[test]
fn gguf_rejects_duplicate_keys() {
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "test.bbb") - 3;
    b[at..at + 3].copy_from_slice(b"aaa");
    expect_format(b, "duplicate metadata key `test.aaa`");
}

#[test]
fn gguf_rejects_bad_alignment() {
    for (value, bad) in [(0u32, true), (48, true), (3, true), (64, false)] {
        let mut w = GgufWriter::new();
        w.add("general.alignment", 32u32).unwrap();
        let mut b = w.to_bytes();
        let at = after_string(&b, "general.alignment") + 4;
        put_u32(&mut b, at, value);
        let r = GgufFile::from_bytes(b);
        if bad {
            assert!(
                matches!(r, Err(ModelError::Metadata { ref key, .. }) if key == "general.alignment"),
                "alignment {value}: {r:?}"
            );
        } else {
            assert_eq!(r.unwrap().alignment(), 64);
        }
    }
}

// ---------------------------------------------------------------- malformed tensor infos

#[test]
fn gguf_rejects_overflowing_dims() {
    let base = sample(&mut Rng::seeded(1));
    let (_, dims_at, _, _) = tensor_fields(&base, "blk.0.attn_q.weight");
    let mut b = base.clone();
    put_u64(&mut b, dims_at, 1 << 32);
    put_u64(&mut b, dims_at + 8, 1 << 32);
    expect_format(b, "overflow");
    let mut b = base.clone();
    put_u64(&mut b, dims_at, u64::MAX);
    expect_format(b, "int64");
    // Product fits in u64 but not in i64.
    let mut b = base;
    put_u64(&mut b, dims_at, 1 << 32);
    put_u64(&mut b, dims_at + 8, 1 << 31);
    expect_format(b, "overflow");
}

#[test]
fn gguf_rejects_too_many_dims() {
    let mut b = sample(&mut Rng::seeded(1));
    let (n_dims_at, _, _, _) = tensor_fields(&b, "blk.0.attn_q.weight");
    put_u32(&mut b, n_dims_at, 5);
    expect_format(b, "dimensions");
}

#[test]
fn gguf_rejects_unknown_type_id() {
    let mut b = sample(&mut Rng::seeded(1));
    let (_, _, type_at, _) = tensor_fields(&b, "blk.0.attn_q.weight");
    put_u32(&mut b, type_at, 1000);
    expect_format(b, "unknown ggml type id 1000");
}

#[test]
fn gguf_rejects_row_not_multiple_of_block() {
    let mut b = sample(&mut Rng::seeded(1));
    let (_, dims_at, _, _) = tensor_fields(&b, "tok_embd.weight");
    // Q8_0 [64, 4] -> [16, 16]: same element count, rows of half a block.
    put_u64(&mut b, dims_at, 16);
    put_u64(&mut b, dims_at + 8, 16);
    expect_format(b, "not a multiple of the Q8_0 block size 32");
}

#[test]
fn gguf_rejects_offset_past_end() {
    let base = sample(&mut Rng::seeded(1));
    for off in [1u64 << 40, u64::MAX - 31, 1 << 63] {
        let mut b = base.clone();
        let (_, _, _, off_at) = tensor_fields(&b, "output_norm.weight");
        put_u64(&mut b, off_at, off);
        expect_format(b, "past the end");
    }
    // Element count that makes the data run past the end.
    let mut b = base;
    let (_, dims_at, _, _) = tensor_fields(&b, "output_norm.weight");
    put_u64(&mut b, dims_at, 1 << 40);
    expect_format(b, "past the end");
}

#[test]
fn gguf_rejects_misaligned_offset() {
    let mut b = sample(&mut Rng::seeded(1));
    let (_, _, _, off_at) = tensor_fields(&b, "blk.0.ffn_up.weight");
    let off = get_u64(&b, off_at);
    put_u64(&mut b, off_at, off + 4);
    expect_format(b, "not a multiple of the alignment");
}

#[test]
fn gguf_rejects_overlapping_tensors() {
    let mut b = sample(&mut Rng::seeded(1));
    let (_, _, _, q_off) = tensor_fields(&b, "blk.0.attn_q.weight");
    let (_, _, _, up_off) = tensor_fields(&b, "blk.0.ffn_up.weight");
    let q = get_u64(&b, q_off);
    put_u64(&mut b, up_off, q + 32);
    expect_format(b, "overlap");
}

#[test]
fn gguf_rejects_duplicate_tensor_names() {
    let mut b = sample(&mut Rng::seeded(1));
    let at = after_string(&b, "blk.0.attn_k.weight") - "k.weight".len();
    b[at] = b'q';
    expect_format(b, "duplicate tensor name `blk.0.attn_q.weight`");
}

// ---------------------------------------------------------------- truncation and fuzzing

#[test]
fn gguf_rejects_truncation_at_every_header_offset() {
    let b = sample(&mut Rng::fresh(
        "gguf_rejects_truncation_at_every_header_offset",
    ));
    let g = GgufFile::from_bytes(b.clone()).unwrap();
    let header_end = (g.data_offset() as usize + 64).min(required_len(&g));
    for len in 0..header_end {
        assert_malformed(
            GgufFile::from_bytes(b[..len].to_vec()),
            &format!("truncated to {len} bytes"),
        );
    }
}

#[test]
fn gguf_rejects_truncation_at_sampled_offsets() {
    let mut rng = Rng::fresh("gguf_rejects_truncation_at_sampled_offsets");
    let b = sample(&mut rng);
    let g = GgufFile::from_bytes(b.clone()).unwrap();
    let need = required_len(&g);
    assert!(need <= b.len());
    for _ in 0..300 {
        let len = rng.below(need);
        assert_malformed(
            GgufFile::from_bytes(b[..len].to_vec()),
            &format!("truncated to {len} of {need} bytes"),
        );
    }
    // Cutting only the last tensor's trailing padding leaves a valid file.
    assert!(GgufFile::from_bytes(b[..need].to_vec()).is_ok());
}

#[test]
fn gguf_random_header_corruption_never_panics() {
    let mut rng = Rng::fresh("gguf_random_header_corruption_never_panics");
    let base = sample(&mut rng);
    let g = GgufFile::from_bytes(base.clone()).unwrap();
    let header = g.data_offset() as usize;
    for _ in 0..3000 {
        let mut b = base.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(header);
            b[at] = match rng.below(3) {
                0 => rng.next_u64() as u8,
                1 => 0xff,
                _ => b[at] ^ (1 << rng.below(8)),
            };
        }
        // Any outcome but a panic is fine; errors must be Format or Metadata.
        if let Err(e) = GgufFile::from_bytes(b) {
            assert!(
                matches!(e, ModelError::Format { .. } | ModelError::Metadata { .. }),
                "{e:?}"
            );
        }
    }
}

#[test]
fn gguf_open_missing_file_is_io_error() {
    let r = GgufFile::open(std::path::Path::new("/nonexistent/combs/model.gguf"));
    assert!(matches!(r, Err(ModelError::Io { .. })), "{r:?}");
}

#[test]
fn gguf_open_reads_a_written_file() {
    let mut rng = Rng::fresh("gguf_open_reads_a_written_file");
    let b = sample(&mut rng);
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gguf_reader_{}.gguf", std::process::id()));
    std::fs::write(&path, &b).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.data(), b.as_slice());
    assert_eq!(g.tensors().len(), 5);
    let empty = path.with_extension("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_malformed(GgufFile::open(&empty), "empty file");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&empty);
}

// ---------------------------------------------------------------- real models

/// A real model from the cache of `scripts/fetch-models.sh`; fails (never skips) when absent.
fn real_model(file: &str) -> PathBuf {
    let dir = std::env::var_os("COMBS_MODELS")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/combs/models")))
        .expect("neither COMBS_MODELS nor HOME is set");
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `bash scripts/fetch-models.sh` to download the test models",
        path.display()
    );
    path
}

#[test]
fn gguf_opens_real_smollm2() {
    let path = real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let t0 = Instant::now();
    let g = GgufFile::open(&path).unwrap();
    eprintln!("opened {} in {:?}", path.display(), t0.elapsed());
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.require_u32("llama.block_count").unwrap(), 30);
    assert_eq!(g.require_u64("llama.embedding_length").unwrap(), 576);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    assert_eq!(
        g.require_arr_str("tokenizer.ggml.tokens").unwrap().len(),
        49152
    );
    assert_eq!(
        g.get_arr_str("tokenizer.ggml.merges")
            .unwrap()
            .unwrap()
            .len(),
        48900
    );
    assert_eq!(
        g.get_arr_i32("tokenizer.ggml.token_type")
            .unwrap()
            .unwrap()
            .len(),
        49152
    );
    assert!(g.get_str("tokenizer.chat_template").unwrap().is_some());
    assert_eq!(g.tensors().len(), 272);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![576, 49152]);
    assert_eq!(emb.qtype, Some(QuantType::Q8_0));
    assert_eq!(g.tensor_data(emb).len() as u64, emb.n_bytes);
    assert_eq!(
        g.tensor("blk.0.attn_q.weight").unwrap().qtype,
        Some(QuantType::Q4_1)
    );
    assert!(g.tensors().iter().all(|t| t.qtype.is_some()));
}

#[test]
fn gguf_opens_real_gemma3_fast() {
    let path = real_model("gemma-3-270m-q4_k_m.gguf");
    let t0 = Instant::now();
    let g = GgufFile::open(&path).unwrap();
    let took = t0.elapsed();
    eprintln!("opened {} in {took:?}", path.display());
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(g.require_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(
        g.require_u32("gemma3.attention.sliding_window").unwrap(),
        512
    );
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), Some("llama"));
    let tokens = g.get_arr_bytes("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 262144);
    assert_eq!(tokens[2], b"<bos>");
    let scores = g.get_arr_f32("tokenizer.ggml.scores").unwrap().unwrap();
    assert!(matches!(scores, std::borrow::Cow::Borrowed(_)));
    assert_eq!(scores.len(), 262144);
    assert_eq!(g.tensors().len(), 236);
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, vec![640, 262144]);
    let types: std::collections::BTreeSet<_> = g.tensors().iter().map(|t| t.type_name()).collect();
    for ty in ["Q4_K", "Q5_0", "Q6_K", "Q8_0", "F32"] {
        assert!(types.contains(ty), "{ty} missing from {types:?}");
    }
    assert!(
        took.as_secs_f64() < 1.0,
        "opening the Gemma file took {took:?}; it must stay well under a second"
    );
}
