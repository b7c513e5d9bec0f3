//! `ImageTiles`: one image after preprocessing — its grid of tiles in
//! row-major order, then the global view (the whole image resized to one
//! tile) last; an image that fits one tile is only its global view
//! (`rows = cols = 0`). Each tile is planar CHW f32, normalized.

/// The normalized tiles of one image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageTiles {
    /// Rows of the tile grid (0 where the image is only its global view).
    pub rows: u32,
    /// Columns of the tile grid (0 where the image is only its global view).
    pub cols: u32,
    /// Side of a tile in pixels.
    pub tile_size: u32,
    /// `rows * cols` grid tiles, row-major, then the global view; each
    /// `3 * tile_size * tile_size` floats, planar RGB.
    pub tiles: Vec<Vec<f32>>,
}
