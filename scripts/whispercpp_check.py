#!/usr/bin/env python3
"""Cross-checks whisper.cpp model files written by `combs convert` in
whisper.cpp itself (PyPI `pywhispercpp`, which bundles whisper.cpp for the
CPU): each file must load, and transcribe short espeak-ng clips to sensible
text. Writes what whisper.cpp said as a fixture
(tests/fixtures/whisper/whispercpp_transcripts.json) for the test that combs
transcribes the same files the same way.

    scripts/whispercpp_check.py [--models DIR] [--write-fixture] [--make-clips] [FILE.bin ...]

Files default to the four scripts/fetch-models.sh --whisper makes, in
${COMBS_MODELS:-~/.cache/combs/models}. The clips are committed in
tests/fixtures/whisper/ (16 kHz mono 16-bit WAV); --make-clips remakes them
with Debian's espeak-ng and sox (`apt-get install espeak-ng sox`), whose
output may differ between versions. The script runs itself in a venv under
~/.cache/combs/whispercpp/venv (created on first use with
pywhispercpp==1.5.1 and numpy). Exits 1 when a file fails to load or a
transcript shares under half its words with the spoken sentence.
"""
import argparse, hashlib, json, os, re, subprocess, sys, wave

PYWHISPERCPP = "pywhispercpp==1.5.1"
VENV = os.path.expanduser("~/.cache/combs/whispercpp/venv")
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "whisper")
CLIPS = {
    "espeak_fox_16k.wav": "The quick brown fox jumps over the lazy dog.",
    "espeak_weather_16k.wav": "Tomorrow the weather will be sunny with a light breeze from the west.",
}
MODELS = ["ggml-tiny.en.bin", "ggml-tiny.en-q8_0.bin", "ggml-base.bin", "ggml-base-q8_0.bin"]
# Decoding as whisper.cpp's defaults have it (greedy, temperature fallback), English, no prompt.
PARAMS = dict(language="en", n_threads=2, no_context=True, print_progress=False)


def in_venv():
    try:
        import pywhispercpp  # noqa: F401
        import numpy  # noqa: F401
        return True
    except ImportError:
        return False


if not in_venv():
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        print(f"[whispercpp_check] creating {VENV} with {PYWHISPERCPP}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        PYWHISPERCPP, "numpy"], check=True)
    if os.environ.get("COMBS_WHISPERCPP_VENV") == "1":
        sys.exit(f"pywhispercpp is not importable in {VENV}; remove it and rerun")
    os.environ["COMBS_WHISPERCPP_VENV"] = "1"
    os.execv(py, [py, __file__] + sys.argv[1:])

import numpy as np  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pywhispercpp.model import Model  # noqa: E402


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def make_clip(path, text):
    tmp = path + ".22k.wav"
    subprocess.run(["espeak-ng", "-w", tmp, text], check=True)
    subprocess.run(["sox", tmp, "-r", "16000", "-c", "1", "-b", "16", path], check=True)
    os.unlink(tmp)


def read_clip(path):
    with wave.open(path) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2, path
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def words(s):
    return re.findall(r"[a-z']+", s.lower())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument("--models", default=os.environ.get("COMBS_MODELS", os.path.expanduser("~/.cache/combs/models")))
    ap.add_argument("--write-fixture", action="store_true")
    ap.add_argument("--make-clips", action="store_true")
    args = ap.parse_args()
    files = args.files or [os.path.join(args.models, m) for m in MODELS]

    clips = {}
    for name, text in CLIPS.items():
        path = os.path.join(FIXTURES, name)
        if args.make_clips or not os.path.exists(path):
            make_clip(path, text)
        clips[name] = (path, text, read_clip(path))

    ok = True
    results = []
    for f in files:
        try:
            model = Model(f, redirect_whispercpp_logs_to=None, **PARAMS)
        except Exception as e:  # pywhispercpp raises on a file whisper.cpp refuses
            print(f"FAIL {f}: whisper.cpp did not load it: {e}")
            ok = False
            continue
        for name, (path, text, pcm) in clips.items():
            segs = model.transcribe(pcm)
            got = "".join(s.text for s in segs).strip()
            ref = set(words(text))
            share = len(ref & set(words(got))) / len(ref)
            status = "ok  " if share >= 0.5 else "FAIL"
            ok &= share >= 0.5
            print(f"{status} {os.path.basename(f):24} {name:24} {share:4.0%} {got!r}")
            results.append({
                "model": os.path.basename(f),
                "model_sha256": sha256(f),
                "clip": name,
                "text": got,
                # t0/t1 in whisper.cpp's units of 10 ms
                "segments": [[s.t0, s.t1, s.text] for s in segs],
            })
        del model

    if args.write_fixture:
        out = os.path.join(FIXTURES, "whispercpp_transcripts.json")
        fixture = {
            "made_by": "scripts/whispercpp_check.py --write-fixture",
            "whisper_cpp": f"pywhispercpp {version('pywhispercpp')} (bundled whisper.cpp, CPU)",
            "params": {**PARAMS, "strategy": "greedy (whisper.cpp defaults otherwise)"},
            "clips": {n: {"sha256": sha256(p), "spoken": t, "samples": int(len(a))} for n, (p, t, a) in clips.items()},
            "results": results,
        }
        with open(out, "w") as fh:
            json.dump(fixture, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
