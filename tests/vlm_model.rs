//! SmolVLM's vision side on the device against its CPU f64 reference
//! (`models::smolvlm_reference`, transformers' math with the literal pixel
//! shuffle) on tiny random projectors written by the project's GGUF
//! writer, on both backends; the projector reader's errors; and prefill
//! from caller-given embeddings against plain prefill and the text
//! model's reference forward.

mod common;

use std::sync::Arc;
use std::time::Instant;

use combs::ModelError;
use combs::formats::gguf::GgufFile;
use combs::gpu::DeviceClass;
use combs::models::clip::ClipVisionHparams;
use combs::models::reference::ReferenceModel;
use combs::models::smolvlm::{ImageEmbeddings, SmolVlmModel, embed_multimodal};
use combs::models::smolvlm_reference::HostProjector;
use combs::models::synth::{SynthConfig, synth_gguf};
use combs::models::{EmbedRows, GenerativeModel, LoadOptions, ModelRegistry};
use combs::ops::plan::Backend;
use combs::quant::{QuantType, dequantize_vec};
use combs::runtime::{Session, SessionOptions};
use combs::vision::ImageTiles;
use common::{Rng, gpu, host_kernels_run_here, rel_err};

fn text_model(n_embd: usize, seed: u64) -> (GgufFile, Arc<dyn GenerativeModel>) {
    text_model_with(n_embd, seed, &LoadOptions::default())
}

fn text_model_with(
    n_embd: usize,
    seed: u64,
    opts: &LoadOptions,
) -> (GgufFile, Arc<dyn GenerativeModel>) {
    let mut cfg = SynthConfig::preset("tiny", QuantType::F32).expect("preset");
    cfg.seed = seed;
    if n_embd != cfg.n_embd {
        cfg.n_embd = n_embd;
        cfg.n_layer = 1;
    }
    let g = GgufFile::from_bytes(synth_gguf(&cfg).expect("synth").to_bytes()).expect("parse");
    let m = ModelRegistry::new()
        .load(&gpu(), &g, opts)
        .expect("load text model");
    (g, m)
}

fn tiny_hp(patch: usize, scale: usize, proj: usize) -> ClipVisionHparams {
    ClipVisionHparams {
        image_size: 8 * patch,
        patch_size: patch,
        n_embd: 64,
        n_ff: 128,
        n_layer: 2,
        n_head: 4,
        eps: 1e-6,
        projection_dim: proj,
        scale_factor: scale,
        preproc_image_size: 32 * patch,
        mean: [0.5, 0.5, 0.5],
        std: [0.5, 0.5, 0.5],
    }
}

fn gguf_of(p: &HostProjector) -> GgufFile {
    GgufFile::from_bytes(p.to_gguf().expect("write").to_bytes()).expect("parse projector")
}

fn load_vlm(
    p: &HostProjector,
    text: Arc<dyn GenerativeModel>,
    opts: &LoadOptions,
) -> combs::Result<SmolVlmModel> {
    SmolVlmModel::from_gguf(&gpu(), &gguf_of(p), text, opts)
}

/// Three tiles through the device model, `per_call` tiles per submission,
/// against the reference.
fn check_encoder(
    patch: usize,
    scale: usize,
    t: QuantType,
    backend: Option<Backend>,
    per_call: usize,
) {
    check_encoder_planned(patch, scale, t, backend, None, per_call);
}

fn check_encoder_planned(
    patch: usize,
    scale: usize,
    t: QuantType,
    backend: Option<Backend>,
    plan_as: Option<DeviceClass>,
    per_call: usize,
) {
    let mut rng = Rng::fresh(&format!(
        "vlm_{patch}_{scale}_{t:?}_{backend:?}_{plan_as:?}"
    ));
    let (_, text) = text_model(64, rng.next_u64());
    let p = HostProjector::random(tiny_hp(patch, scale, 64), t, rng.next_u64()).expect("random");
    let opts = LoadOptions {
        backend,
        plan_as,
        ..LoadOptions::default()
    };
    let vlm = load_vlm(&p, text, &opts).expect("load projector");
    vlm.set_tiles_per_call(per_call).expect("tiles per call");
    assert_eq!(vlm.tiles_per_call().expect("tiles per call"), per_call);
    let side = p.hp.image_size;
    let tiles = ImageTiles {
        rows: 1,
        cols: 2,
        tile_size: side as u32,
        tiles: (0..3).map(|_| rng.normals(3 * side * side, 1.0)).collect(),
    };
    let got = vlm.encode_tiles(&tiles).expect("encode");
    assert_eq!(got.tiles.len(), 3);
    assert_eq!(got.seq_len, p.hp.image_seq_len());
    for (i, (g, tile)) in got.tiles.iter().zip(&tiles.tiles).enumerate() {
        let want = p.encode_tile(tile).expect("reference");
        let e = rel_err(g, &want);
        assert!(
            e < 1e-3,
            "patch {patch} scale {scale} {t:?} {backend:?} {per_call} per call, tile {i}: relative error {e}"
        );
    }
}

#[test]
fn vision_encoder_matches_reference_on_host_kernels() {
    if !host_kernels_run_here() {
        eprintln!("the host's kernels need a CPU device: skipped");
        return;
    }
    check_encoder(4, 2, QuantType::F32, Some(Backend::Host), 1);
    check_encoder(2, 4, QuantType::F16, Some(Backend::Host), 2);
}

#[test]
fn vision_encoder_matches_reference_on_vulkan_kernels() {
    check_encoder(4, 2, QuantType::F16, Some(Backend::Vulkan), 2);
    check_encoder(2, 4, QuantType::F32, Some(Backend::Vulkan), 1);
}

/// The plans of a GPU (its kernel layouts) on whatever device the tests
/// have; cooperative-matrix kernels only where the device has them.
#[test]
fn vision_encoder_matches_reference_on_gpu_plans() {
    check_encoder_planned(
        4,
        2,
        QuantType::F16,
        Some(Backend::Vulkan),
        Some(DeviceClass::Gpu),
        2,
    );
}

#[test]
fn projector_hparams_give_the_preprocessing() {
    let p = HostProjector::random(tiny_hp(4, 2, 64), QuantType::F32, 1).expect("random");
    let hp = ClipVisionHparams::from_gguf(&gguf_of(&p)).expect("hparams");
    assert_eq!(hp, p.hp);
    let c = hp.preprocess_config();
    assert_eq!(
        (c.tile_size, c.longest_edge, c.mean, c.std),
        (32, 128, p.hp.mean, p.hp.std)
    );
    assert_eq!(hp.image_seq_len(), 16);
}

fn load_err(p: &HostProjector, n_embd_text: usize) -> ModelError {
    let (_, text) = text_model(n_embd_text, 5);
    match load_vlm(p, text, &LoadOptions::default()) {
        Ok(_) => panic!("a malformed projector loaded"),
        Err(e) => e,
    }
}

#[test]
fn projector_of_another_width_is_an_error() {
    let p = HostProjector::random(tiny_hp(4, 2, 64), QuantType::F32, 2).expect("random");
    let e = load_err(&p, 96).to_string();
    assert!(
        e.contains("projects to width 64") && e.contains("96"),
        "{e}"
    );
}

#[test]
fn malformed_projectors_are_errors() {
    let base = HostProjector::random(tiny_hp(4, 2, 64), QuantType::F32, 3).expect("random");
    let mut p = HostProjector::random(tiny_hp(4, 2, 64), QuantType::F32, 3).expect("random");
    p.set_tensor("v.blk.1.attn_k.weight", None);
    let e = load_err(&p, 64);
    assert!(
        matches!(&e, ModelError::MissingTensor { name } if name == "v.blk.1.attn_k.weight"),
        "{e}"
    );
    p.set_tensor(
        "v.blk.1.attn_k.weight",
        Some((vec![64, 32], vec![0.0; 64 * 32])),
    );
    let e = load_err(&p, 64);
    assert!(
        matches!(&e, ModelError::Shape { tensor, .. } if tensor == "v.blk.1.attn_k.weight"),
        "{e}"
    );
    p.set_tensor(
        "v.position_embd.weight",
        Some((vec![64, 60], vec![0.0; 64 * 60])),
    );
    assert!(matches!(load_err(&p, 64), ModelError::Shape { .. }));
    // Hyperparameters that do not fit together.
    for (hp, key) in [
        (
            ClipVisionHparams {
                scale_factor: 3,
                ..base.hp
            },
            "scale_factor",
        ),
        (
            ClipVisionHparams {
                n_head: 5,
                ..base.hp
            },
            "head_count",
        ),
        (
            ClipVisionHparams {
                image_size: 30,
                ..base.hp
            },
            "patch_size",
        ),
    ] {
        let q = HostProjector::random(hp, QuantType::F32, 4).expect("random");
        let e = load_err(&q, 64).to_string();
        assert!(e.contains(key), "{key}: {e}");
    }
    // Not a projector at all: the text model's file.
    let (g, text) = text_model(64, 6);
    let e = SmolVlmModel::from_gguf(&gpu(), &g, text, &LoadOptions::default())
        .err()
        .expect("a text model is no projector");
    assert!(matches!(e, ModelError::UnsupportedArchitecture(_)), "{e}");
}

#[test]
fn tiles_of_the_wrong_shape_are_errors() {
    let p = HostProjector::random(tiny_hp(4, 2, 64), QuantType::F32, 7).expect("random");
    let (_, text) = text_model(64, 8);
    let vlm = load_vlm(&p, text, &LoadOptions::default()).expect("load");
    let good = vec![0.0f32; 3 * 32 * 32];
    let cases = [
        ImageTiles {
            rows: 0,
            cols: 0,
            tile_size: 16,
            tiles: vec![good.clone()],
        },
        ImageTiles {
            rows: 2,
            cols: 2,
            tile_size: 32,
            tiles: vec![good.clone(); 4],
        },
        ImageTiles {
            rows: 0,
            cols: 0,
            tile_size: 32,
            tiles: vec![vec![0.0; 10]],
        },
        ImageTiles {
            rows: 0,
            cols: 0,
            tile_size: 32,
            tiles: vec![vec![f32::NAN; 3 * 32 * 32]],
        },
    ];
    for (i, t) in cases.iter().enumerate() {
        assert!(vlm.encode_tiles(t).is_err(), "case {i} encoded");
    }
    assert!(vlm.set_tiles_per_call(0).is_err());
    let ok = ImageTiles {
        rows: 0,
        cols: 0,
        tile_size: 32,
        tiles: vec![good],
    };
    assert_eq!(vlm.encode_tiles(&ok).expect("encode").tiles.len(), 1);
}

/// Token embedding rows of the text model's file.
fn token_rows(g: &GgufFile, tokens: &[u32], n_embd: usize) -> Vec<f32> {
    let t = g.tensor("token_embd.weight").expect("token_embd");
    let table = dequantize_vec(
        t.qtype.expect("type"),
        g.tensor_data(t),
        t.n_elements as usize,
    )
    .expect("dequantize");
    tokens
        .iter()
        .flat_map(|&id| table[id as usize * n_embd..(id as usize + 1) * n_embd].to_vec())
        .collect()
}

fn session(model: &Arc<dyn GenerativeModel>, n_batch: usize) -> Session {
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch,
        ..Default::default()
    };
    Session::new(model.clone(), &opts).expect("session")
}

#[test]
fn prefill_with_own_token_embeddings_matches_prefill() {
    let mut rng = Rng::fresh("embed_own");
    let (g, model) = text_model(64, rng.next_u64());
    let d = model.spec().n_embd;
    let n_vocab = model.spec().n_vocab;
    let prompt: Vec<u32> = (0..23).map(|_| rng.below(n_vocab) as u32).collect();
    let mut plain = session(&model, 5);
    plain.prefill(&prompt).expect("prefill");
    // Two spans, one across the boundary of the calls of 5 tokens.
    let a = token_rows(&g, &prompt[3..12], d);
    let b = token_rows(&g, &prompt[20..23], d);
    let rows = [
        EmbedRows { pos: 20, data: &b },
        EmbedRows { pos: 3, data: &a },
    ];
    let mut embedded = session(&model, 5);
    embedded
        .prefill_with_embeddings(&prompt, &rows)
        .expect("prefill with embeddings");
    let e = rel_err(embedded.logits(), plain.logits());
    assert!(e < 1e-5, "relative error {e}");
    let t = rng.below(n_vocab) as u32;
    plain.decode(t).expect("decode");
    embedded.decode(t).expect("decode");
    let e = rel_err(embedded.logits(), plain.logits());
    assert!(e < 1e-5, "after a decode step: relative error {e}");
}

/// On the default kernels (the host's on lavapipe) and on the Vulkan ones.
#[test]
fn prefill_with_random_rows_matches_reference() {
    for backend in [None, Some(Backend::Vulkan)] {
        prefill_with_random_rows(backend);
    }
}

fn prefill_with_random_rows(backend: Option<Backend>) {
    let mut rng = Rng::fresh(&format!("embed_random_{backend:?}"));
    let opts = LoadOptions {
        backend,
        ..LoadOptions::default()
    };
    let (g, model) = text_model_with(64, rng.next_u64(), &opts);
    let spec = model.spec().clone();
    let (d, n_vocab) = (spec.n_embd, spec.n_vocab);
    let mut reference = ReferenceModel::load(&g, spec).expect("reference");
    let prompt: Vec<u32> = (0..17).map(|_| rng.below(n_vocab) as u32).collect();
    let (pos, n) = (4, 9);
    let image = rng.normals(n * d, 1.0);
    let mut s = session(&model, 6);
    s.prefill_with_embeddings(&prompt, &[EmbedRows { pos, data: &image }])
        .expect("prefill");
    let mut want = Vec::new();
    for (i, &t) in prompt.iter().enumerate() {
        want = if (pos..pos + n).contains(&i) {
            let r = i - pos;
            reference.step_embedding(&image[r * d..(r + 1) * d])
        } else {
            reference.step(t)
        }
        .expect("reference");
    }
    let e = rel_err(s.logits(), &want);
    assert!(e < 1e-3, "{backend:?}: relative error {e}");
}

#[test]
fn bad_embedding_rows_are_errors() {
    let (_, model) = text_model(64, 11);
    let d = model.spec().n_embd;
    let prompt = vec![1u32; 8];
    let rows = vec![0.5f32; 3 * d];
    let mut s = session(&model, 4);
    let bad: [&[EmbedRows<'_>]; 4] = [
        &[EmbedRows {
            pos: 6,
            data: &rows,
        }],
        &[EmbedRows {
            pos: 0,
            data: &rows[..d + 1],
        }],
        &[
            EmbedRows {
                pos: 0,
                data: &rows,
            },
            EmbedRows {
                pos: 2,
                data: &rows,
            },
        ],
        &[EmbedRows { pos: 0, data: &[] }],
    ];
    for (i, b) in bad.iter().enumerate() {
        assert!(s.prefill_with_embeddings(&prompt, b).is_err(), "case {i}");
        assert_eq!(s.len(), 0, "case {i} evaluated tokens");
    }
}

#[test]
fn embed_multimodal_places_rows_at_image_tokens() {
    const IMG: u32 = 7;
    let d = 4;
    let image = |tiles: usize, seq: usize, base: f32| ImageEmbeddings {
        n_embd: d,
        seq_len: seq,
        tiles: (0..tiles)
            .map(|t| (0..seq * d).map(|i| base + (t * 100 + i) as f32).collect())
            .collect(),
    };
    let images = [image(2, 3, 0.0), image(1, 3, 1000.0)];
    // Two tiles of the first image back to back (one run of six image
    // tokens), then text, then the second image.
    let tokens = [1, IMG, IMG, IMG, IMG, IMG, IMG, 2, 3, IMG, IMG, IMG, 4];
    let spans = embed_multimodal(&tokens, IMG, d, &images).expect("placement");
    let mut placed = vec![None; tokens.len()];
    for s in &spans {
        for (r, row) in s.data.chunks_exact(d).enumerate() {
            placed[s.pos + r] = Some(row.to_vec());
        }
    }
    let expected: Vec<Vec<f32>> = images
        .iter()
        .flat_map(|im| {
            im.tiles
                .iter()
                .flat_map(|t| t.chunks_exact(d).map(<[f32]>::to_vec))
        })
        .collect();
    let got: Vec<Vec<f32>> = placed.iter().flatten().cloned().collect();
    assert_eq!(got, expected);
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(placed[i].is_some(), t == IMG, "position {i}");
    }
    let e = embed_multimodal(&tokens[..11], IMG, d, &images).expect_err("one token short");
    assert!(e.to_string().contains("8 image tokens"), "{e}");
    assert!(embed_multimodal(&tokens, IMG, d + 1, &images).is_err());
}

/// The encode time of one tile at SmolVLM-256M's vision geometry (random
/// weights, f16 matrices as the converter writes them); prints it.
#[test]
#[ignore = "slow on lavapipe (a 93M-parameter encoder); run by hand for the timing"]
fn smolvlm_256m_sized_tile_encode_time() {
    let hp = ClipVisionHparams {
        image_size: 512,
        patch_size: 16,
        n_embd: 768,
        n_ff: 3072,
        n_layer: 12,
        n_head: 12,
        eps: 1e-6,
        projection_dim: 576,
        scale_factor: 4,
        preproc_image_size: 2048,
        mean: [0.5; 3],
        std: [0.5; 3],
    };
    let (_, text) = text_model(576, 9);
    let p = HostProjector::random(hp, QuantType::F16, 10).expect("random");
    let vlm = load_vlm(&p, text, &LoadOptions::default()).expect("load");
    let mut rng = Rng::fresh("vlm_time");
    let tile = rng.normals(3 * 512 * 512, 1.0);
    vlm.encode_tile(&tile).expect("warm-up");
    let n = 3;
    let t0 = Instant::now();
    for _ in 0..n {
        vlm.encode_tile(&tile).expect("encode");
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3 / f64::from(n);
    eprintln!("SmolVLM-256M-sized tile: {ms:.1} ms per tile");
}
