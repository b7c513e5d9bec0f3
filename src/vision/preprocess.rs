//! Idefics3 / SmolVLM image preprocessing with image splitting, as
//! transformers' `Idefics3ImageProcessor` (PIL backend) does it and
//! llama.cpp's mtmd (`mtmd_image_preprocessor_idefics3`) copies:
//!
//! 1. resize so the longest edge is `longest_edge`, keeping the aspect
//!    ratio (the other side truncated, bumped to even, at least 1; both
//!    sides then capped at 4096 the same way); small images are scaled
//!    *up*;
//! 2. resize up to multiples of `tile_size` ("resize_for_vision_encoder");
//! 3. if either side is past one tile: row-major `tile_size`² crops, then
//!    the whole step-2 image resized to one tile (the global view, last);
//!    otherwise the step-2 image alone (one tile, `rows = cols = 0`);
//! 4. `x / 255` (in f64, stored as f32), then `(x - mean) / std` in f32,
//!    planar CHW.
//!
//! Every resize is PIL's LANCZOS on uint8 ([`super::resize`]), so the
//! tiles equal transformers' bit for bit (on Pillow 11.3, whose pass order
//! mtmd shares; [`preprocess_ordered`] takes Pillow 13's).
//!
//! Where transformers and mtmd differ, transformers is followed (it is the
//! model's own preprocessing; the tests compare against it):
//! - step 2: transformers rounds the long side up to a tile multiple, then
//!   derives the short side from the aspect ratio of the *new* long side
//!   (`int`, then rounded up to a multiple); mtmd rounds each side up
//!   directly. They agree whenever `longest_edge` is a multiple of
//!   `tile_size` (SmolVLM: 2048 and 512), and can differ by a tile row
//!   otherwise (e.g. Idefics3's 1456 and 364).
//! - an image that fits one tile: transformers gives the global view only
//!   (`rows = cols = 0`), mtmd a 1×1 grid plus the overview (never the
//!   case for SmolVLM, whose `longest_edge` is four tiles).
//! - a short side that step 2 would round to 0 (an aspect ratio past
//!   `tile_size : 1`) is one tile here, as mtmd has it; transformers fails
//!   there (PIL refuses a 0 size).

use std::borrow::Cow;

use rayon::prelude::*;

use super::image::RgbImage;
use super::resize::{PassOrder, resize_lanczos_ordered};
use super::tensor::PixelTensor;
use crate::error::{ModelError, Result};

/// transformers' `MAX_IMAGE_SIZE`: no side is resized past this in step 1.
pub const MAX_RESIZED_SIDE: u32 = 4096;

/// Most tiles along the longest edge a configuration may ask for
/// (SmolVLM and Idefics3 use 4): bounds the tile count, and so the memory,
/// that a projector file's values can make one image take.
pub const MAX_TILES_PER_SIDE: u32 = 64;

/// What the preprocessing needs from the projector: for SmolVLM these come
/// from the projector GGUF's `clip.vision.image_size` (`tile_size`),
/// `clip.vision.preproc_image_size` (`longest_edge`),
/// `clip.vision.image_mean` and `clip.vision.image_std`.
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessConfig {
    /// Side of a square tile in pixels (512 for SmolVLM).
    pub tile_size: u32,
    /// The longest edge images are resized to before tiling (2048 for
    /// SmolVLM-256M).
    pub longest_edge: u32,
    /// Per-channel mean subtracted after scaling to `[0, 1]`.
    pub mean: [f32; 3],
    /// Per-channel standard deviation divided by after the mean.
    pub std: [f32; 3],
}

impl PreprocessConfig {
    /// SmolVLM-256M/500M's values (`preprocessor_config.json`: 512-px
    /// tiles, longest edge 2048, mean and std 0.5).
    pub fn smolvlm() -> Self {
        PreprocessConfig {
            tile_size: 512,
            longest_edge: 2048,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }

    /// Checks the values are usable.
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a zero size, a tile or longest
    /// edge past [`MAX_RESIZED_SIDE`], more than [`MAX_TILES_PER_SIDE`]
    /// tiles along the longest edge, or a mean or std that is not finite
    /// (or a std of 0).
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("tile_size", self.tile_size),
            ("longest_edge", self.longest_edge),
        ] {
            if v == 0 || v > MAX_RESIZED_SIDE {
                return Err(ModelError::invalid(
                    name,
                    format!("{v} is outside 1..={MAX_RESIZED_SIDE}"),
                ));
            }
        }
        let per_side = self.longest_edge.div_ceil(self.tile_size);
        if per_side > MAX_TILES_PER_SIDE {
            return Err(ModelError::invalid(
                "tile_size",
                format!(
                    "{} px tiles cut a {} px edge into {per_side} (at most {MAX_TILES_PER_SIDE})",
                    self.tile_size, self.longest_edge
                ),
            ));
        }
        if self.mean.iter().any(|m| !m.is_finite()) {
            return Err(ModelError::invalid(
                "image_mean",
                format!("{:?} is not finite", self.mean),
            ));
        }
        if self.std.iter().any(|s| !s.is_finite() || *s == 0.0) {
            return Err(ModelError::invalid(
                "image_std",
                format!("{:?} must be finite and non-zero", self.std),
            ));
        }
        Ok(())
    }
}

/// A preprocessed image: the tiles the vision encoder reads, each planar
/// CHW f32 (`3 * tile_size * tile_size` values, normalized).
///
/// Order: the `rows * cols` grid tiles row-major, then the global view.
/// An image that fits one tile has `rows = cols = 0` and the global view
/// alone (transformers' convention, and the prompt's global-only form).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageTiles {
    /// Grid rows (0 when the image is the global view alone).
    pub rows: u32,
    /// Grid columns (0 when the image is the global view alone).
    pub cols: u32,
    /// Side of each tile in pixels.
    pub tile_size: u32,
    /// `rows * cols` grid tiles, then the global view.
    pub tiles: Vec<Vec<f32>>,
}

impl ImageTiles {
    /// Number of tiles, the global view included.
    pub fn len(&self) -> usize {
        self.tiles.len()
    }

    /// Always false for a preprocessed image (there is a global view).
    pub fn is_empty(&self) -> bool {
        self.tiles.is_empty()
    }

    /// Tile `i` (same order as [`ImageTiles::tiles`]) as a `[1, 3, H, W]`
    /// tensor (a copy).
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for an index past the tiles, or a
    /// tile of the wrong length.
    pub fn tensor(&self, i: usize) -> Result<PixelTensor> {
        let tile = self.tiles.get(i).ok_or_else(|| {
            ModelError::invalid("tile", format!("{i} is past the {} tiles", self.len()))
        })?;
        super::tensor::pixels_to_tensor(tile, self.tile_size, self.tile_size)
    }

    /// All tiles as `[1, 3, H, W]` tensors, moved (no copy).
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a tile of the wrong length.
    pub fn into_tensors(self) -> Result<Vec<PixelTensor>> {
        let side = self.tile_size;
        self.tiles
            .into_iter()
            .map(|t| PixelTensor::from_chw(t, side, side))
            .collect()
    }
}

/// Step 1's size as (width, height): transformers'
/// `_resize_output_size_rescale_to_max_len` then
/// `_resize_output_size_scale_below_upper_bound` at [`MAX_RESIZED_SIDE`].
pub fn resized_size(width: u32, height: u32, longest_edge: u32) -> (u32, u32) {
    let (mut w, mut h) = (width, height);
    let aspect = f64::from(w) / f64::from(h);
    if w >= h {
        w = longest_edge;
        h = (f64::from(w) / aspect) as u32;
        h += h % 2;
    } else {
        h = longest_edge;
        w = (f64::from(h) * aspect) as u32;
        w += w % 2;
    }
    let (w, h) = (w.max(1), h.max(1));
    // Below the upper bound: the side past it set to it, the other side
    // truncated from the aspect ratio (no even bump here).
    let aspect = f64::from(w) / f64::from(h);
    let (w, h) = if w >= h && w > MAX_RESIZED_SIDE {
        (
            MAX_RESIZED_SIDE,
            (f64::from(MAX_RESIZED_SIDE) / aspect) as u32,
        )
    } else if h > w && h > MAX_RESIZED_SIDE {
        (
            (f64::from(MAX_RESIZED_SIDE) * aspect) as u32,
            MAX_RESIZED_SIDE,
        )
    } else {
        (w, h)
    };
    (w.max(1), h.max(1))
}

/// Step 2's size as (width, height): transformers'
/// `resize_for_vision_encoder`, with a short side of 0 made one tile.
pub fn tiled_size(width: u32, height: u32, tile_size: u32) -> (u32, u32) {
    let up = |v: u32| v.div_ceil(tile_size).max(1) * tile_size;
    let aspect = f64::from(width) / f64::from(height);
    if width >= height {
        let w = up(width);
        (w, up((f64::from(w) / aspect) as u32))
    } else {
        let h = up(height);
        (up((f64::from(h) * aspect) as u32), h)
    }
}

/// The tile grid an image of this size gets as (rows, cols), without
/// preprocessing it: (0, 0) when it is the global view alone.
pub fn tile_grid(width: u32, height: u32, config: &PreprocessConfig) -> (u32, u32) {
    let (w1, h1) = resized_size(width, height, config.longest_edge);
    let (w2, h2) = tiled_size(w1, h1, config.tile_size);
    if w2 > config.tile_size || h2 > config.tile_size {
        (h2 / config.tile_size, w2 / config.tile_size)
    } else {
        (0, 0)
    }
}

/// Resizes, tiles and normalizes an image for the vision encoder.
///
/// # Errors
/// What [`PreprocessConfig::validate`] refuses.
pub fn preprocess(image: &RgbImage, config: &PreprocessConfig) -> Result<ImageTiles> {
    preprocess_ordered(image, config, PassOrder::HorizontalFirst)
}

/// [`preprocess`] with the resize pass order of a given Pillow (for
/// comparisons with transformers running on Pillow 13).
///
/// # Errors
/// What [`PreprocessConfig::validate`] refuses.
pub fn preprocess_ordered(
    image: &RgbImage,
    config: &PreprocessConfig,
    order: PassOrder,
) -> Result<ImageTiles> {
    config.validate()?;
    let tile = config.tile_size;
    let (w1, h1) = resized_size(image.width(), image.height(), config.longest_edge);
    let resized = resize_if_needed(Cow::Borrowed(image), w1, h1, order)?;
    let (w2, h2) = tiled_size(w1, h1, tile);
    let refined = resize_if_needed(resized, w2, h2, order)?;

    let lut = normalize_table(config);
    if w2 <= tile && h2 <= tile {
        let global = tile_chw(&refined, 0, 0, tile, &lut);
        return Ok(ImageTiles {
            rows: 0,
            cols: 0,
            tile_size: tile,
            tiles: vec![global],
        });
    }
    let (rows, cols) = (h2 / tile, w2 / tile);
    let global_img = resize_lanczos_ordered(&refined, tile, tile, order)?;
    let n = (rows * cols) as usize;
    let tiles: Vec<Vec<f32>> = (0..=n)
        .into_par_iter()
        .map(|i| {
            if i == n {
                tile_chw(&global_img, 0, 0, tile, &lut)
            } else {
                let (r, c) = (i as u32 / cols, i as u32 % cols);
                tile_chw(&refined, c * tile, r * tile, tile, &lut)
            }
        })
        .collect();
    Ok(ImageTiles {
        rows,
        cols,
        tile_size: tile,
        tiles,
    })
}

/// Each byte value's normalized f32 per channel: transformers' `rescale`
/// (`x.astype(float64) * (1/255)`, then cast to float32) followed by its
/// `normalize` (`(x - mean) / std` in float32). A table, because a tile has
/// 786k values and a byte only 256.
fn normalize_table(config: &PreprocessConfig) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        for (v, out) in table.iter_mut().enumerate() {
            let scaled = (v as f64 * (1.0 / 255.0)) as f32;
            *out = (scaled - config.mean[c]) / config.std[c];
        }
    }
    lut
}

/// The image at the given size, borrowed when it already has it (PIL
/// returns a copy then; a copy of 9 MiB is worth skipping).
fn resize_if_needed(
    image: Cow<'_, RgbImage>,
    width: u32,
    height: u32,
    order: PassOrder,
) -> Result<Cow<'_, RgbImage>> {
    if (image.width(), image.height()) == (width, height) {
        Ok(image)
    } else {
        Ok(Cow::Owned(resize_lanczos_ordered(
            &image, width, height, order,
        )?))
    }
}

/// The `side`² crop at (x0, y0) of `img`, normalized, planar CHW.
fn tile_chw(img: &RgbImage, x0: u32, y0: u32, side: u32, lut: &[[f32; 256]; 3]) -> Vec<f32> {
    let side = side as usize;
    let stride = img.width() as usize * 3;
    let mut out = Vec::with_capacity(3 * side * side);
    for (c, table) in lut.iter().enumerate() {
        for y in 0..side {
            let start = (y0 as usize + y) * stride + x0 as usize * 3;
            let row = &img.data()[start..start + side * 3];
            out.extend(row.chunks_exact(3).map(|p| table[p[c] as usize]));
        }
    }
    out
}
