//! Moving bytes between host and device-local buffers through a staging ring:
//! two host-visible halves, so the CPU fills one while the GPU copies the
//! other. The CPU writes each piece straight into the mapped half, split
//! over the rayon pool (repacking weights runs at memory speed only on
//! several cores); copies into many buffers share a half and go in one
//! submission when it is full or at [`Uploader::flush`]. A ring made for new
//! buffers ([`Uploader::for_new_buffers`]) writes device-local memory the
//! host can see (CPU devices, unified memory) in place and skips staging.
//! Made once per model load (or per test) and dropped after.

use std::sync::Arc;

use ash::vk;
use rayon::prelude::*;

use super::buffer::{Buffer, MemoryKind};
use super::command::memory_barrier;
use super::context::GpuContext;
use super::phases::{self, Phase};
use super::wait::{WaitMode, wait_and_reset};
use crate::error::{ModelError, Result};

const DEFAULT_HALF: u64 = 16 << 20;

/// Bytes each rayon task fills; a piece below this is filled on the calling
/// thread, where splitting would cost more than it saves.
const PAR_PIECE: usize = 1 << 20;

/// Staging copies land 16-byte aligned, the best case of most DMA engines.
const REGION_ALIGN: u64 = 16;

struct Slot {
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    in_flight: bool,
    /// Copies out of this half not yet submitted, each into its buffer.
    pending: Vec<(Arc<Buffer>, vk::BufferCopy)>,
    /// Bytes of this half taken by `pending`.
    used: u64,
    /// Buffers the submitted copies use, alive until the fence is waited.
    keep: Vec<Arc<Buffer>>,
}

impl Slot {
    fn new(cmd: vk::CommandBuffer, fence: vk::Fence) -> Self {
        Slot {
            cmd,
            fence,
            in_flight: false,
            pending: Vec::new(),
            used: 0,
            keep: Vec::new(),
        }
    }
}

/// A staging ring for uploads to and downloads from device-local buffers.
pub struct Uploader {
    ctx: Arc<GpuContext>,
    /// Made on first use: a ring that writes in place never needs one.
    staging: Option<Arc<Buffer>>,
    half: u64,
    pool: vk::CommandPool,
    slots: [Slot; 2],
    /// The half being filled.
    cur: usize,
    /// Destinations are new buffers no GPU work uses yet (see
    /// [`Uploader::for_new_buffers`]).
    new_buffers: bool,
}

/// `len` bytes of `buf`'s mapping from `offset`, for the host to write.
///
/// # Safety
/// No GPU work may access the range while the slice lives, and no other
/// host reference to it may exist.
// A mutable view from a shared `Buffer`: the mapping is the GPU's memory,
// which Rust's borrows cannot track; exclusivity is this function's contract.
#[allow(clippy::mut_from_ref)]
unsafe fn mapped_mut(buf: &Buffer, offset: u64, len: u64) -> Result<&mut [u8]> {
    if offset.checked_add(len).is_none_or(|e| e > buf.size()) {
        return Err(ModelError::Internal(format!(
            "host write {offset}+{len} past the end of a {} byte buffer",
            buf.size()
        )));
    }
    let base = buf.host_ptr()?;
    // SAFETY: the range lies inside the mapping, which lives as long as
    // `buf`; exclusivity is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(base.add(offset as usize), len as usize) })
}

/// Calls `fill(pos + k, piece)` for pieces of `out` starting at byte `k`,
/// spread over the rayon pool.
fn par_fill(out: &mut [u8], pos: u64, fill: &(impl Fn(u64, &mut [u8]) + Sync)) {
    let _t = phases::time(Phase::Fill).bytes(out.len() as u64);
    if out.len() <= PAR_PIECE {
        fill(pos, out);
        return;
    }
    out.par_chunks_mut(PAR_PIECE)
        .enumerate()
        .for_each(|(k, piece)| fill(pos + (k * PAR_PIECE) as u64, piece));
}

impl Uploader {
    /// Creates a ring with two halves of 16 MiB.
    ///
    /// # Errors
    /// Out of host-visible memory or a failing Vulkan call.
    pub fn new(ctx: &Arc<GpuContext>) -> Result<Self> {
        Self::with_half_size(ctx, DEFAULT_HALF)
    }

    /// Creates a ring with two halves of `half` bytes each.
    ///
    /// # Errors
    /// As [`Uploader::new`].
    pub fn with_half_size(ctx: &Arc<GpuContext>, half: u64) -> Result<Self> {
        let half = half.max(4096).next_multiple_of(256);
        let dev = ctx.device();
        let pool = ctx.create_command_pool()?;
        let mut up = Uploader {
            ctx: ctx.clone(),
            staging: None,
            half,
            pool,
            slots: [
                Slot::new(vk::CommandBuffer::null(), vk::Fence::null()),
                Slot::new(vk::CommandBuffer::null(), vk::Fence::null()),
            ],
            cur: 0,
            new_buffers: false,
        };
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        // SAFETY: pool is valid.
        let cmds = unsafe { dev.allocate_command_buffers(&alloc) }
            .map_err(|r| ModelError::vk("vkAllocateCommandBuffers", r))?;
        for (slot, cmd) in up.slots.iter_mut().zip(cmds) {
            slot.cmd = cmd;
            // SAFETY: valid device.
            slot.fence = unsafe { dev.create_fence(&vk::FenceCreateInfo::default(), None) }
                .map_err(|r| ModelError::vk("vkCreateFence", r))?;
        }
        Ok(up)
    }

    /// A ring of two halves of `half` bytes for filling buffers that no GPU
    /// work has used yet (a model load): where such a buffer's memory is
    /// host-visible and coherent, uploads write it in place, with no
    /// staging copy and no submission.
    ///
    /// # Errors
    /// As [`Uploader::new`].
    pub fn for_new_buffers(ctx: &Arc<GpuContext>, half: u64) -> Result<Self> {
        let mut up = Self::with_half_size(ctx, half)?;
        up.new_buffers = true;
        Ok(up)
    }

    fn staging(&mut self) -> Result<Arc<Buffer>> {
        if let Some(s) = &self.staging {
            return Ok(s.clone());
        }
        let s = match Buffer::new(&self.ctx, 2 * self.half, MemoryKind::Upload, "staging ring") {
            // Host-visible memory can be scarce (a 256 MiB BAR): a large ring
            // falls back to the default size before failing. Nothing uses
            // the ring's offsets yet, so its halves may still change.
            Err(ModelError::OutOfDeviceMemory { .. }) if self.half > DEFAULT_HALF => {
                self.half = DEFAULT_HALF;
                Buffer::new(&self.ctx, 2 * self.half, MemoryKind::Upload, "staging ring")?
            }
            r => r?,
        };
        self.staging = Some(s.clone());
        Ok(s)
    }

    fn wait_slot(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.slots[i];
        if !slot.in_flight {
            return Ok(());
        }
        let _t = phases::time(Phase::Wait);
        let done = wait_and_reset(&self.ctx, slot.fence, WaitMode::Block);
        slot.in_flight = false;
        slot.keep.clear();
        slot.used = 0;
        done
    }

    /// Records `copies` (source, destination, region) in slot `i`'s command
    /// buffer and submits it; `keep` stays alive until the slot is waited.
    fn submit_copies(
        &mut self,
        i: usize,
        copies: &[(vk::Buffer, vk::Buffer, vk::BufferCopy)],
        keep: Vec<Arc<Buffer>>,
    ) -> Result<()> {
        let _t = phases::time(Phase::Submit);
        let dev = self.ctx.device().clone();
        let slot = &mut self.slots[i];
        let begin = vk::CommandBufferBeginInfo::default()
            .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT);
        // Later compute and host reads must see the copy.
        let dst_stages = vk::PipelineStageFlags::COMPUTE_SHADER
            | vk::PipelineStageFlags::HOST
            | vk::PipelineStageFlags::TRANSFER;
        let dst_access = vk::AccessFlags::SHADER_READ
            | vk::AccessFlags::SHADER_WRITE
            | vk::AccessFlags::HOST_READ
            | vk::AccessFlags::TRANSFER_READ
            | vk::AccessFlags::TRANSFER_WRITE;
        // SAFETY: the slot's command buffer is not pending (waited by the caller);
        // every buffer the copies name stays alive until the fence is waited
        // (kept in the slot).
        unsafe {
            dev.reset_command_buffer(slot.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(|r| ModelError::vk("vkResetCommandBuffer", r))?;
            dev.begin_command_buffer(slot.cmd, &begin)
                .map_err(|r| ModelError::vk("vkBeginCommandBuffer", r))?;
            for &(src, dst, region) in copies {
                dev.cmd_copy_buffer(slot.cmd, src, dst, &[region]);
            }
            memory_barrier(
                &dev,
                slot.cmd,
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_WRITE,
                ),
                (dst_stages, dst_access),
            );
            dev.end_command_buffer(slot.cmd)
                .map_err(|r| ModelError::vk("vkEndCommandBuffer", r))?;
            self.ctx.submit(slot.cmd, slot.fence)?;
        }
        slot.in_flight = true;
        slot.keep = keep;
        Ok(())
    }

    /// Submits the copies waiting in slot `i`, if any.
    fn submit_pending(&mut self, i: usize) -> Result<()> {
        if self.slots[i].pending.is_empty() {
            return Ok(());
        }
        let staging = self.staging()?;
        let pending = std::mem::take(&mut self.slots[i].pending);
        let copies: Vec<_> = pending
            .iter()
            .map(|(dst, region)| (staging.raw(), dst.raw(), *region))
            .collect();
        let mut keep: Vec<Arc<Buffer>> = pending.into_iter().map(|(dst, _)| dst).collect();
        keep.push(staging);
        self.submit_copies(i, &copies, keep)
    }

    /// Copies `data` into `dst` at `offset`. The bytes are on the device
    /// once [`Uploader::flush`] returns, not before.
    ///
    /// # Errors
    /// A range past the end of `dst`, or a failing Vulkan call.
    pub fn upload(&mut self, dst: &Arc<Buffer>, offset: u64, data: &[u8]) -> Result<()> {
        self.upload_with(dst, offset, data.len() as u64, |pos, out| {
            let start = pos as usize;
            out.copy_from_slice(&data[start..start + out.len()]);
        })
    }

    /// Like [`Uploader::upload`], but `fill(pos, out)` writes bytes
    /// `pos..pos + out.len()` of the `len` to upload straight into staging
    /// (or device) memory, so large tensors are converted (repacked) with
    /// no intermediate copy. `fill` runs on several threads at once, on
    /// disjoint pieces.
    ///
    /// # Errors
    /// As [`Uploader::upload`].
    pub fn upload_with(
        &mut self,
        dst: &Arc<Buffer>,
        offset: u64,
        len: u64,
        fill: impl Fn(u64, &mut [u8]) + Sync,
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > dst.size()) {
            return Err(ModelError::Internal(format!(
                "upload of {len} bytes at {offset} past the end of a {} byte buffer",
                dst.size()
            )));
        }
        // Host-visible kinds are written in place under `write_bytes`'s
        // contract (no GPU work on them); device memory only when it is
        // new, where nothing on the queue can still read or write it.
        if dst.kind() != MemoryKind::Device || (self.new_buffers && dst.host_coherent()) {
            // SAFETY: per the contracts above; `dst` outlives the slice.
            let out = unsafe { mapped_mut(dst, offset, len)? };
            par_fill(out, 0, &fill);
            return Ok(());
        }
        let staging = self.staging()?;
        let mut done = 0u64;
        while done < len {
            if self.slots[self.cur].used >= self.half {
                self.submit_pending(self.cur)?;
                self.cur = 1 - self.cur;
                self.wait_slot(self.cur)?;
            }
            let i = self.cur;
            let start = self.slots[i].used;
            let n = (self.half - start).min(len - done);
            let src_offset = i as u64 * self.half + start;
            // SAFETY: this half's earlier copies have completed (waited when
            // it became current) and `start..` is past every piece pending in
            // it; `staging` outlives the slice.
            let out = unsafe { mapped_mut(&staging, src_offset, n)? };
            par_fill(out, done, &fill);
            let region = vk::BufferCopy {
                src_offset,
                dst_offset: offset + done,
                size: n,
            };
            let slot = &mut self.slots[i];
            slot.pending.push((dst.clone(), region));
            slot.used = (start + n).next_multiple_of(REGION_ALIGN).min(self.half);
            done += n;
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `src` at `offset` back to the host.
    ///
    /// # Errors
    /// A range past the end of `src`, or a failing Vulkan call.
    pub fn download(&mut self, src: &Arc<Buffer>, offset: u64, out: &mut [u8]) -> Result<()> {
        let len = out.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > src.size()) {
            return Err(ModelError::Internal(format!(
                "download of {len} bytes at {offset} past the end of a {} byte buffer",
                src.size()
            )));
        }
        if src.kind() != MemoryKind::Device {
            return src.read_bytes(offset, out);
        }
        self.flush()?;
        let staging = self.staging()?;
        let mut done = 0u64;
        while done < len {
            let n = self.half.min(len - done);
            let region = vk::BufferCopy {
                src_offset: offset + done,
                dst_offset: 0,
                size: n,
            };
            self.submit_copies(
                0,
                &[(src.raw(), staging.raw(), region)],
                vec![src.clone(), staging.clone()],
            )?;
            self.wait_slot(0)?;
            staging.read_bytes(0, &mut out[done as usize..(done + n) as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Submits what is pending and waits until every copy has completed.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn flush(&mut self) -> Result<()> {
        self.submit_pending(self.cur)?;
        self.wait_slot(0)?;
        self.wait_slot(1)
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        let _ = self.flush();
        let dev = self.ctx.device();
        // SAFETY: flush waited for both slots; the handles are ours.
        unsafe {
            for s in &self.slots {
                if s.fence != vk::Fence::null() {
                    dev.destroy_fence(s.fence, None);
                }
            }
            dev.destroy_command_pool(self.pool, None);
        }
    }
}

/// Uploads `data` to a new device-local buffer.
///
/// # Errors
/// Out of memory or a failing Vulkan call.
pub fn upload_new(ctx: &Arc<GpuContext>, data: &[u8], name: &str) -> Result<Arc<Buffer>> {
    let buf = Buffer::new(ctx, data.len() as u64, MemoryKind::Device, name)?;
    let mut up = Uploader::for_new_buffers(ctx, (data.len() as u64).min(DEFAULT_HALF))?;
    up.upload(&buf, 0, data)?;
    up.flush()?;
    Ok(buf)
}

/// Reads a whole buffer back to the host as bytes.
///
/// # Errors
/// Out of memory or a failing Vulkan call.
pub fn download_vec(ctx: &Arc<GpuContext>, src: &Arc<Buffer>) -> Result<Vec<u8>> {
    let mut out = vec![0u8; src.size() as usize];
    let mut up = Uploader::with_half_size(ctx, src.size().min(DEFAULT_HALF))?;
    up.download(src, 0, &mut out)?;
    Ok(out)
}
