#!/usr/bin/env python3
"""Disassembles what NVIDIA's Vulkan driver compiled combs' kernels into.

On the GPU machine, `COMBS_PIPELINE_DUMP=DIR combs ...` writes each pipeline
the run creates as the driver's pipeline-cache data (`DIR/<kernel>-<spec>.bin`).
Bring DIR back and run here:

    scripts/sass.py DIR [--out OUT] [--grep NAME]

NVIDIA's driver (tested: 570-series on an H100) stores a pipeline as a
Vulkan cache header and zstd frames; one of them holds an `NVDANVVMNVuc`
container whose machine code starts at the offset and has the size given at
bytes 80 and 76 of it (+8). Each such program (or a plain cubin, where the
data holds ELF images) is written to OUT/<dump>.<n>.code and disassembled
with `nvdisasm -b SM90` (PyPI `nvidia-cuda-nvdisasm`, fetched into
~/.cache/combs/nvdisasm on first use; `zstandard` from PyPI likewise) to
OUT/<dump>.<n>.sass, each
instruction followed by its scheduling controls decoded from the encoding
(sm_70 and later): stall cycles, the scoreboard it sets when its result is
written (W) or its sources read (R), and the scoreboards it waits for (wait).
A load whose scoreboard the next products wait on is a load they do not
overlap. A summary line per kernel gives registers, instructions, loads and
the waits on them.
"""
import argparse
import pathlib
import re
import struct
import subprocess
import sys

CACHE = pathlib.Path.home() / ".cache" / "combs" / "nvdisasm"


def nvdisasm() -> pathlib.Path:
    found = list(CACHE.glob("**/bin/nvdisasm"))
    if found:
        return found[0]
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--index-url",
         "https://pypi.org/simple", "nvidia-cuda-nvdisasm", "-d", str(CACHE)],
        check=True)
    wheel = sorted(CACHE.glob("nvidia_cuda_nvdisasm-*.whl"))[-1]
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(wheel), str(CACHE)], check=True)
    found = list(CACHE.glob("**/bin/nvdisasm"))
    if not found:
        sys.exit(f"no nvdisasm in {wheel}")
    found[0].chmod(0o755)
    return found[0]


def zstd():
    try:
        import zstandard
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "zstandard"], check=True)
        import zstandard
    return zstandard


def nv_programs(data: bytes):
    """Yields the machine code of every `NVDANVVMNVuc` container in the zstd
    frames of NVIDIA pipeline-cache data."""
    z = zstd()
    i = data.find(b"\x28\xb5\x2f\xfd")
    while i >= 0:
        try:
            obj = z.ZstdDecompressor().decompressobj()
            out = obj.decompress(data[i:])
        except z.ZstdError:
            out = b""
        j = out.find(b"NVDANVVMNVuc")
        while j >= 0 and j + 84 <= len(out):
            size, off = struct.unpack_from("<II", out, j + 76)
            code = out[j + off + 8:j + off + 8 + size]
            if size and len(code) == size and size % 16 == 0:
                yield code
            j = out.find(b"NVDANVVMNVuc", j + 12)
        i = data.find(b"\x28\xb5\x2f\xfd", i + 4)


def elf_images(data: bytes):
    """Yields every 64-bit little-endian ELF image inside `data`, whole."""
    i = data.find(b"\x7fELF")
    while i >= 0:
        if i + 0x40 <= len(data) and data[i + 4] == 2 and data[i + 5] == 1:
            phoff, shoff = struct.unpack_from("<QQ", data, i + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, i + 0x36)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            if shentsize == 64 and i + end <= len(data):
                # Sections may lie past the header tables.
                for k in range(shnum):
                    at = i + shoff + k * shentsize
                    kind, = struct.unpack_from("<I", data, at + 4)
                    off, size = struct.unpack_from("<QQ", data, at + 0x18)
                    if kind != 8:  # SHT_NOBITS takes no room in the file
                        end = max(end, off + size)
                if i + end <= len(data):
                    yield data[i:i + end]
        i = data.find(b"\x7fELF", i + 4)


INSN = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);\s*/\* 0x([0-9a-f]{16}) \*/")
CTRL = re.compile(r"\s*/\* 0x([0-9a-f]{16}) \*/\s*$")


def annotate(text: str):
    """`nvdisasm -hex` lines -> (offset, instruction, stall, W, R, wait set)."""
    pend = None
    for ln in text.splitlines():
        m = INSN.match(ln)
        if m:
            pend = (m.group(1), m.group(2).strip())
            continue
        m = CTRL.match(ln)
        if m and pend:
            c = int(m.group(1), 16) >> 41
            wb, rb = (c >> 5) & 7, (c >> 8) & 7
            waits = {i for i in range(6) if (c >> 11) >> i & 1}
            yield pend[0], pend[1], c & 15, (None if wb == 7 else wb), (None if rb == 7 else rb), waits
            pend = None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--out", default=None)
    ap.add_argument("--grep", default="", help="only dumps whose name contains this")
    a = ap.parse_args()
    src = pathlib.Path(a.dir)
    out = pathlib.Path(a.out or (str(src) + "-sass"))
    out.mkdir(parents=True, exist_ok=True)
    tool = nvdisasm()
    for f in sorted(src.iterdir()):
        if a.grep not in f.name or f.is_dir():
            continue
        data = f.read_bytes()
        images = [(img, True) for img in elf_images(data)]
        images += [(code, False) for code in nv_programs(data)]
        if not images:
            print(f"{f.name}: no machine code found in {f.stat().st_size} bytes")
            continue
        for n, (img, elf) in enumerate(images):
            cubin = out / f"{f.stem}.{n}.{'cubin' if elf else 'code'}"
            cubin.write_bytes(img)
            args = ["-c", "-hex"] if elf else ["-b", "SM90", "-hex"]
            r = subprocess.run([str(tool), *args, str(cubin)], capture_output=True, text=True)
            rows = list(annotate(r.stdout))
            lines = []
            loads = {}
            waited = 0
            for off, ins, stall, wb, rb, waits in rows:
                w = "".join(str(i) for i in sorted(waits))
                lines.append(f"{off} s{stall:<2} W{'-' if wb is None else wb} "
                             f"R{'-' if rb is None else rb} wait[{w:<6}] {ins}")
                op = ins.split()[0] if not ins.startswith("@") else ins.split()[1]
                if op.startswith(("LDG", "LDS", "LDSM", "LD.", "LDL")):
                    loads[op.split(".")[0]] = loads.get(op.split(".")[0], 0) + 1
                if waits:
                    waited += 1
            (out / f"{f.stem}.{n}.sass").write_text("\n".join(lines) + "\n" + r.stderr)
            # Registers: the highest R<n> named, plus one (a raw program
            # carries no register count).
            used = [int(x) for x in re.findall(r"\bR(\d+)\b", r.stdout)]
            print(f"{f.stem}.{n}: {len(rows)} instructions, registers "
                  f"{max(used) + 1 if used else '?'}, loads {loads}, "
                  f"{waited} wait on a scoreboard")


if __name__ == "__main__":
    main()
