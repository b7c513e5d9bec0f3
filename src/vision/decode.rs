//! Image files to [`RgbImage`] through the `image` crate: PNG, JPEG, WebP
//! (lossy and lossless), GIF (the first frame), BMP, TIFF (not paletted)
//! and PNM, told by their signature (the decoders built are those; a
//! signature-less TGA is not among them). Sizes are checked from the
//! header, with the crate's [`Limits`] set, before the pixel buffer is
//! allocated. Every format but JPEG and lossy WebP decodes to the same
//! pixels as PIL (`tests/fixtures/vision/formats`, written by Pillow); lossy
//! WebP matched libwebp's there too.
//!
//! Colour types become RGB8 the way PIL's `Image.convert("RGB")` does, as
//! llama.cpp's mtmd (stb_image) does too: grey is replicated into R, G and B,
//! alpha (an alpha channel or a PNG `tRNS` colour) is dropped, not blended,
//! and 16-bit samples keep their high byte (a GIF's transparent palette
//! entry keeps its colour, as in PIL; where a GIF's first frame covers
//! less than its screen, the rest is black as in stb_image, where PIL fills
//! it with palette entry 0). Two known differences from
//! transformers: transformers 5's `convert_to_rgb` blends transparent
//! pixels onto white (4.x dropped alpha as here), and PIL clamps 16-bit
//! greyscale (`I;16`) values to 255 rather than taking the high byte, which
//! turns nearly every such image white; we follow stb_image there. JPEG
//! pixels may differ by a step or two from libjpeg's (PIL) or stb_image's
//! (mtmd): the IDCT and chroma upsampling of JPEG decoders are not
//! specified bit for bit. EXIF orientation is not applied (mtmd does not).

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader, Limits};

use super::image::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, RgbImage, check_size};
use crate::error::{ModelError, Result};

/// Bytes a decoder may hold at once: the largest accepted image as 16-bit
/// RGBA (8 bytes per pixel), the widest layout PNG decodes to.
const MAX_DECODE_ALLOC: u64 = MAX_IMAGE_PIXELS * 8;

/// Reads and decodes an image file (format told by its content, not its
/// name; see the module comment for the formats).
///
/// # Errors
/// [`ModelError::Io`] when the file cannot be read; what [`decode_image`]
/// refuses.
pub fn load_image(path: &Path) -> Result<RgbImage> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_image(&bytes)
}

/// Decodes an image file held in memory to RGB8.
///
/// # Errors
/// [`ModelError::Format`] (format `"PNG"`, `"JPEG"`, `"WebP"`, `"GIF"`,
/// `"BMP"`, `"TIFF"` or `"PNM"`) for a corrupt or truncated file, or a
/// variant its decoder does not handle; `"image"` for content that is none
/// of them;
/// [`ModelError::InvalidArgument`] for an image with no pixels or past
/// [`MAX_IMAGE_SIDE`] / [`MAX_IMAGE_PIXELS`] (refused from the header).
pub fn decode_image(bytes: &[u8]) -> Result<RgbImage> {
    let (format, name) = match image::guess_format(bytes) {
        Ok(f) => match format_name(f) {
            Some(name) => (f, name),
            None => {
                return Err(format_error(
                    "image",
                    format!("{f:?} images are not supported ({SUPPORTED})"),
                ));
            }
        },
        Err(_) => {
            return Err(format_error(
                "image",
                format!("not an image file this build decodes (unknown signature; {SUPPORTED})"),
            ));
        }
    };
    if format == ImageFormat::Jpeg {
        // The JPEG decoder fills a truncated scan with grey rather than
        // failing (PIL raises "image file is truncated"): refuse it here.
        check_jpeg_complete(bytes).map_err(|reason| format_error("JPEG", reason))?;
    }
    // The decoders are another crate's parsers of untrusted headers; a
    // panic in one (as fuzzing found in the audio decoders) fails this
    // image, not the caller.
    std::panic::catch_unwind(|| decode_as(bytes, format, name)).unwrap_or_else(|_| {
        Err(format_error(
            name,
            "the decoder failed on this file (a malformed header)",
        ))
    })
}

/// What [`decode_image`] names in its refusals.
const SUPPORTED: &str = "PNG, JPEG, WebP, GIF, BMP, TIFF and PNM are";

/// The formats this build decodes, by the name its errors give them.
fn format_name(format: ImageFormat) -> Option<&'static str> {
    Some(match format {
        ImageFormat::Png => "PNG",
        ImageFormat::Jpeg => "JPEG",
        ImageFormat::WebP => "WebP",
        ImageFormat::Gif => "GIF",
        ImageFormat::Bmp => "BMP",
        ImageFormat::Tiff => "TIFF",
        ImageFormat::Pnm => "PNM",
        _ => return None,
    })
}

fn decode_as(bytes: &[u8], format: ImageFormat, name: &'static str) -> Result<RgbImage> {
    let mut reader = ImageReader::new(Cursor::new(bytes));
    reader.set_format(format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(|e| decode_error(name, e))?;
    let (width, height) = decoder.dimensions();
    check_size(width, height)?;
    let decoded = DynamicImage::from_decoder(decoder).map_err(|e| decode_error(name, e))?;
    to_rgb8(decoded)
}

/// PIL's `convert("RGB")` on what the decoders return (see the module
/// comment for the rules).
fn to_rgb8(image: DynamicImage) -> Result<RgbImage> {
    let (width, height) = (image.width(), image.height());
    let data = match image {
        DynamicImage::ImageRgb8(rgb) => rgb.into_raw(),
        DynamicImage::ImageRgba8(rgba) => expand(rgba.as_raw(), 4, |p| [p[0], p[1], p[2]]),
        DynamicImage::ImageLuma8(l) => expand(l.as_raw(), 1, |p| [p[0]; 3]),
        DynamicImage::ImageLumaA8(la) => expand(la.as_raw(), 2, |p| [p[0]; 3]),
        DynamicImage::ImageRgb16(rgb) => {
            expand(rgb.as_raw(), 3, |p| [hi(p[0]), hi(p[1]), hi(p[2])])
        }
        DynamicImage::ImageRgba16(rgba) => {
            expand(rgba.as_raw(), 4, |p| [hi(p[0]), hi(p[1]), hi(p[2])])
        }
        DynamicImage::ImageLuma16(l) => expand(l.as_raw(), 1, |p| [hi(p[0]); 3]),
        DynamicImage::ImageLumaA16(la) => expand(la.as_raw(), 2, |p| [hi(p[0]); 3]),
        // Float layouts come from neither decoder built here; the crate's
        // own conversion is as good as any for them.
        other => other.to_rgb8().into_raw(),
    };
    RgbImage::from_rgb8(width, height, data)
}

/// The high byte of a 16-bit sample, as PIL's `RGB;16B` unpacker and
/// stb_image's 16-to-8 conversion take it.
fn hi(v: u16) -> u8 {
    (v >> 8) as u8
}

fn expand<T: Copy>(src: &[T], channels: usize, pixel: impl Fn(&[T]) -> [u8; 3]) -> Vec<u8> {
    let mut out = Vec::with_capacity(src.len() / channels * 3);
    for p in src.chunks_exact(channels) {
        out.extend_from_slice(&pixel(p));
    }
    out
}

/// Walks a JPEG's marker segments from SOI to EOI (skipping each
/// segment by its length, and each scan's entropy-coded data up to the
/// next marker), so that a file cut short anywhere, or whose segment
/// lengths run past its end, is refused. Bytes after EOI are ignored, as
/// decoders ignore them.
fn check_jpeg_complete(bytes: &[u8]) -> std::result::Result<(), String> {
    let truncated = |at: usize| format!("truncated at byte {at} (no end-of-image marker)");
    let mut pos = 2; // after SOI, which the signature check saw
    loop {
        if pos >= bytes.len() {
            return Err(truncated(pos));
        }
        if bytes[pos] != 0xFF {
            return Err(format!(
                "expected a marker at byte {pos}, found {:#04x}",
                bytes[pos]
            ));
        }
        while pos < bytes.len() && bytes[pos] == 0xFF {
            pos += 1; // fill bytes
        }
        let Some(&marker) = bytes.get(pos) else {
            return Err(truncated(pos));
        };
        pos += 1;
        match marker {
            0xD9 => return Ok(()),
            0x01 | 0xD0..=0xD7 => continue,
            _ => {}
        }
        let Some(len) = bytes.get(pos..pos + 2) else {
            return Err(truncated(pos));
        };
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len < 2 {
            return Err(format!("segment length {len} at byte {pos}"));
        }
        pos += len;
        if pos > bytes.len() {
            return Err(truncated(bytes.len()));
        }
        if marker == 0xDA {
            // Entropy-coded data: 0xFF is stuffed as FF 00, and restart
            // markers sit inside it; any other marker ends the scan.
            loop {
                let Some(off) = bytes[pos..].iter().position(|&b| b == 0xFF) else {
                    return Err(truncated(bytes.len()));
                };
                pos += off;
                match bytes.get(pos + 1) {
                    None => return Err(truncated(bytes.len())),
                    Some(0x00 | 0xD0..=0xD7 | 0xFF) => pos += 1,
                    Some(_) => break,
                }
            }
        }
    }
}

fn format_error(format: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format,
        offset: 0,
        reason: reason.into(),
    }
}

fn decode_error(format: &'static str, e: ImageError) -> ModelError {
    match e {
        ImageError::Limits(limit) => ModelError::invalid(
            "image",
            format!(
                "{format} image is too large ({limit}; at most {MAX_IMAGE_SIDE} per side and \
                 {MAX_IMAGE_PIXELS} pixels)"
            ),
        ),
        // A file that ends early surfaces as an I/O error from the cursor.
        ImageError::IoError(io) => format_error(format, format!("truncated or unreadable: {io}")),
        other => format_error(format, other.to_string()),
    }
}
