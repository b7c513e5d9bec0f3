//! Images for vision-language models: the preprocessing settings a
//! projector file states ([`PreprocessConfig`]) and the normalized tiles
//! an image becomes ([`ImageTiles`]), which the vision encoder takes.

pub mod config;
pub mod tiles;

pub use config::PreprocessConfig;
pub use tiles::ImageTiles;
