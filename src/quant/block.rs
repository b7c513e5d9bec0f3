//! [`Block`]: what every GGUF block format gives the reference code — its
//! weights per block and the conversions of one block — so that the loops
//! over a row of blocks are written once, here; and `block!`, which
//! declares a block struct as every format's must be.

use bytemuck::Pod;

/// One GGUF block of a quantized format (`BlockQ4_0`, `BlockQ4K`, ...).
pub trait Block: Pod {
    /// Weights per block.
    const QK: usize;

    /// Expands the block into its `QK` weights (`y.len() == QK`).
    fn dequantize(&self, y: &mut [f32]);

    /// Quantizes `QK` weights (`x.len() == QK`) into a block.
    fn quantize(x: &[f32]) -> Self;
}

/// Expands whole blocks into `out`, `QK` weights per block: the reference
/// every kernel of the format is tested against, bit for bit.
pub fn dequantize_row<B: Block>(blocks: &[B], out: &mut [f32]) {
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(B::QK)) {
        b.dequantize(y);
    }
}

/// Quantizes `x` (a multiple of `QK` long) into blocks, as llama.cpp's
/// reference quantizer of the format does.
pub fn quantize_row<B: Block>(x: &[f32], out: &mut [B]) {
    for (xb, b) in x.chunks_exact(B::QK).zip(out.iter_mut()) {
        *b = B::quantize(xb);
    }
}

/// Declares a GGUF block struct: `#[repr(C)]` plain old data (so that GGUF
/// bytes cast to it), with its size checked at compile time against the
/// bytes the format's block takes in the file.
macro_rules! block {
    (
        $(#[$meta:meta])*
        pub struct $name:ident ($bytes:literal bytes) {
            $($(#[$fmeta:meta])* pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
        }
        const _: () = assert!(std::mem::size_of::<$name>() == $bytes);
    };
}

pub(crate) use block;
