//! `softcap`: `d = cap * tanh(d / cap)` in place (llama.cpp `ggml_softcap`):
//! the final logit soft-cap of the models that have one, applied on the
//! device in the logits step so every reader of the logits sees capped ones.

use super::params::SoftcapParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};

/// Records the soft-cap of every element of `x`, in place.
///
/// # Errors
/// A cap that is not positive and finite, a view outside its buffer, or a
/// value beyond 32 bits.
pub fn record_softcap(rec: &mut Recording, x: Mat<'_>, cap: f32) -> Result<()> {
    if !(cap > 0.0 && cap.is_finite()) {
        return Err(ModelError::invalid("softcap", format!("{cap}")));
    }
    x.check("softcap rows")?;
    let params = SoftcapParams {
        n_rows: pc_u32("n_rows", x.rows)?,
        width: pc_u32("width", x.cols)?,
        ld: pc_u32("ld", x.ld)?,
        offset: pc_u32("offset", x.offset)?,
        cap,
    };
    rec.dispatch_elementwise(
        Kernel::SoftcapF32,
        &[Binding::write(x.buf)],
        &params,
        pc_u32("softcap threads", x.rows * x.cols)?,
    )
}

/// Reference soft-cap of one value.
pub fn softcap_ref(x: f32, cap: f32) -> f32 {
    (f64::from(cap) * (f64::from(x) / f64::from(cap)).tanh()) as f32
}
