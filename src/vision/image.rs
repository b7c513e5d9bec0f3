//! [`RgbImage`], the one pixel type the vision front end works on: 8-bit
//! RGB, interleaved, row-major, with its size bounded before any buffer of
//! that size exists (a hostile header or C caller cannot make us allocate
//! gigabytes).

use crate::error::{ModelError, Result};

/// Largest width or height accepted, in pixels (decoders refuse larger
/// headers before allocating).
pub const MAX_IMAGE_SIDE: u32 = 16384;

/// Largest pixel count accepted: 64 Mpx, 192 MiB as RGB8. Large enough for
/// any camera or panorama a vision prompt plausibly holds (everything is
/// resized to at most 2048 px per side anyway), small enough that decoding
/// and the first resize stay within a few hundred MiB.
pub const MAX_IMAGE_PIXELS: u64 = 1 << 26;

/// An 8-bit RGB image: `width * height * 3` bytes, interleaved, row-major,
/// no padding between rows. Always non-empty and within
/// [`MAX_IMAGE_SIDE`] / [`MAX_IMAGE_PIXELS`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    width: u32,
    height: u32,
    data: Vec<u8>,
}

impl RgbImage {
    /// Wraps interleaved RGB8 bytes (`width * height * 3` of them).
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a 0 width or height, a size past
    /// [`MAX_IMAGE_SIDE`] or [`MAX_IMAGE_PIXELS`], or a byte count that is
    /// not `width * height * 3`.
    pub fn from_rgb8(width: u32, height: u32, data: Vec<u8>) -> Result<Self> {
        let expected = check_size(width, height)?;
        if data.len() as u64 != expected {
            return Err(ModelError::invalid(
                "rgb",
                format!(
                    "{} bytes given, a {width}x{height} RGB8 image has {expected}",
                    data.len()
                ),
            ));
        }
        Ok(RgbImage {
            width,
            height,
            data,
        })
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The pixels, `width * height * 3` bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The pixels, by value.
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// Builds an image whose size the caller has already checked (resize
    /// outputs, whose sizes come from a checked image).
    pub(crate) fn from_parts(width: u32, height: u32, data: Vec<u8>) -> Self {
        debug_assert_eq!(data.len(), width as usize * height as usize * 3);
        RgbImage {
            width,
            height,
            data,
        }
    }
}

/// Checks a size against the bounds and returns its RGB8 byte count.
///
/// # Errors
/// [`ModelError::InvalidArgument`] for an empty or too large size.
pub fn check_size(width: u32, height: u32) -> Result<u64> {
    if width == 0 || height == 0 {
        return Err(ModelError::invalid(
            "image",
            format!("{width}x{height} image has no pixels"),
        ));
    }
    let pixels = u64::from(width) * u64::from(height);
    if width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE || pixels > MAX_IMAGE_PIXELS {
        return Err(ModelError::invalid(
            "image",
            format!(
                "{width}x{height} image is too large (at most {MAX_IMAGE_SIDE} per side and \
                 {MAX_IMAGE_PIXELS} pixels)"
            ),
        ));
    }
    Ok(pixels * 3)
}
