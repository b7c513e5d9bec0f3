//! `get_rows`: `d[t] = scale * W[ids[t]]`, the token-embedding lookup for a
//! table of any format (one dispatch per row chunk; each writes the tokens
//! whose rows it holds).

use std::sync::Arc;

use super::params::GetRowsParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};
use crate::quant::QuantWeight;

const WG: u32 = 64;

/// Records the lookup of one row of `table` per row of `out`, by the i32
/// ids in `ids` (one per row), scaled by `scale`.
///
/// # Errors
/// Columns not a multiple of 32 or not `out`'s, output rows not 4-float
/// aligned, a view outside its buffer, or a value beyond 32 bits.
pub fn record_get_rows(
    rec: &mut Recording,
    table: &QuantWeight,
    ids: &Arc<Buffer>,
    out: Mat<'_>,
    scale: f32,
) -> Result<()> {
    let k = table.cols();
    if !k.is_multiple_of(32) || out.cols != k || !out.aligned4() {
        return Err(ModelError::Shape {
            tensor: table.name().to_string(),
            expected: vec![k.next_multiple_of(32) as u64],
            got: vec![out.cols as u64],
        });
    }
    out.check("get_rows output")?;
    let n_tokens = out.rows;
    for chunk in table.chunks() {
        let params = GetRowsParams {
            k: pc_u32("k", k)?,
            nb: pc_u32("nb", chunk.n_rows * k / table.qtype().block_size())?,
            row_start: pc_u32("row_start", chunk.row_start)?,
            n_rows: pc_u32("n_rows", chunk.n_rows)?,
            n_tokens: pc_u32("n_tokens", n_tokens)?,
            ld_d: pc_u32("ld_d", out.ld / 4)?,
            d_offset: pc_u32("d_offset", out.offset / 4)?,
            scale,
        };
        let groups = groups_1d(rec.context(), pc_u32("n_tokens", n_tokens)?);
        rec.dispatch(
            Kernel::get_rows(table.qtype()),
            &[WG],
            &[
                Binding::read(&chunk.buffer),
                Binding::read(ids),
                Binding::write(out.buf),
            ],
            bytemuck::bytes_of(&params),
            groups,
        )?;
    }
    Ok(())
}
