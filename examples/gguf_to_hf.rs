//! Writes a Llama-family GGUF file (byte-level BPE vocabulary) as a Hugging
//! Face directory with F16 safetensors: `cargo run --release --example
//! gguf_to_hf -- IN.gguf OUT_DIR`. Used to make SmolLM2's real weights in
//! safetensors form for the slow perplexity check (README, "Hugging Face
//! model directories").

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let (Some(input), Some(out)) = (args.next(), args.next()) else {
        return Err("usage: gguf_to_hf IN.gguf OUT_DIR".into());
    };
    let g = combs::formats::gguf::GgufFile::open(&PathBuf::from(input))?;
    combs::models::hf::export::export_llama_f16(&g, &PathBuf::from(&out))?;
    println!("wrote {}", PathBuf::from(out).display());
    Ok(())
}
