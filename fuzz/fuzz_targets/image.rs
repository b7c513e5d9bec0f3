//! Image decoding (every format `decode_image` takes) on arbitrary bytes, then SmolVLM's
//! preprocessing (resize, tiles, pixel tensors) of what decodes.
#![no_main]

use combs::vision::{PreprocessConfig, decode_image, preprocess};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(img) = decode_image(data) else {
        return;
    };
    let config = PreprocessConfig::smolvlm();
    if let Ok(tiles) = preprocess(&img, &config) {
        assert!(!tiles.is_empty());
        for i in 0..tiles.len().min(2) {
            let t = tiles.tensor(i).expect("a tile of the image");
            assert!(t.data().iter().all(|v| v.is_finite()));
        }
    }
});
