//! A window's tokens split into timed segments at consecutive timestamp
//! tokens, and where the next window starts (`seek`), as openai-whisper's
//! `transcribe()` does: after a closing single timestamp the whole window
//! was heard; otherwise the unfinished last segment is dropped and the next
//! window starts at the last timestamp.

/// One timed piece of a window.
#[derive(Clone, Debug, PartialEq)]
pub struct RawSegment {
    /// Start in seconds from the start of the audio.
    pub start: f64,
    /// End in seconds.
    pub end: f64,
    /// Its tokens, timestamps included.
    pub tokens: Vec<u32>,
}

/// Where a window's decoding leads.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// The segments, in order.
    pub segments: Vec<RawSegment>,
    /// Mel frame where the next window starts.
    pub seek: usize,
}

/// The geometry of windows: frames per timestamp step and seconds per frame.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Mel frames per encoder position (2).
    pub input_stride: usize,
    /// Seconds per mel frame (0.01).
    pub frame_seconds: f64,
}

impl Timing {
    /// Seconds per timestamp step (0.02).
    pub fn time_precision(&self) -> f64 {
        self.input_stride as f64 * self.frame_seconds
    }
}

/// Splits the tokens of the window at frame `seek` holding `segment_size`
/// frames of audio; `ts_begin` is the first timestamp token.
pub fn split(tokens: &[u32], ts_begin: u32, seek: usize, segment_size: usize, t: Timing) -> Split {
    let is_ts: Vec<bool> = tokens.iter().map(|&x| x >= ts_begin).collect();
    let n = tokens.len();
    let single_timestamp_ending = n >= 2 && !is_ts[n - 2] && is_ts[n - 1];
    let time_offset = seek as f64 * t.frame_seconds;
    let precision = t.time_precision();
    let pos = |tok: u32| f64::from(tok.saturating_sub(ts_begin));
    let consecutive: Vec<usize> = (1..n).filter(|&i| is_ts[i] && is_ts[i - 1]).collect();
    let mut segments = Vec::new();
    let next_seek;
    if !consecutive.is_empty() {
        let mut slices = consecutive;
        if single_timestamp_ending {
            slices.push(n);
        }
        let mut last = 0;
        for &cur in &slices {
            let s = &tokens[last..cur];
            if let (Some(&first), Some(&end)) = (s.first(), s.last()) {
                segments.push(RawSegment {
                    start: time_offset + pos(first) * precision,
                    end: time_offset + pos(end) * precision,
                    tokens: s.to_vec(),
                });
            }
            last = cur;
        }
        next_seek = if single_timestamp_ending {
            seek + segment_size
        } else {
            let last_ts = tokens
                .get(last.wrapping_sub(1))
                .copied()
                .unwrap_or(ts_begin);
            seek + pos(last_ts) as usize * t.input_stride
        };
    } else {
        let mut duration = segment_size as f64 * t.frame_seconds;
        if let Some(&last_ts) = tokens.iter().rev().find(|&&x| x >= ts_begin)
            && last_ts != ts_begin
        {
            duration = pos(last_ts) * precision;
        }
        segments.push(RawSegment {
            start: time_offset,
            end: time_offset + duration,
            tokens: tokens.to_vec(),
        });
        next_seek = seek + segment_size;
    }
    Split {
        segments,
        seek: next_seek,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TB: u32 = 50363;
    const T: Timing = Timing {
        input_stride: 2,
        frame_seconds: 0.01,
    };

    #[test]
    fn split_pairs_and_seek_to_last_timestamp() {
        // <|0.00|> a b <|1.00|><|1.00|> c <|2.50|><|2.50|> d  (unfinished)
        let toks = [TB, 1, 2, TB + 50, TB + 50, 3, TB + 125, TB + 125, 4];
        let s = split(&toks, TB, 1000, 3000, T);
        assert_eq!(s.segments.len(), 2);
        assert_eq!(s.segments[0].tokens, vec![TB, 1, 2, TB + 50]);
        assert!((s.segments[0].start - 10.0).abs() < 1e-9);
        assert!((s.segments[0].end - 11.0).abs() < 1e-9);
        assert_eq!(s.segments[1].tokens, vec![TB + 50, 3, TB + 125]);
        assert!((s.segments[1].end - 12.5).abs() < 1e-9);
        // The unfinished "d" is dropped; seek moves to the last timestamp (2.50 s = 250 frames).
        assert_eq!(s.seek, 1000 + 250);
    }

    #[test]
    fn split_single_timestamp_ending_consumes_window() {
        let toks = [TB, 1, TB + 40, TB + 40, 2, TB + 90];
        let s = split(&toks, TB, 0, 2200, T);
        assert_eq!(s.segments.len(), 2);
        assert_eq!(s.segments[1].tokens, vec![TB + 40, 2, TB + 90]);
        assert!((s.segments[1].end - 1.8).abs() < 1e-9);
        assert_eq!(s.seek, 2200);
    }

    #[test]
    fn split_without_pairs_is_one_segment() {
        // No timestamps: the whole window.
        let s = split(&[1, 2, 3], TB, 3000, 1500, T);
        assert_eq!(s.segments.len(), 1);
        assert!((s.segments[0].start - 30.0).abs() < 1e-9);
        assert!((s.segments[0].end - 45.0).abs() < 1e-9);
        assert_eq!(s.seek, 4500);
        // One opening timestamp then text: it ends at that timestamp when not 0.
        let s = split(&[TB + 30, 1, 2], TB, 0, 3000, T);
        assert!((s.segments[0].end - 0.6).abs() < 1e-9);
        assert_eq!(s.seek, 3000);
    }
}
