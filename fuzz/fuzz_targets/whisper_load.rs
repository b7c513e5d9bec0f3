//! whisper.cpp model files on arbitrary bytes: the reader (hyperparameters,
//! mel filters, vocabulary, tensor headers), then the load that checks every
//! tensor against the hyperparameters and uploads it (lavapipe here).
#![no_main]

#[path = "common.rs"]
mod common;

use combs::formats::whisper_bin::WhisperFile;
use combs::models::LoadOptions;
use combs::models::whisper::WhisperModel;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(file) = WhisperFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        let _ = (t.n_elements(), t.rows(), t.cols());
    }
    let _ = WhisperModel::load(common::context(), &file, &LoadOptions::default());
});
