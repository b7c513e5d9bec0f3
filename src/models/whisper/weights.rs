//! Where a Whisper model's tensors come from: any [`WhisperSource`] — a
//! whisper.cpp `.bin` file, or tensors held in memory ([`HostWhisper`],
//! what the tests make random models with) — by openai-whisper's names
//! (`encoder.blocks.0.attn.query.weight`), each with its ggml type, its
//! dimensions in ggml order (`ne[0]` the fastest) and its bytes.

use std::collections::HashMap;

use crate::error::{ModelError, Result};
use crate::formats::whisper_bin::{WhisperBinWriter, expected_tensors};
use crate::models::speech::WhisperHparams;
use crate::quant::{QuantType, dequantize_vec, quantize};
use crate::tokenizer::whisper::WhisperVocab;

/// One stored tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    /// Storage type.
    pub qtype: QuantType,
    /// Dimensions in ggml order: `ne[0]` varies fastest (a PyTorch
    /// `[rows, cols]` matrix is `[cols, rows]`).
    pub ne: &'a [usize],
    /// The blocks of every row, row after row.
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.ne.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32.
    ///
    /// # Errors
    /// Bytes that do not hold the tensor's elements.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        dequantize_vec(self.qtype, self.bytes, self.len())
    }
}

/// A Whisper model's file contents: dimensions, filterbank, vocabulary and
/// tensors by name.
pub trait WhisperSource {
    /// The dimensions.
    fn hparams(&self) -> WhisperHparams;
    /// The mel filterbank, `n_mels` rows of `N_FFT / 2 + 1`.
    fn mel_filters(&self) -> &[f32];
    /// The vocabulary.
    fn vocab(&self) -> &WhisperVocab;
    /// The tensor `name`, if stored.
    fn tensor(&self, name: &str) -> Option<TensorView<'_>>;
}

/// The tensor `name`, with its dimensions checked (trailing 1s aside).
///
/// # Errors
/// A missing tensor, other dimensions, bytes not of the dimensions.
pub fn require<'s>(src: &'s dyn WhisperSource, name: &str, ne: &[usize]) -> Result<TensorView<'s>> {
    let t = src
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor { name: name.into() })?;
    let trim = |v: &[usize]| {
        let mut v = v.to_vec();
        while v.len() > 1 && v.last() == Some(&1) {
            v.pop();
        }
        v
    };
    let ok_dims = trim(t.ne) == trim(ne)
        // whisper.cpp stores the convolution biases as [1, d].
        || (ne.len() == 1 && t.len() == ne[0] && t.ne.iter().filter(|&&d| d != 1).count() <= 1);
    if !ok_dims {
        return Err(ModelError::Shape {
            tensor: name.into(),
            expected: ne.iter().map(|&d| d as u64).collect(),
            got: t.ne.iter().map(|&d| d as u64).collect(),
        });
    }
    let want = t.qtype.row_bytes(t.len())?;
    if t.bytes.len() != want {
        return Err(ModelError::Shape {
            tensor: format!("{name} bytes"),
            expected: vec![want as u64],
            got: vec![t.bytes.len() as u64],
        });
    }
    Ok(t)
}

/// A model's tensors in memory.
pub struct HostWhisper {
    /// The dimensions.
    pub hparams: WhisperHparams,
    /// The filterbank.
    pub mel_filters: Vec<f32>,
    /// The vocabulary.
    pub vocab: WhisperVocab,
    /// Tensors: (type, ggml dims, bytes) by name.
    pub tensors: HashMap<String, (QuantType, Vec<usize>, Vec<u8>)>,
}

impl WhisperSource for HostWhisper {
    fn hparams(&self) -> WhisperHparams {
        self.hparams
    }

    fn mel_filters(&self) -> &[f32] {
        &self.mel_filters
    }

    fn vocab(&self) -> &WhisperVocab {
        &self.vocab
    }

    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensors.get(name).map(|(qtype, ne, bytes)| TensorView {
            qtype: *qtype,
            ne,
            bytes,
        })
    }
}

/// A small deterministic generator (SplitMix64) for random models.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

impl HostWhisper {
    /// The model as whisper.cpp's file, its tensors in whisper.cpp's order
    /// and `weight_type` in the header (the type its matrices are stored in).
    ///
    /// # Errors
    /// A tensor the layout expects that the model lacks; the writer's errors.
    pub fn to_whisper_bin(&self, weight_type: QuantType) -> Result<WhisperBinWriter> {
        let mut w = WhisperBinWriter::new(
            self.hparams,
            weight_type,
            self.mel_filters.clone(),
            self.vocab.pieces.clone(),
        )?;
        for t in expected_tensors(&self.hparams) {
            let (qt, ne, bytes) =
                self.tensors
                    .get(&t.name)
                    .ok_or_else(|| ModelError::MissingTensor {
                        name: t.name.clone(),
                    })?;
            w.add_tensor(&t.name, *qt, ne, bytes.clone())?;
        }
        Ok(w)
    }

    /// A model of `hp`'s shape with random weights from `seed` (matrices
    /// scaled by 1/√fan-in so activations stay of unit size), matrices of
    /// the blocks stored as `matrix_type`, embeddings and convolutions as
    /// f16, norms, biases and positions as f32 — the types whisper.cpp
    /// files hold. The vocabulary's pieces are placeholders.
    ///
    /// # Errors
    /// A shape `matrix_type` cannot hold (columns not a multiple of its
    /// block), a vocabulary below Whisper's.
    pub fn random(hp: WhisperHparams, matrix_type: QuantType, seed: u64) -> Result<Self> {
        let mut rng = Mix(seed);
        let mut tensors = HashMap::new();
        let mut put = |name: String, t: QuantType, ne: Vec<usize>, scale: f32, base: f32| {
            let n: usize = ne.iter().product();
            let v: Vec<f32> = (0..n).map(|_| base + scale * rng.sym()).collect();
            let bytes = quantize(t, &v)?;
            tensors.insert(name, (t, ne, bytes));
            Ok::<(), ModelError>(())
        };
        let (d, dt, m) = (hp.n_audio_state, hp.n_text_state, hp.n_mels);
        let f32t = QuantType::F32;
        let inv = |k: usize| 1.0 / (k as f32).sqrt();
        put(
            "encoder.conv1.weight".into(),
            QuantType::F16,
            vec![3, m, d],
            inv(3 * m),
            0.0,
        )?;
        put("encoder.conv1.bias".into(), f32t, vec![1, d], 0.1, 0.0)?;
        put(
            "encoder.conv2.weight".into(),
            QuantType::F16,
            vec![3, d, d],
            inv(3 * d),
            0.0,
        )?;
        put("encoder.conv2.bias".into(), f32t, vec![1, d], 0.1, 0.0)?;
        put(
            "encoder.positional_embedding".into(),
            f32t,
            vec![d, hp.n_audio_ctx],
            0.5,
            0.0,
        )?;
        let block = |put: &mut dyn FnMut(String, QuantType, Vec<usize>, f32, f32) -> Result<()>,
                     p: String,
                     w: usize,
                     cross: bool|
         -> Result<()> {
            let attn =
                |put: &mut dyn FnMut(String, QuantType, Vec<usize>, f32, f32) -> Result<()>,
                 a: &str|
                 -> Result<()> {
                    put(format!("{p}.{a}_ln.weight"), f32t, vec![w], 0.2, 1.0)?;
                    put(format!("{p}.{a}_ln.bias"), f32t, vec![w], 0.1, 0.0)?;
                    for (proj, bias) in [
                        ("query", true),
                        ("key", false),
                        ("value", true),
                        ("out", true),
                    ] {
                        put(
                            format!("{p}.{a}.{proj}.weight"),
                            matrix_type,
                            vec![w, w],
                            inv(w),
                            0.0,
                        )?;
                        if bias {
                            put(format!("{p}.{a}.{proj}.bias"), f32t, vec![w], 0.1, 0.0)?;
                        }
                    }
                    Ok(())
                };
            attn(put, "attn")?;
            if cross {
                attn(put, "cross_attn")?;
            }
            put(format!("{p}.mlp_ln.weight"), f32t, vec![w], 0.2, 1.0)?;
            put(format!("{p}.mlp_ln.bias"), f32t, vec![w], 0.1, 0.0)?;
            put(
                format!("{p}.mlp.0.weight"),
                matrix_type,
                vec![w, 4 * w],
                inv(w),
                0.0,
            )?;
            put(format!("{p}.mlp.0.bias"), f32t, vec![4 * w], 0.1, 0.0)?;
            put(
                format!("{p}.mlp.2.weight"),
                matrix_type,
                vec![4 * w, w],
                inv(4 * w),
                0.0,
            )?;
            put(format!("{p}.mlp.2.bias"), f32t, vec![w], 0.1, 0.0)?;
            Ok(())
        };
        for i in 0..hp.n_audio_layer {
            block(&mut put, format!("encoder.blocks.{i}"), d, false)?;
        }
        put("encoder.ln_post.weight".into(), f32t, vec![d], 0.2, 1.0)?;
        put("encoder.ln_post.bias".into(), f32t, vec![d], 0.1, 0.0)?;
        put(
            "decoder.token_embedding.weight".into(),
            QuantType::F16,
            vec![dt, hp.n_vocab],
            1.0,
            0.0,
        )?;
        put(
            "decoder.positional_embedding".into(),
            f32t,
            vec![dt, hp.n_text_ctx],
            0.5,
            0.0,
        )?;
        for i in 0..hp.n_text_layer {
            block(&mut put, format!("decoder.blocks.{i}"), dt, true)?;
        }
        put("decoder.ln.weight".into(), f32t, vec![dt], 0.2, 1.0)?;
        put("decoder.ln.bias".into(), f32t, vec![dt], 0.1, 0.0)?;
        let pieces = (0..hp.n_vocab.min(50257))
            .map(|i| format!("<{i}>").into_bytes())
            .collect();
        let vocab = WhisperVocab::new(pieces, hp.n_vocab)?;
        let mel_filters = (0..m * 201).map(|i| ((i % 7) as f32) * 0.01).collect();
        Ok(HostWhisper {
            hparams: hp,
            mel_filters,
            vocab,
            tensors,
        })
    }
}

impl WhisperSource for crate::formats::whisper_bin::WhisperFile {
    fn hparams(&self) -> WhisperHparams {
        self.hparams
    }

    fn mel_filters(&self) -> &[f32] {
        &self.mel_filters
    }

    fn vocab(&self) -> &WhisperVocab {
        &self.vocab
    }

    fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        crate::formats::whisper_bin::WhisperFile::tensor(self, name).map(|t| TensorView {
            qtype: t.qtype,
            ne: t.ne,
            bytes: t.bytes,
        })
    }
}
