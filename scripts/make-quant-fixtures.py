#!/usr/bin/env python3
"""Writes the quantization fixtures under tests/fixtures/quant/ that
tests/quant_ref.rs checks combs' CPU quantizers and dequantizers against.

How to run (from the repository root; needs python3 >= 3.9, gcc, network
access to PyPI the first time):

    python3 scripts/make-quant-fixtures.py [--llama-cpp DIR] [--out DIR]

If `gguf` and `numpy` cannot be imported, the script creates a virtual
environment in ~/.cache/combs/fixtures-venv (or $COMBS_FIXTURES_VENV), installs
`gguf==0.19.0` and `numpy` into it, and re-runs itself there.

llama.cpp's sources come from --llama-cpp DIR, else $LLAMA_CPP_DIR, else the
`vendor/llama.cpp` of a llama-cpp-python sdist already unpacked under
~/.cache/combs/tools/src/, else `pip download --no-binary :all: --no-deps
llama-cpp-python==0.3.36` into ~/.cache/combs/fixtures-src.

Where the expected values come from (independent of combs' code):
  * dequantization, every type: the `gguf` package's `gguf.quants.dequantize`
    on random raw blocks (random bytes; every f16 scale field, and every
    F16/BF16/F32 value, set to a random *finite* bit pattern). The script also
    runs llama.cpp's own `dequantize_row_*` on the same blocks and prints
    whether both agree bit for bit.
  * quantization, legacy types (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0): `gguf.quants.quantize`
    on a fixed set of f32 rows; cross-checked against llama.cpp's
    `quantize_row_*_ref`.
  * quantization, K types (Q2_K … Q6_K), which gguf cannot quantize:
    llama.cpp's `quantize_row_q*_K_ref` (what `llama-quantize` and
    `ggml_quantize_chunk` run when there is no importance matrix), from a tiny
    C harness compiled here against ggml/src/ggml-quants.c.

Why `-O2 -ffp-contract=off`: the reference quantizers are chains of float
multiply-adds (`sumlx += w*x[i]*l`, `scale*L[i] + min - x[i]`, ...). With
contraction allowed, and FMA in the target, GCC fuses them into fused
multiply-adds, which round once instead of twice and so change the chosen
scales and levels. A default x86-64 build of ggml-base (no -mfma) cannot fuse
either, so `-ffp-contract=off` is what llama.cpp's x86-64 release binaries
compute; Rust never contracts, so combs must match this build. The script
also builds the harness with `-mfma -ffp-contract=fast` (GCC's default in GNU
C mode; what an FMA-capable target such as aarch64 gets) and prints how many
output blocks differ from the uncontracted build. For Q2_K, Q4_K and Q5_K
they do (7, 2 and 6 of the 24 fixture blocks when the fixtures were last
made; Q3_K, Q6_K and the legacy types happened not to), which is why the
fixtures pin the uncontracted numerics: an FMA build of llama.cpp (aarch64,
or x86-64 with -mfma in ggml-base) writes different K-quant files. `-DNDEBUG` matches a release
build (the `assert` in ggml's `nearest_int` is compiled out).

Fixture format (all integers u32 little-endian, floats f32 little-endian;
`type` is the GGML type id: F32 0, F16 1, Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7,
Q8_0 8, Q2_K 10, Q3_K 11, Q4_K 12, Q5_K 13, Q6_K 14, BF16 30):

  dequant_<name>.bin   b"CQDQ", version=1, type, n
                       then the raw GGUF blocks (n weights' worth of bytes)
                       then n f32: what gguf.quants.dequantize gives
  quant_input.bin      b"CQIN", version=1, n_rows, row_len
                       then n_rows*row_len f32 (rows listed in ROWS below /
                       in the fixtures' README.md)
  quant_<name>.bin     b"CQQU", version=1, type, n_rows, row_len
                       then n_rows rows of GGUF blocks: each row of
                       quant_input.bin quantized on its own
"""

from __future__ import annotations

import argparse
import glob
import os
import struct
import subprocess
import sys
import shutil
import tarfile
import tempfile
from pathlib import Path

GGUF_PIN = "gguf==0.19.0"
LLAMA_CPP_PYTHON_PIN = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "combs"
SEED = 20261130
ROW_LEN = 256


def ensure_python_deps() -> None:
    """Re-executes inside a venv with gguf and numpy when they are missing."""
    try:
        import gguf  # noqa: F401
        import numpy  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get("COMBS_FIXTURES_REEXEC"):
        sys.exit("gguf/numpy still missing inside the fixtures venv")
    venv = Path(os.environ.get("COMBS_FIXTURES_VENV", CACHE / "fixtures-venv"))
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", GGUF_PIN, "numpy"], check=True)
    env = dict(os.environ, COMBS_FIXTURES_REEXEC="1")
    os.execve(str(py), [str(py), __file__, *sys.argv[1:]], env)


def find_llama_cpp(arg: str | None) -> Path:
    """The llama.cpp source tree (the directory holding ggml/src/ggml-quants.c)."""
    candidates = []
    if arg:
        candidates.append(Path(arg))
    if os.environ.get("LLAMA_CPP_DIR"):
        candidates.append(Path(os.environ["LLAMA_CPP_DIR"]))
    for pattern in [
        str(CACHE / "tools/src/llama_cpp_python-*/vendor/llama.cpp"),
        str(CACHE / "fixtures-src/llama_cpp_python-*/vendor/llama.cpp"),
    ]:
        candidates.extend(Path(p) for p in sorted(glob.glob(pattern)))
    for c in candidates:
        if (c / "ggml/src/ggml-quants.c").exists():
            return c
    dest = CACHE / "fixtures-src"
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         LLAMA_CPP_PYTHON_PIN, "-d", str(dest)],
        check=True,
    )
    for sdist in sorted(dest.glob("llama_cpp_python-*.tar.gz")):
        with tarfile.open(sdist) as tf:
            tf.extractall(dest)
    for p in sorted(dest.glob("llama_cpp_python-*/vendor/llama.cpp")):
        if (p / "ggml/src/ggml-quants.c").exists():
            return p
    sys.exit("could not find llama.cpp's ggml/src/ggml-quants.c")


HARNESS_C = r"""
// quantref: runs ggml's reference (de)quantizers over files.
//   quantref quant   TYPE ROW_LEN IN.f32 OUT.bin   (each row on its own)
//   quantref dequant TYPE IN.bin OUT.f32
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ggml-quants.h"

// ggml-quants.c refers to these only from paths the harness never runs
// (row validation, imatrix quantizers); stubs keep the build to one file.
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt); abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void)type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }

typedef void (*qfn)(const float *, void *, int64_t);
typedef void (*dqfn)(const void *, float *, int64_t);
struct qt { const char * name; int blck; size_t size; qfn q; dqfn dq; };
#define QT(n, B, blk, suf) { n, B, sizeof(blk), (qfn)quantize_row_##suf##_ref, (dqfn)dequantize_row_##suf }
static const struct qt TYPES[] = {
    QT("q4_0", QK4_0, block_q4_0, q4_0), QT("q4_1", QK4_1, block_q4_1, q4_1),
    QT("q5_0", QK5_0, block_q5_0, q5_0), QT("q5_1", QK5_1, block_q5_1, q5_1),
    QT("q8_0", QK8_0, block_q8_0, q8_0),
    QT("q2_k", QK_K, block_q2_K, q2_K), QT("q3_k", QK_K, block_q3_K, q3_K),
    QT("q4_k", QK_K, block_q4_K, q4_K), QT("q5_k", QK_K, block_q5_K, q5_K),
    QT("q6_k", QK_K, block_q6_K, q6_K),
};

static void * slurp(const char * path, size_t * len) {
    FILE * f = fopen(path, "rb"); if (!f) { perror(path); exit(1); }
    fseek(f, 0, SEEK_END); *len = (size_t)ftell(f); fseek(f, 0, SEEK_SET);
    void * buf = malloc(*len ? *len : 1);
    if (fread(buf, 1, *len, f) != *len) { perror(path); exit(1); }
    fclose(f); return buf;
}
static void spit(const char * path, const void * buf, size_t len) {
    FILE * f = fopen(path, "wb"); if (!f) { perror(path); exit(1); }
    fwrite(buf, 1, len, f); fclose(f);
}

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: see source\n"); return 2; }
    const struct qt * t = NULL;
    for (size_t i = 0; i < sizeof(TYPES)/sizeof(TYPES[0]); i++)
        if (!strcmp(TYPES[i].name, argv[2])) t = &TYPES[i];
    if (!t) { fprintf(stderr, "unknown type %s\n", argv[2]); return 2; }
    if (!strcmp(argv[1], "quant") && argc == 6) {
        size_t len; float * x = slurp(argv[4], &len);
        int64_t row_len = atoll(argv[3]), n = (int64_t)(len / 4), rows = n / row_len;
        size_t row_bytes = (size_t)(row_len / t->blck) * t->size;
        char * out = calloc((size_t)rows, row_bytes);
        for (int64_t r = 0; r < rows; r++) t->q(x + r*row_len, out + r*row_bytes, row_len);
        spit(argv[5], out, (size_t)rows * row_bytes);
        return 0;
    }
    if (!strcmp(argv[1], "dequant") && argc == 5) {
        size_t len; void * b = slurp(argv[3], &len);
        int64_t n = (int64_t)(len / t->size) * t->blck;
        float * y = malloc((size_t)n * 4);
        t->dq(b, y, n);
        spit(argv[4], y, (size_t)n * 4);
        return 0;
    }
    fprintf(stderr, "bad arguments\n"); return 2;
}
"""


def build_harness(llama: Path, work: Path, flags: list[str], name: str) -> Path:
    """Compiles the harness with ggml-quants.c; returns the executable."""
    ggml = llama / "ggml"
    src = work / "quantref.c"
    src.write_text(HARNESS_C)
    exe = work / name
    cmd = ["gcc", "-std=gnu11", *flags, "-DNDEBUG", f"-I{ggml / 'include'}", f"-I{ggml / 'src'}",
           str(src), str(ggml / "src/ggml-quants.c"), "-o", str(exe), "-lm"]
    subprocess.run(cmd, check=True)
    return exe


def cpu_has_fma() -> bool:
    try:
        return " fma " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def main() -> None:
    ensure_python_deps()
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", help="llama.cpp source tree")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests/fixtures/quant"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    llama = find_llama_cpp(args.llama_cpp)
    print(f"llama.cpp: {llama}")

    work = Path(tempfile.mkdtemp(prefix="combs-quantref-"))
    exe = build_harness(llama, work, ["-O2", "-ffp-contract=off"], "quantref")
    exe_fma = None
    if cpu_has_fma():
        exe_fma = build_harness(llama, work, ["-O2", "-mfma", "-ffp-contract=fast"], "quantref_fma")

    def c_run(binary: Path, mode: str, name: str, payload: bytes, *extra: str) -> bytes:
        src, dst = work / "in.bin", work / "out.bin"
        src.write_bytes(payload)
        if mode == "quant":
            subprocess.run([str(binary), "quant", name, str(ROW_LEN), str(src), str(dst)], check=True)
        else:
            subprocess.run([str(binary), "dequant", name, str(src), str(dst)], check=True)
        return dst.read_bytes()

    rng = np.random.default_rng(SEED)
    names = {
        T.F32: "f32", T.F16: "f16", T.BF16: "bf16", T.Q4_0: "q4_0", T.Q4_1: "q4_1",
        T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0", T.Q2_K: "q2_k", T.Q3_K: "q3_k",
        T.Q4_K: "q4_k", T.Q5_K: "q5_k", T.Q6_K: "q6_k",
    }
    # Byte offsets of the f16 scale fields in each block (ggml-common.h).
    f16_fields = {
        T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
        T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    }
    n_weights = {T.F32: 1024, T.F16: 1024, T.BF16: 1024}

    def finite_bits(bits, exp_mask: int, flip: int):
        # An all-ones exponent (inf/NaN) loses its top exponent bit: still random, now finite.
        bad = (bits & exp_mask) == exp_mask
        bits[bad] &= bits.dtype.type(~flip & ((1 << (8 * bits.itemsize)) - 1))
        return bits

    # ---- dequantization fixtures ----
    for t, name in names.items():
        block, size = GGML_QUANT_SIZES[t]
        n = n_weights.get(t, 4096)
        n_blocks = n // block
        raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        if t == T.F32:
            raw = finite_bits(raw.view(np.uint32), 0x7F800000, 0x40000000).view(np.uint8)
        elif t == T.F16:
            raw = finite_bits(raw.view(np.uint16), 0x7C00, 0x4000).view(np.uint8)
        elif t == T.BF16:
            raw = finite_bits(raw.view(np.uint16), 0x7F80, 0x4000).view(np.uint8)
        else:
            for off in f16_fields[t]:
                field = np.ascontiguousarray(raw[:, off:off + 2]).view(np.uint16)
                field = finite_bits(field, 0x7C00, 0x4000)
                raw[:, off:off + 2] = field.view(np.uint8)
        raw = np.ascontiguousarray(raw).reshape(-1)
        values = quants.dequantize(raw, t).astype(np.float32).reshape(-1)
        assert values.size == n
        with open(out / f"dequant_{name}.bin", "wb") as f:
            f.write(b"CQDQ" + struct.pack("<III", 1, int(t), n))
            f.write(raw.tobytes())
            f.write(values.astype("<f4").tobytes())
        if t in f16_fields:
            ref = np.frombuffer(c_run(exe, "dequant", name, raw.tobytes()), dtype=np.float32)
            diff = int(np.count_nonzero(ref.view(np.uint32) != values.view(np.uint32)))
            print(f"dequant {name}: gguf vs llama.cpp dequantize_row: {diff} of {n} values differ")

    # ---- quantization fixtures ----
    rows = make_rows(np, rng)
    x = np.stack(rows).astype(np.float32)
    n_rows = x.shape[0]
    with open(out / "quant_input.bin", "wb") as f:
        f.write(b"CQIN" + struct.pack("<III", 1, n_rows, ROW_LEN))
        f.write(x.astype("<f4").tobytes())

    for t in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        name = names[t]
        block, size = GGML_QUANT_SIZES[t]
        row_bytes = ROW_LEN // block * size
        c_bytes = c_run(exe, "quant", name, x.tobytes())
        if t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
            expected = c_bytes
            source = "llama.cpp"
        else:
            expected = quants.quantize(x, t).tobytes()
            source = "gguf"
            bad = [r for r in range(n_rows)
                   if expected[r * row_bytes:(r + 1) * row_bytes] != c_bytes[r * row_bytes:(r + 1) * row_bytes]]
            print(f"quant {name}: gguf vs llama.cpp quantize_row_ref: rows differing {bad}")
        if exe_fma is not None:
            f_bytes = c_run(exe_fma, "quant", name, x.tobytes())
            nb = len(c_bytes) // size
            bad = sum(c_bytes[i * size:(i + 1) * size] != f_bytes[i * size:(i + 1) * size] for i in range(nb))
            print(f"quant {name}: with FMA contraction, {bad} of {nb} blocks differ")
        assert len(expected) == n_rows * row_bytes
        with open(out / f"quant_{name}.bin", "wb") as f:
            f.write(b"CQQU" + struct.pack("<IIII", 1, int(t), n_rows, ROW_LEN))
            f.write(expected)
        print(f"quant {name}: expected bytes from {source}")

    from importlib.metadata import version

    sdist = llama.parent.parent.name
    versions = f"gguf {version('gguf')}, numpy {np.__version__}, llama.cpp from {sdist}"
    fmt = __doc__[__doc__.index("Fixture format"):]
    (out / "README.md").write_text(
        "# Quantization fixtures\n\n"
        "Written by `scripts/make-quant-fixtures.py` (see its header for how to run it\n"
        "and why the C reference is built without FMA contraction); read by\n"
        f"`tests/quant_ref.rs`. Made with {versions}.\n\n"
        "```text\n" + fmt.rstrip() + "\n```\n\n"
        "Rows of quant_input.bin:\n\n```text\n" + ROWS.strip("\n") + "\n```\n"
    )
    print(versions)
    shutil.rmtree(work, ignore_errors=True)
    total = sum(p.stat().st_size for p in out.glob("*.bin"))
    print(f"wrote {out} ({total} bytes)")


# What each row of quant_input.bin holds (row index: description).
ROWS = """
 0 N(0,1)
 1 N(0,0.02²), typical weights
 2 N(0,100²)
 3 U(-1,1)
 4 U(0,1): all positive
 5 U(-1,0): all negative
 6 Laplace(0,1), heavy tails
 7 Student-t(2), heavier tails
 8 N(0,1) scaled by 10^U(-3,1) per 16-weight sub-block
 9 N(0,1) scaled per 32-weight sub-block by 1e-30, 1e-8, 1e-3, 1, 10, 1e-5, 0.1, 100
10 all 0.37
11 all -1.25
12 N(0,0.01²) with one outlier +50
13 N(0,0.01²) with one outlier -30
14 1e-30 * N(0,1): scales underflow f16
15 1e-6 * N(0,1): f16-subnormal scales
16 N(0,1) with half the weights zero
17 all zeros
18 N(0,1) with 95% zeros
19 integers in -8..8: exact rounding ties
20 multiples of 0.5 in -4..4: exact rounding ties
21 N(3,1): offset, mostly positive
22 alternating +1, -1
23 N(0,1000²)
"""


def make_rows(np, rng):
    n = ROW_LEN
    rows = [
        rng.normal(0, 1, n),
        rng.normal(0, 0.02, n),
        rng.normal(0, 100, n),
        rng.uniform(-1, 1, n),
        rng.uniform(0, 1, n),
        rng.uniform(-1, 0, n),
        rng.laplace(0, 1, n),
        rng.standard_t(2, n),
        rng.normal(0, 1, n) * np.repeat(10.0 ** rng.uniform(-3, 1, n // 16), 16),
        rng.normal(0, 1, n) * np.repeat(np.array([1e-30, 1e-8, 1e-3, 1, 10, 1e-5, 0.1, 100]), 32),
        np.full(n, 0.37),
        np.full(n, -1.25),
    ]
    r = rng.normal(0, 0.01, n)
    r[37] = 50.0
    rows.append(r)
    r = rng.normal(0, 0.01, n)
    r[200] = -30.0
    rows.append(r)
    rows.append(1e-30 * rng.normal(0, 1, n))
    rows.append(1e-6 * rng.normal(0, 1, n))
    r = rng.normal(0, 1, n)
    r[rng.random(n) < 0.5] = 0.0
    rows.append(r)
    rows.append(np.zeros(n))
    r = rng.normal(0, 1, n)
    r[rng.random(n) < 0.95] = 0.0
    rows.append(r)
    rows.append(rng.integers(-8, 9, n).astype(np.float64))
    rows.append(rng.integers(-8, 9, n) * 0.5)
    rows.append(rng.normal(3, 1, n))
    rows.append(np.where(np.arange(n) % 2 == 0, 1.0, -1.0))
    rows.append(rng.normal(0, 1000, n))
    assert len(rows) == len(ROWS.strip().splitlines())
    return rows


if __name__ == "__main__":
    main()
