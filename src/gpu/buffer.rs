//! `Buffer`: one `VkBuffer` with its memory, freed in `Drop`. Device-local
//! buffers hold weights and activations; host-visible ones (upload, readback)
//! are mapped for the buffer's whole life and copied through safe methods.

use std::sync::Arc;

use ash::vk;
use bytemuck::Pod;
use gpu_allocator::MemoryLocation;
use gpu_allocator::vulkan::{Allocation, AllocationCreateDesc, AllocationScheme};

use super::context::GpuContext;
use crate::error::{ModelError, Result};

/// Where a buffer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Device-local; filled through the staging ring.
    Device,
    /// Host-visible, written by the CPU and read by the GPU (small per-step inputs).
    Upload,
    /// Host-visible, written by the GPU and read by the CPU (logits).
    Readback,
}

/// A Vulkan buffer and its memory. Shared as `Arc<Buffer>` so that recorded
/// command buffers keep what they reference alive.
pub struct Buffer {
    ctx: Arc<GpuContext>,
    raw: vk::Buffer,
    allocation: Option<Allocation>,
    size: u64,
    kind: MemoryKind,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?}, {} bytes)", self.kind, self.size)
    }
}

/// An allocator failure as a [`ModelError`]: exhaustion (the driver's
/// `VK_ERROR_OUT_OF_DEVICE_MEMORY`, or host memory, which gpu-allocator
/// reports only as text) is [`ModelError::OutOfDeviceMemory`]; a lost device
/// (also only text) marks the context lost.
fn alloc_error(
    ctx: &GpuContext,
    what: &str,
    bytes: u64,
    in_use: u64,
    e: gpu_allocator::AllocationError,
) -> ModelError {
    let oom = || ModelError::OutOfDeviceMemory {
        what: what.to_string(),
        bytes,
        in_use,
    };
    match e {
        gpu_allocator::AllocationError::OutOfMemory => oom(),
        e => {
            let text = e.to_string();
            match reported_result(&text) {
                Some(vk::Result::ERROR_DEVICE_LOST) => ctx.mark_lost("vkAllocateMemory"),
                Some(_) => oom(),
                None => ModelError::Allocation {
                    what: what.to_string(),
                    reason: text,
                },
            }
        }
    }
}

/// The `VkResult` an allocator message carries as text, among those that
/// change what combs reports: gpu-allocator passes `vkAllocateMemory`'s and
/// `vkMapMemory`'s results other than device exhaustion only as strings
/// (`Unexpected error in vkAllocateMemory: ERROR_DEVICE_LOST`, or ash's
/// description of the result).
fn reported_result(text: &str) -> Option<vk::Result> {
    [
        vk::Result::ERROR_DEVICE_LOST,
        vk::Result::ERROR_OUT_OF_HOST_MEMORY,
        vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
    ]
    .into_iter()
    .find(|r| text.contains(&format!("{r:?}")) || text.contains(&r.to_string()))
}

impl Buffer {
    /// As [`Buffer::new`], with every byte zero before anything reads it:
    /// for caches whose kernels load whole tiles of rows and mask the rows
    /// past a sequence's end, where masked garbage (NaN from memory another
    /// buffer used before) would still reach the sums as 0 × NaN.
    ///
    /// # Errors
    /// As [`Buffer::new`], or a failing submission.
    pub fn zeroed(
        ctx: &Arc<GpuContext>,
        size: u64,
        kind: MemoryKind,
        name: &str,
    ) -> Result<Arc<Self>> {
        let buf = Self::new(ctx, size, kind, name)?;
        let mut rec = super::Recording::new(ctx, false)?;
        rec.fill(&buf, 0, size / 4 * 4, 0)?;
        rec.finish()?;
        rec.submit_and_wait()?;
        Ok(buf)
    }

    /// Creates a buffer of `size` bytes (at least 4), counted in the
    /// context's memory account (see [`GpuContext::set_memory_budget`])
    /// until it is dropped.
    ///
    /// # Errors
    /// The device is lost; the context's memory budget has no room
    /// ([`ModelError::MemoryBudget`]); out of device memory or a size above
    /// the device's allocation limit ([`ModelError::OutOfDeviceMemory`]).
    /// Each names `name`.
    pub fn new(
        ctx: &Arc<GpuContext>,
        size: u64,
        kind: MemoryKind,
        name: &str,
    ) -> Result<Arc<Self>> {
        ctx.before_allocation()?;
        let size = size.max(4).next_multiple_of(4);
        let in_use = ctx.memory_in_use();
        if size > ctx.caps().max_memory_allocation_size {
            return Err(ModelError::OutOfDeviceMemory {
                what: format!(
                    "{name} (larger than the device's {} byte allocation limit)",
                    ctx.caps().max_memory_allocation_size
                ),
                bytes: size,
                in_use,
            });
        }
        let account = ctx.memory();
        if kind == MemoryKind::Device {
            account.reserve(name, size)?;
        } else {
            account.add_host_visible(size);
        }
        match Self::allocate(ctx, size, kind, name) {
            Ok(b) => Ok(b),
            Err(e) => {
                release(ctx, kind, size);
                Err(e)
            }
        }
    }

    /// [`Buffer::new`] after the bytes are reserved.
    fn allocate(
        ctx: &Arc<GpuContext>,
        size: u64,
        kind: MemoryKind,
        name: &str,
    ) -> Result<Arc<Self>> {
        // What was in use before this buffer's reservation, for messages.
        let in_use = match kind {
            MemoryKind::Device => ctx.memory_in_use().saturating_sub(size),
            MemoryKind::Upload | MemoryKind::Readback => ctx.memory_in_use(),
        };
        let mut usage = vk::BufferUsageFlags::STORAGE_BUFFER
            | vk::BufferUsageFlags::TRANSFER_SRC
            | vk::BufferUsageFlags::TRANSFER_DST
            | vk::BufferUsageFlags::INDIRECT_BUFFER;
        if ctx.caps().coop_mat2.is_some() {
            // matmul_cm2.comp's decode callbacks take references into its buffers.
            usage |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
        }
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(usage)
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let device = ctx.device();
        // SAFETY: valid device and create info.
        let raw = unsafe { device.create_buffer(&info, None) }.map_err(|r| match r {
            vk::Result::ERROR_OUT_OF_DEVICE_MEMORY | vk::Result::ERROR_OUT_OF_HOST_MEMORY => {
                ModelError::OutOfDeviceMemory {
                    what: name.to_string(),
                    bytes: size,
                    in_use,
                }
            }
            r => ctx.vk_error("vkCreateBuffer", r),
        })?;
        // SAFETY: raw was just created on this device.
        let requirements = unsafe { device.get_buffer_memory_requirements(raw) };
        let location = match kind {
            MemoryKind::Device => MemoryLocation::GpuOnly,
            MemoryKind::Upload => MemoryLocation::CpuToGpu,
            MemoryKind::Readback => MemoryLocation::GpuToCpu,
        };
        let allocation = ctx.allocator().allocate(&AllocationCreateDesc {
            name,
            requirements,
            location,
            linear: true,
            allocation_scheme: AllocationScheme::GpuAllocatorManaged,
        });
        let allocation = match allocation {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: raw is unbound and unused.
                unsafe { device.destroy_buffer(raw, None) };
                return Err(alloc_error(ctx, name, size, in_use, e));
            }
        };
        // SAFETY: memory and offset come from an allocation made for these requirements.
        if let Err(r) =
            unsafe { device.bind_buffer_memory(raw, allocation.memory(), allocation.offset()) }
        {
            let _ = ctx.allocator().free(allocation);
            // SAFETY: raw is unused.
            unsafe { device.destroy_buffer(raw, None) };
            return Err(ctx.vk_error("vkBindBufferMemory", r));
        }
        if kind != MemoryKind::Device && allocation.mapped_ptr().is_none() {
            let _ = ctx.allocator().free(allocation);
            // SAFETY: raw is unused.
            unsafe { device.destroy_buffer(raw, None) };
            return Err(ModelError::Allocation {
                what: name.to_string(),
                reason: "host-visible memory is not mapped".into(),
            });
        }
        Ok(Arc::new(Buffer {
            ctx: ctx.clone(),
            raw,
            allocation: Some(allocation),
            size,
            kind,
        }))
    }

    /// The Vulkan handle.
    pub fn raw(&self) -> vk::Buffer {
        self.raw
    }

    /// Size in bytes (rounded up to 4).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Where the memory lives.
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The context this buffer belongs to.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    fn mapped_ptr(&self) -> Option<*mut u8> {
        self.allocation
            .as_ref()
            .and_then(|a| a.mapped_ptr())
            .map(|p| p.as_ptr().cast::<u8>())
    }

    /// Copies `data` into a host-visible buffer at `offset`. The caller must not
    /// have GPU work in flight that touches these bytes.
    ///
    /// # Errors
    /// A device-local buffer, or a range past the end.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        let ptr = self.checked_map(offset, data.len() as u64)?;
        // SAFETY: the range was checked to lie inside the mapped allocation, and
        // `data` is a distinct host allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` out of a host-visible buffer into `out`.
    ///
    /// # Errors
    /// A device-local buffer, or a range past the end.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let ptr = self.checked_map(offset, out.len() as u64)?;
        // SAFETY: as in write_bytes.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Writes plain values (f32, u32, ...) into a host-visible buffer.
    ///
    /// # Errors
    /// As [`Buffer::write_bytes`].
    pub fn write_slice<T: Pod>(&self, offset: u64, data: &[T]) -> Result<()> {
        self.write_bytes(offset, bytemuck::cast_slice(data))
    }

    /// Reads plain values from a host-visible buffer.
    ///
    /// # Errors
    /// As [`Buffer::read_bytes`].
    pub fn read_slice<T: Pod>(&self, offset: u64, out: &mut [T]) -> Result<()> {
        self.read_bytes(offset, bytemuck::cast_slice_mut(out))
    }

    /// The host-visible values at byte `offset`, read in place (no copy).
    ///
    /// # Errors
    /// A device-local buffer, a range past the end, or an offset not aligned to `T`.
    ///
    /// # Safety
    /// No GPU work may write these bytes while the slice lives.
    pub unsafe fn host_slice<T: Pod>(&self, offset: u64, len: usize) -> Result<&[T]> {
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        let ptr = self.checked_map(offset, bytes)?;
        // SAFETY: the range lies inside the mapping, which lives as long as
        // self; the caller keeps the GPU off it.
        let raw = unsafe { std::slice::from_raw_parts(ptr.cast_const(), bytes as usize) };
        bytemuck::try_cast_slice(raw)
            .map_err(|e| ModelError::Internal(format!("host view at {offset}: {e}")))
    }

    /// The start of the mapping, for host steps (`gpu::host`).
    pub(super) fn host_ptr(&self) -> Result<*mut u8> {
        self.mapped_ptr().ok_or_else(|| {
            ModelError::Internal("host access to a buffer the host cannot see".to_string())
        })
    }

    /// Whether the host can write this buffer in place with no flush: its
    /// memory is mapped and host-coherent (every buffer on a CPU device or
    /// under unified memory; on a discrete GPU, the staging kinds only).
    pub(super) fn host_coherent(&self) -> bool {
        self.allocation.as_ref().is_some_and(|a| {
            a.mapped_ptr().is_some()
                && a.memory_properties()
                    .contains(vk::MemoryPropertyFlags::HOST_COHERENT)
        })
    }

    /// An identity of the buffer for borrow tracking.
    pub(super) fn raw_id(&self) -> usize {
        use ash::vk::Handle;
        self.raw.as_raw() as usize
    }

    fn checked_map(&self, offset: u64, len: u64) -> Result<*mut u8> {
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.size) {
            return Err(ModelError::Internal(format!(
                "host access {offset}+{len} past the end of a {} byte buffer",
                self.size
            )));
        }
        let base = self.mapped_ptr().ok_or_else(|| {
            ModelError::Internal("host access to a device-local buffer".to_string())
        })?;
        // SAFETY: offset < size, inside the mapping.
        Ok(unsafe { base.add(offset as usize) })
    }
}

/// Gives back to the context's account what [`Buffer::new`] counted.
fn release(ctx: &GpuContext, kind: MemoryKind, size: u64) {
    match kind {
        MemoryKind::Device => ctx.memory().release(size),
        MemoryKind::Upload | MemoryKind::Readback => ctx.memory().release_host_visible(size),
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(a) = self.allocation.take() {
            // A lost device still frees: vkFreeMemory is valid after a loss,
            // and the allocator's error, if any, has no one to go to.
            let _ = self.ctx.allocator().free(a);
        }
        release(&self.ctx, self.kind, self.size);
        // SAFETY: every recording that used this buffer holds an Arc to it, so
        // no GPU work referencing it can still be pending.
        unsafe { self.ctx.device().destroy_buffer(self.raw, None) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_messages_map_to_lost_and_out_of_memory() {
        let lost = gpu_allocator::AllocationError::Internal(format!(
            "Unexpected error in vkAllocateMemory: {:?}",
            vk::Result::ERROR_DEVICE_LOST
        ));
        assert_eq!(
            reported_result(&lost.to_string()),
            Some(vk::Result::ERROR_DEVICE_LOST)
        );
        let mapped = gpu_allocator::AllocationError::FailedToMap(
            vk::Result::ERROR_OUT_OF_HOST_MEMORY.to_string(),
        );
        assert_eq!(
            reported_result(&mapped.to_string()),
            Some(vk::Result::ERROR_OUT_OF_HOST_MEMORY)
        );
        assert_eq!(reported_result("no compatible memory type"), None);
    }
}
