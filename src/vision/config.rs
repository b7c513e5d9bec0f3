//! `PreprocessConfig`: how an image is cut and normalized before the
//! vision encoder sees it, as the projector file (llama.cpp's `clip`
//! GGUF) states it: `clip.vision.image_size` (the tile side),
//! `clip.vision.preproc_image_size` (the longest edge an image is resized
//! to), `clip.vision.image_mean` and `clip.vision.image_std`.

/// The preprocessing of one vision encoder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PreprocessConfig {
    /// Side of a square tile in pixels (512 for SmolVLM-256M).
    pub tile_size: u32,
    /// The longest edge an image is resized to before tiling (2048 for
    /// SmolVLM-256M).
    pub longest_edge: u32,
    /// Per-channel mean subtracted after scaling to `[0, 1]` (RGB).
    pub mean: [f32; 3],
    /// Per-channel standard deviation divided by after the mean (RGB).
    pub std: [f32; 3],
}
