//! `Mat`: a typed view of an activation matrix on the device — the buffer,
//! where row 0 starts, how many rows (tokens) and columns, the leading
//! dimension and the element type. Every op takes its operands as `Mat`s and
//! checks their shapes itself; the element type is part of the type, so an
//! op that reads f32 only cannot be handed f16 activations.

use std::marker::PhantomData;
use std::sync::Arc;

use half::f16;

use crate::error::{ModelError, Result};
use crate::gpu::Buffer;

/// The element type of an activation matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// IEEE half (the activations batched decode hands to its
    /// cooperative-matrix products, which take them as f16 anyway).
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }
}

/// An element type a [`Mat`] can hold.
pub trait Elem: Copy + 'static {
    /// The runtime tag of the type.
    const DTYPE: DType;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
}

/// A row-major matrix of `rows` × `cols` elements of `T` inside a buffer:
/// row `i` starts at element `offset + i * ld`.
pub struct Mat<'a, T: Elem = f32> {
    /// The buffer holding the matrix.
    pub buf: &'a Arc<Buffer>,
    /// Element index of row 0.
    pub offset: usize,
    /// Rows (tokens).
    pub rows: usize,
    /// Elements per row.
    pub cols: usize,
    /// Elements between the starts of consecutive rows.
    pub ld: usize,
    elem: PhantomData<T>,
}

impl<T: Elem> Clone for Mat<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Elem> Copy for Mat<'_, T> {}

impl<T: Elem> std::fmt::Debug for Mat<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Mat<{:?}>({}x{} at {}, ld {}, buffer of {} bytes)",
            T::DTYPE,
            self.rows,
            self.cols,
            self.offset,
            self.ld,
            self.buf.size()
        )
    }
}

impl<'a, T: Elem> Mat<'a, T> {
    /// `rows` packed rows of `cols` elements from the start of `buf`.
    pub fn new(buf: &'a Arc<Buffer>, rows: usize, cols: usize) -> Self {
        Mat {
            buf,
            offset: 0,
            rows,
            cols,
            ld: cols,
            elem: PhantomData,
        }
    }

    /// The same matrix with rows `ld` elements apart.
    pub fn with_ld(self, ld: usize) -> Self {
        Mat { ld, ..self }
    }

    /// Columns `start..start + cols` of every row.
    pub fn cols_at(self, start: usize, cols: usize) -> Self {
        Mat {
            offset: self.offset + start,
            cols,
            ..self
        }
    }

    /// Rows `first..first + rows`.
    pub fn rows_at(self, first: usize, rows: usize) -> Self {
        Mat {
            offset: self.offset + first * self.ld,
            rows,
            ..self
        }
    }

    /// The first `rows` rows (or as many more as the buffer's layout allows).
    pub fn with_rows(self, rows: usize) -> Self {
        Mat { rows, ..self }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        T::DTYPE
    }

    /// Whether row starts and strides are multiples of 4 elements (vector loads).
    pub fn aligned4(&self) -> bool {
        self.offset.is_multiple_of(4) && (self.rows <= 1 || self.ld.is_multiple_of(4))
    }

    /// Whether `self` and `other` are the same elements of the same buffer.
    pub fn same_as(&self, other: &Mat<'_, T>) -> bool {
        Arc::ptr_eq(self.buf, other.buf)
            && self.offset == other.offset
            && self.rows == other.rows
            && self.cols == other.cols
            && (self.rows <= 1 || self.ld == other.ld)
    }

    /// Checks that the matrix lies inside its buffer with rows that do not
    /// overlap; `what` names the operand in the error.
    ///
    /// # Errors
    /// [`ModelError::InvalidArgument`] naming the operand otherwise.
    pub fn check(&self, what: &'static str) -> Result<()> {
        let bad = |why: String| Err(ModelError::invalid(what, why));
        if self.rows > 1 && self.ld < self.cols {
            return bad(format!("{self:?}: rows overlap (ld below cols)"));
        }
        let end = match self.rows {
            0 => Some(self.offset),
            r => (r - 1)
                .checked_mul(self.ld)
                .and_then(|v| v.checked_add(self.offset + self.cols)),
        };
        let bytes = end.and_then(|e| e.checked_mul(T::DTYPE.bytes()));
        match bytes {
            Some(b) if b as u64 <= self.buf.size() => Ok(()),
            _ => bad(format!("{self:?} reaches past its buffer")),
        }
    }
}

impl<'a> Mat<'a, f32> {
    /// `rows` packed rows of `cols` floats from the start of `buf`.
    pub fn f32(buf: &'a Arc<Buffer>, rows: usize, cols: usize) -> Self {
        Self::new(buf, rows, cols)
    }
}

impl<'a> Mat<'a, f16> {
    /// `rows` packed rows of `cols` halves from the start of `buf`.
    pub fn f16(buf: &'a Arc<Buffer>, rows: usize, cols: usize) -> Self {
        Self::new(buf, rows, cols)
    }
}

/// A matrix of either element type, where an op takes both.
#[derive(Clone, Copy, Debug)]
pub enum AnyMat<'a> {
    /// f32 elements.
    F32(Mat<'a, f32>),
    /// f16 elements.
    F16(Mat<'a, f16>),
}

impl<'a> AnyMat<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            AnyMat::F32(_) => DType::F32,
            AnyMat::F16(_) => DType::F16,
        }
    }

    /// The buffer.
    pub fn buf(&self) -> &'a Arc<Buffer> {
        match self {
            AnyMat::F32(m) => m.buf,
            AnyMat::F16(m) => m.buf,
        }
    }

    /// (offset, rows, cols, ld) in elements.
    pub fn layout(&self) -> (usize, usize, usize, usize) {
        match self {
            AnyMat::F32(m) => (m.offset, m.rows, m.cols, m.ld),
            AnyMat::F16(m) => (m.offset, m.rows, m.cols, m.ld),
        }
    }

    /// Rows (tokens).
    pub fn rows(&self) -> usize {
        self.layout().1
    }

    /// Elements per row.
    pub fn cols(&self) -> usize {
        self.layout().2
    }

    /// Whether row starts and strides are multiples of 4 elements.
    pub fn aligned4(&self) -> bool {
        match self {
            AnyMat::F32(m) => m.aligned4(),
            AnyMat::F16(m) => m.aligned4(),
        }
    }

    /// The f32 matrix, if it is one.
    pub fn as_f32(&self) -> Option<Mat<'a, f32>> {
        match self {
            AnyMat::F32(m) => Some(*m),
            AnyMat::F16(_) => None,
        }
    }

    /// As [`Mat::check`].
    ///
    /// # Errors
    /// As [`Mat::check`].
    pub fn check(&self, what: &'static str) -> Result<()> {
        match self {
            AnyMat::F32(m) => m.check(what),
            AnyMat::F16(m) => m.check(what),
        }
    }
}

impl<'a> From<Mat<'a, f32>> for AnyMat<'a> {
    fn from(m: Mat<'a, f32>) -> Self {
        AnyMat::F32(m)
    }
}

impl<'a> From<Mat<'a, f16>> for AnyMat<'a> {
    fn from(m: Mat<'a, f16>) -> Self {
        AnyMat::F16(m)
    }
}
