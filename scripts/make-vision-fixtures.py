#!/usr/bin/env python3
"""Writes tests/fixtures/vision/idefics3_preprocess_pillow<MAJOR>.json:
transformers' Idefics3 image processor (PIL backend,
do_image_splitting=True) and PIL's LANCZOS resize on synthetic images, for
tests/vision_preprocess.rs. Run it once with Pillow 11.3 (the SmolVLM
references' pin, whose pass order mtmd shares) and once with Pillow 13
(which runs the vertical pass first on tall downscales).

The input images are not stored: both sides generate them from
(width, height, seed) with the integer formula in `pattern` (a wrapping
diagonal gradient plus hash noise, so the resize filter sees edges and
high frequencies); the fixture records the input's SHA-256 so the Rust
test knows it rebuilt the same pixels.

Per case: the tile grid, the sizes after each resize, transformers' prompt
text for the image (Idefics3Processor.replace_image_token, image_seq_len
64), and per tile (grid row-major, then the global view): the SHA-256 of
the tile's uint8 pixels (planar CHW, recovered from the normalized floats
and checked to normalize back bit for bit), the f64 sum of its normalized
floats, and values at seeded positions.

Run with venvs holding numpy, pillow and transformers (no torch needed):
    ~/.cache/combs/vlm-refs/venv/bin/python scripts/make-vision-fixtures.py
        (scripts/setup-vlm-refs.sh: transformers 5.17, Pillow 11.3)
    python3 -m venv ~/.cache/combs/vlm-pre/venv
    ~/.cache/combs/vlm-pre/venv/bin/pip install numpy pillow==13.0.0 transformers
    ~/.cache/combs/vlm-pre/venv/bin/python scripts/make-vision-fixtures.py
"""

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import PIL
import transformers
from PIL import Image
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

OUT = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "vision"
    / f"idefics3_preprocess_pillow{PIL.__version__.split('.')[0]}.json"
)
SAMPLES_PER_TILE = 48
IMAGE_SEQ_LEN = 64
MASK = 0xFFFFFFFF

# (name, width, height, seed, longest_edge, tile_size); SmolVLM-256M is 2048 / 512.
CASES = [
    ("one_tile", 400, 300, 1, 512, 512),
    ("grid_2x3", 900, 600, 2, 1536, 512),
    ("grid_4x4", 1000, 1000, 3, 2048, 512),
    ("tall", 300, 1100, 4, 2048, 512),
    ("wide", 1600, 333, 5, 2048, 512),
    ("1024x768", 1024, 768, 6, 2048, 512),
    ("2048x1024_no_resize", 2048, 1024, 7, 2048, 512),
    ("tiny_upscaled", 37, 23, 8, 2048, 512),
    ("extreme_wide", 3000, 20, 9, 2048, 512),
    ("idefics3_364", 700, 500, 10, 1456, 364),
]

# Direct PIL resizes: (src_w, src_h, seed, dst_w, dst_h).
RESIZES = [
    (97, 61, 11, 13, 200),
    (64, 64, 12, 64, 17),
    (64, 64, 13, 5, 64),
    (300, 200, 14, 1000, 999),
    (2048, 1536, 15, 512, 512),
    (1, 1, 16, 7, 3),
    (1000, 3, 17, 1, 1),
    (120, 400, 18, 100, 50),  # height shrinks most: Pillow runs the vertical pass first
    (400, 120, 19, 50, 100),
]


def pattern(w, h, seed):
    """RGB8 (h, w, 3): diagonal gradient wrapping mod 256, channels offset by
    85, plus hash noise in [-32, 31]; u32 wrapping arithmetic throughout."""
    x = np.arange(w, dtype=np.uint64)[None, :, None]
    y = np.arange(h, dtype=np.uint64)[:, None, None]
    c = np.arange(3, dtype=np.uint64)[None, None, :]
    base = ((x + 2 * y) * 256 // (w + 2 * h) + 85 * c) % 256
    hsh = (x * 374761393 + y * 668265263 + c * 2246822519 + seed * 3266489917) & MASK
    hsh = ((hsh ^ (hsh >> 13)) * 1274126177) & MASK
    hsh = hsh ^ (hsh >> 16)
    noise = (hsh & 63).astype(np.int64) - 32
    return np.clip(base.astype(np.int64) + noise, 0, 255).astype(np.uint8)


def sha(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def to_uint8(tile, mean, std):
    """The uint8 pixels a normalized float32 CHW tile came from, checked by
    normalizing them again the way transformers does."""
    u = np.rint((tile.astype(np.float64) * np.array(std)[:, None, None] + np.array(mean)[:, None, None]) * 255.0)
    u = u.astype(np.uint8)
    again = u.astype(np.float64) * (1 / 255)
    again = again.astype(np.float32)
    m = np.array(mean, dtype=np.float32)
    s = np.array(std, dtype=np.float32)
    again = ((again.T - m) / s).T
    assert np.array_equal(again, tile), "normalization does not invert exactly"
    return u


def run_case(name, w, h, seed, longest_edge, tile):
    mean, std = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]
    proc = Idefics3ImageProcessorPil(
        do_image_splitting=True,
        size={"longest_edge": longest_edge},
        max_image_size={"longest_edge": tile},
        image_mean=mean,
        image_std=std,
        resample=Image.Resampling.LANCZOS,
        do_pad=False,
    )
    rgb = pattern(w, h, seed)
    out = proc(images=[[Image.fromarray(rgb)]], return_row_col_info=True)
    tiles = out["pixel_values"][0]
    rows, cols = out["rows"][0][0], out["cols"][0][0]
    rng = np.random.default_rng(1000 + seed)
    tiles_out = []
    for t in tiles:
        t = np.asarray(t, dtype=np.float32)
        assert t.shape == (3, tile, tile), t.shape
        flat = t.reshape(-1)
        idx = np.sort(rng.choice(flat.size, SAMPLES_PER_TILE, replace=False))
        tiles_out.append(
            {
                "sha256_u8": sha(to_uint8(t, mean, std)),
                "sum": float(flat.astype(np.float64).sum()),
                "samples": [[int(i), float(flat[i])] for i in idx],
            }
        )
    ns = types.SimpleNamespace(
        fake_image_token="<fake_token_around_image>",
        global_image_tag="<global-img>",
        image_token="<image>",
        image_seq_len=IMAGE_SEQ_LEN,
    )
    prompt = Idefics3Processor.replace_image_token(ns, {"rows": [[rows]], "cols": [[cols]]}, 0)
    return {
        "name": name,
        "width": w,
        "height": h,
        "seed": seed,
        "input_sha256": sha(rgb),
        "longest_edge": longest_edge,
        "tile_size": tile,
        "mean": mean,
        "std": std,
        "rows": int(rows),
        "cols": int(cols),
        "prompt": prompt,
        "tiles": tiles_out,
    }


def run_resize(sw, sh, seed, dw, dh):
    src = pattern(sw, sh, seed)
    dst = np.asarray(Image.fromarray(src).resize((dw, dh), resample=Image.Resampling.LANCZOS, reducing_gap=None))
    return {"src": [sw, sh, seed], "input_sha256": sha(src), "dst": [dw, dh], "sha256": sha(dst)}


def main():
    doc = {
        "generator": "scripts/make-vision-fixtures.py",
        "transformers": transformers.__version__,
        "pillow": PIL.__version__,
        "numpy": np.__version__,
        "image_seq_len": IMAGE_SEQ_LEN,
        "cases": [run_case(*c) for c in CASES],
        "resizes": [run_resize(*r) for r in RESIZES],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    for c in doc["cases"]:
        print(f"{c['name']}: {c['width']}x{c['height']} -> {c['rows']}x{c['cols']} + global ({len(c['tiles'])} tiles)", file=sys.stderr)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
