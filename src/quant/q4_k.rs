//! Q4_K: 256 weights per block in 8 sub-blocks of 32; 4-bit quants, 6-bit
//! sub-block scales and mins, f16 super-scales. Follows llama.cpp's
//! `dequantize_row_q4_K` / `quantize_row_q4_K_ref`.

use half::f16;

use super::block::{Block, block};
use super::kquant_search::{Qkx2Search, fp32_to_fp16, max_or_zero, nearest_int, qkx2_sub_blocks};
use super::q2_k::QK_K;

block! {
    /// The 16 bytes Q4_K and Q5_K blocks start with: super-block scales and
    /// the sub-block scales and mins they multiply.
    pub struct ScalesK4 (16 bytes) {
        /// Super-block scale of the scales.
        pub d: f16,
        /// Super-block scale of the mins.
        pub dmin: f16,
        /// 8 scales and 8 mins, 6 bits each.
        pub scales: [u8; 12],
    }
}

block! {
    /// One GGUF Q4_K block.
    pub struct BlockQ4K (144 bytes) {
        /// Scales and mins.
        pub head: ScalesK4,
        /// 4-bit quants.
        pub qs: [u8; QK_K / 2],
    }
}

/// Scale and min of sub-block `j` (0..8) from packed 6-bit scales (llama.cpp `get_scale_min_k4`).
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl ScalesK4 {
    /// Expands the 256 weights of a Q4_K or Q5_K block whose sub-blocks
    /// `2·j64` and `2·j64 + 1` hold the levels `levels(j64, l)` at their
    /// position `l` (0..32).
    pub(crate) fn dequantize(&self, y: &mut [f32], levels: impl Fn(usize, usize) -> (u8, u8)) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        // `d` times the 6-bit scale, `dmin` times the 6-bit min.
        let scale_min = |j: usize| {
            let (sc, m) = get_scale_min_k4(j, &self.scales);
            (d * f32::from(sc), min * f32::from(m))
        };
        for j64 in 0..QK_K / 64 {
            let (d1, m1) = scale_min(2 * j64);
            let (d2, m2) = scale_min(2 * j64 + 1);
            let y = &mut y[64 * j64..64 * j64 + 64];
            for l in 0..32 {
                let (l1, l2) = levels(j64, l);
                y[l] = d1 * f32::from(l1) - m1;
                y[l + 32] = d2 * f32::from(l2) - m2;
            }
        }
    }
}

impl Block for BlockQ4K {
    const QK: usize = QK_K;

    /// Expands the block to f32.
    fn dequantize(&self, y: &mut [f32]) {
        self.head.dequantize(y, |j64, l| {
            let q = self.qs[32 * j64 + l];
            (q & 0xF, q >> 4)
        });
    }

    /// Quantizes 256 weights, bit for bit as llama.cpp's `quantize_row_q4_K_ref`.
    fn quantize(xb: &[f32]) -> Self {
        let (levels, head) = levels_k4(xb, 15, -1.0, 20);
        let mut qs = [0u8; QK_K / 2];
        for j in (0..QK_K).step_by(64) {
            for l in 0..32 {
                qs[j / 2 + l] = levels[j + l] | (levels[j + l + 32] << 4);
            }
        }
        BlockQ4K { head, qs }
    }
}

/// Searches scale and min of each 32-weight sub-block of one super-block
/// (`make_qkx2_quants` with ggml's `nmax`, `rmin` and `nstep`), packs them as
/// 6-bit multiples of the super-scales `d` and `dmin`, and requantizes each
/// sub-block against its rounded scale and min (the part
/// `quantize_row_q4_K_ref` and `quantize_row_q5_K_ref` share).
///
/// Returns the levels (`0..=nmax`; a sub-block whose scale rounds to zero
/// keeps those of the search) and the scales.
pub(crate) fn levels_k4(xb: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; QK_K], ScalesK4) {
    let search = Qkx2Search {
        nmax,
        rmin,
        rdelta: 0.1,
        nstep,
        use_mad: false,
    };
    let (mut levels, scales, mins) = qkx2_sub_blocks::<{ QK_K / 32 }>(xb, &search, |xs, w| {
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        // Weights favour large values, floored by the sub-block's RMS.
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in w.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
    });
    let max_scale = max_or_zero(&scales);
    let max_min = max_or_zero(&mins);

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        // ggml stores the rounded value in a uint8_t before clamping.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);

    // Requantize against the rounded scales and mins.
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let d = d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for ii in 0..32 {
            let l = nearest_int((xb[32 * j + ii] + dm) / d);
            levels[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
    (
        levels,
        ScalesK4 {
            d,
            dmin,
            scales: packed,
        },
    )
}

/// Writes Q4_K blocks (GGUF bytes, unchanged from the file) in the device
/// layout the Q4_K kernels read: every block's 128 bytes of nibbles, then every
/// block's 12 bytes of packed 6-bit sub-block scales and mins, then every
/// block's f16 `d` and `dmin`. Device bytes per weight equal the file's: 144
/// bytes per 256 weights (4.5 bits), so decode reads each weight byte once.
///
/// ```
/// use combs::quant::{QuantType, quantize};
///
/// fn main() -> combs::Result<()> {
///     let w: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
///     let blocks = quantize(QuantType::Q4K, &w)?;
///     let device = combs::repack_q4_k(&blocks)?;
///     assert_eq!(device.len(), blocks.len());
///     assert_eq!(&device[..128], &blocks[16..144]); // the nibbles lead
///     assert_eq!(&device[128..140], &blocks[4..16]); // then the sub-block scales
///     assert_eq!(&device[140..144], &blocks[..4]); // then d and dmin
///     Ok(())
/// }
/// ```
///
/// # Errors
/// `src` is not a whole number of Q4_K blocks.
pub fn repack_q4_k(src: &[u8]) -> crate::Result<Vec<u8>> {
    super::layout::repack_vec(super::QuantType::Q4K, src)
}
