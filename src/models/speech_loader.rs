//! `load_speech_model`: the speech model in a file, on a device, with the
//! loader its format calls for — whisper.cpp's ggml `.bin` files today. A
//! text model's GGUF handed to it is an error that says so, as is a
//! speech model handed to the text loader ([`speech_file_hint`]).

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::registry::LoadOptions;
use super::speech::SpeechToTextModel;
use super::whisper::WhisperModel;
use crate::error::{ModelError, Result};
use crate::formats::whisper_bin::WhisperFile;
use crate::gpu::GpuContext;

/// The first bytes of `path` (fewer where the file is shorter).
fn head(path: &Path) -> Result<Vec<u8>> {
    let io = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "is a directory, not a model file",
        )));
    }
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut buf = Vec::with_capacity(8);
    f.by_ref().take(8).read_to_end(&mut buf).map_err(io)?;
    Ok(buf)
}

/// Loads the speech model in `path` onto `ctx`.
///
/// # Errors
/// I/O errors, a file of no speech format combs reads (a GGUF text model
/// among them), malformed files, missing tensors, device errors.
pub fn load_speech_model(
    ctx: &Arc<GpuContext>,
    path: &Path,
    opts: &LoadOptions,
) -> Result<Arc<dyn SpeechToTextModel>> {
    let bytes = head(path)?;
    if WhisperFile::has_magic(&bytes) {
        let file = WhisperFile::open(path)?;
        return Ok(Arc::new(WhisperModel::load(ctx, &file, opts)?));
    }
    if bytes.starts_with(b"GGUF") {
        return Err(ModelError::UnsupportedArchitecture(format!(
            "{} is a GGUF file (a text model); speech models are whisper.cpp .bin files",
            path.display()
        )));
    }
    Err(ModelError::UnsupportedArchitecture(format!(
        "{} is not a whisper.cpp model file (no ggml magic)",
        path.display()
    )))
}

/// `err` from opening `path` as a GGUF text model, with the reason
/// spelled out where the file is a whisper.cpp speech model.
pub fn speech_file_hint(path: &Path, err: ModelError) -> ModelError {
    match head(path) {
        Ok(bytes) if WhisperFile::has_magic(&bytes) => {
            ModelError::UnsupportedArchitecture(format!(
                "{} is a whisper.cpp speech model; load it with load_speech_model \
             (combs_speech_model_load, `combs transcribe`)",
                path.display()
            ))
        }
        _ => err,
    }
}
