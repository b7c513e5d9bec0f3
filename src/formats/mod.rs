//! Model file formats: the GGUF reader (zero-copy over memmap2) and the GGUF
//! writer used by tests and `combs synth`.

pub mod gguf;
pub mod gguf_writer;

pub use gguf::{GgufFile, MetaArray, MetaValue, TensorInfo, ValueType};
pub use gguf_writer::GgufWriter;
