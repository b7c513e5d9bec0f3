//! `act_round`: rounds activations the way llama.cpp's CPU backend does
//! before each quantized dot product, so that combs can reproduce its
//! numerics when asked ([`Numerics::LlamaCppCpu`]).
//!
//! ggml-cpu never multiplies a quantized weight with f32 activations: it
//! first converts the activation row to the weight type's `vec_dot_type`
//! (8-bit blocks of 32 or 256 with their own scale, or f16 / bf16) and runs
//! an integer or half dot product. That rounding moves SmolLM2's logits by up
//! to about one unit, enough to flip the argmax at several percent of the
//! positions of an English text, so an exact forward pass and llama.cpp
//! disagree there however correct the former is. `glsl/act_round.comp`
//! writes `dequant(quant(x))`, which an exact matmul then turns into the
//! value of llama.cpp's dot product (up to f32 summation order).

use super::params::ActRoundParams;
use super::{Mat, pc_u32};
use crate::error::{ModelError, Result};
use crate::gpu::{Binding, Kernel, Recording};
use crate::quant::QuantType;

/// How linear layers treat their input activations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// f32 activations straight into the dequantizing matmul (the default,
    /// closest to exact arithmetic).
    #[default]
    Exact,
    /// Activations rounded to the weight's `vec_dot_type` first, as
    /// llama.cpp's CPU backend does, to compare outputs token for token.
    LlamaCppCpu,
}

impl Numerics {
    /// The rounding linear layers with weights of type `t` apply to their inputs.
    pub fn rounding_for(self, t: QuantType) -> ActRounding {
        match self {
            Numerics::Exact => ActRounding::None,
            Numerics::LlamaCppCpu => ActRounding::llama_cpp_cpu(t),
        }
    }

    /// Parses `exact` or `llama.cpp` (also `llamacpp`, `llama-cpp`).
    ///
    /// # Errors
    /// Any other name.
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "exact" => Ok(Numerics::Exact),
            "llama.cpp" | "llamacpp" | "llama-cpp" | "llama.cpp-cpu" => Ok(Numerics::LlamaCppCpu),
            other => Err(ModelError::invalid(
                "numerics",
                format!("{other:?}: expected \"exact\" or \"llama.cpp\""),
            )),
        }
    }
}

/// The rounding llama.cpp's CPU backend applies to activations multiplied
/// with a weight of a given type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActRounding {
    /// f32 weights: none.
    None,
    /// `q8_0` / `q8_1`: 8-bit, 32 per block, f16 scale (same values).
    Q8_0,
    /// `q8_K`: 8-bit, 256 per block, f32 scale from the signed extreme.
    Q8K,
    /// f16 weights: activations rounded to f16.
    F16,
    /// bf16 weights: activations rounded to bf16.
    Bf16,
}

impl ActRounding {
    /// The `vec_dot_type` ggml-cpu pairs with weights of type `t`.
    pub fn llama_cpp_cpu(t: QuantType) -> Self {
        use QuantType as T;
        match t {
            T::F32 => ActRounding::None,
            T::F16 => ActRounding::F16,
            T::BF16 => ActRounding::Bf16,
            T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q5_1 | T::Q8_0 => ActRounding::Q8_0,
            T::Q2K | T::Q3K | T::Q4K | T::Q5K | T::Q6K => ActRounding::Q8K,
        }
    }

    /// Elements per rounding block.
    pub fn block(self) -> usize {
        match self {
            ActRounding::Q8_0 => 32,
            ActRounding::Q8K => 256,
            ActRounding::None | ActRounding::F16 | ActRounding::Bf16 => 1,
        }
    }

    fn kernel(self) -> Option<Kernel> {
        match self {
            ActRounding::None => None,
            ActRounding::Q8_0 => Some(Kernel::ActRoundQ80F32),
            ActRounding::Q8K => Some(Kernel::ActRoundQ8KF32),
            ActRounding::F16 => Some(Kernel::ActRoundF16F32),
            ActRounding::Bf16 => Some(Kernel::ActRoundBf16F32),
        }
    }
}

/// Records `out = dequant(quant(x))` for every row of `x`; nothing for
/// [`ActRounding::None`].
///
/// # Errors
/// `out` not of `x`'s shape, a width that is not a multiple of the block,
/// views outside their buffers, or a value beyond 32 bits.
pub fn record_act_round(
    rec: &mut Recording,
    mode: ActRounding,
    x: Mat<'_>,
    out: Mat<'_>,
) -> Result<()> {
    let Some(kernel) = mode.kernel() else {
        return Ok(());
    };
    let width = x.cols;
    if out.rows != x.rows || out.cols != width {
        return Err(ModelError::Shape {
            tensor: "act_round output".into(),
            expected: vec![x.rows as u64, width as u64],
            got: vec![out.rows as u64, out.cols as u64],
        });
    }
    if !width.is_multiple_of(mode.block()) {
        return Err(ModelError::invalid(
            "width",
            format!(
                "{width} is not a multiple of the {mode:?} block of {}",
                mode.block()
            ),
        ));
    }
    x.check("act_round input")?;
    out.check("act_round output")?;
    let params = ActRoundParams {
        n_tokens: pc_u32("n_tokens", x.rows)?,
        width: pc_u32("width", width)?,
        ld_x: pc_u32("ld_x", x.ld)?,
        ld_d: pc_u32("ld_d", out.ld)?,
        x_offset: pc_u32("x_offset", x.offset)?,
        d_offset: pc_u32("d_offset", out.offset)?,
    };
    let threads = pc_u32("act_round threads", x.rows * (width / mode.block()))?;
    rec.dispatch_elementwise(
        kernel,
        &[Binding::read(x.buf), Binding::write(out.buf)],
        &params,
        threads,
    )
}

/// CPU reference of one row: the exact values `glsl/act_round.comp` writes.
pub fn act_round_ref(mode: ActRounding, x: &[f32]) -> Vec<f32> {
    use crate::quant::kquant_search::{fp32_to_bf16_bits, fp32_to_fp16};
    use half::{bf16, f16};
    match mode {
        ActRounding::None => x.to_vec(),
        ActRounding::F16 => x.iter().map(|&v| fp32_to_fp16(v).to_f32()).collect(),
        ActRounding::Bf16 => x
            .iter()
            .map(|&v| bf16::from_bits(fp32_to_bf16_bits(v)).to_f32())
            .collect(),
        ActRounding::Q8_0 => x
            .chunks(32)
            .flat_map(|b| {
                let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = f16::from_f32(amax / 127.0).to_f32();
                let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
                b.iter()
                    .map(move |&v| (v * id).round_ties_even() * d)
                    .collect::<Vec<_>>()
            })
            .collect(),
        ActRounding::Q8K => x
            .chunks(256)
            .flat_map(|b| {
                let (mut amax, mut m) = (0.0f32, 0.0f32);
                for &v in b {
                    if v.abs() > amax {
                        amax = v.abs();
                        m = v;
                    }
                }
                if amax == 0.0 {
                    return vec![0.0; b.len()];
                }
                let iscale = -127.0 / m;
                let d = 1.0 / iscale;
                b.iter()
                    .map(|&v| (iscale * v).round_ties_even().min(127.0) * d)
                    .collect()
            })
            .collect(),
    }
}
