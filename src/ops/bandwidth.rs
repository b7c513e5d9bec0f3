//! The device's copy bandwidth, measured with a plain copy kernel: the
//! yardstick of memory-bound steps (a decode step reads every weight once,
//! so weight bytes ÷ this bandwidth is the fastest a token can come).

use std::sync::Arc;
use std::time::Instant;

use super::Mat;
use super::unary::{UnaryCall, UnaryOp, record_unary};
use crate::error::Result;
use crate::gpu::{Buffer, GpuContext, MemoryKind, Recording};

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
    let floats = (bytes.min(cap) / 4).max(1024) as usize;
    let (src, dst) = (
        Buffer::new(ctx, (floats * 4) as u64, MemoryKind::Device, "copy source")?,
        Buffer::new(ctx, (floats * 4) as u64, MemoryKind::Device, "copy target")?,
    );
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
        let call = UnaryCall {
            op: UnaryOp::Copy,
            x: Mat::new(a, 1, floats),
            out: Mat::new(b, 1, floats),
            add: false,
        };
        record_unary(&mut rec, &call)?;
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
        ns.push(gpu.filter(|&g| timed && g > 0.0).unwrap_or(wall));
    }
    ns.sort_by(f64::total_cmp);
    let per_copy = ns[ns.len() / 2] / COPIES as f64;
    Ok(2.0 * (floats * 4) as f64 / (per_copy.max(1.0) * 1e-9))
}
