#!/usr/bin/env python3
"""Seed corpora of the fuzz targets that come from real files.

  fuzz/make-seeds.py committed   real model headers, texts and templates
                                 -> fuzz/corpus/seed-<target>/ (committed)
  fuzz/make-seeds.py generated   HF directories of tests/fixtures/hf
                                 -> fuzz/corpus/gen-hf_dir/ (not committed)

The header seeds are each real GGUF file's header and tensor table with
every metadata array cut to its first 256 entries (a vocabulary of 49152
strings would make every input megabytes), without the tensor data; the
whisper.cpp header keeps the hyperparameters, mel filters and 256 words.
Models come from scripts/fetch-models.sh (or $COMBS_MODELS).
"""
import json
import os
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))
SEP = b"\xff\x00\xff\x00"
KEEP = 256
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_header(data: bytes) -> bytes:
    """The header and tensor table of a GGUF file, arrays cut to KEEP entries."""
    out = bytearray(data[:8])
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    out += struct.pack("<QQ", n_tensors, n_kv)
    off = 24

    def string(off):
        (n,) = struct.unpack_from("<Q", data, off)
        return off + 8 + n

    def value(t, off):
        if t == 8:
            return string(off)
        if t == 9:
            at, n = struct.unpack_from("<IQ", data, off)
            off += 12
            for _ in range(n):
                off = value(at, off)
            return off
        return off + SCALAR[t]

    for _ in range(n_kv):
        key_end = string(off)
        (t,) = struct.unpack_from("<I", data, key_end)
        end = value(t, key_end + 4)
        if t == 9:
            at, n = struct.unpack_from("<IQ", data, key_end + 4)
            keep = min(n, KEEP)
            body = key_end + 16
            cut = body
            for _ in range(keep):
                cut = value(at, cut)
            out += data[off:key_end + 4] + struct.pack("<IQ", at, keep) + data[body:cut]
        else:
            out += data[off:end]
        off = end
    for _ in range(n_tensors):
        end = string(off)
        (nd,) = struct.unpack_from("<I", data, end)
        end += 4 + 8 * nd + 4 + 8
        out += data[off:end]
        off = end
    return bytes(out)


def whisper_header(data: bytes) -> bytes:
    """Magic, hyperparameters, mel filters and the first KEEP words."""
    off = 4 + 11 * 4
    n_mel, n_fft = struct.unpack_from("<ii", data, off)
    off += 8 + 4 * n_mel * n_fft
    out = bytearray(data[:off])
    (n_words,) = struct.unpack_from("<i", data, off)
    off += 4
    keep = min(n_words, KEEP)
    out += struct.pack("<i", keep)
    for _ in range(keep):
        (n,) = struct.unpack_from("<I", data, off)
        out += data[off:off + 4 + n]
        off += 4 + n
    return bytes(out)


def put(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def committed() -> None:
    for f in sorted(MODELS.glob("*.gguf")) + sorted(MODELS.glob("*/*.gguf")):
        head = gguf_header(f.read_bytes()[: 16 << 20])
        put("seed-gguf_parse", f.stem + ".header", head)
    for f in sorted(MODELS.glob("ggml-*.bin")):
        put("seed-whisper_load", f.stem + ".header", whisper_header(f.read_bytes()[: 4 << 20]))
    tok = ROOT / "tests/fixtures/tokenizer"
    texts = [c["input"] for c in json.loads((tok / "smollm2.json").read_text())["cases"]]
    v = json.loads((tok / "variants.json").read_text())
    texts += list(v.get("texts", [])) + list(v.get("spm_texts", []))
    seen = set()
    for i, t in enumerate(texts):
        if t in seen or len(t.encode()) > 4096:
            continue
        seen.add(t)
        # Flag bit 0 picks the vocabulary (BPE, SPM); 2 and 4 the specials.
        for flags in (0, 1, 6, 7):
            put("seed-tokenize", f"text{i:03d}-{flags}", bytes([flags]) + t.encode())
    templates = set()
    for name in ("chat_smollm2.json", "chat_gemma3.json"):
        d = json.loads((tok / name).read_text())
        for k in ("model_template", "template_used"):
            if d.get(k):
                templates.add(d[k])
        convs = d["conversations"]
    for f in sorted((ROOT / "tests/fixtures/hf").glob("*/tokenizer_config.json")):
        t = json.loads(f.read_text()).get("chat_template")
        if isinstance(t, str):
            templates.add(t)
    for f in sorted((ROOT / "tests/fixtures/hf").glob("*/chat_template.jinja")):
        templates.add(f.read_text())
    for i, t in enumerate(sorted(templates)):
        msgs = [b"You are helpful.", b"Hello <|im_start|> there", b"Hi! How can I help?"]
        put("seed-chat_template", f"template{i:02d}", SEP.join([t.encode()] + msgs))


def generated() -> None:
    for d in sorted((ROOT / "tests/fixtures/hf").iterdir()):
        parts = [d / "config.json", d / "tokenizer.json", d / "model.safetensors"]
        if all(p.exists() for p in parts):
            put("gen-hf_dir", d.name, SEP.join(p.read_bytes() for p in parts))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "committed":
        committed()
    elif mode == "generated":
        generated()
    else:
        sys.exit(__doc__)
