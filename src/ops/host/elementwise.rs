//! The light kernels on the host: RMS norm, rope, gated activation,
//! embedding rows, soft-cap, llama.cpp's input rounding and copies. Their
//! arithmetic is the references' (`rms_norm_ref`, `rope_ref`, `act_ref`,
//! ...): these steps are a small share of a pass, and so the host path is
//! as close to an exact forward as it can be. Each reads its inputs into
//! owned rows first (inputs and outputs may share a buffer: per-head norms
//! and ropes work in place), then writes.

use std::sync::Arc;

use half::f16;

use super::{Rows, dequant_rows};
use crate::error::{ModelError, Result};
use crate::gpu::{HostStep, Recording};
use crate::ops::act_round::{ActRounding, act_round_ref};
use crate::ops::backend::{CopyCall, GetRowsCall};
use crate::ops::glu::{GluCall, GluInput};
use crate::ops::rms_norm::{RmsNormCall, rms_norm_ref};
use crate::ops::rope::{RopeCall, rope_angles, rope_apply};
use crate::ops::softcap::softcap_ref;
use crate::ops::topk::{TopKCall, encode_top_k, top_k_host};
use crate::ops::{AnyMat, Mat};

/// Records an RMS norm.
pub(super) fn rms_norm(rec: &mut Recording, call: &RmsNormCall<'_>) -> Result<()> {
    let width = call.check()?;
    let x = Rows::of(&call.x);
    let (out, out_f16) = match call.out() {
        AnyMat::F32(m) => (Rows::of(&m), false),
        AnyMat::F16(m) => (Rows::of(&m), true),
    };
    let (add, weight) = (call.adds(), call.norm.weight.cloned());
    let (flavor, eps) = (call.norm.flavor, call.norm.eps);
    rec.host(HostStep::new("rms_norm", move |mem| {
        let xs = x.to_vec(mem)?;
        let w = match &weight {
            Some(b) => Some(mem.read::<f32>(b, 0..width)?),
            None => None,
        };
        let normed: Vec<f32> = xs
            .chunks_exact(width)
            .flat_map(|piece| rms_norm_ref(piece, w.as_deref(), flavor, eps))
            .collect();
        if out_f16 {
            let mut d = out.write::<u16>(mem)?;
            for r in 0..out.rows {
                let row = out.row_mut(&mut d, r);
                for (o, &v) in row.iter_mut().zip(&normed[r * out.cols..]) {
                    *o = f16::from_f32(v).to_bits();
                }
            }
        } else {
            let mut d = out.write::<f32>(mem)?;
            for r in 0..out.rows {
                let row = out.row_mut(&mut d, r);
                let src = &normed[r * out.cols..(r + 1) * out.cols];
                if add {
                    row.iter_mut().zip(src).for_each(|(o, &v)| *o += v);
                } else {
                    row.copy_from_slice(src);
                }
            }
        }
        Ok(())
    }))
}

/// Records a rope in place.
pub(super) fn rope(rec: &mut Recording, call: &RopeCall<'_>) -> Result<()> {
    let (x, r) = (call.x, call.rope);
    r.check(x.cols)?;
    x.check("rope input")?;
    let rows = Rows::of(&x);
    let (positions, inv_freq) = (r.positions.clone(), r.inv_freq.clone());
    let (style, head_dim, n_rot, af) = (r.style, r.head_dim, r.n_rot, r.attn_factor);
    rec.host(HostStep::new("rope", move |mem| {
        let pos = mem.read::<i32>(&positions, 0..rows.rows)?;
        let freq = mem.read::<f32>(&inv_freq, 0..n_rot / 2)?;
        let mut d = rows.write::<f32>(mem)?;
        for t in 0..rows.rows {
            let angles = rope_angles(pos[t], &freq, n_rot);
            for head in rows.row_mut(&mut d, t).chunks_exact_mut(head_dim) {
                rope_apply(head, &angles, style, af);
            }
        }
        Ok(())
    }))
}

/// Records a gated activation.
pub(super) fn glu(rec: &mut Recording, call: &GluCall<'_>) -> Result<()> {
    let d = call.out;
    let (g, u, interleaved) = match call.input {
        GluInput::Separate { gate, up } => (Rows::of(&gate), Some(Rows::of(&up)), false),
        GluInput::Interleaved(gu) => (Rows::of(&gu), None, true),
    };
    check_glu(call)?;
    let (out, act_fn) = (Rows::of(&d), call.act);
    rec.host(HostStep::new("glu", move |mem| {
        let gs = g.to_vec(mem)?;
        let us = match &u {
            Some(u) => u.to_vec(mem)?,
            None => Vec::new(),
        };
        let mut o = out.write::<f32>(mem)?;
        let w = out.cols;
        let (mut gate, mut up) = (vec![0.0f32; w], vec![0.0f32; w]);
        for t in 0..out.rows {
            if interleaved {
                for c in 0..w {
                    gate[c] = gs[t * 2 * w + 2 * c];
                    up[c] = gs[t * 2 * w + 2 * c + 1];
                }
            } else {
                gate.copy_from_slice(&gs[t * w..(t + 1) * w]);
                up.copy_from_slice(&us[t * w..(t + 1) * w]);
            }
            super::math::gated(act_fn, &gate, &up, out.row_mut(&mut o, t));
        }
        Ok(())
    }))
}

fn check_glu(call: &GluCall<'_>) -> Result<()> {
    let d = call.out;
    let ok = match call.input {
        GluInput::Separate { gate, up } => [gate, up]
            .iter()
            .all(|m| m.rows == d.rows && m.cols == d.cols),
        GluInput::Interleaved(gu) => gu.rows == d.rows && gu.cols == 2 * d.cols,
    };
    if !ok {
        return Err(ModelError::Shape {
            tensor: "glu input".into(),
            expected: vec![d.rows as u64, d.cols as u64],
            got: vec![],
        });
    }
    d.check("glu output")
}

/// Records the lookup of embedding rows.
pub(super) fn get_rows(rec: &mut Recording, call: &GetRowsCall<'_>) -> Result<()> {
    let table = call.table;
    let k = table.cols();
    if call.out.cols != k {
        return Err(ModelError::Shape {
            tensor: table.name().to_string(),
            expected: vec![k as u64],
            got: vec![call.out.cols as u64],
        });
    }
    call.out.check("get_rows output")?;
    let (t, n_vocab, name) = (table.qtype(), table.rows(), table.name().to_string());
    let chunks: Vec<_> = table
        .chunks()
        .iter()
        .map(|c| (c.buffer.clone(), c.row_start, c.n_rows))
        .collect();
    let (out, ids, scale) = (Rows::of(&call.out), call.ids.clone(), call.scale);
    rec.host(HostStep::new("get_rows", move |mem| {
        let ids = mem.read::<i32>(&ids, 0..out.rows)?;
        let mut o = out.write::<f32>(mem)?;
        for (tok, &id) in ids.iter().enumerate() {
            let id = usize::try_from(id)
                .ok()
                .filter(|&i| i < n_vocab)
                .ok_or_else(|| ModelError::invalid("token id", format!("{id} in `{name}`")))?;
            let (buf, start, n) = chunks
                .iter()
                .find(|c| id >= c.1 && id < c.1 + c.2)
                .ok_or_else(|| ModelError::Internal(format!("row {id} of `{name}` in no chunk")))?;
            let bytes = mem.read_all::<u8>(buf)?;
            let row = out.row_mut(&mut o, tok);
            dequant_rows(t, &bytes, *n, k, id - start, 1, row)?;
            row.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }))
}

/// Records the soft-cap of `x` in place.
pub(super) fn softcap(rec: &mut Recording, x: Mat<'_>, cap: f32) -> Result<()> {
    if !(cap > 0.0 && cap.is_finite()) {
        return Err(ModelError::invalid("softcap", format!("{cap}")));
    }
    x.check("softcap rows")?;
    let rows = Rows::of(&x);
    rec.host(HostStep::new("softcap", move |mem| {
        let mut d = rows.write::<f32>(mem)?;
        for r in 0..rows.rows {
            for v in rows.row_mut(&mut d, r) {
                *v = softcap_ref(*v, cap);
            }
        }
        Ok(())
    }))
}

/// Records the top-k of every row of the call's logits.
pub(super) fn top_k(rec: &mut Recording, call: &TopKCall<'_>) -> Result<()> {
    call.check()?;
    let rows = Rows::of(&call.logits);
    let (k, out) = (call.k, call.out.clone());
    rec.host(HostStep::new("top_k", move |mem| {
        let x = rows.read::<f32>(mem)?;
        let mut o = mem.write::<u32>(&out, 0..rows.rows * k * 2)?;
        for r in 0..rows.rows {
            let list = top_k_host(rows.row(&x, r), k);
            encode_top_k(&list, k, &mut o[r * k * 2..(r + 1) * k * 2]);
        }
        Ok(())
    }))
}

/// Records llama.cpp's rounding of product inputs (its reference code).
pub(super) fn act_round(
    rec: &mut Recording,
    mode: ActRounding,
    x: Mat<'_>,
    out: Mat<'_>,
) -> Result<()> {
    if mode == ActRounding::None {
        return Ok(());
    }
    if out.rows != x.rows || out.cols != x.cols || !x.cols.is_multiple_of(mode.block()) {
        return Err(ModelError::invalid(
            "act_round",
            format!(
                "{} columns into {} (block {})",
                x.cols,
                out.cols,
                mode.block()
            ),
        ));
    }
    x.check("act_round input")?;
    out.check("act_round output")?;
    let (xr, or) = (Rows::of(&x), Rows::of(&out));
    rec.host(HostStep::new("act_round", move |mem| {
        let xs = xr.to_vec(mem)?;
        let mut o = or.write::<f32>(mem)?;
        for r in 0..or.rows {
            let rounded = act_round_ref(mode, &xs[r * xr.cols..(r + 1) * xr.cols]);
            or.row_mut(&mut o, r).copy_from_slice(&rounded);
        }
        Ok(())
    }))
}

/// Records a byte copy between buffers.
pub(super) fn copy(rec: &mut Recording, call: &CopyCall<'_>) -> Result<()> {
    let (src, dst) = (call.src.clone(), call.dst.clone());
    let (so, d_o, n) = (
        call.src_offset as usize,
        call.dst_offset as usize,
        call.bytes as usize,
    );
    if so + n > src.size() as usize || d_o + n > dst.size() as usize || Arc::ptr_eq(&src, &dst) {
        return Err(ModelError::Internal(format!(
            "host copy of {n} bytes from {so} to {d_o} outside its buffers"
        )));
    }
    rec.host(HostStep::new("copy", move |mem| {
        let s = mem.read::<u8>(&src, so..so + n)?;
        mem.write::<u8>(&dst, d_o..d_o + n)?.copy_from_slice(&s);
        Ok(())
    }))
}
