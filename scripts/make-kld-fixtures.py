#!/usr/bin/env python3
"""Write llama.cpp's KL-divergence outputs under tests/fixtures/kld/ (tests/kld.rs,
tests/kld_parity.rs). Every expected value comes from llama.cpp's own
`llama-perplexity` (CPU build of scripts/setup-llamacpp.sh, commit in
llama.cpp-version.txt); combs only makes the tiny input models and is checked
against what llama.cpp wrote.

1. The file format and the statistics, on models whose logits both engines
   compute exactly (`combs synth --preset exact`: zero blocks, ±1 embeddings,
   output weights on a 1/32 grid, RMS epsilon 0, so every logit is an exact
   sum): the base model (`--seed 0`) and a variant close to it (`--seed 1`),
   n_ctx 64, 6 chunks of /usr/share/common-licenses/GPL-3 (186 scored positions,
   enough for llama.cpp's final statistics).

     exact-llama.kld       `llama-perplexity -m exact-base.gguf -f GPL-3 -c 64 -b 64
                           --chunks 6 -t 2 --kl-divergence-base exact-llama.kld`:
                           llama.cpp's base file, byte for byte (122 KB)
     exact-llama-stats.txt `llama-perplexity -m exact-variant.gguf -c 64 -b 64 -t 2
                           --kl-divergence-base exact-llama.kld --kl-divergence`:
                           what llama.cpp prints on stdout (chunk lines and the
                           final statistics), its leading timing line dropped
     exact.json            how the two models are made (command, sha256), the
                           settings, and two checks run here: `combs perplexity
                           --kl-divergence-base` on the base model writes the same
                           bytes as llama.cpp (`combs_base_identical`), and
                           `llama-perplexity --kl-divergence` reading combs' file
                           prints the same as reading its own (`llama_reads_combs_base`)

2. Real models, a subset small enough for lavapipe: SmolLM2-135M-Instruct Q4_1
   and Gemma-3-270M Q4_K_M, the first chunk of 256 tokens of GPL-3 (127
   scored positions). A real base file holds 98 KB (SmolLM2) or 524 KB (Gemma)
   per position, and ~7000 of SmolLM2's 49152 tokens lie above the −16 nats
   llama.cpp's KLD sums over, so it is not committed; <name>.json keeps, per
   position, llama.cpp's exact row header and the stored values of the 64
   most probable tokens and of the actual next token, plus the summed
   probability of the other tokens above −16 nats (what the test lumps into
   one outcome):

     "base":  {"tool": the llama-perplexity command (-fa off),
               "n_ctx", "n_vocab", "tokens": the chunk as tokenized by llama.cpp,
               "rows": [{"scale_bits", "min_log_prob_bits": the row's two f32 as
                         u32 bits, "target_q": stored value of the next token,
                         "top": [[id, q] × 64, most probable first, ties by id],
                         "tail_p": Σ exp(scale·q + min_log_prob) over the other
                         tokens above −16}]}
     "fa_on": what `llama-perplexity -fa on --kl-divergence` prints against that
              base (flash attention on vs off: how far llama.cpp moves from
              itself), parsed: ppl, ppl_base, kld_mean, kld_99, same_top,
              rms_dp (fractions as printed / 100), and the printed text;
     "lumped_check": the same fa-on-vs-off mean KLD computed the way the test
              computes it (64 tokens + one lumped outcome, from llama.cpp's fa-on
              base file) beside llama.cpp's exact figure: how close the test's
              statistic is to llama.cpp's.

Usage:
    scripts/make-kld-fixtures.py [--combs target/release/combs] [--only exact|real]
Environment: COMBS_TOOLS (llama.cpp build, default ~/.cache/combs/tools),
COMBS_MODELS (model cache, default ~/.cache/combs/models).
Needs: scripts/setup-llamacpp.sh --no-venv (llama-perplexity), a combs build,
python3 (standard library only). Takes ~2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "fixtures" / "kld"
TOOLS = Path(os.environ.get("COMBS_TOOLS", Path.home() / ".cache/combs/tools"))
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))
PERPLEXITY = TOOLS / "bin" / "llama-perplexity"
TEXT = Path("/usr/share/common-licenses/GPL-3")
THREADS = "2"

EXACT_CTX, EXACT_CHUNKS = 64, 6
REAL_CTX, TOP_K = 256, 64
REAL = {"smollm2-Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma3-Q4_K_M": "gemma-3-270m-q4_k_m.gguf"}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(cmd: list, what: str) -> str:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{what} failed: {' '.join(map(str, cmd))}\n{p.stderr[-3000:]}")
    return p.stdout


def llama_kld(model: Path, base: Path, extra: tuple = ()) -> str:
    """`llama-perplexity --kl-divergence` stdout from the chunk heading on.
    llama.cpp logs through a worker thread and now and then loses the last
    lines at exit: run again until the statistics are complete."""
    for _ in range(20):
        out = run([PERPLEXITY, "-m", model, "-t", THREADS, *extra, "--kl-divergence-base", base,
                   "--kl-divergence"], "llama-perplexity --kl-divergence")
        if "Same top p:" in out:
            return out[out.index("chunk "):]
    raise SystemExit(f"llama-perplexity --kl-divergence printed no final statistics:\n{out}")


def label(s: str) -> str:
    return "llama-perplexity " + s.replace(str(TEXT), "GPL-3").replace(str(MODELS) + "/", "")


# ---------------------------------------------------------------- 1. exact models

def exact(combs: Path, tmp: Path) -> None:
    models = {}
    for name, seed in (("base", 0), ("variant", 1)):
        path = tmp / f"exact-{name}.gguf"
        cmd = ["synth", "--preset", "exact", "--type", "f16", "--seed", str(seed)]
        run([combs, *cmd, "-o", path], "combs synth")
        models[name] = {"command": "combs " + " ".join(cmd) + f" -o exact-{name}.gguf",
                        "sha256": sha256(path), "path": path}
    ctx = ["-c", str(EXACT_CTX), "-b", str(EXACT_CTX)]
    base_args = [*ctx, "--chunks", str(EXACT_CHUNKS)]
    llama_base = OUT / "exact-llama.kld"
    run([PERPLEXITY, "-m", models["base"]["path"], "-f", TEXT, *base_args, "-t", THREADS,
         "--kl-divergence-base", llama_base], "llama-perplexity --kl-divergence-base")
    stats = llama_kld(models["variant"]["path"], llama_base, tuple(ctx))
    (OUT / "exact-llama-stats.txt").write_text(stats)
    # the two directions checked here (and again by tests/kld.rs)
    combs_base = tmp / "exact-combs.kld"
    run([combs, "perplexity", "-m", models["base"]["path"], "-f", TEXT, "-c", str(EXACT_CTX),
         "--chunks", str(EXACT_CHUNKS), "--kl-divergence-base", combs_base],
        "combs perplexity --kl-divergence-base")
    identical = combs_base.read_bytes() == llama_base.read_bytes()
    reads = llama_kld(models["variant"]["path"], combs_base, tuple(ctx)) == stats
    print(f"  exact: combs' base file {'equals' if identical else 'DIFFERS FROM'} llama.cpp's; "
          f"llama.cpp reading it prints {'the same' if reads else 'OTHER'} statistics")
    meta = {
        "generated_by": "scripts/make-kld-fixtures.py",
        "llama_cpp": version(),
        "text": {"path": str(TEXT), "sha256": sha256(TEXT)},
        "n_ctx": EXACT_CTX, "n_chunk": EXACT_CHUNKS,
        "models": {k: {"command": v["command"], "sha256": v["sha256"]} for k, v in models.items()},
        "base_tool": label(f"-m exact-base.gguf -f {TEXT} {' '.join(base_args)} -t {THREADS} "
                           "--kl-divergence-base exact-llama.kld"),
        "stats_tool": label(f"-m exact-variant.gguf {' '.join(ctx)} -t {THREADS} "
                            "--kl-divergence-base exact-llama.kld --kl-divergence"),
        "combs_base_identical": identical,
        "llama_reads_combs_base": "same statistics" if reads else "other statistics",
    }
    (OUT / "exact.json").write_text(json.dumps(meta, indent=1) + "\n")
    if not (identical and reads):
        raise SystemExit("combs and llama.cpp disagree on the exact models (see above)")


# ---------------------------------------------------------------- 2. real models

def read_base(path: Path):
    """(n_ctx, n_vocab, n_chunk, tokens, rows): rows as (scale, min_log_prob,
    scale_bits, min_bits, q array) per scored position."""
    import array
    data = path.read_bytes()
    if data[:8] != b"_logits_":
        raise SystemExit(f"{path}: not a base file")
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", data, 8)
    tokens = list(struct.unpack_from(f"<{n_ctx * n_chunk}i", data, 20))
    off = 20 + 4 * n_ctx * n_chunk
    nv = 2 * ((n_vocab + 1) // 2) + 4
    q = array.array("H")
    q.frombytes(data[off:])
    if sys.byteorder != "little":
        q.byteswap()
    rows = []
    for r in range(len(q) // nv):
        row = q[r * nv:(r + 1) * nv]
        sb, mb = struct.unpack("<II", row[:4].tobytes())
        scale, minlp = struct.unpack("<ff", row[:4].tobytes())
        rows.append((scale, minlp, sb, mb, row[4:4 + n_vocab]))
    return n_ctx, n_vocab, n_chunk, tokens, rows


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def log_prob(scale: float, minlp: float, q: int) -> float:
    """scale·q + min_log_prob in f32, as llama.cpp's reader computes it."""
    return f32(f32(scale * q) + minlp)


def compress(rows, tokens, n_ctx) -> list:
    first = n_ctx // 2
    out = []
    for j, (scale, minlp, sb, mb, q) in enumerate(rows):
        top = heapq.nsmallest(TOP_K, range(len(q)), key=lambda i: (-q[i], i))
        in_top = set(top)
        # the values above −16 (llama.cpp's KLD sums over those) beyond the top
        qmin = math.floor((-16.0 - minlp) / scale) - 1 if scale else 0
        tail = sum(math.exp(lp) for i, v in enumerate(q)
                   if v >= qmin and i not in in_top and (lp := log_prob(scale, minlp, v)) > -16.0)
        out.append({"scale_bits": sb, "min_log_prob_bits": mb,
                    "target_q": q[tokens[first + j + 1]],
                    "top": [[i, q[i]] for i in top], "tail_p": tail})
    return out


def lumped_kld(base_rows: list, other_rows) -> float:
    """Mean over positions of the test's statistic: KLD over the base's top
    tokens plus the rest lumped into one outcome, the other distribution
    read from a base file (its log-probabilities as stored)."""
    total = 0.0
    for b, (scale, minlp, _, _, q) in zip(base_rows, other_rows):
        bs, bm = struct.unpack("<ff", struct.pack("<II", b["scale_bits"], b["min_log_prob_bits"]))
        # the other side's stored log-probabilities, in double: its tail
        # mass is what its top tokens leave (the floor of its stored values,
        # 16 nats below its largest, would count ~1e-7 for each of Gemma's
        # 262144 tokens)
        kld, top_q = 0.0, 0.0
        for i, v in b["top"]:
            lp = log_prob(bs, bm, v)
            lq = scale * q[i] + minlp
            top_q += math.exp(lq)
            if lp > -16.0:
                kld += math.exp(lp) * (lp - lq)
        r_b, r_q = b["tail_p"], max(1.0 - top_q, 1e-300)
        if r_b > 0:
            kld += r_b * (math.log(r_b) - math.log(r_q))
        total += kld
    return total / len(base_rows)


def parse_stats(text: str) -> dict:
    def grab(lbl: str) -> float:
        m = re.search(re.escape(lbl) + r"\s*:\s*(-?[0-9.]+)", text)
        if not m:
            raise SystemExit(f"no {lbl!r} in llama-perplexity output:\n{text}")
        return float(m.group(1))
    return {"ppl": grab("Mean PPL(Q)"), "ppl_base": grab("Mean PPL(base)"),
            "kld_mean": grab("Mean    KLD"), "kld_99": grab("99.0%   KLD"),
            "same_top": round(grab("Same top p") / 100, 8),
            "rms_dp": round(grab("RMS Δp") / 100, 8)}


def real(tmp: Path) -> None:
    for name, file in REAL.items():
        model = MODELS / file
        if not model.exists():
            raise SystemExit(f"{model} missing: scripts/fetch-models.sh")
        print(name, flush=True)
        ctx = ["-c", str(REAL_CTX), "-b", str(REAL_CTX)]
        off, on = tmp / f"{name}.off.kld", tmp / f"{name}.on.kld"
        args = ["-f", TEXT, *ctx, "--chunks", "1", "-t", THREADS]
        run([PERPLEXITY, "-m", model, *args, "-fa", "off", "--kl-divergence-base", off], "base")
        run([PERPLEXITY, "-m", model, *args, "-fa", "on", "--kl-divergence-base", on], "fa-on base")
        text = llama_kld(model, off, (*ctx, "-fa", "on"))
        n_ctx, n_vocab, n_chunk, tokens, rows = read_base(off)
        base_rows = compress(rows, tokens, n_ctx)
        stats = parse_stats(text)
        lumped = lumped_kld(base_rows, read_base(on)[4])
        print(f"  fa on vs off: {stats}; the test's lumped KLD from the fa-on base file "
              f"{lumped:.6f} (llama.cpp's exact: {stats['kld_mean']:.6f})", flush=True)
        fixture = {
            "generated_by": "scripts/make-kld-fixtures.py",
            "model": file, "sha256": sha256(model), "llama_cpp": version(),
            "text": {"path": str(TEXT), "sha256": sha256(TEXT)},
            "base": {"tool": label(f"-m {model} -f {TEXT} {' '.join(ctx)} --chunks 1 -t {THREADS} "
                                   "-fa off --kl-divergence-base BASE"),
                     "n_ctx": n_ctx, "n_vocab": n_vocab, "top_k": TOP_K, "tokens": tokens,
                     "rows": base_rows},
            "fa_on": {"tool": label(f"-m {model} {' '.join(ctx)} -t {THREADS} -fa on "
                                    "--kl-divergence-base BASE --kl-divergence"),
                      **stats, "text": text},
            "lumped_check": {"fa_on_kld_llama_cpp": stats["kld_mean"], "fa_on_kld_lumped": lumped},
        }
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
        print(f"  wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)", flush=True)


def version() -> str:
    vf = TOOLS / "llama.cpp-version.txt"
    return " ".join(vf.read_text().split()) if vf.exists() else "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--combs", type=Path, default=None, help="combs binary")
    ap.add_argument("--only", choices=["exact", "real"])
    args = ap.parse_args()
    combs = args.combs or Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "combs"
    if not PERPLEXITY.exists():
        raise SystemExit(f"{PERPLEXITY} missing: run scripts/setup-llamacpp.sh --no-venv")
    if not combs.exists():
        raise SystemExit(f"{combs} missing: cargo build --release --bin combs (or --combs PATH)")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        if args.only in (None, "exact"):
            exact(combs, Path(d))
        if args.only in (None, "real"):
            real(Path(d))


if __name__ == "__main__":
    main()
