"""Copies of one test clip in the codecs and containers phones, browsers and
recorders write, and FFmpeg's decoding of each (what faster-whisper reads
before its resampler), for tests/whisper_audio.rs:

  python3 scripts/audio_variants.py AUDIO_DIR      (PYTHONPATH: PyAV 18.1.0)

From AUDIO_DIR/espeak_numbers.wav (16 kHz mono) and espeak_stereo44k.wav
writes AUDIO_DIR/variants/<name> and <name>.f32: FFmpeg's decoded samples,
interleaved f32 (integer formats scaled by 1 / 2^(bits - 1), as combs
scales them), and variants/index.json: per file its codec, rate and
channels as FFmpeg reports them (and one AC-3 file, marked
"unsupported", that combs must refuse by name). Encoded by PyAV's bundled FFmpeg; the
tests compare combs' decoding with FFmpeg's decoding of the same files, so
another encoder build changes nothing they check.
"""
import json
import sys
from pathlib import Path

import av
import numpy as np


def read(path):
    """Planar frames of a file as (rate, [channels, n] float64)."""
    with av.open(str(path)) as c:
        s = c.streams.audio[0]
        parts = []
        for f in c.decode(s):
            a = f.to_ndarray()
            if not f.format.is_planar:
                a = a.reshape(-1, len(f.layout.channels)).T
            scale = {"s16": 2.0**15, "s16p": 2.0**15, "s32": 2.0**31, "s32p": 2.0**31,
                     "u8": None, "u8p": None}.get(f.format.name, 1.0)
            if scale is None:
                a = (a.astype(np.float64) - 128.0) / 128.0
            else:
                a = a.astype(np.float64) / scale
            parts.append(a)
        return s.codec_context.name, s.rate, np.concatenate(parts, axis=1)


def write(path, fmt, codec, pcm, src_rate, rate, layout):
    """Encodes [channels, n] float samples of `src_rate` at `rate`."""
    with av.open(str(path), "w", format=fmt) as out:
        s = out.add_stream(codec, rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm.astype(np.float32)), format="fltp", layout=layout
        )
        frame.sample_rate = src_rate
        resampler = av.AudioResampler(format=s.format.name, layout=layout, rate=rate)
        for f in list(resampler.resample(frame)) + list(resampler.resample(None)):
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)


def main():
    audio = Path(sys.argv[1])
    out = audio / "variants"
    out.mkdir(exist_ok=True)
    _, rate, mono = read(audio / "espeak_numbers.wav")
    _, rate44, stereo = read(audio / "espeak_stereo44k.wav")
    # 5.1 from the mono clip at distinct gains: Opus mapping family 1.
    six = np.stack([mono[0] * g for g in (0.9, 0.7, 0.5, 0.3, 0.6, 0.4)])
    cases = [
        ("aac.m4a", "mp4", "aac", mono, rate, rate, "mono"),
        ("aac_adts.aac", "adts", "aac", mono, rate, rate, "mono"),
        ("aac_stereo44k.m4a", "mp4", "aac", stereo, rate44, rate44, "stereo"),
        ("alac.m4a", "ipod", "alac", mono, rate, rate, "mono"),
        ("pcm.aiff", "aiff", "pcm_s16be", mono, rate, rate, "mono"),
        ("pcm.caf", "caf", "pcm_s16le", mono, rate, rate, "mono"),
        ("ima_adpcm.wav", "wav", "adpcm_ima_wav", mono, rate, rate, "mono"),
        ("ms_adpcm.wav", "wav", "adpcm_ms", mono, rate, rate, "mono"),
        ("mp2.mp2", "mp2", "mp2", mono, rate, rate, "mono"),
        ("alaw_8k.wav", "wav", "pcm_alaw", mono, rate, 8000, "mono"),
        ("mulaw_8k.wav", "wav", "pcm_mulaw", mono, rate, 8000, "mono"),
        ("opus.ogg", "ogg", "libopus", mono, rate, rate, "mono"),
        ("opus.webm", "webm", "libopus", mono, rate, rate, "mono"),
        ("opus_stereo.opus", "ogg", "libopus", stereo, rate44, 48000, "stereo"),
        ("opus_5.1.opus", "ogg", "libopus", six, rate, 48000, "5.1"),
    ]
    index = {}
    for name, fmt, codec, pcm, src, r, layout in cases:
        path = out / name
        write(path, fmt, codec, pcm, src, r, layout)
        dec, dec_rate, samples = read(path)
        samples.T.astype("<f4").tofile(str(path) + ".f32")
        index[name] = {"codec": dec, "rate": dec_rate, "channels": samples.shape[0]}
    # A codec no decoder here handles, in a container symphonia reads.
    write(out / "ac3.mka", "matroska", "ac3", mono, rate, 48000, "mono")
    index["ac3.mka"] = {"codec": "ac3", "unsupported": True}
    (out / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    print(f"{len(index)} variants in {out}")


if __name__ == "__main__":
    main()
