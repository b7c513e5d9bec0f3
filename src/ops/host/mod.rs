//! Native kernels for CPU devices: each kernel family's call recorded as a
//! host step (`gpu::host`) that runs in plain Rust over the same mapped
//! buffers the Vulkan kernels would use. On lavapipe a compute dispatch
//! costs what LLVM makes of a shader whose loads are bounds-checked gathers
//! (docs/perf-notes.md, "CPU devices"); these kernels decode the weights'
//! device layout row by row into f32 and multiply with SIMD FMAs, on every
//! core (rayon), with AVX2/FMA/F16C code picked at run time (pulp).
//!
//! Numerics: f32 throughout, as the Vulkan kernels of CPU devices; the
//! norms sum squares in f64 as the references do.

mod attention;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_kquant;
mod dequant;
mod dot;
mod elementwise;
mod im2col;
mod layer_norm;
mod linear;
mod math;
pub(crate) use math::{max as max_f32, sum_exp_shifted};
mod unary;

use std::ops::Range;
use std::sync::{Arc, LazyLock};

use half::f16;

pub use dequant::dequant_rows;

use super::Mat;
use super::act_round::ActRounding;
use super::attention::AttentionCall;
use super::backend::{CopyCall, GetRowsCall, Kernels};
use super::glu::GluCall;
use super::im2col::Im2colCall;
use super::kv_store::KvStoreCall;
use super::layer_norm::LayerNormCall;
use super::linear::LinearCall;
use super::mat::Elem;
use super::rms_norm::RmsNormCall;
use super::rope::RopeCall;
use super::topk::TopKCall;
use super::unary::UnaryCall;
use crate::error::Result;
use crate::gpu::{Buffer, HostMem, HostMut, HostRef, Recording};

/// The native kernels.
pub struct Host;

/// The native kernels.
pub static HOST: Host = Host;

/// The SIMD level detected at run time (AVX2 + FMA + F16C where present).
fn arch() -> pulp::Arch {
    static ARCH: LazyLock<pulp::Arch> = LazyLock::new(|| {
        if portable_only() {
            pulp::Arch::Scalar
        } else {
            pulp::Arch::new()
        }
    });
    *ARCH
}

/// `COMBS_HOST_SIMD=portable`: only the portable kernels, at the plain
/// instruction set the crate was compiled for, so that the code other
/// machines (aarch64, x86-64 without AVX2) run is tested on this one too.
fn portable_only() -> bool {
    static PORTABLE: LazyLock<bool> =
        LazyLock::new(|| std::env::var("COMBS_HOST_SIMD").is_ok_and(|v| v == "portable"));
    *PORTABLE
}

/// The AVX2/FMA/F16C level, when this machine has it and it is not turned
/// off by `COMBS_HOST_SIMD=portable`.
#[cfg(target_arch = "x86_64")]
fn avx2_level() -> Option<pulp::x86::V3> {
    static V3: LazyLock<Option<pulp::x86::V3>> = LazyLock::new(|| {
        if portable_only() {
            None
        } else {
            pulp::x86::V3::try_new()
        }
    });
    *V3
}

/// `h` as f32 in `out`, equal to `f16::to_f32` for every finite value and
/// infinity (NaNs stay NaNs), in a loop the compiler vectorizes: half's own
/// slice conversion goes through a call per four values. Placing the five
/// exponent bits at the bottom of f32's exponent and multiplying by 2^112
/// rebiases normal and subnormal halves alike, exactly.
#[inline(always)]
pub(crate) fn widen_halves(h: &[f16], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(h) {
        let bits = u32::from(v.to_bits());
        let em = bits & 0x7fff;
        let scaled = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
        let special = if em >= 0x7c00 { 0x7f80_0000 } else { 0 };
        *o = f32::from_bits(scaled.to_bits() | special | ((bits & 0x8000) << 16));
    }
}

/// [`widen_halves`] compiled for the SIMD level detected at run time.
pub(crate) fn widen_halves_simd(h: &[f16], out: &mut [f32]) {
    struct Op<'a>(&'a [f16], &'a mut [f32]);
    impl pulp::WithSimd for Op<'_> {
        type Output = ();
        #[inline(always)]
        fn with_simd<S: pulp::Simd>(self, _: S) {
            widen_halves(self.0, self.1);
        }
    }
    arch().dispatch(Op(h, out));
}

/// A matrix view a host step owns: its buffer and layout, in elements.
#[derive(Clone, Debug)]
pub(crate) struct Rows {
    buf: Arc<Buffer>,
    offset: usize,
    rows: usize,
    cols: usize,
    ld: usize,
}

impl Rows {
    fn of<T: Elem>(m: &Mat<'_, T>) -> Self {
        Rows {
            buf: m.buf.clone(),
            offset: m.offset,
            rows: m.rows,
            cols: m.cols,
            ld: m.ld,
        }
    }

    /// The elements the rows span.
    fn span(&self) -> Range<usize> {
        let len = match self.rows {
            0 => 0,
            r => (r - 1) * self.ld + self.cols,
        };
        self.offset..self.offset + len
    }

    /// Row `r` of a slice holding [`Self::span`].
    fn row<'s, T>(&self, span: &'s [T], r: usize) -> &'s [T] {
        &span[r * self.ld..r * self.ld + self.cols]
    }

    /// Row `r` of a mutable slice holding [`Self::span`].
    fn row_mut<'s, T>(&self, span: &'s mut [T], r: usize) -> &'s mut [T] {
        &mut span[r * self.ld..r * self.ld + self.cols]
    }

    fn read<'m, T: bytemuck::Pod>(&'m self, mem: &'m HostMem) -> Result<HostRef<'m, T>> {
        mem.read(&self.buf, self.span())
    }

    fn write<'m, T: bytemuck::Pod>(&'m self, mem: &'m HostMem) -> Result<HostMut<'m, T>> {
        mem.write(&self.buf, self.span())
    }

    /// The rows as one packed f32 matrix (`rows × cols`).
    fn to_vec(&self, mem: &HostMem) -> Result<Vec<f32>> {
        let span = self.read::<f32>(mem)?;
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            out.extend_from_slice(self.row(&span, r));
        }
        Ok(out)
    }
}

impl Kernels for Host {
    fn rms_norm(&self, rec: &mut Recording, call: &RmsNormCall<'_>) -> Result<()> {
        elementwise::rms_norm(rec, call)
    }

    fn rope(&self, rec: &mut Recording, call: &RopeCall<'_>) -> Result<()> {
        elementwise::rope(rec, call)
    }

    fn linear(&self, rec: &mut Recording, call: &LinearCall<'_>) -> Result<()> {
        linear::record(rec, call)
    }

    fn attention(&self, rec: &mut Recording, call: &AttentionCall<'_>) -> Result<()> {
        attention::record(rec, call)
    }

    fn glu(&self, rec: &mut Recording, call: &GluCall<'_>) -> Result<()> {
        elementwise::glu(rec, call)
    }

    fn get_rows(&self, rec: &mut Recording, call: &GetRowsCall<'_>) -> Result<()> {
        elementwise::get_rows(rec, call)
    }

    fn softcap(&self, rec: &mut Recording, x: Mat<'_>, cap: f32) -> Result<()> {
        elementwise::softcap(rec, x, cap)
    }

    fn act_round(
        &self,
        rec: &mut Recording,
        mode: ActRounding,
        x: Mat<'_>,
        out: Mat<'_>,
    ) -> Result<()> {
        elementwise::act_round(rec, mode, x, out)
    }

    fn copy(&self, rec: &mut Recording, call: &CopyCall<'_>) -> Result<()> {
        elementwise::copy(rec, call)
    }

    fn layer_norm(&self, rec: &mut Recording, call: &LayerNormCall<'_>) -> Result<()> {
        layer_norm::record(rec, call)
    }

    fn unary(&self, rec: &mut Recording, call: &UnaryCall<'_>) -> Result<()> {
        unary::record(rec, call)
    }

    fn im2col(&self, rec: &mut Recording, call: &Im2colCall<'_>) -> Result<()> {
        im2col::record(rec, call)
    }

    fn kv_store(&self, rec: &mut Recording, call: &KvStoreCall<'_>) -> Result<()> {
        attention::record_kv_store(rec, call)
    }

    fn top_k(&self, rec: &mut Recording, call: &TopKCall<'_>) -> Result<()> {
        elementwise::top_k(rec, call)
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

    #[test]
    fn widened_halves_equal_half_for_every_value() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut out = vec![0.0f32; all.len()];
        super::widen_halves_simd(&all, &mut out);
        for (h, o) in all.iter().zip(&out) {
            let want = h.to_f32();
            if want.is_nan() {
                assert!(o.is_nan(), "{:#06x}", h.to_bits());
            } else {
                assert_eq!(o.to_bits(), want.to_bits(), "{:#06x}", h.to_bits());
            }
        }
    }
}
