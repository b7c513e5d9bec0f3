//! [`PixelTensor`], the host-side `[1, 3, H, W]` f32 input of the vision
//! encoder (one tile), with its length checked against its shape once so
//! that the encoder can trust it.

use crate::error::{ModelError, Result};

/// A `[1, 3, height, width]` f32 tensor on the host: planar CHW, each
/// channel a row-major `height * width` plane.
#[derive(Clone, Debug, PartialEq)]
pub struct PixelTensor {
    shape: [usize; 4],
    data: Vec<f32>,
}

impl PixelTensor {
    /// Wraps planar CHW data (`3 * width * height` values) without copying.
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] for a 0 side or a length that is not
    /// `3 * width * height`.
    pub fn from_chw(data: Vec<f32>, width: u32, height: u32) -> Result<Self> {
        let expected = check_shape(width, height)?;
        if data.len() != expected {
            return Err(ModelError::invalid(
                "pixels",
                format!(
                    "{} values given, [1, 3, {height}, {width}] holds {expected}",
                    data.len()
                ),
            ));
        }
        Ok(PixelTensor {
            shape: [1, 3, height as usize, width as usize],
            data,
        })
    }

    /// The shape, `[1, 3, height, width]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// Width (the last dimension).
    pub fn width(&self) -> usize {
        self.shape[3]
    }

    /// Height (the third dimension).
    pub fn height(&self) -> usize {
        self.shape[2]
    }

    /// The values, planar CHW.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The values by value, planar CHW.
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
}

/// Builds the `[1, 3, height, width]` tensor from planar CHW f32 data (a
/// copy; [`PixelTensor::from_chw`] takes ownership instead).
///
/// # Errors
/// [`ModelError::InvalidArgument`] for a 0 side or a length that is not
/// `3 * width * height`.
pub fn pixels_to_tensor(chw: &[f32], width: u32, height: u32) -> Result<PixelTensor> {
    let expected = check_shape(width, height)?;
    if chw.len() != expected {
        return Err(ModelError::invalid(
            "pixels",
            format!(
                "{} values given, [1, 3, {height}, {width}] holds {expected}",
                chw.len()
            ),
        ));
    }
    PixelTensor::from_chw(chw.to_vec(), width, height)
}

/// `3 * width * height`, refusing a 0 side or a count past the address
/// space.
fn check_shape(width: u32, height: u32) -> Result<usize> {
    if width == 0 || height == 0 {
        return Err(ModelError::invalid(
            "pixels",
            format!("a {width}x{height} tensor has no pixels"),
        ));
    }
    (width as usize)
        .checked_mul(height as usize)
        .and_then(|n| n.checked_mul(3))
        .ok_or_else(|| ModelError::invalid("pixels", format!("{width}x{height} is too large")))
}
