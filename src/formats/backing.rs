//! The bytes a file reader parses: a read-only mapping of the file, or a
//! buffer the caller handed over (tests, files just written). One piece for
//! every format, so each opens files the same way.

use std::fs::File;
use std::path::Path;

use crate::error::{ModelError, Result};

/// A file's bytes, mapped or owned.
pub(crate) enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    /// Maps the file at `path` read-only.
    ///
    /// # Errors
    /// [`ModelError::Io`] when it cannot be opened or mapped.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // mmap of an empty file fails on some platforms; the parsers report it as too short.
            return Ok(Backing::Owned(Vec::new()));
        }
        let map = crate::gpu::mapped::map_file(&file).map_err(io)?;
        // Start reading the whole file now: a model's tensors are all read
        // once, and a cold file then streams from disk while the first ones
        // upload. Advice only; a kernel that ignores it costs nothing.
        let _ = map.advise(memmap2::Advice::WillNeed);
        Ok(Backing::Mapped(map))
    }

    /// The bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}
