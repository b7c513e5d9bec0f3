#!/usr/bin/env python3
"""Side-by-side speed of `combs transcribe` and whisper.cpp on the same
whisper.cpp model files and the same audio, in one run, on the GPU:

    bench/vs-whispercpp.py --combs BIN [--audio FILE.wav] [-r N] MODEL.bin...

whisper.cpp runs through the `cyllama-vulkan` wheel (whisper.cpp with ggml's
Vulkan backend; `PYTHONPATH` must reach it): the model loaded once, one
warm-up transcription, then N timed `whisper_full` calls, each timed around
the call, and whisper.cpp's own counters (`whisper_print_timings`) for the
encoder per window and the decoder per token. combs runs `combs transcribe`
N times (after one warm-up run) and reports what it prints: transcription
time without the model load, encoder ms per window, decoder ms per token.
Both decode greedily at temperature 0 without fallback, with timestamps,
in English, and without conditioning on previous text.
Prints one table with the ratios whisper.cpp / combs (above 1: combs is faster).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from array import array


def read_wav(path: str) -> array:
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1 or w.getframerate() != 16000:
            raise SystemExit(f"{path}: need 16 kHz mono 16-bit PCM")
        raw = w.readframes(w.getnframes())
    pcm = array("h")
    pcm.frombytes(raw)
    return array("f", (s / 32768.0 for s in pcm))


class CapturedStderr:
    """whisper.cpp prints its timings through its C logger on fd 2."""

    def __enter__(self):
        self.tmp = tempfile.TemporaryFile(mode="w+b")
        sys.stderr.flush()
        self.saved = os.dup(2)
        os.dup2(self.tmp.fileno(), 2)
        return self

    def __exit__(self, *exc):
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.tmp.seek(0)
        self.text = self.tmp.read().decode("utf-8", "replace")
        self.tmp.close()


def per_run(text: str, what: str) -> tuple[float, int] | None:
    m = re.search(rf"{what} time =\s*([\d.]+) ms /\s*(\d+) runs", text)
    return (float(m.group(1)), int(m.group(2))) if m else None


def whisper_cpp(model: str, pcm: array, reps: int) -> dict:
    import cyllama.whisper as wh

    wh.ggml_backend_load_all()
    ctx = wh.WhisperContext(model)
    params = wh.WhisperFullParams()
    params.language = "en"
    params.temperature = 0.0
    params.temperature_inc = 0.0
    params.no_context = True
    params.n_threads = 4
    params.print_progress = False
    params.print_realtime = False
    params.print_timestamps = False
    ctx.full(pcm, params)  # warm-up: pipelines, buffers
    times, text = [], ""
    ctx.reset_timings()
    for _ in range(reps):
        t = time.perf_counter()
        if ctx.full(pcm, params) != 0:
            raise SystemExit("whisper_full failed")
        times.append(time.perf_counter() - t)
    with CapturedStderr() as cap:
        ctx.print_timings()
    text = " ".join(ctx.full_get_segment_text(i).strip() for i in range(ctx.full_n_segments()))
    enc = per_run(cap.text, "encode")
    dec = [per_run(cap.text, k) for k in ("decode", "batchd")]
    dec_ms = sum(x[0] for x in dec if x)
    dec_n = sum(x[1] for x in dec if x)
    return {
        "total_s": statistics.median(times),
        "encode_ms": enc[0] / enc[1] if enc and enc[1] else float("nan"),
        "windows": enc[1] / reps if enc else float("nan"),
        "token_ms": dec_ms / dec_n if dec_n else float("nan"),
        "text": text,
        "timings": cap.text,
    }


SUMMARY = re.compile(
    r"encode (\d+) windows ([\d.]+) ms \(([\d.]+) ms/window\); decode (\d+) steps ([\d.]+) ms "
    r"\(([\d.]+) ms/token")
TOTAL = re.compile(r"transcribe ([\d.]+) s")


def combs(binary: str, model: str, audio: str, reps: int) -> dict:
    cmd = [binary, "transcribe", "-m", model, audio, "--language", "en", "--beam", "1",
           "--temperature-increment", "0", "--no-condition"]
    runs = []
    for i in range(reps + 1):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"combs failed: {out.stderr}")
        log = out.stdout + out.stderr
        s, t = SUMMARY.search(log), TOTAL.search(log)
        if not (s and t):
            raise SystemExit(f"combs printed no timings:\n{log}")
        if i:  # the first run warms the driver's pipeline cache
            runs.append((float(t.group(1)), float(s.group(3)), float(s.group(6)), int(s.group(1))))
    text = " ".join(re.sub(r"^\[[^]]*\]\s*", "", line).strip()
                    for line in out.stdout.splitlines() if line.startswith("["))
    return {
        "total_s": statistics.median(r[0] for r in runs),
        "encode_ms": statistics.median(r[1] for r in runs),
        "token_ms": statistics.median(r[2] for r in runs),
        "windows": runs[-1][3],
        "text": text,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--combs", required=True)
    ap.add_argument("--audio", default=os.path.expanduser("~/.cache/combs/audio/sample.wav"))
    ap.add_argument("-r", "--reps", type=int, default=5)
    a = ap.parse_args()
    pcm = read_wav(a.audio)
    print(f"audio {a.audio}: {len(pcm) / 16000:.2f} s; medians of {a.reps} runs after a warm-up")
    rows = []
    for m in a.models:
        ours = combs(a.combs, m, a.audio, a.reps)
        theirs = whisper_cpp(m, pcm, a.reps)
        rows.append((os.path.basename(m), ours, theirs))
        print(f"\n{os.path.basename(m)}\n  combs:       {ours['text']}\n  whisper.cpp: {theirs['text']}")
        print("  whisper.cpp timings:\n" + "\n".join(
            "    " + line for line in theirs["timings"].splitlines() if "time" in line))
    print()
    print("| model | end to end combs | whisper.cpp | ratio | encoder ms/window combs | whisper.cpp "
          "| ratio | decoder ms/token combs | whisper.cpp | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, o, t in rows:
        print(f"| {name} | {o['total_s']:.3f} s | {t['total_s']:.3f} s | {t['total_s'] / o['total_s']:.2f} "
              f"| {o['encode_ms']:.2f} | {t['encode_ms']:.2f} | {t['encode_ms'] / o['encode_ms']:.2f} "
              f"| {o['token_ms']:.2f} | {t['token_ms']:.2f} | {t['token_ms'] / o['token_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
