//! Layer norm on the host: the reference's arithmetic (f64 mean and
//! variance), rows spread over the cores.

use rayon::prelude::*;

use super::Rows;
use crate::error::Result;
use crate::gpu::{HostStep, Recording};
use crate::ops::layer_norm::{LayerNormCall, layer_norm_ref};

/// Records a layer norm.
pub(super) fn record(rec: &mut Recording, call: &LayerNormCall<'_>) -> Result<()> {
    call.check()?;
    let (x, out) = (Rows::of(&call.x), Rows::of(&call.out));
    let (w, b, eps) = (
        call.norm.weight.clone(),
        call.norm.bias.clone(),
        call.norm.eps,
    );
    rec.host(HostStep::new("layer_norm", move |mem| {
        let cols = x.cols;
        let xs = x.to_vec(mem)?;
        let w = mem.read::<f32>(&w, 0..cols)?.to_vec();
        let b = mem.read::<f32>(&b, 0..cols)?.to_vec();
        let normed: Vec<Vec<f32>> = xs
            .par_chunks_exact(cols)
            .map(|row| layer_norm_ref(row, &w, &b, eps))
            .collect();
        let mut d = out.write::<f32>(mem)?;
        for (r, row) in normed.iter().enumerate() {
            out.row_mut(&mut d, r).copy_from_slice(row);
        }
        Ok(())
    }))
}
