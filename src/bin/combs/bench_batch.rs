//! `combs bench --batch 1,4,16,64`: aggregate decode throughput of B
//! sequences advanced together (`Model::decode_batch`, one forward pass per
//! step for all B). Each sequence holds a short prompt (evaluated in one
//! batched prefill, not timed); then `-n` steps of all B are timed, after a
//! warm-up, and repeated. With `--sampler greedy|default` each step
//! draws the next tokens (`Model::decode_batch_sample`) instead of reading
//! every row of logits for given tokens. With `--profile`, one more step of
//! each batch size is recorded with GPU timestamps.

use std::time::Instant;

use combs::kv::CacheKind;
use combs::runtime::{BatchRunner, Model, Sampler, SamplerOptions, Session, SessionOptions};

use crate::CliError;

/// Prompt tokens each sequence holds before the timed steps.
pub const BATCH_PROMPT: usize = 16;
/// Rows per page of the sessions' page pool.
const PAGE: usize = 64;

/// One batch size's result.
pub struct BatchResult {
    /// Sequences decoded together.
    pub batch: usize,
    /// Tokens/s summed over the sequences, one figure per repetition.
    pub samples: Vec<f64>,
    /// GPU milliseconds per kernel of one more step, when profiled.
    pub profile: Vec<(String, f64)>,
}

/// Times `n_gen` batched decode steps for each of `sizes`, `reps` times after a warm-up.
///
/// # Errors
/// Session creation (out of memory) or evaluation errors.
pub fn run(
    model: &Model,
    sizes: &[usize],
    n_gen: usize,
    reps: usize,
    profile: bool,
    sampler: Option<&SamplerOptions>,
    tokens: impl Fn(usize, u64) -> Vec<u32>,
) -> Result<Vec<BatchResult>, CliError> {
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let n_ctx = BATCH_PROMPT + n_gen + 1;
    let opts = SessionOptions {
        n_ctx,
        kv_kind: CacheKind::Paged,
        page_size: PAGE,
        // Pages for the largest batch; the first session makes the pool.
        pool_pages: largest * n_ctx.div_ceil(PAGE) + 1,
        n_batch: BATCH_PROMPT,
        ..Default::default()
    };
    let mut out = Vec::new();
    for &b in sizes {
        let mut sessions: Vec<Session> = (0..b)
            .map(|_| model.new_session(&opts))
            .collect::<Result<_, _>>()?;
        let prompts: Vec<Vec<u32>> = (0..b).map(|i| tokens(BATCH_PROMPT, i as u64)).collect();
        {
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            let views: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            model.prefill_batch(&mut refs, &views)?;
        }
        let steps: Vec<Vec<u32>> = (0..n_gen).map(|j| tokens(b, 1000 + j as u64)).collect();
        let mut samples = Vec::new();
        for rep in 0..=reps {
            for s in &mut sessions {
                s.rewind(BATCH_PROMPT)?;
            }
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            let dt = match sampler {
                None => {
                    let t0 = Instant::now();
                    for step in &steps {
                        model.decode_batch(&mut refs, step)?;
                    }
                    t0.elapsed().as_secs_f64()
                }
                Some(o) => {
                    // Each sequence's own seed, as a server's would be.
                    let mut samplers: Vec<Sampler> = (0..b)
                        .map(|i| {
                            Sampler::new(SamplerOptions {
                                seed: o.seed.wrapping_add(i as u64),
                                ..o.clone()
                            })
                        })
                        .collect::<Result<_, _>>()?;
                    let mut srefs: Vec<&mut Sampler> = samplers.iter_mut().collect();
                    let mut next = steps[0].clone();
                    let t0 = Instant::now();
                    for _ in 0..n_gen {
                        next = model.decode_batch_sample(&mut refs, &next, &mut srefs)?;
                    }
                    t0.elapsed().as_secs_f64()
                }
            };
            if rep > 0 {
                samples.push((b * n_gen) as f64 / dt);
            }
        }
        let mut prof = Vec::new();
        if profile && b > 1 {
            // One more step (the context holds it) through a runner that
            // records with timestamps.
            let mut runner = BatchRunner::new(model.weights().clone());
            runner.set_timestamps(true);
            let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
            match sampler {
                None => runner.decode(&mut refs, &steps[0])?,
                Some(o) => {
                    let mut samplers: Vec<Sampler> = (0..b)
                        .map(|_| Sampler::new(o.clone()))
                        .collect::<Result<_, _>>()?;
                    let mut srefs: Vec<&mut Sampler> = samplers.iter_mut().collect();
                    runner.decode_sample(&mut refs, &steps[0], &mut srefs)?;
                }
            }
            prof = runner.last_profile()?;
        }
        out.push(BatchResult {
            batch: b,
            samples,
            profile: prof,
        });
    }
    Ok(out)
}
