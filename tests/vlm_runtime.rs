//! Images through the runtime and the command line, on the tiny random
//! SmolVLM of `tests/fixtures/vlm/` (see its README): prompts with images
//! tokenize to transformers' (and mtmd's, which agree) ids for every test
//! image's grid and through the model's chat template; `combs run` with
//! `--mmproj`/`--image` generates transformers' greedy text; bad images,
//! prompts and sessions are errors.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use combs::models::LoadOptions;
use combs::models::smolvlm::ImageEmbeddings;
use combs::runtime::{EncodedImage, Model, SessionOptions, VisionModel};
use combs::tokenizer::ChatMessage;
use common::gpu;
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vlm")
}

fn json(name: &str) -> Value {
    let path = dir().join(name);
    serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("json")
}

fn load() -> (Model, VisionModel) {
    let ctx = gpu();
    let opts = LoadOptions::default();
    let text = Model::load(&ctx, &dir().join("smolvlm-tiny.gguf"), &opts).expect("text model");
    let vision = text
        .load_vision(&dir().join("mmproj-smolvlm-tiny.gguf"), &opts)
        .expect("projector");
    (text, vision)
}

/// An image of `rows` × `cols` tiles with zero embeddings (tokenization
/// only looks at the grid).
fn grid(vision: &VisionModel, rows: u32, cols: u32) -> EncodedImage {
    let n_tiles = if rows == 0 { 1 } else { rows * cols + 1 } as usize;
    let seq_len = vision.inner().image_seq_len();
    let n_embd = vision.inner().hparams().projection_dim;
    EncodedImage {
        rows,
        cols,
        embeddings: ImageEmbeddings {
            n_embd,
            seq_len,
            tiles: vec![vec![0.0; seq_len * n_embd]; n_tiles],
        },
        preprocess_time: Default::default(),
        encode_time: Default::default(),
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn prompts_tokenize_as_transformers_for_every_image() {
    let (text, vision) = load();
    let refs = json("transformers.json");
    let images = refs["images"].as_object().expect("images");
    assert!(images.len() >= 5);
    for (name, im) in images {
        let (rows, cols) = (
            im["rows"].as_u64().unwrap() as u32,
            im["cols"].as_u64().unwrap() as u32,
        );
        let cfg = vision.inner().preprocess_config();
        let (w, h) = (
            im["width"].as_u64().unwrap() as u32,
            im["height"].as_u64().unwrap() as u32,
        );
        assert_eq!(
            combs::vision::tile_grid(w, h, &cfg),
            (rows, cols),
            "{name}: grid"
        );
        let image = grid(&vision, rows, cols);
        // The chat prompt through the model's own template (typed content).
        let chat = &im["prompts"]["chat"];
        let rendered = text
            .tokenizer()
            .apply_chat_template(
                &[ChatMessage::new(
                    "user",
                    "<image>Can you describe this image?",
                )],
                true,
            )
            .expect("template");
        assert_eq!(
            rendered,
            chat["text"].as_str().unwrap(),
            "{name}: chat text"
        );
        for kind in ["chat", "raw", "chat_cli"] {
            let p = &im["prompts"][kind];
            let got = vision
                .tokenize(
                    p["text"].as_str().unwrap(),
                    std::slice::from_ref(&image),
                    true,
                )
                .expect("tokenize");
            assert_eq!(got, ids(&p["input_ids"]), "{name}: {kind} ids");
        }
    }
}

#[test]
fn expansions_tokenize_as_transformers_for_every_grid() {
    let (_text, vision) = load();
    let refs = json("expansion.json");
    for g in refs["grids"].as_array().expect("grids") {
        let (rows, cols) = (
            g["rows"].as_u64().unwrap() as u32,
            g["cols"].as_u64().unwrap() as u32,
        );
        let image = grid(&vision, rows, cols);
        assert_eq!(
            vision.expansion(&image),
            g["text"].as_str().unwrap(),
            "{rows}x{cols}"
        );
        let got = vision
            .tokenize("<image>", std::slice::from_ref(&image), false)
            .expect("tokenize");
        assert_eq!(got, ids(&g["ids"]), "{rows}x{cols} ids");
    }
}

#[test]
fn bad_prompts_and_sessions_are_errors() {
    let (text, vision) = load();
    let one = [grid(&vision, 2, 4)];
    for (prompt, n) in [("no marker", 1), ("<image><image>", 1), ("<image>", 0)] {
        let err = vision
            .tokenize(prompt, &one[..n], true)
            .expect_err("marker count");
        assert!(err.to_string().contains("markers"), "{err}");
    }
    // Image tokens typed into the text without an image to fill them.
    let tokens = text
        .tokenizer()
        .encode("<image><image>", false, true)
        .expect("encode");
    let mut s = text
        .new_session(&SessionOptions::default())
        .expect("session");
    let err = vision
        .prefill(&mut s, &tokens, &[])
        .expect_err("unfilled image tokens");
    assert!(err.to_string().contains("image tokens"), "{err}");
    // A session of another model (the same file loaded twice).
    let other = Model::load(
        text.weights().context(),
        &dir().join("smolvlm-tiny.gguf"),
        &LoadOptions::default(),
    )
    .expect("second model");
    let mut s = other
        .new_session(&SessionOptions::default())
        .expect("session");
    let image = vision
        .encode(&combs::vision::RgbImage::from_rgb8(8, 8, vec![128; 8 * 8 * 3]).expect("rgb"))
        .expect("encode");
    let err = vision
        .prefill_image(&mut s, &image)
        .expect_err("other model");
    assert!(err.to_string().contains("another text model"), "{err}");
    assert_eq!(s.len(), 0);
}

fn combs(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_combs"))
        .args(args)
        .env(
            "COMBS_DEVICE",
            std::env::var("COMBS_DEVICE").unwrap_or_default(),
        )
        .output()
        .expect("run combs")
}

fn path(name: &str) -> String {
    dir().join(name).display().to_string()
}

#[test]
fn cli_describes_an_image_as_transformers() {
    let refs = json("transformers.json");
    let gen_ = &refs["generation"];
    let (model, mmproj) = (path("smolvlm-tiny.gguf"), path("mmproj-smolvlm-tiny.gguf"));
    for (kind, prompt, chat) in [
        ("chat", "Can you describe this image?", true),
        ("raw", "<image>What is in this picture?", false),
    ] {
        let g = &gen_[kind];
        let image = path(&format!("images/{}.png", g["image"].as_str().unwrap()));
        let mut args = vec![
            "run", "-m", &model, "--mmproj", &mmproj, "--image", &image, "-p", prompt, "-n", "16",
            "--temp", "0",
        ];
        if chat {
            args.push("--chat");
        }
        let out = combs(&args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{kind}: {stderr}");
        let want = g["greedy_text"].as_str().unwrap();
        let echoed = if chat { "" } else { prompt };
        assert_eq!(
            stdout.trim_end_matches('\n'),
            format!("{echoed}{want}"),
            "{kind}"
        );
        assert!(stderr.contains("image: 9 tiles (4x2 + global)"), "{stderr}");
        let n = g["n_prompt_tokens"].as_u64().unwrap();
        assert!(stderr.contains(&format!("prompt {n} tokens")), "{stderr}");
    }
}

#[test]
fn cli_refuses_bad_images_cleanly() {
    let (model, mmproj) = (path("smolvlm-tiny.gguf"), path("mmproj-smolvlm-tiny.gguf"));
    let png = std::fs::read(dir().join("images/tall_300x900.png")).expect("png");
    let tmp = std::env::temp_dir().join(format!("combs-vlm-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let truncated = tmp.join("truncated.png");
    std::fs::write(&truncated, &png[..png.len() / 2]).expect("write");
    let text_file = tmp.join("not-an-image.png");
    std::fs::write(&text_file, b"hello").expect("write");
    let cases: [(Vec<String>, &str); 5] = [
        (
            vec!["--image".into(), path("images/tall_300x900.png")],
            "--mmproj",
        ),
        (
            vec![
                "--mmproj".into(),
                mmproj.clone(),
                "--image".into(),
                truncated.display().to_string(),
            ],
            "truncated.png",
        ),
        (
            vec![
                "--mmproj".into(),
                mmproj.clone(),
                "--image".into(),
                text_file.display().to_string(),
            ],
            "not-an-image.png",
        ),
        (
            vec![
                "--mmproj".into(),
                mmproj.clone(),
                "--image".into(),
                tmp.join("missing.png").display().to_string(),
            ],
            "missing.png",
        ),
        // The text model given as the projector.
        (
            vec![
                "--mmproj".into(),
                model.clone(),
                "--image".into(),
                path("images/tall_300x900.png"),
            ],
            "clip",
        ),
    ];
    for (extra, needle) in cases {
        let mut args: Vec<&str> = vec!["run", "-m", &model, "-p", "x", "-n", "1"];
        args.extend(extra.iter().map(String::as_str));
        let out = combs(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stderr.contains(needle), "{extra:?}: {stderr}");
    }
}
