//! A convolution's patch rows on the host (the reference's loops over the
//! span of the input the call reads).

use super::Rows;
use crate::error::Result;
use crate::gpu::{HostStep, Recording};
use crate::ops::im2col::{Im2colCall, im2col_ref};

/// Records the patches.
pub(super) fn record(rec: &mut Recording, call: &Im2colCall<'_>) -> Result<()> {
    let n_in = call.check()?;
    let (x, _, stride_c, stride_t) = call.layout();
    let (conv, out) = (call.conv, Rows::of(&call.out));
    let (xbuf, x_off) = (x.buf.clone(), x.offset);
    let span = match n_in {
        0 => 0,
        n => (conv.channels - 1) * stride_c + (n - 1) * stride_t + 1,
    };
    rec.host(HostStep::new("im2col", move |mem| {
        let xs = mem.read::<f32>(&xbuf, x_off..x_off + span)?.to_vec();
        let patches = im2col_ref(conv, &xs, n_in, stride_c, stride_t);
        let mut d = out.write::<f32>(mem)?;
        for (r, row) in patches.chunks_exact(out.cols.max(1)).enumerate() {
            out.row_mut(&mut d, r).copy_from_slice(row);
        }
        Ok(())
    }))
}
