//! Host steps: work a recording runs on the CPU, in order with its GPU
//! commands, over the same buffers. On a CPU device (lavapipe) every buffer
//! lives in host memory and is mapped, so the native kernels (`ops::host`)
//! read and write the buffers the Vulkan kernels would, and a forward pass
//! can run with no Vulkan dispatch at all.
//!
//! A step reaches buffers only through [`HostMem`], which hands out slices
//! of element ranges and refuses overlapping borrows within a step (a
//! mutable range never aliases another borrow). Ranges, not whole buffers:
//! sequences on other threads may write other pages of a shared KV pool at
//! the same time, and a reference must cover only what this step touches.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut, Range};

use bytemuck::Pod;

use super::buffer::Buffer;
use crate::error::{ModelError, Result};

/// The work of a host step.
type HostWork = Box<dyn Fn(&HostMem) -> Result<()> + Send + Sync>;

/// One host step: its label (for profiles) and the work.
pub struct HostStep {
    pub(super) label: &'static str,
    pub(super) run: HostWork,
}

impl HostStep {
    /// A step labelled `label` running `run`.
    pub fn new(
        label: &'static str,
        run: impl Fn(&HostMem) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        HostStep {
            label,
            run: Box::new(run),
        }
    }
}

/// A borrowed byte range of one buffer.
#[derive(Clone, Copy)]
struct Borrow {
    buffer: usize,
    bytes: (u64, u64),
    mutable: bool,
}

/// Host access to mapped buffers while one step runs.
#[derive(Default)]
pub struct HostMem {
    borrows: RefCell<Vec<Borrow>>,
}

/// A shared view of elements of a buffer.
pub struct HostRef<'m, T: Pod> {
    slice: &'m [T],
    mem: &'m HostMem,
    borrow: Borrow,
}

/// An exclusive view of elements of a buffer.
pub struct HostMut<'m, T: Pod> {
    slice: &'m mut [T],
    mem: &'m HostMem,
    borrow: Borrow,
}

impl HostMem {
    /// Registers a borrow of `elems` (in units of `T`) of `b`, checking it
    /// lies inside the buffer, is aligned and overlaps no conflicting borrow.
    fn take<T: Pod>(
        &self,
        b: &Buffer,
        elems: &Range<usize>,
        mutable: bool,
    ) -> Result<(*mut u8, Borrow)> {
        let size = std::mem::size_of::<T>();
        let (start, end) = (
            elems.start as u64 * size as u64,
            elems.end as u64 * size as u64,
        );
        if elems.start > elems.end || end > b.size() {
            return Err(ModelError::Internal(format!(
                "host access to elements {}..{} of a {} byte buffer",
                elems.start,
                elems.end,
                b.size()
            )));
        }
        let base = b.host_ptr()?;
        let borrow = Borrow {
            buffer: b.raw_id(),
            bytes: (start, end),
            mutable,
        };
        let mut borrows = self.borrows.borrow_mut();
        let clash = borrows.iter().any(|o| {
            o.buffer == borrow.buffer
                && o.bytes.0 < end
                && start < o.bytes.1
                && (o.mutable || mutable)
        });
        if clash {
            return Err(ModelError::Internal(format!(
                "host step borrows bytes {start}..{end} of a buffer twice"
            )));
        }
        // SAFETY: `start` lies inside the mapping (checked against the size above).
        let ptr = unsafe { base.add(start as usize) };
        if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(ModelError::Internal("misaligned host access".into()));
        }
        borrows.push(borrow);
        Ok((ptr, borrow))
    }

    fn release(&self, borrow: &Borrow) {
        let mut borrows = self.borrows.borrow_mut();
        if let Some(i) = borrows.iter().position(|o| {
            o.buffer == borrow.buffer && o.bytes == borrow.bytes && o.mutable == borrow.mutable
        }) {
            borrows.swap_remove(i);
        }
    }

    /// Elements `elems` of `b`, read.
    ///
    /// # Errors
    /// A device-local buffer the host cannot see, a range outside the
    /// buffer, or one that overlaps a mutable borrow of this step.
    pub fn read<'m, T: Pod>(
        &'m self,
        b: &'m Buffer,
        elems: Range<usize>,
    ) -> Result<HostRef<'m, T>> {
        let (ptr, borrow) = self.take::<T>(b, &elems, false)?;
        // SAFETY: the range is inside the buffer's mapping, which lives as
        // long as `b`; no mutable borrow of it exists in this step, no GPU
        // work runs while host steps do, and other threads' steps touch
        // other ranges (the owners of shared buffers write disjoint pages).
        let slice = unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), elems.len()) };
        Ok(HostRef {
            slice,
            mem: self,
            borrow,
        })
    }

    /// Elements `elems` of `b`, written.
    ///
    /// # Errors
    /// As [`HostMem::read`], and any overlap with another borrow of this step.
    pub fn write<'m, T: Pod>(
        &'m self,
        b: &'m Buffer,
        elems: Range<usize>,
    ) -> Result<HostMut<'m, T>> {
        let (ptr, borrow) = self.take::<T>(b, &elems, true)?;
        // SAFETY: as in `read`, and no other borrow of this step overlaps it.
        let slice = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), elems.len()) };
        Ok(HostMut {
            slice,
            mem: self,
            borrow,
        })
    }

    /// The whole buffer as elements of `T`, read.
    ///
    /// # Errors
    /// As [`HostMem::read`].
    pub fn read_all<'m, T: Pod>(&'m self, b: &'m Buffer) -> Result<HostRef<'m, T>> {
        self.read(b, 0..b.size() as usize / std::mem::size_of::<T>())
    }
}

impl<T: Pod> Deref for HostRef<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T: Pod> Drop for HostRef<'_, T> {
    fn drop(&mut self) {
        self.mem.release(&self.borrow);
    }
}

impl<T: Pod> Deref for HostMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T: Pod> DerefMut for HostMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.slice
    }
}

impl<T: Pod> Drop for HostMut<'_, T> {
    fn drop(&mut self) {
        self.mem.release(&self.borrow);
    }
}
