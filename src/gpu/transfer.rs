//! Moving bytes between host and device-local buffers through a staging ring:
//! two host-visible halves, so the CPU fills one while the GPU copies the
//! other. Made once per model load (or per test) and dropped after.

use std::sync::Arc;

use ash::vk;

use super::buffer::{Buffer, MemoryKind};
use super::command::memory_barrier;
use super::context::GpuContext;
use super::phases::{self, Phase};
use super::wait::{WaitMode, wait_and_reset};
use crate::error::{ModelError, Result};

const DEFAULT_HALF: u64 = 16 << 20;

struct Slot {
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    in_flight: bool,
    keep: Option<Arc<Buffer>>,
}

/// A staging ring for uploads to and downloads from device-local buffers.
pub struct Uploader {
    ctx: Arc<GpuContext>,
    staging: Arc<Buffer>,
    half: u64,
    pool: vk::CommandPool,
    slots: [Slot; 2],
    next: usize,
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
        let staging = Buffer::new(ctx, 2 * half, MemoryKind::Upload, "staging ring")?;
        let dev = ctx.device();
        let pool = ctx.create_command_pool()?;
        let alloc = vk::CommandBufferAllocateInfo::default()
            .command_pool(pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2);
        let mut up = Uploader {
            ctx: ctx.clone(),
            staging,
            half,
            pool,
            slots: [
                Slot {
                    cmd: vk::CommandBuffer::null(),
                    fence: vk::Fence::null(),
                    in_flight: false,
                    keep: None,
                },
                Slot {
                    cmd: vk::CommandBuffer::null(),
                    fence: vk::Fence::null(),
                    in_flight: false,
                    keep: None,
                },
            ],
            next: 0,
        };
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

    fn wait_slot(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.slots[i];
        if !slot.in_flight {
            return Ok(());
        }
        let done = wait_and_reset(self.ctx.device(), slot.fence, WaitMode::Block);
        slot.in_flight = false;
        slot.keep = None;
        done
    }

    /// Submits the copy of `region` from `src` to `dst` on slot `i`.
    fn submit_copy(
        &mut self,
        i: usize,
        src: &Arc<Buffer>,
        dst: &Arc<Buffer>,
        region: vk::BufferCopy,
    ) -> Result<()> {
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
        // both buffers stay alive until the fence is waited (kept in the slot).
        unsafe {
            dev.reset_command_buffer(slot.cmd, vk::CommandBufferResetFlags::empty())
                .map_err(|r| ModelError::vk("vkResetCommandBuffer", r))?;
            dev.begin_command_buffer(slot.cmd, &begin)
                .map_err(|r| ModelError::vk("vkBeginCommandBuffer", r))?;
            dev.cmd_copy_buffer(slot.cmd, src.raw(), dst.raw(), &[region]);
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
        slot.keep = Some(if src.kind() == MemoryKind::Device {
            src.clone()
        } else {
            dst.clone()
        });
        Ok(())
    }

    /// Copies `data` into `dst` at `offset`, in pieces of at most one ring half.
    /// Returns before the last piece has landed; [`Uploader::flush`] waits.
    ///
    /// # Errors
    /// A range past the end of `dst`, or a failing Vulkan call.
    pub fn upload(&mut self, dst: &Arc<Buffer>, offset: u64, data: &[u8]) -> Result<()> {
        self.upload_with(dst, offset, data.len() as u64, |piece_offset, out| {
            let start = piece_offset as usize;
            out.copy_from_slice(&data[start..start + out.len()]);
        })
    }

    /// Like [`Uploader::upload`], but `fill(piece_offset, out)` writes each
    /// piece straight into staging memory, so large tensors can be converted
    /// (repacked) without an intermediate copy of the whole tensor.
    ///
    /// # Errors
    /// As [`Uploader::upload`].
    pub fn upload_with(
        &mut self,
        dst: &Arc<Buffer>,
        offset: u64,
        len: u64,
        mut fill: impl FnMut(u64, &mut [u8]),
    ) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > dst.size()) {
            return Err(ModelError::Internal(format!(
                "upload of {len} bytes at {offset} past the end of a {} byte buffer",
                dst.size()
            )));
        }
        if dst.kind() != MemoryKind::Device {
            let mut tmp = vec![0u8; len as usize];
            fill(0, &mut tmp);
            return dst.write_bytes(offset, &tmp);
        }
        let mut done = 0u64;
        let mut piece = vec![0u8; self.half.min(len) as usize];
        while done < len {
            let n = self.half.min(len - done);
            let i = self.next;
            self.next = 1 - self.next;
            {
                let _t = phases::time(Phase::Wait);
                self.wait_slot(i)?;
            }
            let buf = &mut piece[..n as usize];
            let staging_offset = i as u64 * self.half;
            {
                let _t = phases::time(Phase::Fill).bytes(n);
                fill(done, buf);
                self.staging.write_bytes(staging_offset, buf)?;
            }
            let staging = self.staging.clone();
            let region = vk::BufferCopy {
                src_offset: staging_offset,
                dst_offset: offset + done,
                size: n,
            };
            {
                let _t = phases::time(Phase::Submit);
                self.submit_copy(i, &staging, dst, region)?;
            }
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
        let mut done = 0u64;
        while done < len {
            let n = self.half.min(len - done);
            let staging = self.staging.clone();
            let region = vk::BufferCopy {
                src_offset: offset + done,
                dst_offset: 0,
                size: n,
            };
            self.submit_copy(0, src, &staging, region)?;
            self.wait_slot(0)?;
            self.staging
                .read_bytes(0, &mut out[done as usize..(done + n) as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Waits until every submitted copy has completed.
    ///
    /// # Errors
    /// A failing Vulkan call.
    pub fn flush(&mut self) -> Result<()> {
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
    let mut up = Uploader::with_half_size(ctx, (data.len() as u64).min(DEFAULT_HALF))?;
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
