//! The GGUF reader on arbitrary bytes: header, metadata, tensor table; then
//! everything that reads a parsed file without a device: the architecture
//! spec, the tokenizer, its chat template, the requantizer's plan, and the
//! projector's and SmolVLM's hyperparameters.
#![no_main]

use combs::formats::{GgufFile, MetaValue};
use combs::models::ModelRegistry;
use combs::tokenizer::{ChatMessage, Tokenizer};

fn walk(g: &GgufFile) {
    for (key, value) in g.metadata() {
        // Every typed getter must answer (a value or an error) for every key.
        let _ = g.get_str(key);
        let _ = g.get_u64(key);
        let _ = g.get_i64(key);
        let _ = g.get_f32(key);
        let _ = g.get_f64(key);
        let _ = g.get_bool(key);
        let _ = g.get_arr_str(key);
        let _ = g.get_arr_bytes(key);
        let _ = g.get_arr_f32(key);
        let _ = g.get_arr_i32(key);
        let _ = g.get_arr_u32(key);
        if matches!(value, MetaValue::Array(_)) {
            let _ = g.get_arr(key);
        }
    }
    for t in g.tensors() {
        let data = g.tensor_data(t);
        assert!(data.len() as u64 <= g.data().len() as u64);
        let _ = t.type_name();
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(g) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    walk(&g);
    let _ = ModelRegistry::new().resolve(&g);
    let _ = combs::models::clip::ClipVisionHparams::from_gguf(&g);
    for ftype in [
        combs::quant::requantize::FileType::Q4_0,
        combs::quant::requantize::FileType::Q4KM,
    ] {
        let _ = combs::quant::requantize::plan(&g, ftype);
    }
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        let ids = tok.encode("Hello <|im_start|> wörld 日本 😀\n\t  x", true, true);
        if let Ok(ids) = ids {
            let _ = tok.decode(&ids);
        }
        let n = tok.n_vocab() as u32;
        for t in [0, 1, n / 2, n.saturating_sub(1), n, u32::MAX] {
            let _ = tok.token_to_piece(t);
            let _ = tok.is_eog(t);
        }
        let _ = tok.apply_chat_template(&[ChatMessage::new("user", "hi")], true);
    }
});
