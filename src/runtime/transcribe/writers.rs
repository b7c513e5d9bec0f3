//! Transcripts written as openai-whisper's writers (`utils.py`) write them:
//! SubRip (`.srt`, `HH:MM:SS,mmm`, numbered), WebVTT (`.vtt`, `MM:SS.mmm`
//! with hours only when needed), plain text (one stripped segment per line)
//! and JSON (text, segments, language).

use std::io::Write;

use super::Transcript;
use super::tokens::py_strip;

/// An output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// SubRip subtitles.
    Srt,
    /// WebVTT subtitles.
    Vtt,
    /// openai-whisper's JSON result.
    Json,
    /// One line per segment.
    Txt,
}

impl Format {
    /// The format a file name's extension names (`out.srt`), if any.
    pub fn from_path(path: &std::path::Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "srt" => Some(Format::Srt),
            "vtt" => Some(Format::Vtt),
            "json" => Some(Format::Json),
            "txt" => Some(Format::Txt),
            _ => None,
        }
    }
}

/// openai-whisper's `format_timestamp`: milliseconds rounded half to even,
/// hours shown when asked or non-zero.
pub fn format_timestamp(seconds: f64, always_include_hours: bool, decimal_marker: char) -> String {
    let mut ms = (seconds.max(0.0) * 1000.0).round_ties_even() as u64;
    let hours = ms / 3_600_000;
    ms -= hours * 3_600_000;
    let minutes = ms / 60_000;
    ms -= minutes * 60_000;
    let secs = ms / 1000;
    ms -= secs * 1000;
    let h = if always_include_hours || hours > 0 {
        format!("{hours:02}:")
    } else {
        String::new()
    };
    format!("{h}{minutes:02}:{secs:02}{decimal_marker}{ms:03}")
}

/// Subtitle text of a segment: stripped, with `-->` (the cue arrow) defused.
fn cue_text(text: &str) -> String {
    py_strip(text).replace("-->", "->")
}

/// Writes `t` in `format` to `out`.
///
/// # Errors
/// Writing to `out` failing.
pub fn write(t: &Transcript, format: Format, out: &mut dyn Write) -> std::io::Result<()> {
    match format {
        Format::Srt => {
            for (i, s) in t.segments.iter().enumerate() {
                writeln!(
                    out,
                    "{}\n{} --> {}\n{}\n",
                    i + 1,
                    format_timestamp(s.t0, true, ','),
                    format_timestamp(s.t1, true, ','),
                    cue_text(&s.text)
                )?;
            }
        }
        Format::Vtt => {
            writeln!(out, "WEBVTT\n")?;
            for s in &t.segments {
                writeln!(
                    out,
                    "{} --> {}\n{}\n",
                    format_timestamp(s.t0, false, '.'),
                    format_timestamp(s.t1, false, '.'),
                    cue_text(&s.text)
                )?;
            }
        }
        Format::Txt => {
            for s in &t.segments {
                writeln!(out, "{}", py_strip(&s.text))?;
            }
        }
        Format::Json => {
            let segments: Vec<serde_json::Value> = t
                .segments
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    serde_json::json!({
                        "id": i,
                        "seek": s.seek,
                        "start": s.t0,
                        "end": s.t1,
                        "text": s.text,
                        "tokens": s.tokens,
                        "temperature": s.temperature,
                        "avg_logprob": s.avg_logprob,
                        "compression_ratio": s.compression_ratio,
                        "no_speech_prob": s.no_speech_prob,
                    })
                })
                .collect();
            let v = serde_json::json!({
                "text": t.text,
                "segments": segments,
                "language": t.language,
            });
            serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::other)?;
            writeln!(out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Segment;
    use super::*;

    fn seg(t0: f64, t1: f64, text: &str) -> Segment {
        Segment {
            text: text.into(),
            t0,
            t1,
            tokens: vec![1, 2],
            avg_logprob: -0.25,
            no_speech_prob: 0.01,
            temperature: 0.0,
            compression_ratio: 1.2,
            seek: 0,
        }
    }

    #[test]
    fn format_timestamp_as_openai_whisper() {
        assert_eq!(format_timestamp(0.0, true, ','), "00:00:00,000");
        assert_eq!(format_timestamp(3725.5, false, '.'), "01:02:05.500");
        assert_eq!(format_timestamp(65.02, false, '.'), "01:05.020");
        // 0.0005 s: half a millisecond rounds to even (0).
        assert_eq!(format_timestamp(0.0005, true, ','), "00:00:00,000");
    }

    #[test]
    fn srt_vtt_txt_json_layouts() {
        let t = Transcript {
            language: "en".into(),
            segments: vec![seg(0.0, 2.5, " Hello there."), seg(2.5, 61.0, " a --> b ")],
            text: " Hello there. a --> b ".into(),
            ..Default::default()
        };
        let mut srt = Vec::new();
        write(&t, Format::Srt, &mut srt).expect("write");
        assert_eq!(
            String::from_utf8_lossy(&srt),
            "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n2\n00:00:02,500 --> 00:01:01,000\na -> b\n\n"
        );
        let mut vtt = Vec::new();
        write(&t, Format::Vtt, &mut vtt).expect("write");
        assert_eq!(
            String::from_utf8_lossy(&vtt),
            "WEBVTT\n\n00:00.000 --> 00:02.500\nHello there.\n\n00:02.500 --> 01:01.000\na -> b\n\n"
        );
        let mut txt = Vec::new();
        write(&t, Format::Txt, &mut txt).expect("write");
        assert_eq!(String::from_utf8_lossy(&txt), "Hello there.\na --> b\n");
        let mut json = Vec::new();
        write(&t, Format::Json, &mut json).expect("write");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(v["language"], "en");
        assert_eq!(v["segments"][1]["end"], 61.0);
        assert_eq!(v["segments"][0]["text"], " Hello there.");
    }
}
