//! Activation arithmetic of the host kernels in f32, in loops the compiler
//! vectorizes: the references compute `exp` and `tanh` in f64 through libm,
//! a call per value, which costs more than the products around them in a
//! prompt (SmolLM2's gate alone is 1536 values per token and layer).
//! [`exp`] is Cephes' single-precision polynomial (within 2 ulp of the
//! correctly rounded value over the range that does not overflow).

use crate::ops::glu::Activation;

/// `e^x` in f32: `x = n·ln2 + r`, `|r| ≤ ln2/2`, a degree-6 polynomial in
/// `r`, the power of two from its bits. Saturates at the edges of f32's range
/// (about 1e-38 and 3.4e38) rather than reaching 0 or infinity.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first exact in few bits, so `x - n·ln2` loses
    // nothing to rounding.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.336_55, 88.722_83);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let y = p * r2 + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The activation of `x`, as `glu::act_ref` defines it.
#[inline(always)]
pub(crate) fn act(a: Activation, x: f32) -> f32 {
    match a {
        Activation::Silu => x / (1.0 + exp(-x)),
        Activation::GeluTanh => {
            // `½x(1 + tanh y) = x / (1 + e^{-2y})`: no cancellation where
            // tanh is near -1.
            const K2: f32 = 2.0 * 0.797_884_6; // 2·sqrt(2 / pi)
            x / (1.0 + exp(-K2 * (x + 0.044_715 * x * x * x)))
        }
    }
}

/// `out[i] = act(gate[i]) · up[i]`, for the SIMD level detected at run time.
pub(crate) fn gated(a: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    struct Op<'a>(Activation, &'a [f32], &'a [f32], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            let Op(a, gate, up, out) = self;
            // One loop per activation, so the match is outside the loop.
            match a {
                Activation::Silu => {
                    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                        *o = act(Activation::Silu, g) * u;
                    }
                }
                Activation::GeluTanh => {
                    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                        *o = act(Activation::GeluTanh, g) * u;
                    }
                }
            }
        }
    }
    super::arch().dispatch(Op(a, gate, up, out));
}

/// `x[i] = exp(x[i] - m)`, returning their sum.
pub(crate) fn exp_shifted(x: &mut [f32], m: f32) -> f32 {
    struct Op<'a>(&'a mut [f32], f32);
    impl pulp::WithSimd for Op<'_> {
        type Output = f32;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> f32 {
            let Op(x, m) = self;
            let mut lanes = [0.0f32; 8];
            let mut chunks = x.chunks_exact_mut(8);
            for c in &mut chunks {
                for l in 0..8 {
                    c[l] = exp(c[l] - m);
                    lanes[l] += c[l];
                }
            }
            let mut sum: f32 = lanes.iter().sum();
            for v in chunks.into_remainder() {
                *v = exp(*v - m);
                sum += *v;
            }
            sum
        }
    }
    super::arch().dispatch(Op(x, m))
}

/// The largest value of `x` (NaNs ignored, −∞ for none), in lanes the
/// compiler vectorizes.
pub(crate) fn max(x: &[f32]) -> f32 {
    struct Op<'a>(&'a [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = f32;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> f32 {
            let mut lanes = [f32::NEG_INFINITY; 8];
            let mut chunks = self.0.chunks_exact(8);
            for c in &mut chunks {
                for l in 0..8 {
                    lanes[l] = lanes[l].max(c[l]);
                }
            }
            let m = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            chunks.remainder().iter().copied().fold(m, f32::max)
        }
    }
    super::arch().dispatch(Op(x))
}

/// `Σ exp(x[i] − m)`: the exponentials in f32 by [`exp`], summed in f64
/// lanes so a 50 000-entry row loses nothing to the sum's rounding.
pub(crate) fn sum_exp_shifted(x: &[f32], m: f32) -> f64 {
    struct Op<'a>(&'a [f32], f32);
    impl pulp::WithSimd for Op<'_> {
        type Output = f64;
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) -> f64 {
            let Op(x, m) = self;
            let mut lanes = [0.0f64; 8];
            let mut chunks = x.chunks_exact(8);
            for c in &mut chunks {
                for l in 0..8 {
                    lanes[l] += f64::from(exp(c[l] - m));
                }
            }
            let sum: f64 = lanes.iter().sum();
            sum + chunks
                .remainder()
                .iter()
                .map(|&v| f64::from(exp(v - m)))
                .sum::<f64>()
        }
    }
    super::arch().dispatch(Op(x, m))
}

/// The exact GELU `x (1 + erf(x/√2)) / 2` in f32, erf by Abramowitz &
/// Stegun 7.1.26 (absolute error below 1.5e-7, as `unary.comp`) over [`exp`]:
/// the reference's f64 libm `erf` is a call per value.
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    let z = x * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z.abs());
    let poly = ((((1.061_405_4 * t - 1.453_152) * t + 1.421_413_8) * t - 0.284_496_74) * t
        + 0.254_829_6)
        * t;
    let e = poly * exp(-z * z);
    let erf = if z < 0.0 { e - 1.0 } else { 1.0 - e };
    0.5 * x * (1.0 + erf)
}

/// `x[i] = gelu_erf(x[i])`, for the SIMD level detected at run time.
pub(crate) fn gelu_erf_slice(x: &mut [f32]) {
    struct Op<'a>(&'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            for v in self.0.iter_mut() {
                *v = gelu_erf(*v);
            }
        }
    }
    super::arch().dispatch(Op(x));
}

#[cfg(test)]
mod tests {
    use crate::ops::glu::{Activation, act_ref};

    #[test]
    fn exp_within_two_ulp_of_f64() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp() as f32;
            let got = super::exp(x);
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}) = {got}, want {want} ({ulp} ulp)");
            x += 0.001_37;
        }
        assert!(super::exp(-200.0) < 1e-37 && super::exp(200.0) > 3e38);
        assert!(super::exp(f32::NAN).is_nan());
    }

    #[test]
    fn activations_match_the_reference() {
        for a in [Activation::Silu, Activation::GeluTanh] {
            let mut x = -30.0f32;
            while x < 30.0 {
                let (got, want) = (super::act(a, x), act_ref(a, x));
                // f32 rounding of exp's argument (up to ~20 in magnitude)
                // alone moves the result by several ulp.
                let tol = 16.0 * f32::EPSILON * want.abs().max(1e-3);
                assert!((got - want).abs() <= tol, "{a:?}({x}) = {got}, want {want}");
                x += 0.003_1;
            }
        }
    }

    #[test]
    fn max_and_sum_of_exps_match_f64() {
        use rand::RngExt;
        let mut rng = rand::rng();
        for n in [0usize, 1, 7, 8, 9, 51_865] {
            let mut row: Vec<f32> = (0..n).map(|_| rng.random_range(-30.0f32..30.0)).collect();
            // Masked entries, as the logit filters leave them.
            for v in row.iter_mut().step_by(5) {
                *v = f32::NEG_INFINITY;
            }
            let want_max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(super::max(&row), want_max, "max of {n}");
            if want_max.is_finite() {
                let want: f64 = row
                    .iter()
                    .map(|&x| (f64::from(x) - f64::from(want_max)).exp())
                    .sum();
                let got = super::sum_exp_shifted(&row, want_max);
                assert!(
                    (got - want).abs() <= 1e-6 * want,
                    "sum of {n}: {got} vs {want}"
                );
            }
        }
        assert_eq!(super::max(&[f32::NAN, 1.0, f32::NAN]), 1.0);
    }
}
