//! `get_rows`: `d[t] = scale * W[ids[t]]`, the token-embedding lookup for a
//! table of any format (one dispatch per row chunk; each writes the tokens
//! whose rows it holds).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{View, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};
use crate::quant::QuantWeight;

/// Push constants of `glsl/get_rows.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct GetRowsParams {
    /// Columns.
    pub k: u32,
    /// Blocks in the chunk.
    pub nb: u32,
    /// First row of the chunk.
    pub row_start: u32,
    /// Rows in the chunk.
    pub n_rows: u32,
    /// Tokens.
    pub n_tokens: u32,
    /// vec4s between tokens of d.
    pub ld_d: u32,
    /// vec4 index of d's token 0.
    pub d_offset: u32,
    /// Multiplier (Gemma scales embeddings by √n_embd).
    pub scale: f32,
}
const _: () = assert!(std::mem::size_of::<GetRowsParams>() == 32);

const WG: u32 = 64;

/// Records the lookup of `n_tokens` ids (i32 in `ids`) into `d`.
///
/// # Errors
/// Columns not a multiple of 32, or output offsets not multiples of 4.
pub fn record_get_rows(
    rec: &mut Recording,
    table: &QuantWeight,
    ids: &Arc<Buffer>,
    n_tokens: usize,
    d: View<'_>,
    scale: f32,
) -> Result<()> {
    super::expect_f32("record_get_rows", &[d])?;
    let k = table.cols();
    if !k.is_multiple_of(32) || !d.ld.is_multiple_of(4) || !d.offset.is_multiple_of(4) {
        return Err(ModelError::Shape {
            tensor: table.name().to_string(),
            expected: vec![k.next_multiple_of(32) as u64],
            got: vec![k as u64],
        });
    }
    let kernel =
        Kernel::by_name(&format!("get_rows_{}_f32", table.qtype().name())).ok_or_else(|| {
            ModelError::UnsupportedTensorType {
                tensor: table.name().to_string(),
                ggml_type: table.qtype().to_string(),
            }
        })?;
    for chunk in table.chunks() {
        let params = GetRowsParams {
            k: pc_u32("k", k)?,
            nb: pc_u32("nb", chunk.n_rows * k / table.qtype().block_size())?,
            row_start: pc_u32("row_start", chunk.row_start)?,
            n_rows: pc_u32("n_rows", chunk.n_rows)?,
            n_tokens: pc_u32("n_tokens", n_tokens)?,
            ld_d: pc_u32("ld_d", d.ld / 4)?,
            d_offset: pc_u32("d_offset", d.offset / 4)?,
            scale,
        };
        let groups = groups_1d(rec.context(), pc_u32("n_tokens", n_tokens)?);
        rec.dispatch(
            kernel,
            &[WG],
            &[
                Binding::read(&chunk.buffer),
                Binding::read(ids),
                Binding::write(d.buf),
            ],
            bytemuck::bytes_of(&params),
            groups,
        )?;
    }
    Ok(())
}
