#!/usr/bin/env python3
"""Small images in every format combs decodes beyond PNG and JPEG, and what
PIL's Image.open(...).convert("RGB") makes of each (what transformers'
processors do to an image file), under tests/fixtures/vision/formats/:

  <case>.<ext>   the file, written by Pillow from seeded random pixels
  <case>.rgb     PIL's RGB8 pixels of it, row-major
  cases.json     per case: file, width, height, PIL's mode after open, and
                 the largest difference the test allows (0: exact; lossy
                 WebP is decoded by another decoder than libwebp)

  PYTHONPATH=<dir with pillow 11.3> python3 scripts/make-image-format-fixtures.py

Pillow 11.3.0 (`pip install --target DIR pillow==11.3.0`, the version
scripts/setup-vlm-refs.sh pins). Re-running rewrites the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import PIL
from PIL import Image

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/vision/formats"
W, H = 23, 17


def noise(rng: random.Random, mode: str, w: int = W, h: int = H) -> Image.Image:
    bands = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    data = bytes(rng.randrange(256) for _ in range(w * h * bands))
    return Image.frombytes(mode, (w, h), data)


def paletted(rng: random.Random, colours: int) -> Image.Image:
    im = Image.new("P", (W, H))
    palette = [rng.randrange(256) for _ in range(3 * colours)]
    im.putpalette(palette)
    im.putdata([rng.randrange(colours) for _ in range(W * H)])
    return im


def bilevel(rng: random.Random) -> Image.Image:
    return noise(rng, "L").point(lambda v: 255 if v >= 128 else 0).convert("1")


def main() -> None:
    rng = random.Random(20261205)
    OUT.mkdir(parents=True, exist_ok=True)
    cases: dict[str, dict] = {}

    def add(name: str, ext: str, im: Image.Image, tol: int = 0, **save) -> None:
        path = OUT / f"{name}.{ext}"
        im.save(path, **save)
        with Image.open(path) as back:
            mode = back.mode
            rgb = back.convert("RGB")
        (OUT / f"{name}.rgb").write_bytes(rgb.tobytes())
        cases[name] = {
            "file": path.name,
            "width": rgb.width,
            "height": rgb.height,
            "mode": mode,
            "tolerance": tol,
        }

    add("webp_lossless_rgb", "webp", noise(rng, "RGB"), lossless=True)
    add("webp_lossless_rgba", "webp", noise(rng, "RGBA"), lossless=True, exact=True)
    # A smooth gradient: lossy coding of noise is all artefacts, and what is
    # compared is the decoders, not the encoder.
    grad = Image.new("RGB", (64, 48))
    grad.putdata([(4 * x, 5 * y, (2 * x + 3 * y) % 256) for y in range(48) for x in range(64)])
    add("webp_lossy_rgb", "webp", grad, tol=4, quality=90)
    add("gif_palette", "gif", paletted(rng, 200))
    add("gif_grey", "gif", noise(rng, "L"))
    # A transparent palette entry: PIL's convert("RGB") shows its colour.
    add("gif_transparent", "gif", paletted(rng, 16), transparency=3)
    # Animated: the first frame is the image.
    frames = [paletted(rng, 32) for _ in range(3)]
    add("gif_animated", "gif", frames[0], save_all=True, append_images=frames[1:], duration=100)
    add("bmp_rgb", "bmp", noise(rng, "RGB"))
    add("bmp_palette", "bmp", paletted(rng, 256))
    add("bmp_grey", "bmp", noise(rng, "L"))
    add("bmp_bilevel", "bmp", bilevel(rng))
    add("bmp_rgba", "bmp", noise(rng, "RGBA"))
    add("tiff_rgb", "tiff", noise(rng, "RGB"))
    add("tiff_rgb_lzw", "tiff", noise(rng, "RGB"), compression="tiff_lzw")
    add("tiff_rgb_deflate", "tiff", noise(rng, "RGB"), compression="tiff_adobe_deflate")
    add("tiff_rgb_packbits", "tiff", noise(rng, "RGB"), compression="packbits")
    add("tiff_grey", "tiff", noise(rng, "L"))
    add("tiff_rgba", "tiff", noise(rng, "RGBA"))
    add("tiff_palette", "tiff", paletted(rng, 64))
    add("ppm_rgb", "ppm", noise(rng, "RGB"))
    add("pgm_grey", "pgm", noise(rng, "L"))
    add("pbm_bilevel", "pbm", bilevel(rng))

    meta = {"pillow": PIL.__version__, "cases": cases}
    (OUT / "cases.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"{len(cases)} cases in {OUT}")


if __name__ == "__main__":
    main()
