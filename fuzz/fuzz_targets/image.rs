//! Image decoding (every format `decode_image` takes) on arbitrary bytes,
//! then SmolVLM's preprocessing (resize, tiles, pixel tensors) of what
//! decodes, at a small tile size.
#![no_main]

use combs::vision::{PreprocessConfig, decode_image, preprocess};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(img) = decode_image(data) else {
        return;
    };
    // SmolVLM's geometry scaled down (64-pixel tiles, 128-pixel longest
    // edge): the same resize and tiling code, at a fraction of the time per
    // input, so the decoders see many more inputs.
    let config = PreprocessConfig {
        tile_size: 64,
        longest_edge: 128,
        ..PreprocessConfig::smolvlm()
    };
    if let Ok(tiles) = preprocess(&img, &config) {
        assert!(!tiles.is_empty());
        for i in 0..tiles.len().min(2) {
            let t = tiles.tensor(i).expect("a tile of the image");
            assert!(t.data().iter().all(|v| v.is_finite()));
        }
    }
});
