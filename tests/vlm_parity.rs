//! SmolVLM against HF transformers on the tiny random Idefics3 of
//! `tests/fixtures/vlm/` (made by `scripts/make-vlm-fixtures.py`, see its
//! README): the per-tile image embeddings after the connector within 1e-3
//! (max abs difference over max abs reference) of transformers' float64
//! forward, given the processor's own tiles (lossless PNGs of the exact
//! normalized values); then, for the chat and raw prompts with one image,
//! the last-token logits within 0.05 absolute and 16 greedy tokens equal
//! to transformers'. The fixtures are found in `tests/fixtures/vlm/`, else
//! in `$COMBS_VLM_FIXTURES`; a test without them says so and passes.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use combs::models::LoadOptions;
use combs::models::smolvlm::{ImageEmbeddings, SmolVlmModel};
use combs::runtime::{Model, SessionOptions};
use combs::vision::ImageTiles;
use common::gpu;
use serde_json::Value;

fn fixtures() -> Option<PathBuf> {
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vlm");
    let dirs = [
        Some(committed),
        std::env::var_os("COMBS_VLM_FIXTURES").map(PathBuf::from),
    ];
    let found = dirs
        .into_iter()
        .flatten()
        .find(|d| d.join("transformers.json").is_file() && d.join("smolvlm-tiny.gguf").is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: no SmolVLM fixtures in tests/fixtures/vlm or $COMBS_VLM_FIXTURES \
             (scripts/make-vlm-fixtures.py makes them)"
        );
    }
    found
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

struct Fixture {
    dir: PathBuf,
    refs: Value,
    text: Model,
    vlm: SmolVlmModel,
}

fn load() -> Option<Fixture> {
    let dir = fixtures()?;
    let refs: Value = serde_json::from_slice(
        &std::fs::read(dir.join("transformers.json")).expect("transformers.json"),
    )
    .expect("json");
    let ctx = gpu();
    let opts = LoadOptions::default();
    let text = Model::load(&ctx, &dir.join("smolvlm-tiny.gguf"), &opts).expect("text model");
    let vlm = SmolVlmModel::load(
        &ctx,
        &dir.join("mmproj-smolvlm-tiny.gguf"),
        text.weights().clone(),
        &opts,
    )
    .expect("projector");
    Some(Fixture {
        dir,
        refs,
        text,
        vlm,
    })
}

/// The processor's tiles of image `name`, from their lossless PNGs:
/// `(u8 / 255 − mean) / std` is exactly what it computed.
fn tiles(f: &Fixture, name: &str) -> ImageTiles {
    let im = &f.refs["images"][name];
    let cfg = f.vlm.preprocess_config();
    let tiles = im["tiles"]
        .as_array()
        .expect("tiles")
        .iter()
        .map(|t| {
            let path = f.dir.join(t["png"].as_str().expect("png"));
            let img = image::open(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .to_rgb8();
            let side = cfg.tile_size as usize;
            assert_eq!((img.width() as usize, img.height() as usize), (side, side));
            let mut v = vec![0.0f32; 3 * side * side];
            for (i, px) in img.pixels().enumerate() {
                for c in 0..3 {
                    v[c * side * side + i] = (f32::from(px[c]) / 255.0 - cfg.mean[c]) / cfg.std[c];
                }
            }
            v
        })
        .collect();
    ImageTiles {
        rows: im["rows"].as_u64().expect("rows") as u32,
        cols: im["cols"].as_u64().expect("cols") as u32,
        tile_size: cfg.tile_size,
        tiles,
    }
}

fn encode_checked(f: &Fixture, name: &str) -> ImageEmbeddings {
    let got = f.vlm.encode_tiles(&tiles(f, name)).expect("encode");
    let want = read_f32(
        &f.dir.join(
            f.refs["images"][name]["embeddings"]["file"]
                .as_str()
                .expect("file"),
        ),
    );
    let per = got.seq_len * got.n_embd;
    assert_eq!(want.len(), got.tiles.len() * per, "{name}: embedding count");
    let mut worst = 0.0f32;
    for (i, (g, w)) in got.tiles.iter().zip(want.chunks_exact(per)).enumerate() {
        let max_abs = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = g
            .iter()
            .zip(w)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        let rel = diff / max_abs;
        assert!(
            rel < 1e-3,
            "{name} tile {i}: {rel} relative to transformers"
        );
        worst = worst.max(rel);
    }
    eprintln!(
        "{name}: {} tiles, worst {worst:.2e} relative to transformers",
        got.tiles.len()
    );
    got
}

/// Two images' tiles (26, a square image's and one cut without a resize);
/// the prompt test below encodes the generation image's too.
#[test]
fn tile_embeddings_match_transformers() {
    let Some(f) = load() else { return };
    assert_eq!(f.vlm.image_seq_len(), 64);
    for name in ["square_640", "exact_2048x1024"] {
        assert!(f.refs["images"][name].is_object(), "fixture image {name}");
        encode_checked(&f, name);
    }
}

#[test]
fn prompt_with_image_matches_transformers_logits_and_greedy_tokens() {
    let Some(f) = load() else { return };
    let image_token = f.refs["image_token_id"].as_u64().expect("image token") as u32;
    let parsed = f
        .text
        .tokenizer()
        .encode("<image>", false, true)
        .expect("tokenize");
    assert_eq!(parsed, [image_token], "the text vocabulary's <image>");
    for kind in ["chat", "raw"] {
        let generation = &f.refs["generation"][kind];
        let name = generation["image"].as_str().expect("image");
        let emb = encode_checked(&f, name);
        let ids: Vec<u32> = f.refs["images"][name]["prompts"][kind]["input_ids"]
            .as_array()
            .expect("input ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let images = [emb];
        let spans = f
            .vlm
            .embed_multimodal(&ids, image_token, &images)
            .expect("placement");
        // Calls of 256 tokens: tiles straddle the boundaries between calls.
        let opts = SessionOptions {
            n_ctx: 1024,
            n_batch: 256,
            ..Default::default()
        };
        let mut s = f.text.new_session(&opts).expect("session");
        s.prefill_with_embeddings(&ids, &spans).expect("prefill");
        let want = read_f32(
            &f.dir
                .join(generation["last_logits_file"].as_str().expect("file")),
        );
        let diff = s
            .logits()
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff < 0.05, "{kind}: last logits {diff} from transformers");
        eprintln!(
            "{kind}: {} prompt tokens, last logits within {diff:.2e}",
            ids.len()
        );
        let greedy: Vec<u32> = generation["greedy_f32"]
            .as_array()
            .expect("greedy")
            .iter()
            .map(|v| v.as_u64().expect("token") as u32)
            .collect();
        let mut got = Vec::new();
        for _ in 0..greedy.len() {
            let t = argmax(s.logits());
            got.push(t);
            s.decode(t).expect("decode");
        }
        assert_eq!(got, greedy, "{kind}: greedy tokens");
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The fixture text model is the vision model's: widths agree, and a
/// projector is refused by a text model of another width elsewhere
/// (`tests/vlm_model.rs`).
#[test]
fn fixture_projector_states_smolvlm_256m_geometry() {
    let Some(f) = load() else { return };
    let hp = f.vlm.hparams();
    assert_eq!(
        (
            hp.image_size,
            hp.patch_size,
            hp.scale_factor,
            hp.preproc_image_size
        ),
        (512, 16, 4, 2048)
    );
    assert_eq!(hp.projection_dim, f.text.spec().n_embd);
    let _: &Arc<_> = f.vlm.text_model();
}
