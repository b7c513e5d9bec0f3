//! The MLC-style steps of [`GenerativeModel`] — `embed`, `prefill`,
//! `decode` over a cache from `create_kv_cache` — by which a caller drives
//! any architecture one call at a time, input vectors and logits on the
//! host. Each step records the model's calls (`record_embed`,
//! `record_put_rows`, `record_blocks`, `record_logits`) over activations of
//! its own, submits and waits: the same kernels as a `Session`, which is
//! the fast path (it keeps its activations and replays one recorded decode
//! step, where these record every call afresh).

use std::sync::Arc;

use super::{GenerativeModel, RowCopy, Scratch};
use crate::error::{ModelError, Result};
use crate::gpu::{Buffer, MemoryKind, run_once};
use crate::kv::KVCache;

/// Most rows one recorded call carries (a longer input runs as several).
const MAX_CALL_ROWS: usize = 512;

/// As [`GenerativeModel::embed`].
pub(super) fn embed<M: GenerativeModel + ?Sized>(m: &M, tokens: &[u32]) -> Result<Vec<f32>> {
    let (d, n_vocab) = (m.spec().n_embd, m.spec().n_vocab);
    if tokens.is_empty() {
        return Err(ModelError::invalid("tokens", "no tokens to embed"));
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ModelError::TokenOutOfRange {
            token: i64::from(t),
            n_vocab,
        });
    }
    let ctx = m.context();
    let rows = MAX_CALL_ROWS.min(tokens.len());
    let s = m.create_scratch(rows, 1)?;
    let read = Buffer::new(
        ctx,
        (4 * rows * d) as u64,
        MemoryKind::Readback,
        "embeddings",
    )?;
    let mut out = vec![0.0f32; tokens.len() * d];
    for (piece, dst) in tokens.chunks(rows).zip(out.chunks_mut(rows * d)) {
        let ids: Vec<i32> = piece.iter().map(|&t| t as i32).collect();
        s.ids().write_slice(0, &ids)?;
        run_once(ctx, |rec| {
            m.record_embed(rec, &s, piece.len())?;
            m.record_read_rows(rec, &s, piece.len(), &read)
        })?;
        read.read_slice(0, dst)?;
    }
    Ok(out)
}

/// As [`GenerativeModel::prefill`].
pub(super) fn prefill<M: GenerativeModel + ?Sized>(
    m: &M,
    embeddings: &[f32],
    cache: &mut dyn KVCache,
) -> Result<Vec<f32>> {
    let d = m.spec().n_embd;
    if embeddings.is_empty() || !embeddings.len().is_multiple_of(d) {
        return Err(ModelError::invalid(
            "embeddings",
            format!("{} floats are not whole rows of {d}", embeddings.len()),
        ));
    }
    if embeddings.iter().any(|v| !v.is_finite()) {
        return Err(ModelError::invalid("embeddings", "non-finite values"));
    }
    let n = embeddings.len() / d;
    if cache.len() + n > cache.n_ctx() {
        return Err(ModelError::ContextFull {
            n_ctx: cache.n_ctx(),
            requested: cache.len() + n,
        });
    }
    let ctx = m.context();
    let rows = MAX_CALL_ROWS.min(cache.max_call_tokens()).min(n).max(1);
    let s = m.create_scratch(rows, 1)?;
    let staging = Buffer::new(ctx, (4 * rows * d) as u64, MemoryKind::Upload, "input rows")?;
    let start = cache.len();
    let pieces: Vec<&[f32]> = embeddings.chunks(rows * d).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let last = i + 1 == pieces.len();
        if let Err(e) = call(m, &s, &staging, piece, cache, last) {
            // An input is evaluated whole or not at all.
            let _ = cache.truncate(start);
            return Err(e);
        }
    }
    let mut logits = vec![0.0f32; m.spec().n_vocab];
    s.logits.read_slice(0, &mut logits)?;
    Ok(logits)
}

/// Evaluates the rows `piece` after what `cache` holds, in one recorded
/// call over `s`, `staging` carrying them to the device; the logits of the
/// last row land in `s.logits` where `last`.
fn call<M: GenerativeModel + ?Sized>(
    m: &M,
    s: &Scratch,
    staging: &Arc<Buffer>,
    piece: &[f32],
    cache: &mut dyn KVCache,
    last: bool,
) -> Result<()> {
    let n = piece.len() / m.spec().n_embd;
    let pos0 = cache.len();
    cache.reserve(n)?;
    let pos: Vec<i32> = (0..n).map(|j| (pos0 + j) as i32).collect();
    s.positions().write_slice(0, &pos)?;
    staging.write_slice(0, piece)?;
    let all = [RowCopy {
        src_row: 0,
        dst_row: 0,
        rows: n,
    }];
    let kv: &dyn KVCache = cache;
    run_once(m.context(), |rec| {
        m.record_put_rows(rec, s, n, staging, &all)?;
        m.record_blocks(rec, s, kv, n)?;
        if last {
            m.record_logits(rec, s, n - 1, 1, 0)?;
        }
        Ok(())
    })?;
    cache.commit(n);
    Ok(())
}

/// As [`GenerativeModel::decode`].
pub(super) fn decode<M: GenerativeModel + ?Sized>(
    m: &M,
    embedding: &[f32],
    cache: &mut dyn KVCache,
) -> Result<Vec<f32>> {
    let d = m.spec().n_embd;
    if embedding.len() != d {
        return Err(ModelError::invalid(
            "embedding",
            format!("{} floats, one row is {d}", embedding.len()),
        ));
    }
    prefill(m, embedding, cache)
}
