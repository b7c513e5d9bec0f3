//! `LentBuffer`: a host-visible buffer whose rows readers take in place
//! (no copy) under a lease. Whoever records GPU writes into the buffer
//! submits them only while [`LentBuffer::is_free`] holds — no lease alive —
//! so a reader's rows never change under it; that contract is what makes
//! [`HostRows::as_slice`] safe to call.

use std::sync::Arc;

use bytemuck::Pod;

use super::buffer::Buffer;
use crate::error::Result;

/// A host-visible buffer lent out to readers.
pub struct LentBuffer {
    buf: Arc<Buffer>,
    lease: Arc<()>,
}

impl LentBuffer {
    /// Lends rows of `buf` (a host-visible buffer).
    pub fn new(buf: Arc<Buffer>) -> Self {
        LentBuffer {
            buf,
            lease: Arc::new(()),
        }
    }

    /// Whether no reader holds rows of the buffer: only then may GPU work
    /// that writes it be submitted.
    pub fn is_free(&self) -> bool {
        Arc::strong_count(&self.lease) == 1
    }

    /// The buffer, for recording the GPU work that writes it (submitted only
    /// while [`Self::is_free`]).
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buf
    }

    /// `len` values of `T` at byte `offset`, held until the returned rows drop.
    pub fn lend<T: Pod>(&self, offset: u64, len: usize) -> HostRows<T> {
        HostRows {
            buf: self.buf.clone(),
            _lease: self.lease.clone(),
            offset,
            len,
            elem: std::marker::PhantomData,
        }
    }
}

/// Rows of a [`LentBuffer`] a reader holds. Clones share the lease.
pub struct HostRows<T> {
    buf: Arc<Buffer>,
    /// Held, never read: the lender counts the holders.
    _lease: Arc<()>,
    offset: u64,
    len: usize,
    elem: std::marker::PhantomData<T>,
}

impl<T> Clone for HostRows<T> {
    fn clone(&self) -> Self {
        HostRows {
            buf: self.buf.clone(),
            _lease: self._lease.clone(),
            offset: self.offset,
            len: self.len,
            elem: std::marker::PhantomData,
        }
    }
}

impl<T: Pod> HostRows<T> {
    /// The values, read in place.
    ///
    /// # Errors
    /// A device-local buffer or a range outside it.
    pub fn as_slice(&self) -> Result<&[T]> {
        // SAFETY: the lender submits no GPU work writing the buffer while a
        // lease (this one) is alive (`LentBuffer::is_free`).
        unsafe { self.buf.host_slice::<T>(self.offset, self.len) }
    }
}
