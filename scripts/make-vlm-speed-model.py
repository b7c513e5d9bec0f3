#!/usr/bin/env python3
"""A SmolVLM-256M-sized llama.cpp GGUF pair with random weights, for speed
runs (bench/vs-mtmd.py), written with only numpy and llama.cpp's gguf-py:

    make-vlm-speed-model.py --out DIR [--only text|mmproj] [--seed N]
                            [--fixtures tests/fixtures/vlm] [--compare REFDIR]

writes DIR/smolvlm-256m-random.gguf (text, ~313 MiB) and
DIR/mmproj-smolvlm-256m-random.gguf (projector, ~181 MiB) and prints their
sizes and sha256s. Seeded (the same seed gives the same bytes); ~15 s on two
cores here (8.5 s writing, the rest hashing), under 1 GiB of memory.

All metadata (tokenizer: SmolLM2's vocabulary and merges plus SmolVLM's added
tokens; chat template; every hyperparameter key and its GGUF type) is copied
from the tiny fixture pair that llama.cpp's converter made,
tests/fixtures/vlm/{smolvlm-tiny.gguf,mmproj-smolvlm-tiny.gguf}
(scripts/make-vlm-fixtures.py), and only the dimensions are changed to
SmolVLM-256M's:
  vision (SigLIP): n_embd 768, 12 blocks, 12 heads, ffn 3072, patch 16,
    image 512, preproc_image_size 2048, scale factor 4 (64 tokens per tile),
    projection to the text width 576;
  text (SmolLM2-135M, llama): n_embd 576, 30 blocks, 9 heads, 3 KV heads
    (head dim 64), ffn 1536, vocab 49280, context 8192, rope base 1e5,
    untied output.weight.
Tensor names, types (F16 matrices, F32 norms/biases/patch and position
embeddings), shapes and order are those llama.cpp's convert_hf_to_gguf.py
writes for the HF model (blocks in its lexical order 0, 1, 10, 11, 2, ...):
`--compare DIR` checks them against a pair the converter made
(make-vlm-fixtures.py stage `speed`, ~/.cache/combs/models/smolvlm-256m-random).
Values: matrices ~ N(0, 1/fan_in), token and position embeddings
~ N(0, 0.5^2), norm weights ~ 1 + N(0, 0.25^2), biases ~ N(0, 0.1^2) (the
recipe of make-vlm-fixtures.py), each tensor from its own stream seeded by
(seed, crc32(name)), so activations stay O(1) through all layers.
The text is random: only speed means anything on this pair.

gguf-py: llama.cpp's gguf-py/gguf package (the copy vendored in the
llama-cpp-python sdist, ~/.cache/combs/tools/src/llama_cpp_python-0.3.36/
vendor/llama.cpp/gguf-py; 0.8 MB); its PyYAML import (only for model cards)
is stubbed when PyYAML is missing. Here: PYTHONPATH=<that gguf-py> and a
python with numpy (~/.cache/combs/vbench-venv/bin/python).

On the GPU machine (the `run` tool carries the work tree plus at most 64 MiB
of ignored paths, so the ~500 MiB pair is made there, not carried). Its
python3 (3.12) already has numpy (and PyYAML): only gguf-py travels. Once,
here, in the repo root (.gguf-py/ is in .gitignore; 0.8 MB):

    mkdir -p .gguf-py
    cp -r ~/.cache/combs/tools/src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py/gguf .gguf-py/

then carry ".gguf-py" (with ".whl" and the combs binary for bench/vs-mtmd.py,
whose docstring has the whole run) and on the device:

    PYTHONPATH=.gguf-py python3 scripts/make-vlm-speed-model.py --out /tmp/vlm --no-sha

(seconds there; the tiny pair comes with the work tree under
tests/fixtures/vlm/). Should numpy ever be missing there, carry a wheel:
`pip download numpy --only-binary=:all: --python-version 3.12 --platform
manylinux2014_x86_64 -d .whl-numpy` here (~16 MB, also ignored), and
`pip install -q --no-deps --no-index --target /tmp/np .whl-numpy/numpy-*.whl`
plus PYTHONPATH=/tmp/np:.gguf-py there.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
import types
import zlib
from pathlib import Path

import numpy as np

try:
    import yaml  # noqa: F401  (gguf-py's metadata module imports it)
except ImportError:
    sys.modules["yaml"] = types.ModuleType("yaml")
import gguf  # noqa: E402

TEXT_NAME = "smolvlm-256m-random.gguf"
MMPROJ_NAME = "mmproj-smolvlm-256m-random.gguf"
TINY_TEXT = "smolvlm-tiny.gguf"
TINY_MMPROJ = "mmproj-smolvlm-tiny.gguf"

# SmolVLM-256M's geometry (HF config: SigLIP vision_config + SmolLM2-135M text_config)
TEXT_DIMS = dict(n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=49280, n_ctx=8192,
                 rope_base=100000.0)
VISION_DIMS = dict(n_embd=768, n_layer=12, n_head=12, n_ff=3072, patch=16, image=512, scale=4, n_embd_text=576)


def text_dims_of(r: gguf.GGUFReader) -> dict:
    f = lambda k: r.fields[k].contents()  # noqa: E731
    return dict(n_embd=f("llama.embedding_length"), n_layer=f("llama.block_count"),
                n_head=f("llama.attention.head_count"), n_head_kv=f("llama.attention.head_count_kv"),
                n_ff=f("llama.feed_forward_length"), n_vocab=len(r.fields["tokenizer.ggml.tokens"].data),
                n_ctx=f("llama.context_length"), rope_base=f("llama.rope.freq_base"))


def vision_dims_of(r: gguf.GGUFReader) -> dict:
    f = lambda k: r.fields[k].contents()  # noqa: E731
    return dict(n_embd=f("clip.vision.embedding_length"), n_layer=f("clip.vision.block_count"),
                n_head=f("clip.vision.attention.head_count"), n_ff=f("clip.vision.feed_forward_length"),
                patch=f("clip.vision.patch_size"), image=f("clip.vision.image_size"),
                scale=f("clip.vision.projector.scale_factor"), n_embd_text=f("clip.vision.projection_dim"))


def text_kv(d: dict) -> dict:
    hd = d["n_embd"] // d["n_head"]
    return {"llama.block_count": d["n_layer"], "llama.context_length": d["n_ctx"],
            "llama.embedding_length": d["n_embd"], "llama.feed_forward_length": d["n_ff"],
            "llama.attention.head_count": d["n_head"], "llama.attention.head_count_kv": d["n_head_kv"],
            "llama.attention.key_length": hd, "llama.attention.value_length": hd,
            "llama.rope.dimension_count": hd, "llama.rope.freq_base": d["rope_base"],
            "llama.vocab_size": d["n_vocab"]}


def vision_kv(d: dict) -> dict:
    return {"clip.vision.embedding_length": d["n_embd"], "clip.vision.block_count": d["n_layer"],
            "clip.vision.attention.head_count": d["n_head"], "clip.vision.feed_forward_length": d["n_ff"],
            "clip.vision.patch_size": d["patch"], "clip.vision.image_size": d["image"],
            "clip.vision.projector.scale_factor": d["scale"], "clip.vision.projection_dim": d["n_embd_text"]}


def text_shape(name: str, d: dict) -> list[int]:
    """GGUF shape (ne0 first) of a text tensor."""
    e, f, v = d["n_embd"], d["n_ff"], d["n_vocab"]
    kv = d["n_head_kv"] * (e // d["n_head"])
    suffix = re.sub(r"^blk\.\d+\.", "", name)
    table = {"output.weight": [e, v], "token_embd.weight": [e, v], "output_norm.weight": [e],
             "attn_norm.weight": [e], "ffn_norm.weight": [e], "ffn_down.weight": [f, e],
             "ffn_gate.weight": [e, f], "ffn_up.weight": [e, f], "attn_k.weight": [e, kv],
             "attn_v.weight": [e, kv], "attn_q.weight": [e, e], "attn_output.weight": [e, e]}
    return table[suffix]


def vision_shape(name: str, d: dict) -> list[int]:
    """GGUF shape (ne0 first) of a projector tensor."""
    e, f, p = d["n_embd"], d["n_ff"], d["patch"]
    suffix = re.sub(r"^v\.blk\.\d+\.", "", name)
    if suffix.endswith(".bias"):
        return [f] if suffix == "ffn_up.bias" else [e]
    table = {"mm.model.fc.weight": [e * d["scale"] ** 2, d["n_embd_text"]],
             "v.patch_embd.weight": [p, p, 3, e], "v.position_embd.weight": [e, (d["image"] // p) ** 2],
             "v.post_ln.weight": [e], "ln1.weight": [e], "ln2.weight": [e], "ffn_up.weight": [e, f],
             "ffn_down.weight": [f, e], "attn_q.weight": [e, e], "attn_k.weight": [e, e],
             "attn_v.weight": [e, e], "attn_out.weight": [e, e]}
    return table[suffix]


def tensor_plan(tiny: gguf.GGUFReader, n_layer: int, shape_of, dims: dict, tiny_dims: dict):
    """(name, GGUF shape, type) for the big model: the tiny file's tensors in
    its order, its block 0 pattern repeated for n_layer blocks in the
    converter's lexical block order; the shape formulas are first checked
    against the tiny file's own shapes."""
    blk = re.compile(r"^((?:v\.)?blk\.)(\d+)\.(.*)$")
    head, per_block, tail, prefix = [], [], [], None
    for t in tiny.tensors:
        shape, typ = [int(x) for x in t.shape], t.tensor_type
        want = shape_of(t.name, tiny_dims)
        if want != shape:
            raise SystemExit(f"shape formula for {t.name}: {want}, the tiny file has {shape}")
        m = blk.match(t.name)
        if m:
            prefix = m.group(1)
            if m.group(2) == "0":
                per_block.append((m.group(3), typ))
        elif prefix is None:
            head.append((t.name, typ))
        else:
            tail.append((t.name, typ))
    names = [(n, ty) for n, ty in head]
    for i in sorted(range(n_layer), key=str):
        names += [(f"{prefix}{i}.{s}", ty) for s, ty in per_block]
    names += tail
    return [(n, shape_of(n, dims), ty) for n, ty in names]


def values(name: str, shape: list[int], typ, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    n = int(np.prod(shape))
    if name.endswith(".bias"):
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
    elif name in ("token_embd.weight", "v.position_embd.weight"):
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.5)
    elif len(shape) == 1:  # norm weights
        x = np.float32(1.0) + rng.standard_normal(n, dtype=np.float32) * np.float32(0.25)
    else:  # matrices: fan_in = all but the last GGUF dim (ne0, or 16*16*3 for the patch conv)
        fan_in = int(np.prod(shape[:-1]))
        x = rng.standard_normal(n, dtype=np.float32) * np.float32(1.0 / np.sqrt(fan_in))
    dt = {gguf.GGMLQuantizationType.F16: np.float16, gguf.GGMLQuantizationType.F32: np.float32}[typ]
    return x.astype(dt, copy=False).reshape(list(reversed(shape)))


def copy_kv(w: gguf.GGUFWriter, tiny: gguf.GGUFReader, over: dict) -> None:
    missing = set(over) - set(tiny.fields)
    if missing:
        raise SystemExit(f"keys not in the tiny file: {sorted(missing)}")
    for key, f in tiny.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer adds these
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = over.get(key, f.contents())
        w.add_key_value(key, val, vtype, sub)


def write(path: Path, tiny_path: Path, kind: str, seed: int) -> None:
    tiny = gguf.GGUFReader(tiny_path)
    arch = tiny.fields["general.architecture"].contents()
    if kind == "text":
        dims, tiny_dims, shape_of = TEXT_DIMS, text_dims_of(tiny), text_shape
        over = text_kv(dims)
    else:
        dims, tiny_dims, shape_of = VISION_DIMS, vision_dims_of(tiny), vision_shape
        over = vision_kv(dims)
    plan = tensor_plan(tiny, dims["n_layer"], shape_of, dims, tiny_dims)
    n_params = sum(int(np.prod(s)) for _, s, _ in plan)
    over["general.name"] = "SmolVLM-256M random"
    over["general.size_label"] = gguf.size_label(n_params, 0, 0, 0)
    w = gguf.GGUFWriter(path, arch)
    copy_kv(w, tiny, over)
    for name, shape, typ in plan:
        dt = np.float16 if typ == gguf.GGMLQuantizationType.F16 else np.float32
        w.add_tensor_info(name, list(reversed(shape)), np.dtype(dt), int(np.prod(shape)) * np.dtype(dt).itemsize)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, typ in plan:
        w.write_tensor_data(values(name, shape, typ, seed))
    w.close()


def table(path: Path) -> list[tuple[str, str, tuple[int, ...]]]:
    r = gguf.GGUFReader(path)
    return [(t.name, t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in r.tensors]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for the pair")
    ap.add_argument("--only", choices=("text", "mmproj"), help="write just one of the two files")
    ap.add_argument("--seed", type=int, default=1802)
    ap.add_argument("--fixtures", default="tests/fixtures/vlm", help="where the tiny pair is")
    ap.add_argument("--compare", help="a directory with the converter's pair: check names/types/shapes/order")
    ap.add_argument("--no-sha", action="store_true", help="skip the sha256s")
    a = ap.parse_args()
    out, fx = Path(a.out), Path(a.fixtures)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [("text", TEXT_NAME, TINY_TEXT), ("mmproj", MMPROJ_NAME, TINY_MMPROJ)]
    bad = 0
    for kind, name, tiny in jobs:
        if a.only and a.only != kind:
            continue
        t0 = time.perf_counter()
        write(out / name, fx / tiny, kind, a.seed)
        dt = time.perf_counter() - t0
        digest = "" if a.no_sha else sha256(out / name)
        print(f"{out / name}: {(out / name).stat().st_size} bytes in {dt:.1f} s  sha256 {digest}")
        if a.compare:
            ref = Path(a.compare) / name
            mine, theirs = table(out / name), table(ref)
            if mine == theirs:
                print(f"  tensor table equals {ref} ({len(mine)} tensors, same order)")
            else:
                bad += 1
                print(f"  tensor table DIFFERS from {ref}:")
                for x in sorted(set(mine) ^ set(theirs)):
                    print("   ", "mine " if x in mine else "ref  ", x)
                if set(mine) == set(theirs):
                    print("    (same set, different order)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
