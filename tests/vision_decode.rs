//! Image decoding and its bounds: PNG and JPEG files made here with the
//! `image` crate's encoders from fresh random pixels, every PNG colour type
//! converted to RGB8 as PIL's `convert("RGB")` does (alpha dropped, grey
//! replicated, 16-bit to its high byte), and bad input — truncated or
//! corrupt files, unknown formats, empty and oversized images, headers
//! claiming 100000×100000 — refused with a clear error before any
//! allocation of that size. WebP, GIF, BMP, TIFF and PNM files written by
//! Pillow against the pixels PIL's `convert("RGB")` makes of them.

mod common;

use combs::ModelError;
use combs::vision::{MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE, RgbImage, decode_image, load_image};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

fn png(w: u32, h: u32, pixels: &[u8], color: ExtendedColorType) -> Vec<u8> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(pixels, w, h, color)
        .expect("encode PNG");
    out
}

fn jpeg(w: u32, h: u32, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 100)
        .write_image(rgb, w, h, ExtendedColorType::Rgb8)
        .expect("encode JPEG");
    out
}

fn random_bytes(rng: &mut common::Rng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v);
    v
}

fn format_of(err: &ModelError) -> &'static str {
    match err {
        ModelError::Format { format, .. } => format,
        other => panic!("expected a format error, got {other}"),
    }
}

/// CRC-32 (ISO-HDLC), as PNG chunks carry it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose IHDR claims `w`×`h` RGB8, followed by the IDAT and IEND of
/// a real 1×1 image (the header alone decides whether it is refused).
fn png_claiming(w: u32, h: u32) -> Vec<u8> {
    let real = png(1, 1, &[1, 2, 3], ExtendedColorType::Rgb8);
    let mut out = real.clone();
    // Signature (8) + length (4) + "IHDR" (4), then width and height.
    out[16..20].copy_from_slice(&w.to_be_bytes());
    out[20..24].copy_from_slice(&h.to_be_bytes());
    let crc = crc32(&out[12..29]);
    out[29..33].copy_from_slice(&crc.to_be_bytes());
    out
}

#[test]
fn decode_png_rgb8_round_trips() {
    let mut rng = common::Rng::fresh("decode_png_rgb8");
    let (w, h) = (1 + rng.below(70) as u32, 1 + rng.below(70) as u32);
    let rgb = random_bytes(&mut rng, (w * h * 3) as usize);
    let img = decode_image(&png(w, h, &rgb, ExtendedColorType::Rgb8)).expect("decode");
    assert_eq!((img.width(), img.height()), (w, h));
    assert_eq!(img.data(), &rgb[..]);
}

#[test]
fn decode_png_colour_types_convert_like_pil() {
    let mut rng = common::Rng::fresh("decode_png_colour_types");
    let (w, h) = (1 + rng.below(40) as u32, 1 + rng.below(40) as u32);
    let n = (w * h) as usize;
    // (colour type, bytes per pixel, the RGB8 PIL's convert("RGB") gives)
    type Convert = fn(&[u8]) -> [u8; 3];
    let cases: [(ExtendedColorType, usize, Convert); 7] = [
        (ExtendedColorType::L8, 1, |p| [p[0]; 3]),
        (ExtendedColorType::La8, 2, |p| [p[0]; 3]),
        (ExtendedColorType::Rgba8, 4, |p| [p[0], p[1], p[2]]),
        // 16-bit samples are big-endian in the encoder's input here as in
        // the file; the high byte is the first.
        (ExtendedColorType::L16, 2, |p| [p[0]; 3]),
        (ExtendedColorType::La16, 4, |p| [p[0]; 3]),
        (ExtendedColorType::Rgb16, 6, |p| [p[0], p[2], p[4]]),
        (ExtendedColorType::Rgba16, 8, |p| [p[0], p[2], p[4]]),
    ];
    for (color, bpp, convert) in cases {
        let raw = random_bytes(&mut rng, n * bpp);
        // The encoder takes 16-bit samples in native order.
        let input: Vec<u8> = if bpp > 1
            && matches!(
                color,
                ExtendedColorType::L16
                    | ExtendedColorType::La16
                    | ExtendedColorType::Rgb16
                    | ExtendedColorType::Rgba16
            ) {
            raw.chunks_exact(2)
                .flat_map(|s| u16::from_be_bytes([s[0], s[1]]).to_ne_bytes())
                .collect()
        } else {
            raw.clone()
        };
        let img = decode_image(&png(w, h, &input, color)).expect("decode");
        let want: Vec<u8> = raw.chunks_exact(bpp).flat_map(convert).collect();
        assert_eq!(img.data(), &want[..], "{color:?}");
    }
}

#[test]
fn decode_jpeg_is_close_to_its_source() {
    // JPEG is lossy: a smooth random image at quality 100 comes back within
    // a few steps; decoders differ in their last bit, so no exact check.
    let mut rng = common::Rng::fresh("decode_jpeg");
    let (w, h) = (16 + rng.below(64) as u32, 16 + rng.below(64) as u32);
    let (a, b, c) = (
        rng.range(0.5, 2.0),
        rng.range(0.5, 2.0),
        rng.range(0.0, 6.0),
    );
    let rgb: Vec<u8> = (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| {
                [0.0f32, 2.0, 4.0].map(|ch| {
                    let v = ((x as f32 * a + y as f32 * b) / 16.0 + c + ch).sin();
                    (127.5 + 100.0 * v) as u8
                })
            })
        })
        .collect();
    let img = decode_image(&jpeg(w, h, &rgb)).expect("decode");
    assert_eq!((img.width(), img.height()), (w, h));
    let mean_abs: f64 = img
        .data()
        .iter()
        .zip(&rgb)
        .map(|(&p, &q)| (f64::from(p) - f64::from(q)).abs())
        .sum::<f64>()
        / rgb.len() as f64;
    assert!(mean_abs < 3.0, "mean |diff| {mean_abs}");
}

#[test]
fn decode_truncated_png_is_png_format_error() {
    let mut rng = common::Rng::fresh("truncated_png");
    let rgb = random_bytes(&mut rng, 32 * 32 * 3);
    let file = png(32, 32, &rgb, ExtendedColorType::Rgb8);
    for cut in [file.len() / 2, file.len() - 13, 20] {
        let err = decode_image(&file[..cut])
            .err()
            .unwrap_or_else(|| panic!("PNG cut at {cut} decoded"));
        assert_eq!(format_of(&err), "PNG", "cut at {cut}: {err}");
    }
}

#[test]
fn decode_corrupt_png_is_png_format_error() {
    let mut rng = common::Rng::fresh("corrupt_png");
    let rgb = random_bytes(&mut rng, 32 * 32 * 3);
    let mut file = png(32, 32, &rgb, ExtendedColorType::Rgb8);
    // Flip a byte inside the image data: the chunk's CRC no longer holds.
    let mid = file.len() / 2;
    file[mid] ^= 0x55;
    let Err(err) = decode_image(&file) else {
        panic!("corrupt PNG decoded");
    };
    assert_eq!(format_of(&err), "PNG", "{err}");
}

#[test]
fn decode_truncated_jpeg_is_jpeg_format_error() {
    let mut rng = common::Rng::fresh("truncated_jpeg");
    let rgb = random_bytes(&mut rng, 48 * 48 * 3);
    let file = jpeg(48, 48, &rgb);
    for cut in [file.len() / 2, 100, 3] {
        let err = decode_image(&file[..cut])
            .err()
            .unwrap_or_else(|| panic!("JPEG cut at {cut} of {} decoded", file.len()));
        assert_eq!(format_of(&err), "JPEG", "cut at {cut}: {err}");
    }
}

#[test]
fn decode_corrupt_jpeg_header_is_jpeg_format_error() {
    let mut rng = common::Rng::fresh("corrupt_jpeg");
    let rgb = random_bytes(&mut rng, 48 * 48 * 3);
    let mut file = jpeg(48, 48, &rgb);
    // The first segment's length (after FF D8 FF xx) runs past the file.
    file[4] = 0xFF;
    file[5] = 0xFF;
    let Err(err) = decode_image(&file) else {
        panic!("corrupt JPEG decoded");
    };
    assert_eq!(format_of(&err), "JPEG", "{err}");
}

#[test]
fn decode_unknown_format_is_format_error() {
    let mut rng = common::Rng::fresh("unknown_format");
    let mut junk = random_bytes(&mut rng, 256);
    junk[0] = b'x'; // no known signature starts with it
    assert_eq!(format_of(&decode_image(&junk).expect_err("junk")), "image");
    assert_eq!(format_of(&decode_image(&[]).expect_err("empty")), "image");
    // A format the crate knows but this build does not decode (ICO).
    let ico = b"\x00\x00\x01\x00\x01\x00\x10\x10\x00\x00\x01\x00\x20\x00";
    let err = decode_image(ico).expect_err("ico");
    assert_eq!(format_of(&err), "image");
    assert!(err.to_string().contains("not supported"), "{err}");
    // A GIF signature with nothing behind it is a broken GIF.
    let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";
    assert_eq!(format_of(&decode_image(gif).expect_err("gif")), "GIF");
}

#[test]
fn decode_huge_png_header_is_refused_before_allocating() {
    for (w, h) in [
        (100_000, 100_000),
        (MAX_IMAGE_SIDE + 1, 1),
        (16_000, 16_000), // within the side bound, past the pixel bound
    ] {
        let err = decode_image(&png_claiming(w, h)).expect_err("huge PNG accepted");
        assert!(
            matches!(err, ModelError::InvalidArgument { .. }),
            "{w}x{h}: {err}"
        );
    }
    // A header within bounds is read (and then fails on the 1x1 data).
    let err = decode_image(&png_claiming(64, 64)).expect_err("bad data");
    assert_eq!(format_of(&err), "PNG");
}

#[test]
fn decode_huge_jpeg_header_is_refused_before_allocating() {
    let file = jpeg(8, 8, &[128u8; 8 * 8 * 3]);
    // SOF0 (FF C0): length (2), precision (1), height (2), width (2).
    let sof = file
        .windows(2)
        .position(|m| m == [0xFF, 0xC0])
        .expect("baseline JPEG has SOF0");
    let mut huge = file.clone();
    huge[sof + 5..sof + 7].copy_from_slice(&65_000u16.to_be_bytes());
    huge[sof + 7..sof + 9].copy_from_slice(&65_000u16.to_be_bytes());
    let err = decode_image(&huge).expect_err("huge JPEG accepted");
    assert!(matches!(err, ModelError::InvalidArgument { .. }), "{err}");
}

#[test]
fn zero_sized_png_is_an_error() {
    let err = decode_image(&png_claiming(0, 0)).expect_err("0x0 PNG accepted");
    assert!(
        matches!(
            err,
            ModelError::InvalidArgument { .. } | ModelError::Format { .. }
        ),
        "{err}"
    );
}

#[test]
fn from_rgb8_checks_size_and_length() {
    assert!(RgbImage::from_rgb8(0, 0, Vec::new()).is_err());
    assert!(RgbImage::from_rgb8(0, 5, Vec::new()).is_err());
    assert!(RgbImage::from_rgb8(2, 2, vec![0; 11]).is_err());
    assert!(RgbImage::from_rgb8(2, 2, vec![0; 13]).is_err());
    // Past the bounds: refused from the size alone, before the length.
    assert!(RgbImage::from_rgb8(100_000, 100_000, Vec::new()).is_err());
    let side = (MAX_IMAGE_PIXELS as f64).sqrt() as u32 + 1;
    assert!(RgbImage::from_rgb8(side, side, Vec::new()).is_err());
    let ok = RgbImage::from_rgb8(2, 2, vec![7; 12]).expect("valid");
    assert_eq!((ok.width(), ok.height(), ok.data().len()), (2, 2, 12));
}

#[test]
fn load_image_reads_a_file_and_reports_a_missing_one() {
    let mut rng = common::Rng::fresh("load_image");
    let rgb = random_bytes(&mut rng, 5 * 3 * 3);
    let dir = std::env::temp_dir().join(format!("combs-vision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("a.png");
    std::fs::write(&path, png(5, 3, &rgb, ExtendedColorType::Rgb8)).expect("write");
    let img = load_image(&path).expect("load");
    assert_eq!(img.data(), &rgb[..]);
    let err = load_image(&dir.join("missing.png")).expect_err("missing file");
    assert!(matches!(err, ModelError::Io { .. }), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn formats_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision/formats")
}

fn format_cases() -> Vec<(String, serde_json::Value)> {
    let text = std::fs::read_to_string(formats_dir().join("cases.json")).expect("cases.json");
    let meta: serde_json::Value = serde_json::from_str(&text).expect("cases.json parses");
    let cases = meta["cases"].as_object().expect("cases");
    cases.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// WebP (lossless and lossy), GIF (palette, grey, a transparent entry, the
/// first frame of an animation), BMP (24/32-bit, palette, grey, 1-bit),
/// TIFF (raw, LZW, deflate, PackBits; RGB, RGBA, grey) and PNM files that
/// Pillow 11.3 wrote, against what its `convert("RGB")` made of each
/// (`scripts/make-image-format-fixtures.py`). A palette TIFF is refused by
/// name (the `tiff` crate does not expand palettes).
#[test]
fn other_formats_decode_as_pil_converts_them() {
    let cases = format_cases();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for (name, case) in cases {
        let file = formats_dir().join(case["file"].as_str().expect("file"));
        if name == "tiff_palette" {
            let err = load_image(&file).expect_err("palette TIFF decoded");
            assert_eq!(format_of(&err), "TIFF", "{err}");
            continue;
        }
        let img = load_image(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = std::fs::read(formats_dir().join(format!("{name}.rgb"))).expect("rgb");
        let (w, h) = (case["width"].as_u64(), case["height"].as_u64());
        assert_eq!(
            (Some(u64::from(img.width())), Some(u64::from(img.height()))),
            (w, h),
            "{name}"
        );
        let tol = case["tolerance"].as_u64().expect("tolerance") as i32;
        let worst = img
            .data()
            .iter()
            .zip(&want)
            .map(|(a, b)| (i32::from(*a) - i32::from(*b)).abs())
            .max()
            .unwrap_or(0);
        assert_eq!(img.data().len(), want.len(), "{name}");
        assert!(worst <= tol, "{name}: pixels differ from PIL's by {worst}");
    }
}

/// Each file cut to half its length is refused with its format's name
/// (an animated GIF's first frame may end before the cut: it decodes).
#[test]
fn truncated_files_of_other_formats_are_refused() {
    for (name, case) in format_cases() {
        let file = case["file"].as_str().expect("file");
        let bytes = std::fs::read(formats_dir().join(file)).expect("read");
        let half = &bytes[..bytes.len() / 2];
        let want = match file.rsplit('.').next() {
            Some("webp") => "WebP",
            Some("gif") => "GIF",
            Some("bmp") => "BMP",
            Some("tiff") => "TIFF",
            _ => "PNM",
        };
        match decode_image(half) {
            Err(err) => assert_eq!(format_of(&err), want, "{name}: {err}"),
            Ok(_) => assert_eq!(name, "gif_animated", "{name}: a truncated file decoded"),
        }
    }
}

/// Headers claiming more than the bounds are refused before any pixel
/// buffer is allocated, in every format (as invalid arguments where the
/// header parses).
#[test]
fn huge_headers_of_other_formats_are_refused_before_allocating() {
    let read = |f: &str| std::fs::read(formats_dir().join(f)).expect("read");
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    // PNM: the size is text.
    let mut ppm = b"P6\n60000 60000\n255\n".to_vec();
    ppm.extend_from_slice(&[0u8; 64]);
    files.push(("PNM", ppm));
    // BMP: BITMAPINFOHEADER's width and height (i32 at 18 and 22).
    let mut bmp = read("bmp_rgb.bmp");
    bmp[18..22].copy_from_slice(&60_000i32.to_le_bytes());
    bmp[22..26].copy_from_slice(&60_000i32.to_le_bytes());
    files.push(("BMP", bmp));
    // GIF: the logical screen (u16 at 6 and 8).
    let mut gif = read("gif_palette.gif");
    gif[6..8].copy_from_slice(&60_000u16.to_le_bytes());
    gif[8..10].copy_from_slice(&60_000u16.to_le_bytes());
    files.push(("GIF", gif));
    // WebP lossless: 14-bit width - 1 and height - 1 after the 0x2f
    // signature byte; 16384 x 16384 is within the side bound, past the
    // pixel bound.
    let mut webp = read("webp_lossless_rgb.webp");
    assert_eq!(&webp[12..16], b"VP8L");
    let bits = u32::from_le_bytes([webp[21], webp[22], webp[23], webp[24]]);
    let bits = (bits & !0x0FFF_FFFF) | 0x0FFF_FFFF;
    webp[21..25].copy_from_slice(&bits.to_le_bytes());
    files.push(("WebP", webp));
    // TIFF: the ImageWidth and ImageLength entries (LONG values at 18, 30).
    let mut tiff = read("tiff_rgb.tiff");
    assert_eq!(&tiff[10..12], &[0x00, 0x01], "ImageWidth first");
    tiff[18..22].copy_from_slice(&60_000u32.to_le_bytes());
    tiff[30..34].copy_from_slice(&60_000u32.to_le_bytes());
    files.push(("TIFF", tiff));
    for (what, bytes) in files {
        let err = decode_image(&bytes).expect_err(what);
        // The tiff crate checks the strips against the size first: a
        // format error, also before any pixel buffer.
        let tiff_refused =
            what == "TIFF" && matches!(err, ModelError::Format { format: "TIFF", .. });
        assert!(
            tiff_refused || matches!(err, ModelError::InvalidArgument { .. }),
            "{what}: {err}"
        );
    }
}
