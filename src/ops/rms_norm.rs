//! `rms_norm`: `d = x / sqrt(mean(x²) + eps) * w` per row (llama.cpp
//! `ggml_rms_norm` then `ggml_mul`), with Gemma's `(1 + w)` flavor, an
//! unweighted form, and a residual form that adds the result into `d`.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::{View, expect_f32, kernel_subgroup, pc_u32};
use crate::error::Result;
use crate::gpu::{Binding, Buffer, Kernel, Recording, groups_1d};

/// Push constants of `glsl/rms_norm.comp`.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub struct RmsNormParams {
    /// Elements per row.
    pub n_cols: u32,
    /// Rows.
    pub n_rows: u32,
    /// Floats between rows of x.
    pub ld_x: u32,
    /// Floats between rows of d.
    pub ld_d: u32,
    /// Float index of x's row 0.
    pub x_offset: u32,
    /// Float index of d's row 0.
    pub d_offset: u32,
    /// Epsilon inside the square root.
    pub eps: f32,
    /// 1: (1 + w); 2: add into d; 4: no weight.
    pub flags: u32,
    /// Rows per group (a token's heads); rows of a group are `ld_x` / `ld_d` apart.
    pub group: u32,
    /// Floats between groups of x.
    pub ld_group_x: u32,
    /// Floats between groups of d.
    pub ld_group_d: u32,
}
const _: () = assert!(std::mem::size_of::<RmsNormParams>() == 44);

/// How the normalized row is scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormFlavor {
    /// `x̂ · w` (Llama, Qwen, Mistral, Phi-3; Gemma GGUFs store `1 + w` already).
    Plain,
    /// `x̂ · (1 + w)`, for weights stored zero-centred.
    ZeroCentred,
}

/// Invocations per row. A few rows (batched decode) take 256, so that each
/// invocation loads few elements: on the H200, 16 rows of 2048 in 8.8 µs
/// per dispatch against 11.4 with 128. Many rows (prompts) take just enough
/// for 16 elements each in registers, so that narrow rows do not leave
/// most of a wide workgroup idle.
fn workgroup_size(n_rows: usize, n_cols: usize) -> u32 {
    if n_rows <= 64 {
        return 256;
    }
    match n_cols {
        0..=1024 => 64,
        1025..=2048 => 128,
        _ => 256,
    }
}

/// Records an RMS norm of `n_rows` rows of `n_cols` from `x` into `d`.
/// `weight` of `None` normalizes only; `add` adds the result into `d`.
/// `d` may be f16 (rounded once, to nearest), except with `add`.
///
/// # Errors
/// A value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_rms_norm(
    rec: &mut Recording,
    x: View<'_>,
    weight: Option<&Arc<Buffer>>,
    flavor: NormFlavor,
    d: View<'_>,
    n_rows: usize,
    n_cols: usize,
    eps: f32,
    add: bool,
) -> Result<()> {
    let g = Grouping {
        group: n_rows.max(1),
        ld_group_x: 0,
        ld_group_d: 0,
    };
    record(rec, x, weight, flavor, d, n_rows, n_cols, eps, add, g)
}

/// Records an RMS norm, in place, of every head of `n_tokens` tokens of
/// `x`: head `h` of token `t` is the `head_dim` floats at
/// `x.offset + t * x.ld + h * head_dim` (per-head Q/K norms, with heads
/// packed in rows wider than them).
///
/// # Errors
/// A value beyond 32 bits.
#[allow(clippy::too_many_arguments)]
pub fn record_rms_norm_heads(
    rec: &mut Recording,
    x: View<'_>,
    weight: Option<&Arc<Buffer>>,
    flavor: NormFlavor,
    n_tokens: usize,
    heads: usize,
    head_dim: usize,
    eps: f32,
) -> Result<()> {
    let g = Grouping {
        group: heads.max(1),
        ld_group_x: x.ld,
        ld_group_d: x.ld,
    };
    expect_f32("rms_norm of heads", &[x])?;
    let rows = View { ld: head_dim, ..x };
    record(
        rec,
        rows,
        weight,
        flavor,
        rows,
        n_tokens * heads,
        head_dim,
        eps,
        false,
        g,
    )
}

/// Rows in groups: row r lies at group (r / group), member (r % group).
struct Grouping {
    group: usize,
    ld_group_x: usize,
    ld_group_d: usize,
}

#[allow(clippy::too_many_arguments)]
fn record(
    rec: &mut Recording,
    x: View<'_>,
    weight: Option<&Arc<Buffer>>,
    flavor: NormFlavor,
    d: View<'_>,
    n_rows: usize,
    n_cols: usize,
    eps: f32,
    add: bool,
    g: Grouping,
) -> Result<()> {
    expect_f32("rms_norm input", &[x])?;
    if add && d.f16 {
        return Err(crate::error::ModelError::Internal(
            "rms_norm cannot add into f16".into(),
        ));
    }
    let flags = match flavor {
        NormFlavor::Plain => 0,
        NormFlavor::ZeroCentred => 1,
    } | if add { 2 } else { 0 }
        | if weight.is_none() { 4 } else { 0 };
    let params = RmsNormParams {
        n_cols: pc_u32("n_cols", n_cols)?,
        n_rows: pc_u32("n_rows", n_rows)?,
        ld_x: pc_u32("ld_x", x.ld)?,
        ld_d: pc_u32("ld_d", d.ld)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        d_offset: pc_u32("d_offset", d.offset)?,
        eps,
        flags,
        group: pc_u32("group", g.group)?,
        ld_group_x: pc_u32("ld_group_x", g.ld_group_x)?,
        ld_group_d: pc_u32("ld_group_d", g.ld_group_d)?,
    };
    let ctx = rec.context().clone();
    let groups = groups_1d(&ctx, pc_u32("rows", n_rows)?);
    rec.dispatch(
        if d.f16 {
            Kernel::RmsNormF32F16
        } else {
            Kernel::RmsNormF32
        },
        &[workgroup_size(n_rows, n_cols), kernel_subgroup(&ctx)],
        &[
            Binding::read(x.buf),
            Binding::read(weight.unwrap_or(x.buf)),
            Binding::write(d.buf),
        ],
        bytemuck::bytes_of(&params),
        groups,
    )
}

/// Reference RMS norm of one row (f64 sum of squares, as ggml's CPU path).
pub fn rms_norm_ref(x: &[f32], w: Option<&[f32]>, flavor: NormFlavor, eps: f32) -> Vec<f32> {
    let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, &v)| {
            let mut wi = w.map_or(1.0, |w| w[i]);
            if flavor == NormFlavor::ZeroCentred {
                wi += 1.0;
            }
            v * scale * wi
        })
        .collect()
}
