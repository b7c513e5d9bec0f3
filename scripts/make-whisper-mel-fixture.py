#!/usr/bin/env python3
"""Writes tests/fixtures/whisper/mel_filters.json: the mel filterbanks of
openai-whisper's `whisper/assets/mel_filters.npz` (PyPI `openai-whisper`, the
sdist), as the nonzero entries of each bank, for the test that compares
combs' computed filterbank with them (`formats::whisper_bin::mel_filters`);
and tests/fixtures/whisper/tiktoken_vocab.json: the vocabulary section
whisper.cpp's `convert-pt-to-ggml.py` writes from `gpt2.tiktoken` and
`multilingual.tiktoken` (token count, sha256 of the u32-length-prefixed token
bytes in rank order), for the test of the converted files' vocabularies.

    python3 scripts/make-whisper-mel-fixture.py [OUT.json]

Needs only python3 with pip: the npz is a zip of .npy files, read here without numpy.
"""
import io, json, os, struct, subprocess, sys, tarfile, tempfile, zipfile, ast, hashlib

PKG = "openai-whisper==20250625"
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "tests", "fixtures", "whisper", "mel_filters.json")

with tempfile.TemporaryDirectory() as d:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                    "-d", d, PKG], check=True)
    sdist = [f for f in os.listdir(d) if f.endswith(".tar.gz")][0]
    with tarfile.open(os.path.join(d, sdist)) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("whisper/assets/mel_filters.npz"))
        npz = t.extractfile(member).read()
        tiktoken = {}
        for kind in ("gpt2", "multilingual"):
            m = next(m for m in t.getmembers() if m.name.endswith(f"whisper/assets/{kind}.tiktoken"))
            tiktoken[kind] = t.extractfile(m).read()

def read_npy(b):
    assert b[:6] == b"\x93NUMPY", "not an npy file"
    major = b[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", b, 8); start = 10
    else:
        (hlen,) = struct.unpack_from("<I", b, 8); start = 12
    header = ast.literal_eval(b[start:start + hlen].decode("latin1"))
    assert header["descr"] == "<f4" and not header["fortran_order"], header
    rows, cols = header["shape"]
    data = struct.unpack_from("<%df" % (rows * cols), b, start + hlen)
    return rows, cols, data

banks = {}
with zipfile.ZipFile(io.BytesIO(npz)) as z:
    for name in sorted(z.namelist()):
        rows, cols, data = read_npy(z.read(name))
        raw = struct.pack("<%df" % len(data), *data)
        banks[name[:-4]] = {
            "rows": rows,
            "cols": cols,
            "sha256_f32le": hashlib.sha256(raw).hexdigest(),
            # [row, col, value] for every nonzero weight; repr of the f32 as a
            # double is exact, so the values round-trip bit for bit
            "nonzero": [[i // cols, i % cols, v] for i, v in enumerate(data) if v != 0.0],
        }

fixture = {"source": f"{PKG} whisper/assets/mel_filters.npz (sha256 {hashlib.sha256(npz).hexdigest()})",
           "made_by": "scripts/make-whisper-mel-fixture.py", "banks": banks}
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    json.dump(fixture, f, separators=(",", ":"))
    f.write("\n")
print(f"wrote {out}: " + ", ".join(f"{k} {v['rows']}x{v['cols']} ({len(v['nonzero'])} nonzero)" for k, v in banks.items()))

import base64
vocab = {}
for kind, contents in tiktoken.items():
    tokens = [base64.b64decode(tok) for tok, rank in (line.split() for line in contents.splitlines() if line)]
    section = b"".join(struct.pack("<I", len(tok)) + tok for tok in tokens)
    vocab[kind] = {"n_tokens": len(tokens), "sha256_len_prefixed": hashlib.sha256(section).hexdigest()}
vout = os.path.join(os.path.dirname(out), "tiktoken_vocab.json")
with open(vout, "w") as f:
    json.dump({"source": f"{PKG} whisper/assets/*.tiktoken", "made_by": "scripts/make-whisper-mel-fixture.py",
               "vocab": vocab}, f, indent=1)
    f.write("\n")
print(f"wrote {vout}: " + ", ".join(f"{k} {v['n_tokens']} tokens" for k, v in vocab.items()))
