//! Model file formats: the GGUF reader (zero-copy over memmap2), the GGUF
//! writer used by tests and `combs synth`, and the GGML tensor type table
//! both read, whisper.cpp's model files (`whisper_bin`) and CTranslate2
//! model directories (`ctranslate2`), and Hugging Face model directories
//! (`hf`: config.json, safetensors, tokenizer.json). Nothing here
//! depends on the `quant` module.

pub(crate) mod backing;
pub mod ctranslate2;
pub mod ggml_type;
pub mod gguf;
pub mod gguf_writer;
pub mod hf;
pub(crate) mod id_enum;
pub mod whisper_bin;

pub use gguf::{GgufFile, MetaArray, MetaValue, TensorInfo, ValueType};
pub use gguf_writer::GgufWriter;
