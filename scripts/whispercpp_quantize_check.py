#!/usr/bin/env python3
"""Checks that the quantized tensors of a whisper.cpp file written by
`combs convert --type q*` are byte-identical to what ggml's own quantizer
(`ggml_quantize_chunk` in the libggml-base.so that PyPI `pywhispercpp`
bundles, the function whisper.cpp's `quantize` tool calls) makes from the
same F16/F32 source file.

    scripts/whispercpp_quantize_check.py SRC-f16.bin QUANTIZED.bin [...]

Runs in the venv of scripts/whispercpp_check.py
(~/.cache/combs/whispercpp/venv; run that script once to create it).
Exits 1 when a tensor differs. Seen: tiny.en q8_0 q5_1 q5_0 q4_1 q4_0 (65 of
65 tensors identical each), base q8_0 and q5_1 (97 of 97).
"""
import ctypes, glob, os, struct, sys

VENV = os.path.expanduser("~/.cache/combs/whispercpp/venv")
try:
    import numpy as np
    import pywhispercpp  # noqa: F401
except ImportError:
    py = os.path.join(VENV, "bin", "python")
    if os.environ.get("COMBS_WHISPERCPP_VENV") == "1" or not os.path.exists(py):
        sys.exit(f"needs {VENV}: run scripts/whispercpp_check.py once to create it")
    os.environ["COMBS_WHISPERCPP_VENV"] = "1"
    os.execv(py, [py, __file__] + sys.argv[1:])

site = os.path.dirname(os.path.dirname(pywhispercpp.__file__))
lib = ctypes.CDLL(glob.glob(os.path.join(site, "libggml-base.so*"))[0])
lib.ggml_quantize_chunk.restype = ctypes.c_size_t
lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
lib.ggml_row_size.restype = ctypes.c_size_t
lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
lib.ggml_quantize_init.argtypes = [ctypes.c_int]


def read(path):
    """Tensors of a whisper.cpp file: name -> (ggml type, ne, bytes)."""
    d = open(path, "rb").read()
    o = 0

    def i32():
        nonlocal o
        v = struct.unpack_from("<i", d, o)[0]
        o += 4
        return v

    assert i32() == 0x67676d6c, f"{path}: not a whisper.cpp file"
    for _ in range(11):
        i32()
    n_mel, n_fft = i32(), i32()
    o += n_mel * n_fft * 4
    for _ in range(i32()):
        n = i32()  # not `o += i32()`: that reads o before i32 advances it
        o += n
    out = {}
    while o < len(d):
        n_dims, name_len, ttype = i32(), i32(), i32()
        ne = [i32() for _ in range(n_dims)]
        name = d[o:o + name_len].decode()
        o += name_len
        size = lib.ggml_row_size(ttype, ne[0]) * (int(np.prod(ne)) // ne[0])
        out[name] = (ttype, ne, d[o:o + size])
        o += size
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src = read(sys.argv[1])
    failed = False
    for path in sys.argv[2:]:
        checked = differ = 0
        for name, (ttype, ne, data) in read(path).items():
            if ttype in (0, 1):  # F32, F16: not quantized
                continue
            stype, _, sdata = src[name]
            x = np.frombuffer(sdata, dtype=np.float16 if stype == 1 else np.float32).astype(np.float32)
            rows = x.size // ne[0]
            lib.ggml_quantize_init(ttype)
            buf = ctypes.create_string_buffer(lib.ggml_row_size(ttype, ne[0]) * rows)
            n = lib.ggml_quantize_chunk(ttype, x.ctypes.data, buf, 0, rows, ne[0], None)
            checked += 1
            if buf.raw[:n] != data:
                differ += 1
                print(f"DIFF {path}: {name}")
        failed |= differ > 0 or checked == 0
        print(f"{path}: {checked} quantized tensors, {differ} differ from ggml_quantize_chunk")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
