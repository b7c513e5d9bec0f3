//! The logit filters of openai-whisper's `decoding.py`, applied in its
//! order to each sequence's logits before a token is chosen: `SuppressBlank`,
//! `SuppressTokens`, `ApplyTimestampRules`. Each works on one row of logits
//! and that sequence's tokens (prompt and start sequence included; sampling
//! began at `sample_begin`).

use crate::tokenizer::whisper::WhisperSpecials;

/// The filters of one decoding task.
#[derive(Clone, Debug)]
pub struct LogitFilters {
    /// Index of the first sampled token in each sequence.
    pub sample_begin: usize,
    /// Blank and end-of-text ids suppressed at the first sampled position
    /// (`None`: the rule is off).
    pub suppress_blank: Option<Vec<u32>>,
    /// Ids suppressed at every position.
    pub suppress: Vec<u32>,
    /// Timestamp rules (`None`: decoding without timestamps).
    pub timestamps: Option<TimestampRules>,
}

/// openai-whisper's `ApplyTimestampRules`.
#[derive(Clone, Copy, Debug)]
pub struct TimestampRules {
    /// The special ids (`eot`, `no_timestamps`, `timestamp_begin`).
    pub specials: WhisperSpecials,
    /// Latest timestamp index allowed first (`None`: any).
    pub max_initial_timestamp_index: Option<usize>,
}

impl LogitFilters {
    /// Applies every filter to `logits` (one row of `n_vocab`), the
    /// sequence so far being `tokens`.
    pub fn apply(&self, logits: &mut [f32], tokens: &[u32]) {
        if let Some(blank) = &self.suppress_blank
            && tokens.len() == self.sample_begin
        {
            mask(logits, blank);
        }
        mask(logits, &self.suppress);
        if let Some(rules) = &self.timestamps {
            rules.apply(logits, tokens, self.sample_begin);
        }
    }
}

/// Sets the logits of `ids` to −∞ (ids past the row are ignored).
fn mask(logits: &mut [f32], ids: &[u32]) {
    for &id in ids {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// Sets `logits[range]` to −∞, clamped to the row.
fn mask_range(logits: &mut [f32], start: usize, end: usize) {
    let end = end.min(logits.len());
    if start < end {
        logits[start..end].fill(f32::NEG_INFINITY);
    }
}

impl TimestampRules {
    /// The rules on one row: `<|notimestamps|>` never; timestamps in pairs
    /// (after a lone timestamp only another timestamp or end-of-text, after
    /// a pair only text); never decreasing, and a pair never of zero
    /// length; a timestamp first, no later than the maximum initial one;
    /// and a timestamp forced when the timestamps' total probability
    /// exceeds every single text token's.
    pub fn apply(&self, logits: &mut [f32], tokens: &[u32], sample_begin: usize) {
        let s = &self.specials;
        let tb = s.timestamp_begin as usize;
        let n = logits.len();
        mask(logits, &[s.no_timestamps]);
        let sampled = tokens.get(sample_begin..).unwrap_or(&[]);
        let is_ts = |t: u32| t >= s.timestamp_begin;
        let last_was_timestamp = sampled.last().is_some_and(|&t| is_ts(t));
        let penultimate_was_timestamp = sampled.len() < 2 || is_ts(sampled[sampled.len() - 2]);
        if last_was_timestamp {
            if penultimate_was_timestamp {
                mask_range(logits, tb, n);
            } else {
                mask_range(logits, 0, s.eot as usize);
            }
        }
        if let Some(&last_ts) = sampled.iter().rev().find(|&&t| is_ts(t)) {
            // A pair's end may repeat its start only when it closes the pair
            // just opened; otherwise the next timestamp must be later.
            let timestamp_last = if last_was_timestamp && !penultimate_was_timestamp {
                last_ts as usize
            } else {
                last_ts as usize + 1
            };
            mask_range(logits, tb, timestamp_last);
        }
        if tokens.len() == sample_begin {
            mask_range(logits, 0, tb);
            if let Some(max) = self.max_initial_timestamp_index {
                mask_range(logits, tb + max + 1, n);
            }
        }
        // openai-whisper compares log-probabilities of the masked row; both
        // sides carry the same normalizer, so the logits compare alike
        // without a softmax over the whole vocabulary each step.
        if tb < n {
            let ts = logsumexp(&logits[tb..]);
            let max_text = crate::ops::host::max_f32(&logits[..tb]);
            if ts > max_text {
                mask_range(logits, 0, tb);
            }
        }
    }
}

/// `log_softmax` of a row (all −∞ gives all NaN, as torch does).
pub fn log_softmax(row: &[f32]) -> Vec<f32> {
    let lse = logsumexp(row);
    row.iter().map(|&x| x - lse).collect()
}

/// `log(sum(exp(row)))`, shifted by the maximum for range; −∞ for an empty
/// or all −∞ row.
pub fn logsumexp(row: &[f32]) -> f32 {
    // Vectorized: this runs over the whole vocabulary at every step.
    let max = crate::ops::host::max_f32(row);
    if max == f32::NEG_INFINITY {
        return f32::NEG_INFINITY;
    }
    if !max.is_finite() {
        return max;
    }
    let sum = crate::ops::host::sum_exp_shifted(row, max);
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::whisper::WhisperVocab;
    use rand::RngExt;

    fn specials() -> WhisperSpecials {
        WhisperVocab::new(Vec::new(), 51864)
            .expect("vocab")
            .specials
    }

    fn random_row(n: usize) -> Vec<f32> {
        let mut rng = rand::rng();
        (0..n).map(|_| rng.random_range(-4.0f32..4.0)).collect()
    }

    fn rules(max: Option<usize>) -> TimestampRules {
        TimestampRules {
            specials: specials(),
            max_initial_timestamp_index: max,
        }
    }

    fn allowed(row: &[f32]) -> Vec<usize> {
        row.iter()
            .enumerate()
            .filter(|(_, l)| l.is_finite())
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn timestamp_rules_first_token_is_early_timestamp() {
        let s = specials();
        let tb = s.timestamp_begin as usize;
        let mut row = random_row(51864);
        let prompt = [s.sot];
        rules(Some(50)).apply(&mut row, &prompt, 1);
        assert_eq!(allowed(&row), (tb..=tb + 50).collect::<Vec<_>>());
    }

    #[test]
    fn timestamp_rules_pairs_and_monotonic() {
        let s = specials();
        let tb = s.timestamp_begin;
        let r = rules(Some(50));
        // <|0.00|> text <|1.00|>: lone timestamp last -> a timestamp >= 1.00 or eot.
        let mut row = random_row(51864);
        // End-of-text far likelier than all timestamps together, so the
        // forcing rule does not hide the pair rule.
        row[s.eot as usize] = 50.0;
        let seq = [s.sot, tb, 100, tb + 50];
        r.apply(&mut row, &seq, 1);
        let a = allowed(&row);
        // Text below end-of-text is masked (the specials above it are left
        // to the suppress list), and timestamps before the opening one.
        let (eot, tb) = (s.eot as usize, tb as usize);
        assert!(a.iter().all(|&i| i >= eot && !(tb..tb + 50).contains(&i)));
        assert!(a.contains(&eot) && a.contains(&(tb + 50)));
        let tb = s.timestamp_begin;
        // <|0.00|> text <|1.00|><|1.00|>: after a pair, text only (no timestamp at all).
        let mut row = random_row(51864);
        row[100] = 50.0;
        let seq = [s.sot, tb, 100, tb + 50, tb + 50];
        r.apply(&mut row, &seq, 1);
        assert!(allowed(&row).iter().all(|&i| i < tb as usize));
        // <|0.00|> text: the closing timestamp must be after the opening one.
        let mut row = random_row(51864);
        row[100] = 50.0;
        let seq = [s.sot, tb + 10, 100];
        r.apply(&mut row, &seq, 1);
        let a = allowed(&row);
        assert!(!a.contains(&((tb + 10) as usize)) && a.contains(&((tb + 11) as usize)));
        assert!(!a.contains(&(s.no_timestamps as usize)));
    }

    #[test]
    fn timestamp_rules_force_timestamp_when_mass_exceeds_best_text() {
        let s = specials();
        let tb = s.timestamp_begin as usize;
        // Every timestamp a little less likely than the best text token, but
        // together far more likely: text is masked.
        let mut row = vec![-30.0f32; 51864];
        row[500] = 0.0;
        for l in &mut row[tb..] {
            *l = -1.0;
        }
        let seq = [s.sot, s.timestamp_begin, 100];
        rules(None).apply(&mut row, &seq, 1);
        assert!(allowed(&row).iter().all(|&i| i >= tb));
        // The same with a single cheap timestamp: text stays.
        let mut row = vec![-30.0f32; 51864];
        row[500] = 0.0;
        row[tb + 20] = -1.0;
        rules(None).apply(&mut row, &seq, 1);
        assert!(row[500].is_finite());
    }

    #[test]
    fn suppress_blank_only_at_first_sampled_position() {
        let s = specials();
        let f = LogitFilters {
            sample_begin: 1,
            suppress_blank: Some(vec![220, s.eot]),
            suppress: vec![7],
            timestamps: None,
        };
        let mut row = random_row(51864);
        f.apply(&mut row, &[s.sot]);
        assert!(row[220] == f32::NEG_INFINITY && row[s.eot as usize] == f32::NEG_INFINITY);
        assert!(row[7] == f32::NEG_INFINITY && row[8].is_finite());
        let mut row = random_row(51864);
        f.apply(&mut row, &[s.sot, 300]);
        assert!(row[220].is_finite() && row[s.eot as usize].is_finite());
        assert!(row[7] == f32::NEG_INFINITY);
    }

    #[test]
    fn logsumexp_matches_direct_sum() {
        let row = random_row(1000);
        let direct: f64 = row.iter().map(|&x| f64::from(x).exp()).sum::<f64>().ln();
        assert!((f64::from(logsumexp(&row)) - direct).abs() < 1e-5);
        assert_eq!(logsumexp(&[f32::NEG_INFINITY; 3]), f32::NEG_INFINITY);
    }
}
