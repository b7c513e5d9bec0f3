//! Images in prompts: a [`VisionModel`] (a SmolVLM / Idefics3 projector
//! file beside the text [`Model`] it feeds) turns an image into tile
//! embeddings, a prompt text with `<image>` markers into token ids with
//! each marker expanded as mtmd and transformers expand it, and prefills a
//! [`Session`] with the image embeddings at the image tokens' positions.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::model::Model;
use super::session::Session;
use crate::error::{ModelError, Result};
use crate::models::LoadOptions;
use crate::models::smolvlm::{ImageEmbeddings, SmolVlmModel};
use crate::tokenizer::{IMAGE_MARKER, Tokenizer};
use crate::vision::{RgbImage, image_prompt_expansion, preprocess};

/// A vision projector loaded beside a text model.
pub struct VisionModel {
    vlm: SmolVlmModel,
    tokenizer: Arc<Tokenizer>,
    /// The text vocabulary's `<image>`: the positions image embeddings take.
    image_token: u32,
}

/// One image, encoded: its tile grid and each tile's embeddings.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    /// Grid rows (0: the global view alone).
    pub rows: u32,
    /// Grid columns (0: the global view alone).
    pub cols: u32,
    /// One block of embeddings per tile, the global view last.
    pub embeddings: ImageEmbeddings,
    /// Time spent resizing, tiling and normalizing.
    pub preprocess_time: Duration,
    /// Time spent in the vision encoder.
    pub encode_time: Duration,
}

impl EncodedImage {
    /// Tiles, the global view included.
    pub fn n_tiles(&self) -> usize {
        self.embeddings.tiles.len()
    }

    /// Embeddings (`<image>` positions) of the image in a prompt; the
    /// markers around them take a few positions more.
    pub fn n_embeddings(&self) -> usize {
        self.embeddings.n_rows()
    }
}

impl Model {
    /// Loads a projector file (llama.cpp's `mmproj-*.gguf` of an Idefics3 /
    /// SmolVLM model) beside this text model.
    ///
    /// # Errors
    /// I/O and format errors of the file, a projector of another kind or
    /// one that does not project to this model's width, a tokenizer without
    /// `<image>`, device errors.
    pub fn load_vision(&self, path: &Path, opts: &LoadOptions) -> Result<VisionModel> {
        let image_token = image_token(self.tokenizer())?;
        let vlm = SmolVlmModel::load(self.weights().context(), path, self.weights().clone(), opts)?;
        Ok(VisionModel {
            vlm,
            tokenizer: self.tokenizer().clone(),
            image_token,
        })
    }
}

/// The id `<image>` tokenizes to, when it is one special token.
fn image_token(tok: &Tokenizer) -> Result<u32> {
    match tok.encode(IMAGE_MARKER, false, true)?.as_slice() {
        [id] => Ok(*id),
        _ => Err(ModelError::invalid(
            "text model",
            "its vocabulary has no <image> token: not a vision-language model's text file",
        )),
    }
}

impl VisionModel {
    /// The projector's model.
    pub fn inner(&self) -> &SmolVlmModel {
        &self.vlm
    }

    /// Resizes, tiles and encodes `image`.
    ///
    /// # Errors
    /// An image the preprocessing refuses (see [`crate::vision::preprocess()`]),
    /// device errors.
    pub fn encode(&self, image: &RgbImage) -> Result<EncodedImage> {
        let t = Instant::now();
        let tiles = preprocess(image, &self.vlm.preprocess_config())?;
        let preprocess_time = t.elapsed();
        let t = Instant::now();
        let embeddings = self.vlm.encode_tiles(&tiles)?;
        Ok(EncodedImage {
            rows: tiles.rows,
            cols: tiles.cols,
            embeddings,
            preprocess_time,
            encode_time: t.elapsed(),
        })
    }

    /// Resizes and tiles `image`, then encodes one submission's worth of its
    /// tiles with GPU timestamps: each kind of step's device nanoseconds,
    /// largest first, and the number of tiles encoded.
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn profile_encode(&self, image: &RgbImage) -> Result<(Vec<(String, f64)>, usize)> {
        let tiles = preprocess(image, &self.vlm.preprocess_config())?;
        self.vlm.profile_tiles(&tiles)
    }

    /// The prompt text that stands for `image`.
    pub fn expansion(&self, image: &EncodedImage) -> String {
        image_prompt_expansion(image.rows, image.cols, self.vlm.image_seq_len())
    }

    /// Tokenizes `text`, each [`IMAGE_MARKER`] (`<image>`) in it standing
    /// for the next of `images`: text between markers is tokenized on its
    /// own, as mtmd does, with special tokens parsed; `add_special` adds
    /// the model's BOS where it wants one.
    ///
    /// # Errors
    /// As many markers as images is required; tokenizer errors.
    pub fn tokenize(
        &self,
        text: &str,
        images: &[EncodedImage],
        add_special: bool,
    ) -> Result<Vec<u32>> {
        let pieces: Vec<&str> = text.split(IMAGE_MARKER).collect();
        if pieces.len() != images.len() + 1 {
            return Err(ModelError::invalid(
                "prompt",
                format!(
                    "{} {IMAGE_MARKER} markers for {} images",
                    pieces.len() - 1,
                    images.len()
                ),
            ));
        }
        let mut tokens = self.tokenizer.encode(pieces[0], add_special, true)?;
        for (image, piece) in images.iter().zip(&pieces[1..]) {
            tokens.extend(self.tokenizer.encode(&self.expansion(image), false, true)?);
            tokens.extend(self.tokenizer.encode(piece, false, true)?);
        }
        Ok(tokens)
    }

    /// Evaluates `tokens` (from [`VisionModel::tokenize`]) at the end of
    /// `session`, the images' embeddings at their `<image>` tokens, in
    /// order.
    ///
    /// # Errors
    /// A session of another text model, image tokens that do not match the
    /// images' embeddings, and the errors of
    /// [`Session::prefill_with_embeddings`].
    pub fn prefill(
        &self,
        session: &mut Session,
        tokens: &[u32],
        images: &[EncodedImage],
    ) -> Result<()> {
        if !Arc::ptr_eq(session.model(), self.vlm.text_model()) {
            return Err(ModelError::invalid(
                "session",
                "it belongs to another text model than the projector's",
            ));
        }
        let rows = self.vlm.embed_multimodal(
            tokens,
            self.image_token,
            images.iter().map(|i| &i.embeddings),
        )?;
        session.prefill_with_embeddings(tokens, &rows)
    }

    /// Evaluates `image` alone (its markers and embeddings) at the end of
    /// `session`.
    ///
    /// # Errors
    /// As [`VisionModel::prefill`].
    pub fn prefill_image(&self, session: &mut Session, image: &EncodedImage) -> Result<()> {
        let tokens = self.tokenize(IMAGE_MARKER, std::slice::from_ref(image), false)?;
        self.prefill(session, &tokens, std::slice::from_ref(image))
    }
}
