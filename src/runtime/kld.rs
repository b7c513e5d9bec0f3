//! KL divergence of a model's predictions from a base file's, with the
//! statistics `llama-perplexity --kl-divergence` prints and its labels
//! (`tools/perplexity/perplexity.cpp`: `log_softmax(…, base_log_prob, …)`,
//! `kl_divergence()`, llama.cpp 0c1e570).
//!
//! Every quantity follows llama.cpp's arithmetic, f32 where it computes in
//! float and f64 where it accumulates in double, so that the same logits
//! against the same base file print the same numbers: per position the KL
//! divergence sums `p_base·(log p_base − log q)` over the tokens the base
//! stores above −16 nats; "same top" compares the argmax of the logits with
//! that of the stored (quantized) base; Δp is the change of the
//! probability of the actual next token; percentiles interpolate linearly
//! between sorted values; the ± figures are llama.cpp's standard errors.

use std::fmt;

use super::kld_file::{row_len, row_scale};

/// Running sums over the positions compared so far (llama.cpp's
/// `kl_divergence_result`), and every position's KLD and Δp for the
/// percentiles.
#[derive(Clone, Debug, Default)]
pub struct KldStats {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    count: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// A value and its standard error.
pub type Estimate = (f64, f64);

/// llama.cpp's `mean_and_uncertainty`: the mean of `sum / count` and its
/// standard error (0 with 10 values or fewer).
fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> Estimate {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

/// llama.cpp's `covariance` of two means (0 with fewer than 10 values).
fn covariance(a: f64, b: f64, ab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (ab / n - (a / n) * (b / n)) / (n - 1.0)
}

impl KldStats {
    /// No positions yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions compared.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Adds one position: `logits` (n_vocab) against the stored base row
    /// (`row_len(n_vocab)` values) for the actual next token `target`.
    /// Returns the position's KLD and Δp.
    pub fn add(&mut self, logits: &[f32], base_row: &[u16], target: usize) -> (f64, f32) {
        let n_vocab = logits.len();
        debug_assert_eq!(base_row.len(), row_len(n_vocab));
        let mut max_logit = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let sum_exp: f64 = logits
            .iter()
            .map(|&l| f64::from((l - max_logit).exp()))
            .sum();
        let log_sum_exp = sum_exp.ln() as f32;
        let (scale, min_log_prob) = row_scale(base_row);
        let base = &base_row[4..4 + n_vocab];

        let nll = max_logit + log_sum_exp - logits[target];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);
        let nll_base = -(scale * f32::from(base[target]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);

        let max_logit = max_logit + log_sum_exp;
        let mut sum = 0.0f64;
        let mut imax_base = 0;
        let mut p_log_base_max = 0.0f32;
        for (i, (&q, &l)) in base.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(q) + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += f64::from(p_base * (p_log_base - l + max_logit));
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }

        let p_base = (-nll_base).exp();
        let p = (-nll).exp();
        let p_diff = p - p_base;
        self.sum_p_diff += f64::from(p_diff);
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());
        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
        (sum, p_diff)
    }

    /// Adds the rows of one chunk: `logits` (rows × n_vocab) against the
    /// base file's rows of that chunk, `targets[j]` the token after row `j`.
    pub fn add_chunk(&mut self, logits: &[f32], base_rows: &[u16], targets: &[u32]) {
        let n_rows = targets.len();
        if n_rows == 0 {
            return;
        }
        let n_vocab = logits.len() / n_rows;
        let nv = row_len(n_vocab);
        for (j, &t) in targets.iter().enumerate() {
            self.add(
                &logits[j * n_vocab..(j + 1) * n_vocab],
                &base_rows[j * nv..(j + 1) * nv],
                t as usize,
            );
        }
    }

    fn ln_ppl(&self) -> Estimate {
        mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count)
    }

    fn ln_ppl_base(&self) -> Estimate {
        mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count)
    }

    fn ln_ppl_ratio(&self) -> (Estimate, f64) {
        let (q, b) = (self.ln_ppl(), self.ln_ppl_base());
        let cov = covariance(
            self.sum_nll,
            self.sum_nll_base,
            self.sum_nll_nll_base,
            self.count,
        );
        let unc = (q.1 * q.1 + b.1 * b.1 - 2.0 * cov).sqrt();
        ((q.0 - b.0, unc), cov)
    }

    fn rms_p_diff(&self) -> Estimate {
        let mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count);
        let rms = mse.0.sqrt();
        (rms, 0.5 / rms * mse.1)
    }

    fn same_top(&self) -> Estimate {
        let p = self.n_same_top as f64 / self.count as f64;
        (p, (p * (1.0 - p) / (self.count as f64 - 1.0)).sqrt())
    }

    /// The heading of the per-chunk lines, as llama.cpp prints it.
    pub fn chunk_heading() -> &'static str {
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p"
    }

    /// llama.cpp's line after chunk `chunk` (1-based): running PPL(Q),
    /// ln(PPL(Q)/PPL(base)), mean KLD, RMS Δp and same top p, each ± its error.
    pub fn chunk_line(&self, chunk: usize) -> String {
        let (lq, ppl_q) = (self.ln_ppl(), self.ln_ppl().0.exp());
        let (ratio, _) = self.ln_ppl_ratio();
        let kld = mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count);
        let rms = self.rms_p_diff();
        let top = self.same_top();
        format!(
            "{:4}    {} ± {}    {} ± {}    {} ± {}    {} ± {} %    {} ± {} %",
            chunk,
            cf(ppl_q, 9, 4),
            cf(ppl_q * lq.1, 9, 4),
            cf(ratio.0, 10, 5),
            cf(ratio.1, 10, 5),
            cf(kld.0, 10, 5),
            cf(kld.1, 10, 5),
            cf(100.0 * rms.0, 6, 3),
            cf(100.0 * rms.1, 6, 3),
            cf(100.0 * top.0, 6, 3),
            cf(100.0 * top.1, 6, 3),
        )
    }

    /// The final statistics; `None` below 100 positions, where llama.cpp
    /// prints none ("we do not wish to do statistics on so few values").
    pub fn report(&self) -> Option<KldReport> {
        if self.count < 100 {
            return None;
        }
        let mut kld = self.kld_values.clone();
        kld.sort_by(f32::total_cmp);
        let mut dp = self.p_diff_values.clone();
        dp.sort_by(f32::total_cmp);
        let (lq, lb) = (self.ln_ppl(), self.ln_ppl_base());
        let (ppl, ppl_base) = (lq.0.exp(), lb.0.exp());
        let (ppl_unc, ppl_base_unc) = (ppl * lq.1, ppl_base * lb.1);
        let (ln_ratio, cov) = self.ln_ppl_ratio();
        let ratio = ln_ratio.0.exp();
        let ppl_cov = ppl * ppl_base * cov;
        let kld_q = |label, f| Quantile {
            label,
            value: percentile(&kld, f),
        };
        let dp_q = |label, f| Quantile {
            label,
            value: percentile(&dp, f),
        };
        Some(KldReport {
            count: self.count,
            ppl: (ppl, ppl_unc),
            ppl_base: (ppl_base, ppl_base_unc),
            ppl_cor: cov / (lq.1 * lb.1),
            ln_ppl_ratio: ln_ratio,
            ppl_ratio: (ratio, ratio * ln_ratio.1),
            ppl_diff: (
                ppl - ppl_base,
                (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt(),
            ),
            kld: mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count),
            kld_quantiles: vec![
                kld_q("Maximum KLD", 1.0),
                kld_q("99.9%   KLD", 0.999),
                kld_q("99.0%   KLD", 0.990),
                kld_q("95.0%   KLD", 0.950),
                kld_q("90.0%   KLD", 0.900),
                Quantile {
                    label: "Median  KLD",
                    value: median(&kld),
                },
                kld_q("10.0%   KLD", 0.100),
                kld_q(" 5.0%   KLD", 0.050),
                kld_q(" 1.0%   KLD", 0.010),
                kld_q(" 0.1%   KLD", 0.001),
                kld_q("Minimum KLD", 0.0),
            ],
            p_diff: mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count),
            p_diff_quantiles: vec![
                dp_q("Maximum Δp", 1.0),
                dp_q("99.9%   Δp", 0.999),
                dp_q("99.0%   Δp", 0.990),
                dp_q("95.0%   Δp", 0.950),
                dp_q("90.0%   Δp", 0.900),
                dp_q("75.0%   Δp", 0.750),
                Quantile {
                    label: "Median  Δp",
                    value: median(&dp),
                },
                dp_q("25.0%   Δp", 0.250),
                dp_q("10.0%   Δp", 0.100),
                dp_q(" 5.0%   Δp", 0.050),
                dp_q(" 1.0%   Δp", 0.010),
                dp_q(" 0.1%   Δp", 0.001),
                dp_q("Minimum Δp", 0.0),
            ],
            rms_p_diff: self.rms_p_diff(),
            same_top: self.same_top(),
            max_abs_p_diff: self.max_p_diff,
        })
    }
}

/// llama.cpp's `percentile` lambda over sorted values, in f32: linear
/// interpolation at `fraction·(n − 1)`.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let mut p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

/// llama.cpp's median of sorted values (the mean of the middle two, in f32).
fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n.is_multiple_of(2) {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    } else {
        values[n / 2]
    }
}

/// A percentile line: llama.cpp's label and the value.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantile {
    /// The label before the colon, as llama.cpp prints it (`"99.0%   KLD"`).
    pub label: &'static str,
    /// The value (a probability difference for Δp, not in percent).
    pub value: f32,
}

/// The statistics `llama-perplexity --kl-divergence` prints at the end;
/// `Display` writes them with its labels and formats.
#[derive(Clone, Debug, PartialEq)]
pub struct KldReport {
    /// Positions compared.
    pub count: usize,
    /// Mean PPL(Q): the model's perplexity over the scored positions.
    pub ppl: Estimate,
    /// Mean PPL(base): the base file's.
    pub ppl_base: Estimate,
    /// Correlation of the two log-perplexities (a fraction).
    pub ppl_cor: f64,
    /// Mean ln(PPL(Q)/PPL(base)).
    pub ln_ppl_ratio: Estimate,
    /// Mean PPL(Q)/PPL(base).
    pub ppl_ratio: Estimate,
    /// Mean PPL(Q)−PPL(base).
    pub ppl_diff: Estimate,
    /// Mean KLD.
    pub kld: Estimate,
    /// Maximum, 99.9% … 0.1%, median and minimum KLD.
    pub kld_quantiles: Vec<Quantile>,
    /// Mean Δp (a probability difference).
    pub p_diff: Estimate,
    /// Maximum, 99.9% … 0.1%, median and minimum Δp.
    pub p_diff_quantiles: Vec<Quantile>,
    /// RMS Δp.
    pub rms_p_diff: Estimate,
    /// Fraction of positions whose argmax equals the base's.
    pub same_top: Estimate,
    /// Largest |Δp|.
    pub max_abs_p_diff: f32,
}

impl KldReport {
    /// The KLD quantile with this label (`"99.0%   KLD"`, `"Median  KLD"`).
    pub fn kld_at(&self, label: &str) -> Option<f32> {
        self.kld_quantiles
            .iter()
            .find(|q| q.label == label)
            .map(|q| q.value)
    }
}

/// A number as C's `printf("%W.Plf")` writes it, `inf` and `nan` included.
fn cf(v: f64, width: usize, prec: usize) -> String {
    let s = if v.is_nan() {
        if v.is_sign_negative() { "-nan" } else { "nan" }.to_string()
    } else if v.is_infinite() {
        if v < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{v:.prec$}")
    };
    format!("{s:>width$}")
}

impl fmt::Display for KldReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pm = |e: Estimate, w: usize, p: usize| format!("{} ± {}", cf(e.0, w, p), cf(e.1, w, p));
        let pct = |e: Estimate| (100.0 * e.0, 100.0 * e.1);
        writeln!(f, "====== Perplexity statistics ======")?;
        writeln!(f, "Mean PPL(Q)                   : {}", pm(self.ppl, 10, 6))?;
        writeln!(
            f,
            "Mean PPL(base)                : {}",
            pm(self.ppl_base, 10, 6)
        )?;
        writeln!(
            f,
            "Cor(ln(PPL(Q)), ln(PPL(base))): {}%",
            cf(100.0 * self.ppl_cor, 6, 2)
        )?;
        writeln!(
            f,
            "Mean ln(PPL(Q)/PPL(base))     : {}",
            pm(self.ln_ppl_ratio, 10, 6)
        )?;
        writeln!(
            f,
            "Mean PPL(Q)/PPL(base)         : {}",
            pm(self.ppl_ratio, 10, 6)
        )?;
        writeln!(
            f,
            "Mean PPL(Q)-PPL(base)         : {}",
            pm(self.ppl_diff, 10, 6)
        )?;
        writeln!(f)?;
        writeln!(f, "====== KL divergence statistics ======")?;
        writeln!(f, "Mean    KLD: {}", pm(self.kld, 10, 6))?;
        for q in &self.kld_quantiles {
            writeln!(f, "{}: {}", q.label, cf(f64::from(q.value), 10, 6))?;
        }
        writeln!(f)?;
        writeln!(f, "====== Token probability statistics ======")?;
        let dp = pct(self.p_diff);
        writeln!(f, "Mean    Δp: {} ± {} %", cf(dp.0, 6, 3), cf(dp.1, 5, 3))?;
        for q in &self.p_diff_quantiles {
            writeln!(f, "{}: {}%", q.label, cf(100.0 * f64::from(q.value), 6, 3))?;
        }
        let rms = pct(self.rms_p_diff);
        writeln!(f, "RMS Δp    : {} ± {} %", cf(rms.0, 6, 3), cf(rms.1, 5, 3))?;
        let top = pct(self.same_top);
        writeln!(f, "Same top p: {} ± {} %", cf(top.0, 6, 3), cf(top.1, 5, 3))
    }
}

#[cfg(test)]
mod tests {
    use super::super::kld_file::quantize_row;
    use super::*;

    #[test]
    fn percentile_interpolates_like_llama_cpp() {
        let v = [0.0f32, 1.0, 2.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 1.5);
        assert_eq!(percentile(&v, 1.0), 4.0);
        assert_eq!(percentile(&v, 0.0), 0.0);
        assert_eq!(median(&v), 1.5);
        assert_eq!(median(&v[..3]), 1.0);
    }

    #[test]
    fn c_format_matches_printf() {
        assert_eq!(cf(1.23456, 10, 5), "   1.23456");
        assert_eq!(cf(-0.0000001, 10, 5), "  -0.00000");
        assert_eq!(cf(f64::NAN, 6, 3), "   nan");
        assert_eq!(cf(f64::INFINITY, 6, 3), "   inf");
    }

    #[test]
    fn kld_of_a_row_against_itself_is_near_zero_and_same_top() {
        let logits: Vec<f32> = (0..101).map(|i| ((i * 37 % 101) as f32) * 0.1).collect();
        let mut row = vec![0u16; row_len(logits.len())];
        quantize_row(&logits, 5, &mut row);
        let mut s = KldStats::new();
        let (kld, dp) = s.add(&logits, &row, 5);
        assert!(kld.abs() < 1e-4, "{kld}");
        assert!(dp.abs() < 1e-4, "{dp}");
        assert_eq!(s.same_top().0, 1.0);
    }
}
