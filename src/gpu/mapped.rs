//! Files mapped read-only into host memory: the model files whose tensor
//! bytes the uploads copy to the device straight from the page cache, with
//! no copy in between. Mapping is the one `unsafe` step of reading a file,
//! kept here with the crate's other unsafe code.

use std::fs::File;

/// Maps `file` read-only.
///
/// # Errors
/// What the operating system reports.
pub fn map_file(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the map is read-only; the documented contract of the model
    // loaders is that a file is not modified while it is open. Every read
    // goes through slices bounds-checked against the map's length.
    unsafe { memmap2::Mmap::map(file) }
}
