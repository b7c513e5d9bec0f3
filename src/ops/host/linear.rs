//! Products on the host: tiles of weight rows decoded to f32 once per call
//! (`dequant_rows`), multiplied with every token of the call by a register
//! micro-kernel (4 rows × 2 tokens, 8 lanes each), tiles spread over the
//! cores. The folded steps of the Vulkan families (a norm of the input, a
//! rope or a gate on the output) are done with the reference arithmetic of
//! the steps they replace, so fused and unfused host passes agree exactly.

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use super::dot::{self, DotRows, Planes};
use super::{Rows, dequant_rows};
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx2_kquant};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, HostMem, HostStep, Recording};
use crate::ops::AnyMat;
use crate::ops::glu::Activation;
use crate::ops::linear::{Input, LinearCall, Output};
use crate::ops::rms_norm::{NormFlavor, rms_norm_ref};
use crate::ops::rope::{RopeStyle, rope_angles, rope_apply};
use crate::quant::QuantType;

/// Weight rows one task decodes and multiplies.
const TILE: usize = 16;

/// The weight as a host step holds it.
struct Weight {
    name: String,
    qtype: QuantType,
    cols: usize,
    rows: usize,
    /// (buffer, first row, rows) of each chunk.
    chunks: Vec<(Arc<Buffer>, usize, usize)>,
}

/// What the product reads, as a host step holds it.
enum In {
    F32(Rows),
    F16(Rows),
    Normed {
        x: Rows,
        weight: Arc<Buffer>,
        flavor: NormFlavor,
        eps: f32,
    },
}

/// A rope of adjacent pairs on the first `rows` output rows.
struct Rope {
    rows: usize,
    head_dim: usize,
    n_rot: usize,
    positions: Arc<Buffer>,
    inv_freq: Arc<Buffer>,
    attn_factor: f32,
}

/// Where the product goes, as a host step holds it.
enum Out {
    Store(Rows),
    Accumulate(Rows),
    Roped(Rows, Rope),
    Gated(Rows, Activation),
}

/// Records a product as a host step.
///
/// # Errors
/// Operands that do not match the weight, or an input or output only the
/// skinny cooperative-matrix products take (f16 gated output, sums of
/// squares).
pub(super) fn record(rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
    call.check()?;
    let unsupported = || {
        ModelError::kernel(
            "host linear",
            format!(
                "`{}`: {:?} into {:?}",
                call.weight.name(),
                call.input,
                call.output
            ),
        )
    };
    let input = match call.input {
        Input::F32(x) => In::F32(Rows::of(&x)),
        Input::F16(x) => In::F16(Rows::of(&x)),
        Input::Normed { x, norm } => In::Normed {
            x: Rows::of(&x),
            weight: norm.weight.clone(),
            flavor: norm.flavor,
            eps: norm.eps,
        },
        Input::NormedBySquares { .. } => return Err(unsupported()),
    };
    let output = match call.output {
        Output::Store(m) => Out::Store(Rows::of(&m)),
        Output::Accumulate(m) => Out::Accumulate(Rows::of(&m)),
        Output::Roped { out, rope } => {
            let r = rope.rope();
            Out::Roped(
                Rows::of(&out),
                Rope {
                    rows: rope.rows,
                    head_dim: r.head_dim,
                    n_rot: r.n_rot,
                    positions: r.positions.clone(),
                    inv_freq: r.inv_freq.clone(),
                    attn_factor: r.attn_factor,
                },
            )
        }
        Output::Gated {
            out: AnyMat::F32(m),
            act,
        } => Out::Gated(Rows::of(&m), act),
        Output::Gated { .. } | Output::AccumulateSquares { .. } => return Err(unsupported()),
    };
    let w = call.weight;
    let weight = Weight {
        name: w.name().to_string(),
        qtype: w.qtype(),
        cols: w.cols(),
        rows: w.rows(),
        chunks: w
            .chunks()
            .iter()
            .map(|c| (c.buffer.clone(), c.row_start, c.n_rows))
            .collect(),
    };
    let bias = call.bias.cloned();
    rec.host(HostStep::new("linear", move |mem| {
        let xs = inputs(mem, &input, weight.cols)?;
        let n = xs.len() / weight.cols.max(1);
        let y = product(mem, &weight, &xs, n)?;
        store(mem, &weight, bias.as_deref(), &y, n, &output)
    }))
}

/// The input rows, packed (`n × cols` f32).
fn inputs(mem: &HostMem, input: &In, cols: usize) -> Result<Vec<f32>> {
    Ok(match input {
        In::F32(x) => x.to_vec(mem)?,
        In::F16(x) => {
            let span = x.read::<u16>(mem)?;
            (0..x.rows)
                .flat_map(|r| x.row(&span, r).iter().map(|&h| f16::from_bits(h).to_f32()))
                .collect()
        }
        In::Normed {
            x,
            weight,
            flavor,
            eps,
        } => {
            let w = mem.read::<f32>(weight, 0..cols)?;
            let xs = x.to_vec(mem)?;
            xs.chunks_exact(cols)
                .flat_map(|row| rms_norm_ref(row, Some(&w), *flavor, *eps))
                .collect()
        }
    })
}

/// `y[r * n + t] = W[r] · x[t]` for every weight row and token.
fn product(mem: &HostMem, w: &Weight, xs: &[f32], n: usize) -> Result<Vec<f32>> {
    let k = w.cols;
    let mut y = vec![0.0f32; w.rows * n];
    for (buf, start, rows) in &w.chunks {
        let bytes = mem.read_all::<u8>(buf)?;
        let chunk: &[u8] = &bytes;
        let ys = &mut y[start * n..(start + rows) * n];
        if n == 1 && one_token(w.qtype, chunk, *rows, k, xs, ys) {
            continue;
        }
        ys.par_chunks_mut(TILE * n)
            .enumerate()
            .try_for_each_init(Vec::new, |wbuf: &mut Vec<f32>, (i, yt)| {
                let r0 = i * TILE;
                let nr = yt.len() / n;
                wbuf.resize(nr * k, 0.0);
                dequant_rows(w.qtype, chunk, *rows, k, r0, nr, wbuf)?;
                tile_products(wbuf, nr, xs, n, k, yt);
                Ok::<(), ModelError>(())
            })
            .map_err(|e| ModelError::Internal(format!("`{}`: {e}", w.name)))?;
    }
    Ok(y)
}

/// One token's products straight from the packed rows, without decoded
/// rows in between, where the format has such a kernel; `false` leaves `y`
/// to the tiled path.
fn one_token(q: QuantType, chunk: &[u8], rows: usize, k: usize, x: &[f32], y: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = super::avx2_level() {
        let kquant = avx2_kquant::fused(q);
        if !(kquant || dot::fused(q)) {
            return false;
        }
        let Some(planes) = Planes::new(q, chunk, rows, k) else {
            return false;
        };
        let xb = avx2::x_blocks(simd, x);
        y.par_chunks_mut(TILE).enumerate().for_each(|(i, yt)| {
            if kquant {
                avx2_kquant::dot_rows(simd, &planes, i * TILE, &xb, yt);
            } else {
                avx2::dot_rows(simd, &planes, i * TILE, &xb, yt);
            }
        });
        return true;
    }
    if !dot::fused(q) {
        return false;
    }
    let Some(planes) = Planes::new(q, chunk, rows, k) else {
        return false;
    };
    y.par_chunks_mut(TILE).enumerate().for_each(|(i, yt)| {
        let (w, r0, y) = (&planes, i * TILE, yt);
        super::arch().dispatch(DotRows { w, r0, x, y });
    });
    true
}

/// A tile's products with every token: the AVX2 micro-kernel where the
/// machine has it, else the portable one at the SIMD level `pulp` finds.
fn tile_products(w: &[f32], nr: usize, x: &[f32], n: usize, k: usize, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = super::avx2_level() {
        avx2::tile(simd, w, nr, x, n, k, y);
        return;
    }
    super::arch().dispatch(Tile { w, nr, x, n, k, y });
}

/// One tile's products, compiled for the SIMD level `pulp` detected
/// (`with_simd` is inlined into a function with those target features, and
/// everything below it into `with_simd`).
struct Tile<'a> {
    w: &'a [f32],
    nr: usize,
    x: &'a [f32],
    n: usize,
    k: usize,
    y: &'a mut [f32],
}

impl pulp::WithSimd for Tile<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        tile(self.w, self.nr, self.x, self.n, self.k, self.y);
    }
}

/// `y[r * n + t] = w[r] · x[t]` for `nr` rows of `w` and `n` tokens of `x`.
#[inline(always)]
fn tile(w: &[f32], nr: usize, x: &[f32], n: usize, k: usize, y: &mut [f32]) {
    let row = |s, i| row_of(s, i, k);
    let mut r = 0;
    while r < nr {
        let rs = (nr - r).min(4);
        let mut t = 0;
        while t < n {
            let ts = (n - t).min(2);
            let mut acc = [[0.0f32; 2]; 4];
            match (rs, ts) {
                (4, 2) => micro::<4, 2>(
                    [row(w, r), row(w, r + 1), row(w, r + 2), row(w, r + 3)],
                    [row(x, t), row(x, t + 1)],
                    &mut acc,
                ),
                (4, 1) => micro::<4, 1>(
                    [row(w, r), row(w, r + 1), row(w, r + 2), row(w, r + 3)],
                    [row(x, t)],
                    &mut acc,
                ),
                (_, 2) => {
                    for i in 0..rs {
                        micro::<1, 2>([row(w, r + i)], [row(x, t), row(x, t + 1)], &mut acc[i..]);
                    }
                }
                _ => {
                    for i in 0..rs {
                        micro::<1, 1>([row(w, r + i)], [row(x, t)], &mut acc[i..]);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate().take(rs) {
                for (j, &v) in a.iter().enumerate().take(ts) {
                    y[(r + i) * n + t + j] = v;
                }
            }
            t += ts;
        }
        r += rs;
    }
}

/// Row `i` of packed rows of `k`.
#[inline(always)]
fn row_of(s: &[f32], i: usize, k: usize) -> &[f32] {
    &s[i * k..(i + 1) * k]
}

/// `acc[i][j] = w[i] · x[j]`, 8 lanes per row and token in registers.
#[inline(always)]
fn micro<const R: usize, const T: usize>(w: [&[f32]; R], x: [&[f32]; T], acc: &mut [[f32; 2]]) {
    let k = w[0].len();
    let k8 = k / 8 * 8;
    let mut lanes = [[[0.0f32; 8]; T]; R];
    let w8: [&[[f32; 8]]; R] = w.map(|s| bytemuck::cast_slice(&s[..k8]));
    let x8: [&[[f32; 8]]; T] = x.map(|s| bytemuck::cast_slice(&s[..k8]));
    for c in 0..k8 / 8 {
        for i in 0..R {
            let wv = w8[i][c];
            for j in 0..T {
                let xv = x8[j][c];
                for l in 0..8 {
                    lanes[i][j][l] = wv[l].mul_add(xv[l], lanes[i][j][l]);
                }
            }
        }
    }
    for i in 0..R {
        for j in 0..T {
            let mut s: f32 = lanes[i][j].iter().sum();
            for c in k8..k {
                s = w[i][c].mul_add(x[j][c], s);
            }
            acc[i][j] = s;
        }
    }
}

/// Writes `y` (+ bias) into the output with the folded step.
fn store(
    mem: &HostMem,
    w: &Weight,
    bias: Option<&Buffer>,
    y: &[f32],
    n: usize,
    out: &Out,
) -> Result<()> {
    let b = match bias {
        Some(b) => Some(mem.read::<f32>(b, 0..w.rows)?),
        None => None,
    };
    let value = |r: usize, t: usize| y[r * n + t] + b.as_ref().map_or(0.0, |b| b[r]);
    match out {
        Out::Store(o) | Out::Accumulate(o) => {
            let add = matches!(out, Out::Accumulate(_));
            let mut d = o.write::<f32>(mem)?;
            for t in 0..n {
                for (r, v) in o.row_mut(&mut d, t).iter_mut().enumerate() {
                    *v = if add { *v + value(r, t) } else { value(r, t) };
                }
            }
        }
        Out::Roped(o, rope) => {
            let pos = mem.read::<i32>(&rope.positions, 0..n)?;
            let freq = mem.read::<f32>(&rope.inv_freq, 0..rope.n_rot / 2)?;
            let mut d = o.write::<f32>(mem)?;
            for t in 0..n {
                let row = o.row_mut(&mut d, t);
                for (r, v) in row.iter_mut().enumerate() {
                    *v = value(r, t);
                }
                let angles = rope_angles(pos[t], &freq, rope.n_rot);
                for head in row[..rope.rows].chunks_exact_mut(rope.head_dim) {
                    rope_apply(head, &angles, RopeStyle::Normal, rope.attn_factor);
                }
            }
        }
        Out::Gated(o, act) => {
            let mut d = o.write::<f32>(mem)?;
            let (mut gate, mut up) = (vec![0.0f32; o.cols], vec![0.0f32; o.cols]);
            for t in 0..n {
                for c in 0..o.cols {
                    gate[c] = value(2 * c, t);
                    up[c] = value(2 * c + 1, t);
                }
                super::math::gated(*act, &gate, &up, o.row_mut(&mut d, t));
            }
        }
    }
    Ok(())
}
