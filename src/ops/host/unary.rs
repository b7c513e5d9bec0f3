//! Elementwise functions on the host (the exact and tanh GELUs, the copy and
//! their adding forms), rows spread over the cores; the GELUs in f32
//! arithmetic (`math::gelu_erf` and `math::act`, the GLSL kernels') rather
//! than the reference's f64.

use rayon::prelude::*;

use super::Rows;
use crate::error::Result;
use crate::gpu::{HostStep, Recording};
use crate::ops::glu::Activation;
use crate::ops::unary::{UnaryCall, UnaryOp};

/// Records `out (+)= op(x)`.
pub(super) fn record(rec: &mut Recording, call: &UnaryCall<'_>) -> Result<()> {
    call.check()?;
    let (x, out, op, add) = (Rows::of(&call.x), Rows::of(&call.out), call.op, call.add);
    rec.host(HostStep::new("unary", move |mem| {
        let cols = x.cols.max(1);
        let mut ys = x.to_vec(mem)?;
        match op {
            UnaryOp::GeluErf => ys
                .par_chunks_mut(cols)
                .for_each(super::math::gelu_erf_slice),
            UnaryOp::GeluTanh => ys.par_chunks_mut(cols).for_each(|row| {
                for v in row {
                    *v = super::math::act(Activation::GeluTanh, *v);
                }
            }),
            UnaryOp::Copy => {}
        }
        let mut d = out.write::<f32>(mem)?;
        for (r, src) in ys.chunks_exact(cols).enumerate() {
            let row = out.row_mut(&mut d, r);
            if add {
                row.iter_mut().zip(src).for_each(|(o, &v)| *o += v);
            } else {
                row.copy_from_slice(src);
            }
        }
        Ok(())
    }))
}
