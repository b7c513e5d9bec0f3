//! Shared test helpers: the GPU context (a missing Vulkan device fails the
//! test with what to install; it never skips) and a seeded random source that
//! draws fresh data on every run and prints its seed for replay.

#![allow(dead_code)]

pub mod steps;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use combs::gpu::GpuContext;

/// The device every GPU test runs on (lavapipe on machines without a GPU).
pub fn gpu() -> Arc<GpuContext> {
    static CTX: OnceLock<Arc<GpuContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        GpuContext::new(None).unwrap_or_else(|e| {
            panic!(
                "no Vulkan device for the GPU tests: {e}\n\
                 install one, e.g. `apt-get install -y libvulkan1 mesa-vulkan-drivers` (lavapipe)"
            )
        })
    })
    .clone()
}

/// Whether the host's native kernels can run on the test device: they read
/// and write the buffers in place, which only a CPU device's are to the
/// host (on a GPU the tests that ask for them run the Vulkan kernels' plan
/// alone, or skip).
pub fn host_kernels_run_here() -> bool {
    gpu().caps().class() == combs::gpu::DeviceClass::Cpu
}

/// SplitMix64: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `COMBS_TEST_SEED` if set, else from the clock;
    /// the seed is printed so a failure can be replayed.
    pub fn fresh(label: &str) -> Self {
        let seed = std::env::var("COMBS_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0x5eed)
            });
        eprintln!("[{label}] COMBS_TEST_SEED={seed}");
        Rng(seed)
    }

    /// A generator with a fixed seed.
    pub fn seeded(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[lo, hi)`.
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.f32()
    }

    /// Uniform integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.f32().max(1e-7);
        let u2 = self.f32();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }

    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }

    /// `n` values from N(0, scale²).
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// Largest absolute difference over the largest reference magnitude.
pub fn max_rel(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output");
    let scale = want
        .iter()
        .map(|&v| f64::from(v).abs())
        .fold(1e-30, f64::max);
    got.iter()
        .zip(want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).abs())
        .fold(0.0, f64::max)
        / scale
}

/// Relative L2 error of `got` against `want`.
pub fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|v| v.is_finite()), "non-finite output");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| f64::from(b).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Random GGUF bytes of `t` with finite scales and quants, normal weights for dense types.
pub fn random_weight(rng: &mut Rng, t: combs::quant::QuantType, n: usize) -> Vec<u8> {
    match t {
        combs::quant::QuantType::F32 => bytemuck::cast_slice(&rng.normals(n, 0.5)).to_vec(),
        combs::quant::QuantType::F16 => rng
            .normals(n, 0.5)
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        combs::quant::QuantType::BF16 => rng
            .normals(n, 0.5)
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => {
            let mut bytes = vec![0u8; n / t.block_size() * t.block_bytes()];
            rng.fill(&mut bytes);
            let layout = combs::quant::DeviceLayout::of(t).expect("quantized");
            for block in bytes.chunks_exact_mut(t.block_bytes()) {
                for &off in layout.scales {
                    let v = rng.range(0.001, 0.05) * if rng.below(2) == 0 { 1.0 } else { -1.0 };
                    block[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            bytes
        }
    }
}

/// A file written for one test, removed when dropped (also when the test
/// panics); it derefs to its path.
pub struct TempFile(PathBuf);

impl TempFile {
    /// Writes `bytes` to `name` in this test process's temporary directory.
    pub fn write(name: &str, bytes: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("combs-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("write a temporary file");
        TempFile(p)
    }
}

impl std::ops::Deref for TempFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // Removed only once the last file of the process is gone.
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
