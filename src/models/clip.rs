//! The projector file of a vision-language model: llama.cpp's `clip` GGUF
//! (`general.architecture = clip`, written by `convert_hf_to_gguf.py
//! --mmproj`). This file reads and checks its vision hyperparameters
//! (`clip.vision.*`, key names of `tools/mtmd/clip-impl.h`) for the
//! Idefics3 projector (`clip.projector_type = idefics3`: SigLIP and a pixel
//! shuffle then one linear projection) and derives the preprocessing
//! settings from them.

use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::vision::PreprocessConfig;

/// `general.architecture` of projector files.
pub const CLIP_ARCH: &str = "clip";

/// The projector type this build runs.
pub const IDEFICS3: &str = "idefics3";

/// The vision tower and connector of an Idefics3 projector file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClipVisionHparams {
    /// Side of a square tile in pixels (`clip.vision.image_size`).
    pub image_size: usize,
    /// Side of a patch (`clip.vision.patch_size`).
    pub patch_size: usize,
    /// Encoder width (`clip.vision.embedding_length`).
    pub n_embd: usize,
    /// MLP hidden width (`clip.vision.feed_forward_length`).
    pub n_ff: usize,
    /// Encoder blocks (`clip.vision.block_count`).
    pub n_layer: usize,
    /// Attention heads (`clip.vision.attention.head_count`).
    pub n_head: usize,
    /// Layer norm epsilon (`clip.vision.attention.layer_norm_epsilon`).
    pub eps: f32,
    /// Output width, the text model's (`clip.vision.projection_dim`).
    pub projection_dim: usize,
    /// Pixel-shuffle factor (`clip.vision.projector.scale_factor`).
    pub scale_factor: usize,
    /// Longest edge before tiling (`clip.vision.preproc_image_size`;
    /// the tile side where absent, as the converter writes it).
    pub preproc_image_size: usize,
    /// Per-channel mean (`clip.vision.image_mean`).
    pub mean: [f32; 3],
    /// Per-channel standard deviation (`clip.vision.image_std`).
    pub std: [f32; 3],
}

fn bad(key: &str, reason: impl Into<String>) -> ModelError {
    ModelError::Metadata {
        key: key.into(),
        reason: reason.into(),
    }
}

fn dim(g: &GgufFile, key: &str, max: u32) -> Result<usize> {
    let v = g.require_u32(key)?;
    if v == 0 || v > max {
        return Err(bad(key, format!("{v} is outside 1..={max}")));
    }
    Ok(v as usize)
}

fn rgb(g: &GgufFile, key: &str, positive: bool) -> Result<[f32; 3]> {
    let v = g.get_arr_f32(key)?.ok_or_else(|| bad(key, "missing"))?;
    let ok = v.len() == 3 && v.iter().all(|x| x.is_finite() && (!positive || *x > 0.0));
    if !ok {
        return Err(bad(
            key,
            format!(
                "{v:?} is not 3 finite values{}",
                if positive { " above 0" } else { "" }
            ),
        ));
    }
    Ok([v[0], v[1], v[2]])
}

impl ClipVisionHparams {
    /// Reads and checks the hyperparameters of an Idefics3 projector file.
    ///
    /// # Errors
    /// Not a `clip` file, no vision encoder, another projector type, a
    /// missing or out-of-range key, or dimensions that do not fit together
    /// (a tile not a whole number of patches, a patch grid not a multiple
    /// of the scale factor, a width not a whole number of heads).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.architecture()?;
        if arch != CLIP_ARCH {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "{arch} (a projector file has architecture `{CLIP_ARCH}`)"
            )));
        }
        if g.get_bool("clip.has_vision_encoder")? == Some(false) {
            return Err(bad("clip.has_vision_encoder", "false: no vision encoder"));
        }
        let proj = match g.get_str("clip.vision.projector_type")? {
            Some(p) => p,
            None => g.require_str("clip.projector_type")?,
        };
        if proj != IDEFICS3 {
            return Err(ModelError::UnsupportedArchitecture(format!(
                "clip projector `{proj}` (only `{IDEFICS3}` is supported)"
            )));
        }
        let image_size = dim(g, "clip.vision.image_size", 4096)?;
        let eps_key = "clip.vision.attention.layer_norm_epsilon";
        let eps = g.require_f32(eps_key)?;
        if !(eps.is_finite() && eps > 0.0 && eps < 1.0) {
            return Err(bad(eps_key, format!("{eps} is not in (0, 1)")));
        }
        let hp = ClipVisionHparams {
            image_size,
            patch_size: dim(g, "clip.vision.patch_size", 1024)?,
            n_embd: dim(g, "clip.vision.embedding_length", 1 << 16)?,
            n_ff: dim(g, "clip.vision.feed_forward_length", 1 << 18)?,
            n_layer: dim(g, "clip.vision.block_count", 1024)?,
            n_head: dim(g, "clip.vision.attention.head_count", 1024)?,
            eps,
            projection_dim: dim(g, "clip.vision.projection_dim", 1 << 18)?,
            scale_factor: dim(g, "clip.vision.projector.scale_factor", 64)?,
            preproc_image_size: match g.get_u32("clip.vision.preproc_image_size")? {
                Some(_) => dim(g, "clip.vision.preproc_image_size", 1 << 15)?,
                None => image_size,
            },
            mean: rgb(g, "clip.vision.image_mean", false)?,
            std: rgb(g, "clip.vision.image_std", true)?,
        };
        hp.check()?;
        Ok(hp)
    }

    fn check(&self) -> Result<()> {
        if !self.image_size.is_multiple_of(self.patch_size) {
            return Err(bad(
                "clip.vision.patch_size",
                format!(
                    "{} does not divide the image size {}",
                    self.patch_size, self.image_size
                ),
            ));
        }
        if !self.grid().is_multiple_of(self.scale_factor) {
            return Err(bad(
                "clip.vision.projector.scale_factor",
                format!(
                    "{} does not divide the {}-patch grid side",
                    self.scale_factor,
                    self.grid()
                ),
            ));
        }
        let (w, h) = (self.n_embd, self.n_head);
        // What the attention kernels take: even head widths up to 256.
        if !w.is_multiple_of(h) || !(w / h).is_multiple_of(2) || w / h > 256 {
            return Err(bad(
                "clip.vision.attention.head_count",
                format!("width {w} over {h} heads"),
            ));
        }
        if self.preproc_image_size < self.image_size {
            return Err(bad(
                "clip.vision.preproc_image_size",
                format!(
                    "{} is below the tile size {}",
                    self.preproc_image_size, self.image_size
                ),
            ));
        }
        Ok(())
    }

    /// Patches along a tile's side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patches of one tile: the encoder's positions.
    pub fn n_patches(&self) -> usize {
        self.grid() * self.grid()
    }

    /// Floats of one patch row: `3 · patch_size²`.
    pub fn patch_width(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }

    /// Embeddings one tile becomes after the connector (64 for SmolVLM-256M).
    pub fn image_seq_len(&self) -> usize {
        self.n_patches() / (self.scale_factor * self.scale_factor)
    }

    /// The preprocessing these hyperparameters state.
    pub fn preprocess_config(&self) -> PreprocessConfig {
        PreprocessConfig {
            tile_size: self.image_size as u32,
            longest_edge: self.preproc_image_size as u32,
            mean: self.mean,
            std: self.std,
        }
    }

    /// Where the encoder's row `r` takes its patch from, as the patch's
    /// row-major index in the tile's grid: rows are stored in the order of
    /// the connector's pixel shuffle, so that the shuffle is a plain view of
    /// the encoder output as rows of `scale_factor²` consecutive rows. The
    /// encoder does not mind the order (its attention sees every position
    /// and its positions are added per patch).
    ///
    /// Output row `o = i · g/s + j` of the shuffle (transformers'
    /// `Idefics3Connector.pixel_shuffle`, mtmd's `build_patch_merge_permute`)
    /// concatenates, `k` outer and `m` inner, the patches at grid row
    /// `s·i + k` and column `s·j + m` (`s` the scale factor, `g` the grid).
    pub fn patch_order(&self) -> Vec<usize> {
        let (g, s) = (self.grid(), self.scale_factor);
        let gs = g / s;
        let mut order = Vec::with_capacity(g * g);
        for i in 0..gs {
            for j in 0..gs {
                for k in 0..s {
                    for m in 0..s {
                        order.push((s * i + k) * g + s * j + m);
                    }
                }
            }
        }
        order
    }
}
