//! `im2col`: the patches of a 1-D convolution as rows — row `t` holds
//! `x(c, t * stride + j - pad)` at column `c * kernel + j` (zero outside the
//! input), zero-padded to a width the products take (a multiple of 32) —
//! so the convolution is one product with its weight `[out, channels *
//! kernel]` (PyTorch's and ggml's layout of a conv1d weight, row by row).

use super::params::Im2colParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};

/// A 1-D convolution's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1d {
    /// Input channels.
    pub channels: usize,
    /// Taps.
    pub kernel: usize,
    /// Input positions between output positions.
    pub stride: usize,
    /// Zero positions on each side of the input.
    pub pad: usize,
}

impl Conv1d {
    /// Output positions of an input of `n_in` positions.
    pub fn n_out(&self, n_in: usize) -> usize {
        (n_in + 2 * self.pad)
            .checked_sub(self.kernel)
            .map_or(0, |v| v / self.stride.max(1) + 1)
    }

    /// Columns of a patch row: `channels * kernel` rounded up to 32.
    pub fn width(&self) -> usize {
        (self.channels * self.kernel).next_multiple_of(32)
    }
}

/// How the input is laid out.
#[derive(Clone, Copy, Debug)]
pub enum ConvInput<'a> {
    /// One row per channel, one column per position (log-mel features).
    ChannelRows(Mat<'a>),
    /// One row per position, one column per channel (the residual stream).
    PositionRows(Mat<'a>),
}

/// The patches of `input` for `conv` into `out` (`n_out` rows of `conv.width()`).
#[derive(Clone, Copy, Debug)]
pub struct Im2colCall<'a> {
    /// The convolution.
    pub conv: Conv1d,
    /// The input.
    pub input: ConvInput<'a>,
    /// The patch rows.
    pub out: Mat<'a>,
}

impl<'a> Im2colCall<'a> {
    /// (input matrix, input positions, floats between channels, between positions).
    pub fn layout(&self) -> (Mat<'a>, usize, usize, usize) {
        match self.input {
            ConvInput::ChannelRows(m) => (m, m.cols, m.ld, 1),
            ConvInput::PositionRows(m) => (m, m.rows, 1, m.ld),
        }
    }

    /// Checks the shapes; returns the input positions.
    ///
    /// # Errors
    /// A stride or kernel of 0, channels not the input's, an output not of
    /// the patches' shape, views outside their buffers.
    pub fn check(&self) -> Result<usize> {
        let c = self.conv;
        let (x, n_in, _, _) = self.layout();
        let channels = match self.input {
            ConvInput::ChannelRows(m) => m.rows,
            ConvInput::PositionRows(m) => m.cols,
        };
        if c.stride == 0 || c.kernel == 0 || channels != c.channels {
            return Err(ModelError::invalid(
                "conv1d",
                format!("{c:?} over {channels} input channels"),
            ));
        }
        let (rows, cols) = (c.n_out(n_in), c.width());
        if self.out.rows != rows || self.out.cols != cols {
            return Err(ModelError::Shape {
                tensor: "im2col output".into(),
                expected: vec![rows as u64, cols as u64],
                got: vec![self.out.rows as u64, self.out.cols as u64],
            });
        }
        x.check("im2col input")?;
        self.out.check("im2col output")?;
        Ok(n_in)
    }
}

/// Records the patches.
///
/// # Errors
/// As [`Im2colCall::check`], or a value beyond 32 bits.
pub fn record_im2col(rec: &mut Recording, call: &Im2colCall<'_>) -> Result<()> {
    let n_in = call.check()?;
    let (x, _, stride_c, stride_t) = call.layout();
    let (c, out) = (call.conv, call.out);
    let params = Im2colParams {
        n_out: pc_u32("n_out", out.rows)?,
        n_in: pc_u32("n_in", n_in)?,
        channels: pc_u32("channels", c.channels)?,
        kernel: pc_u32("kernel", c.kernel)?,
        stride: pc_u32("stride", c.stride)?,
        pad: pc_u32("pad", c.pad)?,
        stride_c: pc_u32("stride_c", stride_c)?,
        stride_t: pc_u32("stride_t", stride_t)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        width: pc_u32("width", out.cols)?,
        ld_d: pc_u32("ld_d", out.ld)?,
        d_offset: pc_u32("d_offset", out.offset)?,
    };
    rec.dispatch_elementwise(
        Kernel::Im2colF32,
        &[Binding::read(x.buf), Binding::write(out.buf)],
        &params,
        pc_u32("im2col threads", out.rows * out.cols)?,
    )
}

/// Reference patches of `x(c, s) = x[c * stride_c + s * stride_t]` over
/// `n_in` positions: `n_out` rows of `conv.width()`.
pub fn im2col_ref(
    conv: Conv1d,
    x: &[f32],
    n_in: usize,
    stride_c: usize,
    stride_t: usize,
) -> Vec<f32> {
    let (n_out, width) = (conv.n_out(n_in), conv.width());
    let mut out = vec![0.0f32; n_out * width];
    for t in 0..n_out {
        for c in 0..conv.channels {
            for j in 0..conv.kernel {
                let s = (t * conv.stride + j) as isize - conv.pad as isize;
                if s >= 0 && (s as usize) < n_in {
                    out[t * width + c * conv.kernel + j] = x[c * stride_c + s as usize * stride_t];
                }
            }
        }
    }
    out
}
