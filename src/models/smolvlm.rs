//! `SmolVlmModel`: the vision side of SmolVLM (Idefics3) beside its text
//! model. A projector file (`models::clip`) holds SigLIP — the patch
//! embedding (a 2-D convolution of stride = kernel, stated as a product
//! over patch rows), learned positions, pre-LayerNorm blocks of full
//! self-attention and a tanh-GELU MLP, a final LayerNorm — and the
//! Idefics3 connector: a pixel shuffle by the scale factor, then one
//! linear projection (no bias) to the text model's width. Transformers'
//! `modeling_idefics3.py` and mtmd's `clip_graph_siglip` define the math.
//!
//! The shuffle costs nothing here: the patch rows enter the encoder in the
//! shuffled order ([`ClipVisionHparams::patch_order`]; positions permuted
//! alike at load time), so the encoder's output viewed as rows of
//! `scale_factor²` rows is the shuffled matrix. The blocks are the speech
//! encoder's ([`EncoderBlock`]), stated to the planner, which picks the
//! kernels; one tile's steps are recorded once and replayed for every tile.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::clip::ClipVisionHparams;
use super::loader::TensorLoader;
use super::registry::LoadOptions;
use super::{EmbedRows, GenerativeModel};
use crate::error::{ModelError, Result};
use crate::formats::gguf::GgufFile;
use crate::gpu::{Buffer, DeviceClass, GpuContext, MemoryKind, Recording, upload_new};
use crate::ops::Mat;
use crate::ops::act_round::Numerics;
use crate::ops::layer_norm::LayerNorm;
use crate::ops::linear::Linear;
use crate::ops::plan::{
    EncoderBlock, Forward, FullKv, FullKvAddressing, Heads, LnMlp, LnSelfAttention, Planner,
    Workspace, WorkspaceShape,
};
use crate::ops::unary::UnaryOp;
use crate::quant::{QuantType, quantize};
use crate::vision::{ImageTiles, PreprocessConfig};

/// The embeddings of one image: one `[seq_len, n_embd]` row-major block
/// per tile, in the order of the tiles (grid row-major, global view last).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageEmbeddings {
    /// Floats per embedding (the text model's width).
    pub n_embd: usize,
    /// Embeddings per tile.
    pub seq_len: usize,
    /// Each tile's `seq_len * n_embd` floats.
    pub tiles: Vec<Vec<f32>>,
}

impl ImageEmbeddings {
    /// Embeddings of all tiles.
    pub fn n_rows(&self) -> usize {
        self.tiles.len() * self.seq_len
    }
}

/// A layer norm's weight and bias on the device.
struct NormW {
    w: Arc<Buffer>,
    b: Arc<Buffer>,
    eps: f32,
}

impl NormW {
    fn load(l: &mut TensorLoader<'_>, p: &str, d: usize, eps: f32) -> Result<Self> {
        Ok(NormW {
            w: l.vector(&format!("{p}.weight"), d)?,
            b: l.vector(&format!("{p}.bias"), d)?,
            eps,
        })
    }

    fn norm(&self) -> LayerNorm<'_> {
        LayerNorm {
            weight: &self.w,
            bias: &self.b,
            eps: self.eps,
        }
    }

    fn bytes(&self) -> u64 {
        self.w.size() + self.b.size()
    }
}

/// One SigLIP block's weights.
struct BlockW {
    ln1: NormW,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    ln2: NormW,
    up: Linear,
    down: Linear,
}

impl BlockW {
    fn load(l: &mut TensorLoader<'_>, il: usize, hp: &ClipVisionHparams) -> Result<Self> {
        let (d, ff) = (hp.n_embd, hp.n_ff);
        let p = format!("v.blk.{il}");
        // Some converters swapped the names of the two MLP products; mtmd
        // tells them apart by the shape of `ffn_down`, and so does this.
        let down_name = format!("{p}.ffn_down.weight");
        let swapped =
            ff != d && l.has(&down_name) && l.host_dims(&down_name)?.first() == Some(&(d as u64));
        let (up, down) = if swapped {
            ("ffn_down", "ffn_up")
        } else {
            ("ffn_up", "ffn_down")
        };
        Ok(BlockW {
            ln1: NormW::load(l, &format!("{p}.ln1"), d, hp.eps)?,
            q: l.linear(&format!("{p}.attn_q"), d, d, true)?,
            k: l.linear(&format!("{p}.attn_k"), d, d, true)?,
            v: l.linear(&format!("{p}.attn_v"), d, d, true)?,
            out: l.linear(&format!("{p}.attn_out"), d, d, true)?,
            ln2: NormW::load(l, &format!("{p}.ln2"), d, hp.eps)?,
            up: l.linear(&format!("{p}.{up}"), ff, d, true)?,
            down: l.linear(&format!("{p}.{down}"), d, ff, true)?,
        })
    }

    fn block(&self, heads: Heads) -> EncoderBlock<'_> {
        EncoderBlock {
            attn: LnSelfAttention {
                norm: self.ln1.norm(),
                q: &self.q,
                k: &self.k,
                v: &self.v,
                out: &self.out,
                heads,
            },
            mlp: LnMlp {
                norm: self.ln2.norm(),
                act: UnaryOp::GeluTanh,
                up: &self.up,
                down: &self.down,
            },
        }
    }

    fn bytes(&self) -> u64 {
        let lin = [&self.q, &self.k, &self.v, &self.out, &self.up, &self.down];
        lin.iter().map(|l| l.device_bytes()).sum::<u64>() + self.ln1.bytes() + self.ln2.bytes()
    }
}

/// The buffers of one call's encoding (up to `tiles` tiles at once) and its
/// recorded steps.
struct EncoderScratch {
    /// Most tiles of one call.
    tiles: usize,
    ws: Workspace,
    /// Patch rows of the tiles, `[tiles · n_patches, patch_cols]`,
    /// host-written.
    patches: Arc<Buffer>,
    /// The same in device memory, which the product reads many times.
    patches_dev: Arc<Buffer>,
    keys: FullKv,
    at: FullKvAddressing,
    /// The connector's output on the device, `[tiles · seq_len, projection_dim]`.
    out_dev: Arc<Buffer>,
    /// The same, where the host reads it.
    out: Arc<Buffer>,
    /// The recorded call of `k + 1` tiles at index `k`, once made.
    steps: Vec<Option<Recording>>,
}

impl EncoderScratch {
    fn new(
        ctx: &Arc<GpuContext>,
        hp: &ClipVisionHparams,
        planner: Planner,
        patch_cols: usize,
        tiles: usize,
    ) -> Result<Self> {
        let n = hp.n_patches();
        let rows = tiles * n;
        let shape = WorkspaceShape {
            n_embd: hp.n_embd,
            n_q: hp.n_embd,
            n_kv: hp.n_embd,
            n_ff: hp.n_ff,
            n_vocab: 1,
        };
        let round_inputs = planner.numerics != Numerics::Exact;
        let out_bytes = (4 * tiles * hp.image_seq_len() * hp.projection_dim) as u64;
        let patch_bytes = (4 * rows * patch_cols) as u64;
        Ok(EncoderScratch {
            tiles,
            ws: Workspace::new(ctx, shape, rows, 1, round_inputs)?,
            patches: Buffer::new(ctx, patch_bytes, MemoryKind::Upload, "patch rows")?,
            patches_dev: Buffer::new(ctx, patch_bytes, MemoryKind::Device, "patch rows")?,
            keys: FullKv::new(ctx, rows, hp.n_embd, "vision attention")?,
            at: FullKvAddressing::batched(ctx, n, tiles)?,
            out_dev: Buffer::new(ctx, out_bytes, MemoryKind::Device, "image embeddings")?,
            out: Buffer::new(ctx, out_bytes, MemoryKind::Readback, "image embeddings")?,
            steps: (0..tiles).map(|_| None).collect(),
        })
    }
}

/// Tiles one call encodes by default: one on CPU devices (nothing to gain,
/// memory to lose); elsewhere up to 16, as many as keep the widest
/// activation buffer within one descriptor's range, so that each product
/// has rows enough to fill a large GPU.
fn default_tiles_per_call(ctx: &GpuContext, hp: &ClipVisionHparams, patch_cols: usize) -> usize {
    if ctx.caps().class() == DeviceClass::Cpu {
        return 1;
    }
    let widest = (2 * hp.n_ff).max(3 * hp.n_embd).max(patch_cols);
    let per_tile = (4 * hp.n_patches() * widest) as u64;
    let fit = ctx.caps().max_binding_bytes(4) / per_tile.max(1);
    (fit as usize).clamp(1, 16)
}

/// SmolVLM's vision encoder and connector on a device, with the text model
/// its embeddings feed.
pub struct SmolVlmModel {
    ctx: Arc<GpuContext>,
    planner: Planner,
    hp: ClipVisionHparams,
    text: Arc<dyn GenerativeModel>,
    /// Columns of a patch row on the device (`3·p²` rounded up to 32).
    patch_cols: usize,
    patch: Linear,
    /// Learned positions in the encoder's row order.
    positions: Arc<Buffer>,
    blocks: Vec<BlockW>,
    post_ln: NormW,
    fc: Linear,
    order: Vec<usize>,
    encoder: Mutex<EncoderScratch>,
}

impl SmolVlmModel {
    /// Opens the projector file at `path` and uploads it beside `text`.
    ///
    /// # Errors
    /// As [`SmolVlmModel::from_gguf`], and I/O or format errors of the file.
    pub fn load(
        ctx: &Arc<GpuContext>,
        path: &Path,
        text: Arc<dyn GenerativeModel>,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let g = GgufFile::open(path)?;
        Self::from_gguf(ctx, &g, text, opts)
    }

    /// Uploads the projector in `g` beside the text model `text`.
    ///
    /// # Errors
    /// Not an Idefics3 projector file (see [`ClipVisionHparams::from_gguf`]),
    /// a projection width other than the text model's, missing tensors or
    /// tensors of other shapes or types, device errors.
    pub fn from_gguf(
        ctx: &Arc<GpuContext>,
        g: &GgufFile,
        text: Arc<dyn GenerativeModel>,
        opts: &LoadOptions,
    ) -> Result<Self> {
        let hp = ClipVisionHparams::from_gguf(g)?;
        let n_text = text.spec().n_embd;
        if hp.projection_dim != n_text {
            return Err(ModelError::invalid(
                "projector",
                format!(
                    "it projects to width {} (clip.vision.projection_dim), the text model's is {n_text}",
                    hp.projection_dim
                ),
            ));
        }
        let (d, p, n) = (hp.n_embd, hp.patch_size, hp.n_patches());
        let mut l = TensorLoader::new(ctx, g, opts.show_progress)?;
        let patch_cols = hp.patch_width().next_multiple_of(32);
        let patch = {
            let name = "v.patch_embd.weight";
            let w = l.host_f32(name, &[p, p, 3, d])?;
            let mut padded = vec![0.0f32; d * patch_cols];
            for (dst, src) in padded
                .chunks_exact_mut(patch_cols)
                .zip(w.chunks_exact(hp.patch_width()))
            {
                dst[..src.len()].copy_from_slice(src);
            }
            let qt = match l.qtype(name)? {
                QuantType::F16 => QuantType::F16,
                _ => QuantType::F32,
            };
            let weight = l.upload_matrix(name, qt, d, patch_cols, &quantize(qt, &padded)?)?;
            let bias = Some(l.vector("v.patch_embd.bias", d)?);
            Linear { weight, bias }
        };
        let order = hp.patch_order();
        let positions = {
            let name = "v.position_embd.weight";
            let pos = l.host_f32(name, &[d, n])?;
            let permuted: Vec<f32> = order
                .iter()
                .flat_map(|&r| pos[r * d..(r + 1) * d].iter().copied())
                .collect();
            upload_new(ctx, bytemuck::cast_slice(&permuted), name)?
        };
        let blocks = (0..hp.n_layer)
            .map(|il| BlockW::load(&mut l, il, &hp))
            .collect::<Result<Vec<_>>>()?;
        let post_ln = NormW::load(&mut l, "v.post_ln", d, hp.eps)?;
        let merge = hp.scale_factor * hp.scale_factor;
        let fc = Linear {
            weight: l.matrix("mm.model.fc.weight", n_text, merge * d)?,
            bias: None,
        };
        l.finish()?;
        let planner = opts.planner_for(ctx)?;
        let tiles = default_tiles_per_call(ctx, &hp, patch_cols);
        let encoder = EncoderScratch::new(ctx, &hp, planner, patch_cols, tiles)?;
        Ok(SmolVlmModel {
            ctx: ctx.clone(),
            planner,
            hp,
            text,
            patch_cols,
            patch,
            positions,
            blocks,
            post_ln,
            fc,
            order,
            encoder: Mutex::new(encoder),
        })
    }

    /// The projector's hyperparameters.
    pub fn hparams(&self) -> &ClipVisionHparams {
        &self.hp
    }

    /// How images are to be preprocessed for this encoder.
    pub fn preprocess_config(&self) -> PreprocessConfig {
        self.hp.preprocess_config()
    }

    /// Embeddings per tile (64 for SmolVLM-256M).
    pub fn image_seq_len(&self) -> usize {
        self.hp.image_seq_len()
    }

    /// The text model the embeddings feed.
    pub fn text_model(&self) -> &Arc<dyn GenerativeModel> {
        &self.text
    }

    /// Where `images`' embeddings go in the prompt `tokens` (see
    /// [`embed_multimodal`]), for [`crate::runtime::Session::prefill_with_embeddings`];
    /// `image_token` is the text vocabulary's `<image>`.
    ///
    /// # Errors
    /// As [`embed_multimodal`].
    pub fn embed_multimodal<'a>(
        &self,
        tokens: &[u32],
        image_token: u32,
        images: impl IntoIterator<Item = &'a ImageEmbeddings>,
    ) -> Result<Vec<EmbedRows<'a>>> {
        embed_multimodal(tokens, image_token, self.text.spec().n_embd, images)
    }

    /// The device.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// Bytes of the vision weights on the device.
    pub fn device_bytes(&self) -> u64 {
        self.patch.device_bytes()
            + self.positions.size()
            + self.blocks.iter().map(BlockW::bytes).sum::<u64>()
            + self.post_ln.bytes()
            + self.fc.device_bytes()
    }

    /// Encodes every tile of an image: one `[image_seq_len, n_embd_text]`
    /// block per tile, in the tiles' order.
    ///
    /// # Errors
    /// No tiles, tiles of another size or length than the encoder takes,
    /// non-finite values, device errors.
    pub fn encode_tiles(&self, tiles: &ImageTiles) -> Result<ImageEmbeddings> {
        let side = self.hp.image_size;
        if tiles.tile_size as usize != side {
            return Err(ModelError::invalid(
                "image tiles",
                format!(
                    "tiles of {} pixels, the encoder takes {side}",
                    tiles.tile_size
                ),
            ));
        }
        let grid = tiles.rows as usize * tiles.cols as usize;
        let expected = if grid == 0 { 1 } else { grid + 1 };
        if tiles.tiles.len() != expected {
            return Err(ModelError::invalid(
                "image tiles",
                format!(
                    "{} tiles for a {}x{} grid plus the global view",
                    tiles.tiles.len(),
                    tiles.rows,
                    tiles.cols
                ),
            ));
        }
        let mut out = Vec::with_capacity(tiles.tiles.len());
        let mut enc = self.scratch()?;
        for batch in tiles.tiles.chunks(enc.tiles) {
            out.extend(self.encode_batch(&mut enc, batch)?);
        }
        Ok(ImageEmbeddings {
            n_embd: self.hp.projection_dim,
            seq_len: self.hp.image_seq_len(),
            tiles: out,
        })
    }

    /// Encodes one tile (planar RGB, `3 · image_size²` normalized floats)
    /// into its `image_seq_len` embeddings of the text model's width.
    ///
    /// # Errors
    /// A tile of another length, non-finite values, device errors.
    pub fn encode_tile(&self, tile: &[f32]) -> Result<Vec<f32>> {
        let mut enc = self.scratch()?;
        let mut out = self.encode_batch(&mut enc, std::slice::from_ref(&tile.to_vec()))?;
        out.pop()
            .ok_or_else(|| ModelError::Internal("no tile encoded".into()))
    }

    /// Encodes the first call's worth of `tiles` (as many as one submission
    /// takes) with GPU timestamps: each kind of step's device nanoseconds,
    /// largest first, and how many tiles the call held.
    ///
    /// # Errors
    /// As [`Self::encode_tiles`]; a device without timestamps gives no times.
    pub fn profile_tiles(&self, tiles: &ImageTiles) -> Result<(Vec<(String, f64)>, usize)> {
        let enc = self.scratch()?;
        let k = tiles.tiles.len().min(enc.tiles);
        if k == 0 {
            return Err(ModelError::invalid("image tiles", "no tiles to profile"));
        }
        let t = std::time::Instant::now();
        self.write_patches(&enc, &tiles.tiles[..k])?;
        let write = t.elapsed();
        let mut rec = self.record(&enc, k, true)?;
        rec.submit_and_wait()?;
        let t = std::time::Instant::now();
        self.read_embeddings(&enc, k)?;
        let read = t.elapsed();
        let mut times = rec.profile()?;
        times.push(("patch rows (host)".into(), write.as_secs_f64() * 1e9));
        times.push(("read embeddings (host)".into(), read.as_secs_f64() * 1e9));
        Ok((times, k))
    }

    /// Most tiles one submission encodes.
    ///
    /// # Errors
    /// The encoder's buffers poisoned by a panic.
    pub fn tiles_per_call(&self) -> Result<usize> {
        Ok(self.scratch()?.tiles)
    }

    /// Encodes up to `tiles` tiles per submission from now on (each more
    /// takes the activation buffers of one tile more).
    ///
    /// # Errors
    /// No tiles, out of device memory.
    pub fn set_tiles_per_call(&self, tiles: usize) -> Result<()> {
        if tiles == 0 {
            return Err(ModelError::invalid("tiles per call", "must be positive"));
        }
        let mut enc = self.scratch()?;
        *enc = EncoderScratch::new(&self.ctx, &self.hp, self.planner, self.patch_cols, tiles)?;
        Ok(())
    }

    fn scratch(&self) -> Result<std::sync::MutexGuard<'_, EncoderScratch>> {
        self.encoder
            .lock()
            .map_err(|_| ModelError::Internal("vision encoder scratch poisoned".into()))
    }

    /// Encodes `batch` (at most `enc.tiles` tiles) in one submission.
    fn encode_batch(&self, enc: &mut EncoderScratch, batch: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        let k = batch.len();
        if k == 0 || k > enc.tiles {
            return Err(ModelError::Internal(format!(
                "{k} tiles in a call of at most {}",
                enc.tiles
            )));
        }
        self.write_patches(enc, batch)?;
        if enc.steps[k - 1].is_none() {
            let rec = self.record(enc, k, false)?;
            enc.steps[k - 1] = Some(rec);
        }
        let step = enc.steps[k - 1]
            .as_mut()
            .ok_or_else(|| ModelError::Internal("vision step missing".into()))?;
        step.submit_and_wait()?;
        self.read_embeddings(enc, k)
    }

    /// The connector's output of the call's first `k` tiles, one block each.
    fn read_embeddings(&self, enc: &EncoderScratch, k: usize) -> Result<Vec<Vec<f32>>> {
        let per = self.hp.image_seq_len() * self.hp.projection_dim;
        let mut v = vec![0.0f32; k * per];
        enc.out.read_slice(0, &mut v)?;
        Ok(v.chunks_exact(per).map(<[f32]>::to_vec).collect())
    }

    /// The tiles' patch rows into the encoder's input.
    fn write_patches(&self, enc: &EncoderScratch, batch: &[Vec<f32>]) -> Result<()> {
        use rayon::prelude::*;
        let floats = self.hp.n_patches() * self.patch_cols;
        // A tile's rows take a few milliseconds to gather: all tiles at once.
        let rows: Vec<Vec<f32>> = batch
            .par_iter()
            .map(|tile| patch_rows(&self.hp, &self.order, self.patch_cols, tile))
            .collect::<Result<_>>()?;
        for (i, r) in rows.iter().enumerate() {
            enc.patches.write_slice((4 * i * floats) as u64, r)?;
        }
        Ok(())
    }

    /// Records the encoding of `k` tiles over `enc`: the products over all
    /// their rows at once, the attention within each tile; `profile` adds
    /// timestamps.
    fn record(&self, enc: &EncoderScratch, k: usize, profile: bool) -> Result<Recording> {
        let hp = &self.hp;
        let n = k * hp.n_patches();
        let head_dim = hp.n_embd / hp.n_head;
        let heads = Heads {
            n_head: hp.n_head,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        };
        // Streamed (the GPU starts while the rest is recorded) unless each
        // dispatch is timed.
        let mut rec = if profile {
            Recording::new(&self.ctx, true)?
        } else {
            Recording::streaming(&self.ctx)?
        };
        {
            let mut f = Forward::new(&mut rec, self.planner, &enc.ws, n)?;
            f.copy_rows(Mat::new(&enc.patches, n, self.patch_cols), &enc.patches_dev)?;
            let patches = Mat::new(&enc.patches_dev, n, self.patch_cols);
            f.patch_embed(patches, &self.patch, &self.positions, hp.n_patches())?;
            for b in &self.blocks {
                f.encoder_block(&b.block(heads), &enc.keys, &enc.at)?;
            }
            let states = f.final_norm(self.post_ln.norm())?;
            let seq = k * hp.image_seq_len();
            let out = Mat::new(&enc.out_dev, seq, hp.projection_dim);
            f.project_merged(states, hp.scale_factor * hp.scale_factor, &self.fc, out)?;
            f.copy_rows(out, &enc.out)?;
        }
        rec.finish()?;
        Ok(rec)
    }
}

/// The patch rows of one tile in the encoder's row order `order`: row `r`
/// holds patch `order[r]` (row-major in the grid) as `[channel][y][x]`,
/// the order of the convolution kernel's flattened rows, then zeros up to
/// `cols`.
///
/// # Errors
/// A tile of another length than `3 · image_size²`, or non-finite values.
pub fn patch_rows(
    hp: &ClipVisionHparams,
    order: &[usize],
    cols: usize,
    tile: &[f32],
) -> Result<Vec<f32>> {
    let (t, p, g) = (hp.image_size, hp.patch_size, hp.grid());
    if tile.len() != 3 * t * t {
        return Err(ModelError::invalid(
            "image tile",
            format!(
                "{} floats, a {t}x{t} RGB tile has {}",
                tile.len(),
                3 * t * t
            ),
        ));
    }
    if tile.iter().any(|v| !v.is_finite()) {
        return Err(ModelError::invalid("image tile", "non-finite values"));
    }
    let mut rows = vec![0.0f32; order.len() * cols];
    for (row, &patch) in rows.chunks_exact_mut(cols).zip(order) {
        let (py, px) = (patch / g, patch % g);
        for c in 0..3 {
            for y in 0..p {
                let src = c * t * t + (py * p + y) * t + px * p;
                let dst = (c * p + y) * p;
                row[dst..dst + p].copy_from_slice(&tile[src..src + p]);
            }
        }
    }
    Ok(rows)
}

/// Where each image's embeddings go in a prompt: the `i`-th `image_token`
/// of `tokens` takes the `i`-th embedding of the images in order (each
/// image's tiles in order), as one span per run of consecutive image tokens
/// within one tile.
///
/// # Errors
/// A count of image tokens other than the images' embeddings, or
/// embeddings of another width than `n_embd`.
pub fn embed_multimodal<'a>(
    tokens: &[u32],
    image_token: u32,
    n_embd: usize,
    images: impl IntoIterator<Item = &'a ImageEmbeddings>,
) -> Result<Vec<EmbedRows<'a>>> {
    let images: Vec<&ImageEmbeddings> = images.into_iter().collect();
    for im in &images {
        let ok = im.n_embd == n_embd && im.tiles.iter().all(|t| t.len() == im.seq_len * n_embd);
        if !ok {
            return Err(ModelError::invalid(
                "image embeddings",
                format!("rows of width {} (the text model's is {n_embd})", im.n_embd),
            ));
        }
    }
    let slots: Vec<usize> = (0..tokens.len())
        .filter(|&i| tokens[i] == image_token)
        .collect();
    let n_rows: usize = images.iter().map(|im| im.n_rows()).sum();
    if slots.len() != n_rows {
        return Err(ModelError::invalid(
            "prompt",
            format!(
                "{} image tokens for {} images of {n_rows} embeddings",
                slots.len(),
                images.len()
            ),
        ));
    }
    let mut spans: Vec<EmbedRows<'a>> = Vec::new();
    let mut next = slots.iter();
    for im in &images {
        for tile in &im.tiles {
            let mut row = 0;
            while row < im.seq_len {
                let start = *next
                    .next()
                    .ok_or_else(|| ModelError::Internal("image slots ran out".into()))?;
                let mut len = 1;
                while row + len < im.seq_len && tokens.get(start + len) == Some(&image_token) {
                    next.next();
                    len += 1;
                }
                spans.push(EmbedRows {
                    pos: start,
                    data: &tile[row * n_embd..(row + len) * n_embd],
                });
                row += len;
            }
        }
    }
    Ok(spans)
}
