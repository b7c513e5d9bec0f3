//! The device's copy bandwidth, measured with a plain copy kernel
//! (`glsl/copy.comp`: 16-byte words, a grid of a few workgroups per SM
//! striding over the buffer): the yardstick of memory-bound steps (a
//! decode step reads every weight once, so weight bytes ÷ this bandwidth
//! is the fastest a token can come).

use std::sync::Arc;
use std::time::Instant;

use super::params::CopyParams;
use super::pc_u32;
use crate::error::Result;
use crate::gpu::{Binding, Buffer, GpuContext, Kernel, MemoryKind, Recording};

/// Invocations per workgroup of the copy.
const COPY_WG: u32 = 256;

/// Copies recorded per timed submission.
const COPIES: usize = 8;

/// Bytes per second a plain copy kernel moves (each byte read once and
/// written once, both counted) through buffers of up to `bytes` (capped by
/// the device's binding range and a quarter of its memory): the median of
/// five submissions, timed by GPU timestamps where the queue has them, by
/// the host's clock otherwise.
///
/// # Errors
/// Out of device memory, device errors.
pub fn copy_bandwidth(ctx: &Arc<GpuContext>, bytes: u64) -> Result<f64> {
    let caps = ctx.caps();
    let cap = caps
        .max_binding_bytes(16)
        .min(caps.device_local_bytes / 4)
        .max(1 << 20);
    let words = (bytes.min(cap) / 16).max(1024) as usize;
    let (src, dst) = (
        Buffer::new(ctx, (words * 16) as u64, MemoryKind::Device, "copy source")?,
        Buffer::new(ctx, (words * 16) as u64, MemoryKind::Device, "copy target")?,
    );
    // Enough workgroups for every SM several times over, few enough that
    // each invocation copies many words.
    let groups = 8 * caps.sm_count.unwrap_or(128);
    let params = CopyParams {
        n_words: pc_u32("copy words", words)?,
    };
    let timed = caps.timestamp_period_ns.is_some();
    let mut rec = if timed {
        Recording::timed(ctx)?
    } else {
        Recording::new(ctx, false)?
    };
    rec.timestamp("start");
    for i in 0..COPIES {
        // Alternate directions so each copy depends on the last one.
        let (a, b) = if i % 2 == 0 {
            (&src, &dst)
        } else {
            (&dst, &src)
        };
        rec.dispatch(
            Kernel::CopyU32x4,
            &[COPY_WG],
            &[Binding::read(a), Binding::write(b)],
            bytemuck::bytes_of(&params),
            [groups, 1, 1],
        )?;
    }
    rec.timestamp("end");
    rec.finish()?;
    rec.submit_and_wait()?;
    let mut ns = Vec::with_capacity(5);
    for _ in 0..5 {
        let t = Instant::now();
        rec.submit_and_wait()?;
        let wall = t.elapsed().as_secs_f64() * 1e9;
        let gpu = rec.timestamps()?.last().map(|(_, ns)| *ns);
        ns.push(gpu.filter(|&g| g > 0.0).unwrap_or(wall));
    }
    ns.sort_by(f64::total_cmp);
    let per_copy = ns[ns.len() / 2] / COPIES as f64;
    Ok(2.0 * (words * 16) as f64 / (per_copy.max(1.0) * 1e-9))
}
