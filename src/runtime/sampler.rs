//! Token sampling from logits: repetition penalty, top-k, top-p, min-p,
//! temperature and a seeded draw, in llama.cpp's default chain order
//! (penalties → top-k → top-p → min-p → temperature → draw); greedy argmax
//! when the temperature is 0.

use super::rng::Rng;
use crate::error::{ModelError, Result};
use crate::ops::topk::{ranks_before, top_k_host};

/// Sampling parameters (the C API's `combs_sampler_options`).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerOptions {
    /// 0: greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 or less: all).
    pub top_k: i32,
    /// Keep the smallest set whose probability reaches p (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one (0: none).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1: none).
    pub repeat_penalty: f32,
    /// How many recent tokens the penalty looks at (0: none, -1: all).
    pub repeat_last_n: i32,
    /// Seed of the random draw.
    pub seed: u64,
}

impl Default for SamplerOptions {
    fn default() -> Self {
        SamplerOptions {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5eed,
        }
    }
}

impl SamplerOptions {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplerOptions {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Checks every field's range.
    ///
    /// # Errors
    /// A negative or non-finite temperature, top_p or min_p outside [0, 1],
    /// a repeat penalty that is not positive, repeat_last_n below -1.
    pub fn validate(&self) -> Result<()> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(ModelError::invalid(
                "temperature",
                format!("{} is negative or not finite", self.temperature),
            ));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(ModelError::invalid(
                "top_p",
                format!("{} is outside [0, 1]", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ModelError::invalid(
                "min_p",
                format!("{} is outside [0, 1]", self.min_p),
            ));
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(ModelError::invalid(
                "repeat_penalty",
                format!("{} is not a positive number", self.repeat_penalty),
            ));
        }
        if self.repeat_last_n < -1 {
            return Err(ModelError::invalid(
                "repeat_last_n",
                format!("{} is below -1", self.repeat_last_n),
            ));
        }
        Ok(())
    }
}

/// A sampler with its random state and the recent tokens the penalty sees.
#[derive(Clone, Debug)]
pub struct Sampler {
    opts: SamplerOptions,
    rng: Rng,
    recent: Vec<u32>,
}

/// Index of the largest logit above -inf (the first on ties, NaN never);
/// 0 when there is none.
pub fn argmax(logits: &[f32]) -> usize {
    // Two passes the compiler vectorizes: the maximum (a comparison that
    // NaN fails, so NaN never wins), then its first position.
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let m = acc
        .iter()
        .chain(chunks.remainder())
        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
    if m == f32::NEG_INFINITY || m.is_nan() {
        return 0;
    }
    logits.iter().position(|&v| v == m).unwrap_or(0)
}

impl Sampler {
    /// A sampler with validated options.
    ///
    /// # Errors
    /// As [`SamplerOptions::validate`].
    pub fn new(opts: SamplerOptions) -> Result<Self> {
        opts.validate()?;
        Ok(Sampler {
            rng: Rng::new(opts.seed),
            opts,
            recent: Vec::new(),
        })
    }

    /// The options.
    pub fn options(&self) -> &SamplerOptions {
        &self.opts
    }

    /// Records a token the penalty should see (prompt tokens, say).
    pub fn accept(&mut self, token: u32) {
        self.recent.push(token);
        let keep = match self.opts.repeat_last_n {
            -1 => usize::MAX,
            n => n.max(0) as usize,
        };
        if self.recent.len() > keep.max(1).saturating_mul(2) {
            let drop = self.recent.len() - keep;
            self.recent.drain(..drop);
        }
    }

    /// Forgets recent tokens.
    pub fn reset(&mut self) {
        self.recent.clear();
        self.rng = Rng::new(self.opts.seed);
    }

    /// Whether the repetition penalty changes anything.
    fn penalizes(&self) -> bool {
        self.opts.repeat_penalty != 1.0 && self.opts.repeat_last_n != 0
    }

    /// The distinct tokens the penalty applies to now.
    fn penalty_window(&self) -> std::collections::HashSet<u32> {
        if !self.penalizes() {
            return std::collections::HashSet::new();
        }
        let n = match self.opts.repeat_last_n {
            -1 => self.recent.len(),
            n => (n as usize).min(self.recent.len()),
        };
        self.recent[self.recent.len() - n..]
            .iter()
            .copied()
            .collect()
    }

    /// `v` after the penalty, for a token in the window.
    fn penalize(&self, v: f32) -> f32 {
        if v > 0.0 {
            v / self.opts.repeat_penalty
        } else {
            v * self.opts.repeat_penalty
        }
    }

    /// The logits after the penalty (borrowed when there is none).
    fn penalized<'a>(&self, logits: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        if !self.penalizes() {
            return std::borrow::Cow::Borrowed(logits);
        }
        let mut l = logits.to_vec();
        for t in self.penalty_window() {
            if let Some(v) = l.get_mut(t as usize) {
                *v = self.penalize(*v);
            }
        }
        std::borrow::Cow::Owned(l)
    }

    /// How many of the best logits (by value, then lower index) the next
    /// draw depends on: [`Self::sample_candidates`] given that many draws
    /// what [`Self::sample`] would from the whole row. `None` when the
    /// draw needs every logit (no top-k with a temperature, or a penalty
    /// below 1 that can raise a token from anywhere in the row).
    pub fn candidates_needed(&self) -> Option<usize> {
        // A penalty of at least 1 only lowers tokens: a token outside the
        // best top_k + (tokens in the window) stays behind top_k others.
        let n_pen = if self.penalizes() {
            if self.opts.repeat_penalty < 1.0 {
                return None;
            }
            self.penalty_window().len()
        } else {
            0
        };
        if self.opts.temperature <= 0.0 {
            return Some(1 + n_pen);
        }
        (self.opts.top_k > 0).then(|| self.opts.top_k as usize + n_pen)
    }

    /// Draws the next token from `logits` and remembers it for the penalty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let l = self.penalized(logits);
        let t = if self.opts.temperature <= 0.0 || l.is_empty() {
            argmax(&l) as u32
        } else if self.opts.top_k > 0 {
            // Only the top-k go on: select them in one pass (NaN never is).
            let cand = top_k_host(&l, self.opts.top_k as usize);
            self.draw(cand)
        } else {
            // NaN logits are never candidates.
            let cand: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_nan())
                .map(|(i, &v)| (i as u32, v))
                .collect();
            self.draw(cand)
        };
        self.accept(t);
        t
    }

    /// [`Self::sample`] from the best logits of the row only: `cands` holds
    /// `(token, logit)` of at least [`Self::candidates_needed`] of them
    /// (or every one that is not NaN), best first by value and then lower
    /// index, as `ops::topk` returns them. Draws the same token as
    /// `sample` on the whole row, and remembers it.
    pub fn sample_candidates(&mut self, cands: &[(u32, f32)]) -> u32 {
        let window = self.penalty_window();
        let cand: Vec<(u32, f32)> = cands
            .iter()
            .filter(|c| !c.1.is_nan())
            .map(|&(t, v)| {
                if window.contains(&t) {
                    (t, self.penalize(v))
                } else {
                    (t, v)
                }
            })
            .collect();
        let t = if self.opts.temperature <= 0.0 {
            cand.iter()
                .copied()
                .reduce(|a, b| if ranks_before(b, a) { b } else { a })
                .map_or(0, |c| c.0)
        } else {
            self.draw(cand)
        };
        self.accept(t);
        t
    }

    /// The chain after the penalty over `cand` (penalized, no NaN): top-k,
    /// top-p, min-p, temperature, the seeded draw.
    fn draw(&mut self, mut cand: Vec<(u32, f32)>) -> u32 {
        if cand.is_empty() {
            return 0;
        }
        // By value, then lower index: a total order, so which of equal
        // logits survive the cut does not depend on where they came from.
        let order = |a: &(u32, f32), b: &(u32, f32)| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.0.cmp(&b.0))
        };
        let k = if self.opts.top_k > 0 {
            (self.opts.top_k as usize).min(cand.len())
        } else {
            cand.len()
        };
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, order);
            cand.truncate(k);
        }
        cand.sort_by(order);
        let softmax = |c: &[(u32, f32)], temp: f32| -> Vec<f64> {
            let m = f64::from(c[0].1);
            let e: Vec<f64> = c
                .iter()
                .map(|x| ((f64::from(x.1) - m) / f64::from(temp)).exp())
                .collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect()
        };
        if self.opts.top_p < 1.0 {
            let p = softmax(&cand, 1.0);
            let mut cum = 0.0;
            let mut keep = cand.len();
            for (i, pi) in p.iter().enumerate() {
                cum += pi;
                if cum >= f64::from(self.opts.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cand.truncate(keep.max(1));
        }
        if self.opts.min_p > 0.0 {
            let p = softmax(&cand, 1.0);
            let floor = p[0] * f64::from(self.opts.min_p);
            let keep = p.iter().take_while(|&&pi| pi >= floor).count().max(1);
            cand.truncate(keep);
        }
        let p = softmax(&cand, self.opts.temperature);
        let r = self.rng.next_f64();
        let mut cum = 0.0;
        for (c, pi) in cand.iter().zip(&p) {
            cum += pi;
            if r < cum {
                return c.0;
            }
        }
        cand[cand.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_greedy_picks_argmax() {
        let mut s = Sampler::new(SamplerOptions::greedy()).expect("valid");
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
    }

    #[test]
    fn sampler_same_seed_same_tokens() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 17) as f32 * 0.3).collect();
        let opts = SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let draw = |seed| {
            let mut s = Sampler::new(SamplerOptions {
                seed,
                ..opts.clone()
            })
            .expect("valid");
            (0..50).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn sampler_top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplerOptions {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        })
        .expect("valid");
        for _ in 0..20 {
            assert_eq!(s.sample(&[0.0, 1.0, 0.5]), 1);
        }
    }

    #[test]
    fn sampler_min_p_and_top_p_cut_the_tail() {
        // Token 0 dominates; min_p 0.5 keeps only it, and so does top_p 0.5.
        let logits = [10.0, 0.0, 0.0, 0.0];
        for (top_p, min_p) in [(1.0, 0.5), (0.5, 0.0)] {
            let mut s = Sampler::new(SamplerOptions {
                temperature: 1.0,
                top_k: 0,
                top_p,
                min_p,
                ..Default::default()
            })
            .expect("valid");
            assert!((0..50).all(|_| s.sample(&logits) == 0));
        }
    }

    #[test]
    fn sampler_frequencies_follow_softmax() {
        let logits = [0.0f32, (2.0f32).ln()];
        let mut s = Sampler::new(SamplerOptions {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 99,
            ..Default::default()
        })
        .expect("valid");
        let n = 20000;
        let ones = (0..n).filter(|_| s.sample(&logits) == 1).count();
        let frac = ones as f64 / n as f64;
        assert!((frac - 2.0 / 3.0).abs() < 0.02, "{frac}");
    }

    #[test]
    fn sampler_repeat_penalty_discourages_recent() {
        let mut s = Sampler::new(SamplerOptions {
            temperature: 0.0,
            repeat_penalty: 2.0,
            repeat_last_n: 4,
            ..Default::default()
        })
        .expect("valid");
        s.accept(1);
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&[0.0, 3.0, 2.0]), 2);
    }

    /// Drawing from the best `candidates_needed` logits gives the same
    /// tokens as drawing from the whole row, step after step (the penalty
    /// window moving), for chains with and without a penalty, ties among
    /// the logits, NaN and greedy decoding.
    #[test]
    fn sampler_candidates_draw_as_the_whole_row() {
        use crate::ops::topk::top_k_ref;
        let mut seed = 0x1234_5678_9abc_def0u64 ^ std::process::id() as u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let n_vocab = 500;
        for case in 0..40 {
            let opts = SamplerOptions {
                temperature: [0.0, 0.3, 0.8, 1.5][case % 4],
                top_k: [1, 5, 40, 64][(case / 4) % 4],
                top_p: [1.0, 0.9, 0.5][case % 3],
                min_p: [0.0, 0.05, 0.2][(case / 3) % 3],
                repeat_penalty: [1.0, 1.1, 3.0][(case / 2) % 3],
                repeat_last_n: [0, 8, 64, -1][(case / 5) % 4],
                seed: next(),
            };
            let mut whole = Sampler::new(opts.clone()).expect("valid");
            let mut cands = Sampler::new(opts.clone()).expect("valid");
            for step in 0..60 {
                let ties = case % 7 == 0;
                let logits: Vec<f32> = (0..n_vocab)
                    .map(|_| {
                        let r = next();
                        if r % 97 == 0 {
                            f32::NAN
                        } else if ties {
                            (r % 5) as f32 * 0.5
                        } else {
                            ((r >> 11) as f64 / (1u64 << 53) as f64 * 12.0 - 6.0) as f32
                        }
                    })
                    .collect();
                let k = cands.candidates_needed().expect("top-k or greedy");
                let list = top_k_ref(&logits, k);
                let a = whole.sample(&logits);
                let b = cands.sample_candidates(&list);
                assert_eq!(a, b, "case {case} step {step} {opts:?} k {k}");
            }
        }
    }

    #[test]
    fn sampler_candidates_needed_when_the_row_matters() {
        let with = |o: SamplerOptions| Sampler::new(o).expect("valid").candidates_needed();
        assert_eq!(with(SamplerOptions::greedy()), Some(1));
        assert_eq!(with(SamplerOptions::default()), Some(40));
        let all = SamplerOptions {
            top_k: 0,
            ..Default::default()
        };
        assert_eq!(with(all), None);
        let raising = SamplerOptions {
            repeat_penalty: 0.9,
            ..Default::default()
        };
        assert_eq!(with(raising), None);
        let mut s = Sampler::new(SamplerOptions {
            repeat_penalty: 1.2,
            repeat_last_n: 3,
            ..Default::default()
        })
        .expect("valid");
        for t in [5, 6, 5, 7, 8] {
            s.accept(t);
        }
        // The window holds 5, 7, 8.
        assert_eq!(s.candidates_needed(), Some(43));
    }

    #[test]
    fn sampler_rejects_invalid_options() {
        let bad: [fn(&mut SamplerOptions); 5] = [
            |o| o.temperature = -1.0,
            |o| o.top_p = 1.5,
            |o| o.min_p = -0.1,
            |o| o.repeat_penalty = 0.0,
            |o| o.temperature = f32::NAN,
        ];
        for spoil in bad {
            let mut o = SamplerOptions::default();
            spoil(&mut o);
            assert!(Sampler::new(o.clone()).is_err(), "{o:?}");
        }
    }
}
