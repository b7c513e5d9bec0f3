//! Images in, vision-encoder input out, for SmolVLM (Idefics3): decoding
//! PNG, JPEG, WebP, GIF, BMP, TIFF and PNM files to RGB8 ([`decode`]), PIL-exact LANCZOS resizing ([`resize`]),
//! the tiling and normalization of transformers' Idefics3 image processor
//! ([`mod@preprocess`]), the `[1, 3, H, W]` tensor of a tile ([`tensor`]) and
//! the prompt text that stands for an image ([`prompt`]). Nothing here
//! touches a device.

pub mod decode;
pub mod image;
pub mod preprocess;
pub mod prompt;
pub mod resize;
pub mod tensor;

pub use decode::{decode_image, load_image};
pub use image::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, RgbImage};
pub use preprocess::{
    ImageTiles, MAX_RESIZED_SIDE, MAX_TILES_PER_SIDE, PreprocessConfig, preprocess,
    preprocess_ordered, resized_size, tile_grid, tiled_size,
};
pub use prompt::{
    FAKE_TOKEN_AROUND_IMAGE, GLOBAL_IMAGE_TOKEN, IMAGE_TOKEN, image_prompt_expansion,
};
pub use resize::{PassOrder, resize_lanczos, resize_lanczos_ordered};
pub use tensor::{PixelTensor, pixels_to_tensor};
