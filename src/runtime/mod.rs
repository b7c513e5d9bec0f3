//! The runtime: sessions (one sequence each), batched forward passes over
//! many sessions, sampling, and the generation loop that ties them to a
//! tokenizer.

pub mod batch;
pub mod generate;
pub mod kld;
pub mod kld_file;
pub mod model;
pub mod multimodal;
pub mod perplexity;
pub mod rng;
pub mod sampler;
pub mod session;
mod stages;
pub mod transcribe;

pub use batch::BatchRunner;
pub use generate::{GenerationStats, StopReason, generate};
pub use model::Model;
pub use multimodal::{EncodedImage, VisionModel};
pub use sampler::{Sampler, SamplerOptions};
pub use session::{Session, SessionOptions};
