//! Opus tracks (Ogg Opus `.opus`/`.ogg`, WebM/Matroska) decoded with the
//! pure-Rust `opus-decoder` crate, which symphonia lacks: the packets come
//! from symphonia's demuxers, the stream's setup from its `OpusHead`
//! (RFC 7845 §5.1). Decoded at 48 kHz as FFmpeg decodes Opus (what
//! faster-whisper reads before its resampler), with the header's pre-skip
//! and output gain applied and the end trimmed to the stream's last
//! granule position where the container says it.

use opus_decoder::OpusDecoder;
use symphonia::core::packet::Packet;

use super::decode::{Collect, DecodedAudio};
use crate::error::{ModelError, Result};

/// Opus always decodes at 48 kHz here (the rate its timestamps count in).
const RATE: u32 = 48_000;

/// Samples per channel of the longest Opus packet (120 ms at 48 kHz).
const MAX_PACKET_FRAMES: usize = 5760;

/// What an `OpusHead` says about a stream.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OpusHead {
    /// Output channels.
    pub channels: usize,
    /// 48 kHz samples to drop from the start (encoder priming).
    pub pre_skip: u64,
    /// Gain to apply, in 1/256 dB.
    pub gain_q8: i16,
    /// Streams and coupled (stereo) streams, and each output channel's
    /// decoded channel; `None` for mapping family 0 (one stream).
    pub multistream: Option<(usize, usize, Vec<u8>)>,
}

fn opus_error(reason: impl Into<String>) -> ModelError {
    ModelError::Format {
        format: "Opus",
        offset: 0,
        reason: reason.into(),
    }
}

/// Parses an identification header (RFC 7845 §5.1), as Ogg carries it in
/// its first packet and Matroska in the track's codec private data.
pub(crate) fn parse_head(bytes: &[u8]) -> Result<OpusHead> {
    if bytes.len() < 19 || &bytes[..8] != b"OpusHead" {
        return Err(opus_error("the track has no OpusHead header"));
    }
    // Version 0.x; the upper nibble changing means an incompatible layout.
    if bytes[8] >> 4 != 0 {
        return Err(opus_error(format!("OpusHead version {}", bytes[8])));
    }
    let channels = usize::from(bytes[9]);
    if channels == 0 {
        return Err(opus_error("OpusHead with 0 channels"));
    }
    let pre_skip = u64::from(u16::from_le_bytes([bytes[10], bytes[11]]));
    let gain_q8 = i16::from_le_bytes([bytes[16], bytes[17]]);
    let family = bytes[18];
    let multistream = if family == 0 {
        if channels > 2 {
            return Err(opus_error(format!(
                "mapping family 0 with {channels} channels (at most 2)"
            )));
        }
        None
    } else {
        let table = bytes.get(19..21 + channels).ok_or_else(|| {
            opus_error(format!(
                "OpusHead of mapping family {family} is cut short ({} bytes for {channels} channels)",
                bytes.len()
            ))
        })?;
        let (streams, coupled) = (usize::from(table[0]), usize::from(table[1]));
        if streams == 0 || coupled > streams || streams + coupled > 255 {
            return Err(opus_error(format!(
                "{streams} streams with {coupled} coupled"
            )));
        }
        let mapping = table[2..].to_vec();
        // 255 is a silent channel; anything else must name a decoded one.
        if let Some(&bad) = mapping
            .iter()
            .find(|&&m| m != 255 && usize::from(m) >= streams + coupled)
        {
            return Err(opus_error(format!(
                "channel mapped to decoded channel {bad} of {}",
                streams + coupled
            )));
        }
        Some((streams, coupled, mapping))
    };
    Ok(OpusHead {
        channels,
        pre_skip,
        gain_q8,
        multistream,
    })
}

enum Decoder {
    Single(Box<OpusDecoder>),
    Multi(Multistream),
}

impl Decoder {
    fn new(head: &OpusHead) -> Result<Self> {
        let setup =
            |e: opus_decoder::OpusError| opus_error(format!("cannot set up the decoder: {e}"));
        Ok(match &head.multistream {
            None => Decoder::Single(Box::new(
                OpusDecoder::new(RATE, head.channels).map_err(setup)?,
            )),
            Some((streams, coupled, mapping)) => {
                let decoders = (0..*streams)
                    .map(|i| OpusDecoder::new(RATE, if i < *coupled { 2 } else { 1 }))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(setup)?;
                Decoder::Multi(Multistream {
                    decoders,
                    coupled: *coupled,
                    mapping: mapping.clone(),
                    scratch: vec![0.0; MAX_PACKET_FRAMES * 2],
                })
            }
        })
    }

    /// Frames per channel decoded into `pcm` (interleaved), or `None` for
    /// a packet that does not decode.
    fn decode(&mut self, packet: &[u8], pcm: &mut [f32]) -> Option<usize> {
        match self {
            Decoder::Single(d) => d.decode_float(packet, pcm, false).ok(),
            Decoder::Multi(m) => m.decode(packet, pcm),
        }
    }
}

/// Several Opus streams in one packet (RFC 7845 §5.1.1, mapping families
/// 1 and 255): every stream but the last in self-delimiting framing (RFC
/// 6716 Appendix B), the first `coupled` stereo. Decoded stream by stream
/// as libopus' multistream decoder does (the crate's own takes the
/// framing for a length prefix, and every real packet fails).
struct Multistream {
    decoders: Vec<OpusDecoder>,
    coupled: usize,
    mapping: Vec<u8>,
    scratch: Vec<f32>,
}

impl Multistream {
    fn decode(&mut self, packet: &[u8], pcm: &mut [f32]) -> Option<usize> {
        let channels = self.mapping.len();
        let n = self.decoders.len();
        let mut rest = packet;
        let mut frames = None;
        for (i, decoder) in self.decoders.iter_mut().enumerate() {
            let own;
            let sub: &[u8] = if i + 1 < n {
                let (regular, used) = undelimit(rest)?;
                rest = &rest[used..];
                own = regular;
                &own
            } else {
                rest
            };
            let got = decoder.decode_float(sub, &mut self.scratch, false).ok()?;
            if *frames.get_or_insert(got) != got {
                return None; // streams of one packet must last alike
            }
            // Decoded channels: 2i, 2i + 1 for coupled stream i, then one
            // per uncoupled stream.
            let (first, width) = if i < self.coupled {
                (2 * i, 2)
            } else {
                (self.coupled + i, 1)
            };
            for (c, &m) in self.mapping.iter().enumerate() {
                let m = usize::from(m);
                if m == 255 || m < first || m >= first + width {
                    continue;
                }
                for f in 0..got {
                    pcm[f * channels + c] = self.scratch[f * width + (m - first)];
                }
            }
        }
        let frames = frames?;
        for (c, &m) in self.mapping.iter().enumerate() {
            if m == 255 {
                for f in 0..frames {
                    pcm[f * channels + c] = 0.0;
                }
            }
        }
        Some(frames)
    }
}

/// A frame length of the packet framing: one byte below 252, else two
/// (`first + 4 * second`). Returns the length and the bytes it took.
fn frame_len(data: &[u8], at: usize) -> Option<(usize, usize)> {
    let first = usize::from(*data.get(at)?);
    if first < 252 {
        Some((first, 1))
    } else {
        Some((first + 4 * usize::from(*data.get(at + 1)?), 2))
    }
}

/// A self-delimited Opus packet at the start of `data` as the regular
/// packet it stands for (the extra length of its last frame removed), and
/// the bytes it took (RFC 6716 Appendix B). `None`: malformed.
fn undelimit(data: &[u8]) -> Option<(Vec<u8>, usize)> {
    let toc = *data.first()?;
    let mut out = vec![toc];
    let (payload, padding, end) = match toc & 3 {
        // One frame, or two of one size: the size is the added field.
        0 | 1 => {
            let (len, used) = frame_len(data, 1)?;
            let frames = if toc & 3 == 0 { 1 } else { 2 };
            let start = 1 + used;
            (start..start + frames * len, 0, start + frames * len)
        }
        // Two frames: the first's size (kept), then the second's (added).
        2 => {
            let (l1, u1) = frame_len(data, 1)?;
            let (l2, u2) = frame_len(data, 1 + u1)?;
            out.extend_from_slice(data.get(1..1 + u1)?);
            let start = 1 + u1 + u2;
            (start..start + l1 + l2, 0, start + l1 + l2)
        }
        // M frames: a count byte, padding sizes, M - 1 sizes if VBR (kept),
        // then the added size (of each frame if CBR, of the last if VBR).
        _ => {
            let count = *data.get(1)?;
            let m = usize::from(count & 0x3F);
            if m == 0 {
                return None;
            }
            let mut pos = 2;
            let mut padding = 0usize;
            if count & 0x40 != 0 {
                loop {
                    let b = usize::from(*data.get(pos)?);
                    pos += 1;
                    padding += if b == 255 { 254 } else { b };
                    if b != 255 {
                        break;
                    }
                }
            }
            let mut total = 0usize;
            if count & 0x80 != 0 {
                for _ in 0..m - 1 {
                    let (len, used) = frame_len(data, pos)?;
                    total += len;
                    pos += used;
                }
            }
            out.extend_from_slice(data.get(1..pos)?);
            let (len, used) = frame_len(data, pos)?;
            pos += used;
            total += if count & 0x80 != 0 { len } else { m * len };
            (pos..pos + total, padding, pos + total + padding)
        }
    };
    out.extend_from_slice(data.get(payload.clone())?);
    // The padding follows the frames in both framings.
    out.extend_from_slice(data.get(payload.end..payload.end + padding)?);
    Some((out, end))
}

/// Decodes an Opus track (mixed down to one channel where `mono`): `head`
/// is its `OpusHead`, `next` hands on the track's packets in order (`None`
/// at the end).
///
/// # Errors
/// [`ModelError::Format`] (format `"Opus"`) for a missing or malformed
/// header, or a track that decodes to nothing; what `next` returns.
pub(crate) fn decode_track(
    head: Option<&[u8]>,
    mono: bool,
    mut next: impl FnMut() -> Result<Option<Packet>>,
) -> Result<DecodedAudio> {
    let head = parse_head(head.unwrap_or_default())?;
    let mut decoder = Decoder::new(&head)?;
    let channels = head.channels;
    let mut pcm = vec![0.0f32; MAX_PACKET_FRAMES * channels];
    let mut out = Collect::new(mono, channels, None);
    let gain = 10f32.powf(f32::from(head.gain_q8) / (20.0 * 256.0));
    // Ogg's demuxer marks the pre-skip on the first packets itself; where a
    // container leaves it unmarked (Matroska), the header's count applies.
    let mut marked_start = false;
    let mut skip = 0u64;
    let mut first = true;
    while let Some(packet) = next()? {
        // A corrupt packet is skipped, as FFmpeg does.
        let Some(frames) = decoder.decode(&packet.data, &mut pcm) else {
            continue;
        };
        if first {
            marked_start = packet.trim_start.get() > 0;
            skip = if marked_start { 0 } else { head.pre_skip };
            first = false;
        }
        let frames = frames as u64;
        let start = if marked_start {
            packet.trim_start.get()
        } else {
            let s = skip.min(frames);
            skip -= s;
            s
        };
        let end = frames.saturating_sub(packet.trim_end.get()).max(start);
        let (a, b) = (start as usize * channels, end as usize * channels);
        if head.gain_q8 != 0 {
            for v in &mut pcm[a..b] {
                *v *= gain;
            }
        }
        out.push(&pcm[a..b]);
    }
    if out.is_empty() {
        return Err(opus_error("no audio decoded"));
    }
    Ok(out.finish(RATE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(channels: u8, pre_skip: u16, gain: i16, family: u8, table: &[u8]) -> Vec<u8> {
        let mut h = b"OpusHead".to_vec();
        h.push(1);
        h.push(channels);
        h.extend_from_slice(&pre_skip.to_le_bytes());
        h.extend_from_slice(&48_000u32.to_le_bytes());
        h.extend_from_slice(&gain.to_le_bytes());
        h.push(family);
        h.extend_from_slice(table);
        h
    }

    #[test]
    fn parses_family_0_and_1_heads() {
        let h = parse_head(&head(2, 312, -256, 0, &[])).unwrap();
        assert_eq!(
            h,
            OpusHead {
                channels: 2,
                pre_skip: 312,
                gain_q8: -256,
                multistream: None
            }
        );
        let h = parse_head(&head(3, 0, 0, 1, &[2, 1, 0, 2, 1])).unwrap();
        assert_eq!(h.multistream, Some((2, 1, vec![0, 2, 1])));
    }

    /// Self-delimited packets of each framing code (RFC 6716 Appendix B)
    /// turn into the regular packets they stand for, the bytes after them
    /// left alone.
    #[test]
    fn undelimits_every_framing_code() {
        let trailing = [0xEEu8, 0xEE];
        let big: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let mut sd_big = vec![0x00, 252, 12];
        sd_big.extend_from_slice(&big);
        let mut reg_big = vec![0x00];
        reg_big.extend_from_slice(&big);
        let cases: [(Vec<u8>, Vec<u8>); 6] = [
            (vec![0x00, 3, 1, 2, 3], vec![0x00, 1, 2, 3]),
            (vec![0x01, 2, 5, 6, 7, 8], vec![0x01, 5, 6, 7, 8]),
            (vec![0x02, 1, 3, 9, 4, 4, 4], vec![0x02, 1, 9, 4, 4, 4]),
            (
                vec![0x03, 0x03, 2, 1, 1, 2, 2, 3, 3],
                vec![0x03, 0x03, 1, 1, 2, 2, 3, 3],
            ),
            (
                vec![0x03, 0xC2, 2, 1, 2, 7, 8, 8, 0, 0],
                vec![0x03, 0xC2, 2, 1, 7, 8, 8, 0, 0],
            ),
            (sd_big, reg_big),
        ];
        for (sd, regular) in cases {
            let mut data = sd.clone();
            data.extend_from_slice(&trailing);
            assert_eq!(undelimit(&data), Some((regular, sd.len())), "{sd:?}");
            assert_eq!(undelimit(&sd[..sd.len() - 1]), None, "cut short: {sd:?}");
        }
        assert_eq!(undelimit(&[0x03, 0x00, 1]), None, "0 frames");
        assert_eq!(undelimit(&[]), None);
    }

    #[test]
    fn refuses_bad_heads() {
        for (bytes, what) in [
            (b"OpusHeaX".to_vec(), "no OpusHead"),
            (head(0, 0, 0, 0, &[]), "0 channels"),
            (head(3, 0, 0, 0, &[]), "at most 2"),
            (head(2, 0, 0, 1, &[1]), "cut short"),
            (head(2, 0, 0, 1, &[1, 2, 0, 1]), "coupled"),
            (head(2, 0, 0, 1, &[1, 0, 0, 5]), "decoded channel 5"),
        ] {
            let mut bytes = bytes;
            if what == "no OpusHead" {
                bytes.resize(19, 0);
            }
            let err = parse_head(&bytes).unwrap_err().to_string();
            assert!(err.contains(what), "{what}: {err}");
        }
        let mut v = head(1, 0, 0, 0, &[]);
        v[8] = 0x10;
        assert!(parse_head(&v).unwrap_err().to_string().contains("version"));
    }
}
