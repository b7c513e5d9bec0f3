//! Idefics3 preprocessing against transformers: the fixtures
//! `tests/fixtures/vision/idefics3_preprocess_pillow{11,13}.json`
//! (scripts/make-vision-fixtures.py) hold what transformers'
//! `Idefics3ImageProcessorPil` (image splitting on) and PIL's LANCZOS resize
//! make of synthetic images that both sides generate from (width, height,
//! seed), on Pillow 11.3 (the default pass order, mtmd's) and Pillow 13
//! ([`PassOrder::Pillow13`]). Every tile is compared bit for bit
//! through the SHA-256 of its uint8 pixels; the normalized floats at the
//! fixture's sampled positions are compared exactly where no resize
//! happened and within the 0.02 elsewhere; the prompt text against
//! `Idefics3Processor.replace_image_token`.

mod common;

use std::path::PathBuf;

use combs::vision::{
    PassOrder, PreprocessConfig, RgbImage, image_prompt_expansion, pixels_to_tensor, preprocess,
    preprocess_ordered, resize_lanczos_ordered, tile_grid,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fixtures and the pass order of the Pillow that made each.
const FIXTURES: [(&str, PassOrder); 2] = [
    (
        "idefics3_preprocess_pillow11.json",
        PassOrder::HorizontalFirst,
    ),
    ("idefics3_preprocess_pillow13.json", PassOrder::Pillow13),
];

fn fixture(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vision")
        .join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/make-vision-fixtures.py)", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The script's `pattern`: a diagonal gradient wrapping mod 256 plus hash
/// noise in [-32, 31], u32 wrapping arithmetic.
fn pattern(w: u32, h: u32, seed: u32) -> RgbImage {
    let mut data = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let base =
                    (u64::from(x + 2 * y) * 256 / u64::from(w + 2 * h) + 85 * u64::from(c)) % 256;
                let mut hs = x
                    .wrapping_mul(374_761_393)
                    .wrapping_add(y.wrapping_mul(668_265_263))
                    .wrapping_add(c.wrapping_mul(2_246_822_519))
                    .wrapping_add(seed.wrapping_mul(3_266_489_917));
                hs = (hs ^ (hs >> 13)).wrapping_mul(1_274_126_177);
                hs ^= hs >> 16;
                let noise = i64::from(hs & 63) - 32;
                data.push((base as i64 + noise).clamp(0, 255) as u8);
            }
        }
    }
    RgbImage::from_rgb8(w, h, data).expect("pattern size is valid")
}

fn sha_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn u32_of(v: &Value) -> u32 {
    v.as_u64().expect("integer") as u32
}

fn f32s(v: &Value) -> [f32; 3] {
    let a = v.as_array().expect("array of 3");
    [0, 1, 2].map(|i| a[i].as_f64().expect("number") as f32)
}

/// A normalized tile's uint8 pixels, planar CHW (the inverse of
/// `(x / 255 - mean) / std`, exact for values that came from bytes).
fn tile_bytes(tile: &[f32], mean: [f32; 3], std: [f32; 3]) -> Vec<u8> {
    let plane = tile.len() / 3;
    tile.iter()
        .enumerate()
        .map(|(i, &v)| {
            let c = i / plane;
            ((f64::from(v) * f64::from(std[c]) + f64::from(mean[c])) * 255.0).round() as u8
        })
        .collect()
}

fn case(file: &str, name: &str) -> Value {
    fixture(file)["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name} in the fixture"))
        .clone()
}

fn check_case(name: &str) {
    for (file, order) in FIXTURES {
        check_case_in(file, order, name);
    }
}

fn check_case_in(file: &str, order: PassOrder, name: &str) {
    let c = case(file, name);
    let (w, h, seed) = (
        u32_of(&c["width"]),
        u32_of(&c["height"]),
        u32_of(&c["seed"]),
    );
    let image = pattern(w, h, seed);
    assert_eq!(
        sha_hex(image.data()),
        c["input_sha256"].as_str().expect("input_sha256"),
        "{name}: the test did not rebuild the script's input image"
    );
    let config = PreprocessConfig {
        tile_size: u32_of(&c["tile_size"]),
        longest_edge: u32_of(&c["longest_edge"]),
        mean: f32s(&c["mean"]),
        std: f32s(&c["std"]),
    };
    let tiles =
        preprocess_ordered(&image, &config, order).unwrap_or_else(|e| panic!("{name}: {e}"));
    if order == PassOrder::HorizontalFirst {
        assert_eq!(preprocess(&image, &config).expect("preprocess"), tiles);
    }
    let (rows, cols) = (u32_of(&c["rows"]), u32_of(&c["cols"]));
    assert_eq!((tiles.rows, tiles.cols), (rows, cols), "{name}: tile grid");
    assert_eq!(tile_grid(w, h, &config), (rows, cols), "{name}: tile_grid");
    let want_tiles = c["tiles"].as_array().expect("tiles");
    assert_eq!(tiles.tiles.len(), want_tiles.len(), "{name}: tile count");
    assert_eq!(
        tiles.len(),
        if rows == 0 {
            1
        } else {
            (rows * cols + 1) as usize
        }
    );

    // No resize at all when the image is already longest_edge wide and a
    // whole number of tiles: then the grid tiles are plain crops.
    let exact_grid = w.max(h) == config.longest_edge
        && w.is_multiple_of(config.tile_size)
        && h.is_multiple_of(config.tile_size);
    let side = config.tile_size as usize;
    for (i, (got, want)) in tiles.tiles.iter().zip(want_tiles).enumerate() {
        let is_global = i + 1 == tiles.tiles.len();
        assert_eq!(got.len(), 3 * side * side, "{name}: tile {i} length");
        let mut max_diff = 0f32;
        for s in want["samples"].as_array().expect("samples") {
            let idx = s[0].as_u64().expect("index") as usize;
            let v = s[1].as_f64().expect("value") as f32;
            if exact_grid && !is_global {
                assert_eq!(got[idx].to_bits(), v.to_bits(), "{name}: tile {i} [{idx}]");
            }
            max_diff = max_diff.max((got[idx] - v).abs());
        }
        assert!(max_diff <= 0.02, "{name}: tile {i} differs by {max_diff}");
        let sum: f64 = got.iter().map(|&v| f64::from(v)).sum();
        let want_sum = want["sum"].as_f64().expect("sum");
        assert!(
            (sum - want_sum).abs() <= 1e-6 * (got.len() as f64),
            "{name}: tile {i} sum {sum} vs {want_sum}"
        );
        assert_eq!(
            sha_hex(&tile_bytes(got, config.mean, config.std)),
            want["sha256_u8"].as_str().expect("sha256_u8"),
            "{name} ({file}): tile {i} of {} ({}) pixels differ from transformers'",
            tiles.len(),
            if is_global { "global view" } else { "grid" }
        );
    }

    let prompt = image_prompt_expansion(rows, cols, 64);
    assert_eq!(
        prompt,
        c["prompt"].as_str().expect("prompt"),
        "{name}: prompt text"
    );
}

#[test]
fn preprocess_one_tile_is_global_view_only() {
    check_case("one_tile");
}

#[test]
fn preprocess_grid_2x3_matches_transformers() {
    check_case("grid_2x3");
}

#[test]
fn preprocess_grid_4x4_matches_transformers() {
    check_case("grid_4x4");
}

#[test]
fn preprocess_tall_matches_transformers() {
    check_case("tall");
}

#[test]
fn preprocess_wide_matches_transformers() {
    check_case("wide");
}

#[test]
fn preprocess_1024x768_is_13_tiles_matching_transformers() {
    check_case("1024x768");
}

#[test]
fn preprocess_2048x1024_without_resize_is_bit_exact() {
    check_case("2048x1024_no_resize");
}

#[test]
fn preprocess_tiny_upscaled_matches_transformers() {
    check_case("tiny_upscaled");
}

#[test]
fn preprocess_extreme_wide_matches_transformers() {
    check_case("extreme_wide");
}

#[test]
fn preprocess_idefics3_364_tiles_matches_transformers() {
    check_case("idefics3_364");
}

#[test]
fn resize_lanczos_matches_pil() {
    for (file, order) in FIXTURES {
        for r in fixture(file)["resizes"].as_array().expect("resizes") {
            let (sw, sh, seed) = (
                u32_of(&r["src"][0]),
                u32_of(&r["src"][1]),
                u32_of(&r["src"][2]),
            );
            let (dw, dh) = (u32_of(&r["dst"][0]), u32_of(&r["dst"][1]));
            let src = pattern(sw, sh, seed);
            assert_eq!(
                sha_hex(src.data()),
                r["input_sha256"].as_str().expect("sha")
            );
            let out = resize_lanczos_ordered(&src, dw, dh, order).expect("resize");
            assert_eq!((out.width(), out.height()), (dw, dh));
            assert_eq!(
                sha_hex(out.data()),
                r["sha256"].as_str().expect("sha256"),
                "{sw}x{sh} -> {dw}x{dh} differs from PIL ({file})"
            );
        }
    }
}

#[test]
fn preprocess_normalizes_planar_chw_from_fresh_pixels() {
    // A 512x512 image with longest edge 512 is neither resized nor split,
    // so its one tile is the image itself, normalized: check every value
    // against (x / 255 - mean) / std computed here.
    let mut rng = common::Rng::fresh("preprocess_normalizes");
    let mut data = vec![0u8; 512 * 512 * 3];
    rng.fill(&mut data);
    let image = RgbImage::from_rgb8(512, 512, data.clone()).expect("image");
    let mean = [
        rng.range(0.2, 0.6),
        rng.range(0.2, 0.6),
        rng.range(0.2, 0.6),
    ];
    let std = [
        rng.range(0.2, 0.6),
        rng.range(0.2, 0.6),
        rng.range(0.2, 0.6),
    ];
    let config = PreprocessConfig {
        tile_size: 512,
        longest_edge: 512,
        mean,
        std,
    };
    let tiles = preprocess(&image, &config).expect("preprocess");
    assert_eq!((tiles.rows, tiles.cols, tiles.len()), (0, 0, 1));
    let plane = 512 * 512;
    for c in 0..3 {
        for p in 0..plane {
            let x = (f64::from(data[p * 3 + c]) / 255.0) as f32;
            let want = (x - mean[c]) / std[c];
            let got = tiles.tiles[0][c * plane + p];
            assert!((got - want).abs() <= 1e-6, "c{c} p{p}: {got} vs {want}");
        }
    }
    let t = tiles.tensor(0).expect("tensor");
    assert_eq!(t.shape(), [1, 3, 512, 512]);
    assert_eq!(t.data(), &tiles.tiles[0][..]);
}

#[test]
fn preprocess_rejects_bad_config() {
    let image = pattern(8, 8, 1);
    let base = PreprocessConfig::smolvlm();
    for bad in [
        PreprocessConfig {
            tile_size: 0,
            ..base.clone()
        },
        PreprocessConfig {
            longest_edge: 0,
            ..base.clone()
        },
        PreprocessConfig {
            longest_edge: 100_000,
            ..base.clone()
        },
        PreprocessConfig {
            tile_size: 1,
            ..base.clone()
        },
        PreprocessConfig {
            std: [0.5, 0.0, 0.5],
            ..base.clone()
        },
        PreprocessConfig {
            mean: [f32::NAN, 0.5, 0.5],
            ..base.clone()
        },
    ] {
        let err = preprocess(&image, &bad).expect_err("bad config accepted");
        assert!(
            matches!(err, combs::ModelError::InvalidArgument { .. }),
            "{err}"
        );
    }
}

#[test]
fn tile_grid_counts_for_aspect_ratios() {
    // Grids worked out by hand from transformers' rules at SmolVLM's 2048 /
    // 512: the long side always becomes 2048 = 4 tiles.
    let smolvlm = PreprocessConfig::smolvlm();
    for (w, h, want) in [
        (1024, 768, (3, 4)),
        (2048, 1024, (2, 4)),
        (1000, 1000, (4, 4)),
        (768, 1024, (4, 3)),
        (4000, 100, (1, 4)),
        (100, 4000, (4, 1)),
        (1, 1, (4, 4)),
    ] {
        assert_eq!(tile_grid(w, h, &smolvlm), want, "{w}x{h}");
    }
}

#[test]
fn pixels_to_tensor_checks_lengths() {
    let mut rng = common::Rng::fresh("pixels_to_tensor");
    let (w, h) = (1 + rng.below(40) as u32, 1 + rng.below(40) as u32);
    let chw = rng.normals(3 * (w * h) as usize, 1.0);
    let t = pixels_to_tensor(&chw, w, h).expect("tensor");
    assert_eq!(t.shape(), [1, 3, h as usize, w as usize]);
    assert_eq!((t.width(), t.height()), (w as usize, h as usize));
    assert_eq!(t.data(), &chw[..]);
    assert!(pixels_to_tensor(&chw[1..], w, h).is_err());
    assert!(pixels_to_tensor(&chw, w + 1, h).is_err());
    assert!(pixels_to_tensor(&[], 0, 0).is_err());
}

#[test]
fn prompt_expansion_global_only_and_grid_forms() {
    let n = 1 + common::Rng::fresh("prompt_expansion").below(100);
    let img = "<image>".repeat(n);
    let global = format!("<fake_token_around_image><global-img>{img}<fake_token_around_image>");
    assert_eq!(image_prompt_expansion(0, 0, n), global);
    let grid = image_prompt_expansion(2, 3, n);
    let mut want = String::new();
    for r in 1..=2 {
        for c in 1..=3 {
            want += &format!("<fake_token_around_image><row_{r}_col_{c}>{img}");
        }
        want += "\n";
    }
    want += "\n";
    want += &global;
    assert_eq!(grid, want);
    assert_eq!(grid.matches("<image>").count(), 7 * n);
    assert_eq!(grid.matches('\n').count(), 3);
}

#[test]
#[ignore = "timing, not correctness: run with --release --ignored --nocapture"]
fn preprocess_1024x768_timing() {
    let image = pattern(1024, 768, 6);
    let config = PreprocessConfig::smolvlm();
    let _ = preprocess(&image, &config).expect("warm-up");
    let runs = 10;
    let t = std::time::Instant::now();
    for _ in 0..runs {
        let tiles = preprocess(&image, &config).expect("preprocess");
        assert_eq!(tiles.len(), 13);
    }
    let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
    eprintln!(
        "preprocess 1024x768 -> 13 tiles: {ms:.1} ms ({} threads)",
        rayon::current_num_threads()
    );
}
