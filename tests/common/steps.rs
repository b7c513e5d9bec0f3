//! Model runs several tests compare between two loads of one model.

use std::sync::Arc;

use combs::gpu::Recording;
use combs::kv::CacheKind;
use combs::models::GenerativeModel;
use combs::runtime::{BatchRunner, Session, SessionOptions};

/// The logit rows of `prompt` in chunks of 5 (each a 5-row batch), then of
/// one decode step per token of `more`, in a fresh paged session of
/// `n_ctx` positions, and that session.
pub fn prompt_and_decode_rows(
    model: &Arc<dyn GenerativeModel>,
    prompt: &[u32],
    more: &[u32],
    n_ctx: usize,
) -> (Session, Vec<Vec<f32>>) {
    let opts = SessionOptions {
        n_ctx,
        n_batch: 5,
        n_logit_rows: 5,
        kv_kind: CacheKind::Paged,
        page_size: 16,
        ..Default::default()
    };
    let mut s = Session::new(model.clone(), &opts).expect("session");
    let n_vocab = model.spec().n_vocab;
    let all = s.prefill_all_logits(prompt).expect("prefill");
    let mut rows: Vec<Vec<f32>> = all.chunks(n_vocab).map(<[f32]>::to_vec).collect();
    for &t in more {
        s.decode(t).expect("decode");
        rows.push(s.logits().to_vec());
    }
    (s, rows)
}

/// Every logit row the model produces for `prompt` in chunks of 5, then one
/// decode step per token of `more`, then one batched decode step of `batch`
/// sessions (forks of the prompt) each taking its own token.
pub fn logit_rows(
    model: Arc<dyn GenerativeModel>,
    prompt: &[u32],
    more: &[u32],
    batch: usize,
) -> Vec<Vec<f32>> {
    let (s, mut rows) = prompt_and_decode_rows(&model, prompt, more, 96);
    let mut forks: Vec<Session> = (0..batch).map(|_| s.fork().expect("fork")).collect();
    let tokens: Vec<u32> = (0..batch).map(|i| more[i % more.len()]).collect();
    let mut refs: Vec<&mut Session> = forks.iter_mut().collect();
    BatchRunner::new(model)
        .decode(&mut refs, &tokens)
        .expect("batched decode");
    rows.extend(forks.iter().map(|f| f.logits().to_vec()));
    rows
}

/// One decode step of a fresh contiguous session, recorded (not run): its
/// dispatch and barrier counts say how the model was planned.
pub fn recorded_decode_step(model: &Arc<dyn GenerativeModel>) -> Recording {
    let cache = model
        .create_kv_cache(&combs::kv::CacheConfig::contiguous(8))
        .expect("cache");
    let scratch = model.create_scratch(1, 1).expect("scratch");
    scratch.ids().write_slice(0, &[1i32]).expect("ids");
    scratch
        .positions()
        .write_slice(0, &[0i32])
        .expect("positions");
    let mut rec = Recording::new(model.context(), false).expect("recording");
    model.record_embed(&mut rec, &scratch, 1).expect("embed");
    model
        .record_blocks(&mut rec, &scratch, cache.as_ref(), 1)
        .expect("blocks");
    model
        .record_logits(&mut rec, &scratch, 0, 1, 0)
        .expect("logits");
    rec
}
