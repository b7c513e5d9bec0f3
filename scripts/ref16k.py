"""The 16 kHz arrays the Whisper references transcribed, without their venv.

  python3 scripts/ref16k.py AUDIO_DIR tests/fixtures/whisper/clips.json OUT_DIR

Decodes each clip of clips.json as faster-whisper 1.2.1's decode_audio does
(PyAV: frames grouped through a FIFO, one s16 / mono / 16 kHz resampler,
flushed at the end) and writes OUT_DIR/<clip>.s16 (int16 LE). Each array's
sha256 (as f32 / 32768, what make-whisper-fixtures.py recorded) must match,
so the tests compare against the very arrays the references read; exits 1
otherwise (another PyAV / FFmpeg resampler)."""
import hashlib
import io
import itertools
import json
import sys
from pathlib import Path
import av
import numpy as np

def decode(path, rate=16000):
    """faster_whisper.audio.decode_audio, as int16."""
    resampler = av.audio.resampler.AudioResampler(format="s16", layout="mono", rate=rate)
    raw = io.BytesIO()
    with av.open(str(path), mode="r", metadata_errors="ignore") as c:
        frames = c.decode(audio=0)
        fifo = av.audio.fifo.AudioFifo()
        def grouped():
            for f in frames:
                f.pts = None
                fifo.write(f)
                if fifo.samples >= 500000:
                    yield fifo.read()
            if fifo.samples > 0:
                yield fifo.read()
        for f in itertools.chain(grouped(), [None]):
            for out in resampler.resample(f):
                raw.write(out.to_ndarray())
    return np.frombuffer(raw.getbuffer(), dtype=np.int16).copy()

def main():
    audio, clips_json, out = (Path(a) for a in sys.argv[1:4])
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name, c in json.loads(clips_json.read_text()).items():
        s16 = decode(audio / c["file"])
        f32 = (s16.astype(np.float32) / 32768.0).astype("<f4")
        if hashlib.sha256(f32.tobytes()).hexdigest() != c["sha256_16k"]:
            print(f"{name}: the 16 kHz array differs from the references' one", file=sys.stderr)
            bad += 1
            continue
        s16.astype("<i2").tofile(out / f"{name}.s16")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
