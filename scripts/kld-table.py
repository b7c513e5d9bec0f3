#!/usr/bin/env python3
"""README's parity table: combs against llama.cpp's CPU logits measured the way
llama.cpp's users compare quantizations and backends (KL divergence,
`llama-perplexity --kl-divergence`), for every real model here, beside
llama.cpp against itself and beside the exact f64 forward of the same weights.

    scripts/kld-table.py [--models smollm2-Q4_1,...] [--chunks N] [--dir DIR]
                         [--combs BIN] [--numerics exact,llama.cpp] [--llama-only]
                         [--vulkan PYTHON3.12] [--no-reference]

Per model (smollm2-{Q4_1,Q8_0,Q4_0,Q5_0,Q4_K_M}, gemma3-Q4_K_M), on
/usr/share/common-licenses/GPL-3 in chunks of 512 (all 14, or the first N),
each step leaving its output in DIR (default ~/.cache/combs/kld; a step
whose output is there is not run again, so an interrupted run resumes):

  1. <name>.fa-off.kld   llama.cpp's base file: `llama-perplexity -m M -f GPL-3 -c 512
                         -b 512 -fa off --kl-divergence-base` (CPU build of
                         scripts/setup-llamacpp.sh)
  2. <name>.fa-on.txt    `llama-perplexity -fa on --kl-divergence` against it:
                         llama.cpp with flash attention on vs off
     <name>.meta.json    model file, sha256, chunks, the commands
     (--llama-only stops here: what tests/kld_parity.rs's full set reads)
  3. <name>.vulkan.kld   with --vulkan PY: llama.cpp's Vulkan backend through the cyllama
     <name>.vulkan.txt   wheel (scripts/llamacpp_kld_base.py) on the same tokens, flash
     <name>.vulkan-fa-on.txt  attention off (a base file, and its statistics against the
                         CPU base) and on (its statistics against Vulkan's fa-off base)
  4. <name>.ref.txt      `combs perplexity --reference --kl-divergence` against the
     <name>.ref.kld      llama.cpp base(s): the exact forward (CPU, f64 sums, f32 K/V),
                         whose own log-probabilities are saved
  5. <name>.combs-<numerics>.txt
                         `combs perplexity [--numerics N] --kl-divergence` against the
                         llama.cpp base(s) and the exact forward's, in one pass

then prints the markdown table (and DIR/table.md, DIR/table.json): per model
the base's PPL, and for each run PPL, ΔPPL = PPL/PPL(base) − 1, mean KLD,
99% KLD and same top p against llama.cpp's CPU base (fa off), plus combs
against the exact forward and, with --vulkan, everything against llama.cpp
Vulkan's logits. Slow on lavapipe (per SmolLM2 file ~25 min per combs run,
~15 for the exact forward; Gemma 3 about twice that); fast on a GPU but for
the exact forward, which runs on one CPU core (--no-reference skips it).

On the GPU machine (H200), with Python 3.12 and numpy, the cyllama-vulkan
wheel, and llama.cpp's CPU tools carried from here (or --no-cpu without them):
    python3.12 -m pip install --no-deps --target /tmp/cy cyllama_vulkan-0.7.0-*.whl
    PYTHONPATH=/tmp/cy scripts/kld-table.py --vulkan python3.12 --combs target/release/combs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOOLS = Path(os.environ.get("COMBS_TOOLS", Path.home() / ".cache/combs/tools"))
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))
PERPLEXITY = TOOLS / "bin" / "llama-perplexity"
TEXT = Path("/usr/share/common-licenses/GPL-3")
CTX = 512
FILES = {
    "smollm2-Q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "smollm2-Q8_0": "SmolLM2-135M-Instruct.Q8_0.gguf",
    "smollm2-Q4_0": "SmolLM2-135M-Instruct.Q4_0.gguf",
    "smollm2-Q5_0": "SmolLM2-135M-Instruct.Q5_0.gguf",
    "smollm2-Q4_K_M": "SmolLM2-135M-Instruct.Q4_K_M.gguf",
    "gemma3-Q4_K_M": "gemma-3-270m-q4_k_m.gguf",
}


def log(msg: str) -> None:
    print(f"[kld-table] {msg}", file=sys.stderr, flush=True)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(cmd: list, out: Path | None = None, env: dict | None = None) -> str:
    """Runs cmd; its stdout goes to `out` (written only when it succeeds)."""
    cmd = [str(c) for c in cmd]
    log("$ " + " ".join(cmd))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    log(f"  {time.time() - t0:.0f} s")
    if out is not None:
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(p.stdout)
        tmp.replace(out)
    return p.stdout


def llama_kld(cmd: list, out: Path) -> None:
    """llama-perplexity --kl-divergence; llama.cpp's logging thread now and
    then loses the last lines at exit, so run again until they are there."""
    for _ in range(20):
        text = run(cmd)
        if "Same top p:" in text:
            out.write_text(text[text.index("chunk "):])
            return
    raise SystemExit(f"llama-perplexity printed no final statistics: {cmd}")


def stats(block: str) -> dict:
    """The table's figures from one statistics block (llama.cpp's labels)."""
    def grab(label: str) -> float:
        m = re.search(r"^" + re.escape(label) + r"\s*:\s*(-?[0-9.]+|-?nan|-?inf)", block, re.M)
        if not m:
            raise SystemExit(f"no {label!r} in:\n{block[-2000:]}")
        return float(m.group(1))
    s = {"ppl": grab("Mean PPL(Q)"), "ppl_base": grab("Mean PPL(base)"),
         "kld": grab("Mean    KLD"), "kld_99": grab("99.0%   KLD"),
         "same_top": grab("Same top p")}
    s["dppl"] = 100.0 * (s["ppl"] / s["ppl_base"] - 1.0)
    return s


def blocks(text: str, bases: list) -> dict:
    """combs' output against one or several bases: {base file name: stats}."""
    if len(bases) == 1:
        return {bases[0].name: stats(text)}
    out = {}
    parts = re.split(r"^###### against (.*) ######$", text, flags=re.M)
    for path, body in zip(parts[1::2], parts[2::2]):
        out[Path(path).name] = stats(body)
    return out


def done(path: Path, meta_ok: bool) -> bool:
    return meta_ok and path.exists() and path.stat().st_size > 0


def one_model(name: str, a, d: Path) -> dict:
    model = MODELS / FILES[name]
    if not model.exists():
        raise SystemExit(f"{model} missing: scripts/fetch-models.sh (and scripts/setup-llamacpp.sh)")
    meta_path = d / f"{name}.meta.json"
    want = {"model": model.name, "sha256": sha256(model), "chunks": a.chunks, "n_ctx": CTX,
            "text": str(TEXT), "text_sha256": sha256(TEXT)}
    old = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    ok = all(old.get(k) == v for k, v in want.items())
    threads = str(os.cpu_count() or 2)
    ctx = ["-c", CTX, "-b", CTX, "-t", threads]
    chunks = ["--chunks", a.chunks] if a.chunks else []
    row = {"name": name, "file": model.name}
    llama_bases = []
    base = d / f"{name}.fa-off.kld"
    if a.cpu:
        if not done(base, ok):
            run([PERPLEXITY, "-m", model, "-f", TEXT, *ctx, *chunks, "-fa", "off",
                 "--kl-divergence-base", base])
        fa_on = d / f"{name}.fa-on.txt"
        if not done(fa_on, ok):
            llama_kld([PERPLEXITY, "-m", model, *ctx, "-fa", "on", "--kl-divergence-base", base,
                       "--kl-divergence"], fa_on)
        want["commands"] = {
            "base": f"llama-perplexity -m {model.name} -f GPL-3 -c {CTX} -b {CTX} -t N "
                    f"{' '.join(map(str, chunks))} -fa off --kl-divergence-base {base.name}",
            "fa_on": f"llama-perplexity -m {model.name} -c {CTX} -b {CTX} -t N -fa on "
                     f"--kl-divergence-base {base.name} --kl-divergence",
        }
        row["fa_on"] = stats(fa_on.read_text())
        llama_bases.append(base)
    version = TOOLS / "llama.cpp-version.txt"
    want["llama_cpp"] = " ".join(version.read_text().split()) if version.exists() else "unknown"
    meta_path.write_text(json.dumps(want, indent=1) + "\n")
    if a.llama_only:
        return row
    if a.vulkan:
        # llama.cpp's Vulkan backend, flash attention off (the base) and on
        # (against it), on the CPU base's tokens or on the text tokenized by it
        vk, vk_txt = d / f"{name}.vulkan.kld", d / f"{name}.vulkan.txt"
        vk_on, vk_on_txt = d / f"{name}.vulkan-fa-on.kld", d / f"{name}.vulkan-fa-on.txt"
        tokens = ["--tokens-from", base] if a.cpu else ["-f", TEXT, "-c", CTX, *chunks]
        script = [a.vulkan, HERE / "llamacpp_kld_base.py", model]
        if not (done(vk, ok) and (done(vk_txt, ok) or not a.cpu)):
            compare = ["--compare", base] if a.cpu else []
            run([*script, *tokens, "--flash-attn", "off", "-o", vk, *compare], vk_txt)
        if not done(vk_on_txt, ok):
            run([*script, "--tokens-from", vk, "--flash-attn", "on", "-o", vk_on,
                 "--compare", vk], vk_on_txt)
        if a.cpu:
            row["vulkan_vs_cpu"] = stats(vk_txt.read_text())
        row["vulkan_fa_on"] = stats(vk_on_txt.read_text())
        llama_bases.append(vk)
    ref_kld = d / f"{name}.ref.kld"
    compared = list(llama_bases)
    if not a.no_reference:
        ref_txt = d / f"{name}.ref.txt"
        if not (done(ref_txt, ok) and done(ref_kld, ok)):
            bargs = [x for b in llama_bases for x in ("--kl-divergence-base", b)]
            run([a.combs, "perplexity", "-m", model, "--reference", *bargs, "--kl-divergence",
                 "--kl-divergence-save", ref_kld, *chunks], ref_txt)
        row["reference"] = blocks(ref_txt.read_text(), llama_bases)
        compared.append(ref_kld)
    for numerics in a.numerics:
        out = d / f"{name}.combs-{numerics}.txt"
        if not done(out, ok):
            bargs = [x for b in compared for x in ("--kl-divergence-base", b)]
            run([a.combs, "perplexity", "-m", model, "--numerics", numerics, *bargs,
                 "--kl-divergence", *chunks], out)
        row[f"combs-{numerics}"] = blocks(out.read_text(), compared)
    return row


def fmt(s: dict | None) -> str:
    if s is None:
        return "| – | – | – | – | – |"
    return (f"| {s['ppl']:.4f} | {s['dppl']:+.2f}% | {s['kld']:.6f} | {s['kld_99']:.6f} "
            f"| {s['same_top']:.2f}% |")


def table(rows: list, a) -> str:
    runs = [("combs", "combs-exact"), ("combs `--numerics llama.cpp`", "combs-llama.cpp")]
    head = "| PPL | ΔPPL | mean KLD | 99% KLD | same top p |"
    lines = []

    def section(title: str, base_of, own_rows) -> None:
        lines.extend(["", f"| model | {title} {head}", "| --- | --- | --- | --- | --- | --- | --- |"])
        for r in rows:
            base = base_of(r)
            # the base's own PPL, as llama.cpp's statistics report it
            ppl_base = next((r[k]["ppl_base"] for _, k in own_rows if k in r), None)
            lines.append(f"| {r['name']} | the base (PPL(base)) | "
                         + (f"{ppl_base:.4f} |" if ppl_base else "– |") + " | | | |")
            first = False

            def add(label: str, s: dict | None) -> None:
                nonlocal first
                lines.append(f"| {r['name'] if first else ''} | {label} " + fmt(s))
                first = False
            for label, key in own_rows:
                if key in r:
                    add(label, r[key])
            for label, key in runs:
                if key in r:
                    add(label, r[key].get(base))
            if "reference" in r:
                add("exact f64 forward", r["reference"].get(base))
            ref = f"{r['name']}.ref.kld"
            for label, key in runs:
                if key in r and ref in r[key]:
                    add(f"{label} vs the exact forward", r[key][ref])

    if a.cpu:
        section("against llama.cpp CPU, flash attention off (the base):",
                lambda r: f"{r['name']}.fa-off.kld",
                [("llama.cpp CPU, flash attention on", "fa_on"),
                 ("llama.cpp Vulkan", "vulkan_vs_cpu")])
    if a.vulkan:
        section("against llama.cpp Vulkan, flash attention off (the base):",
                lambda r: f"{r['name']}.vulkan.kld",
                [("llama.cpp Vulkan, flash attention on", "vulkan_fa_on")])
    return "\n".join(lines[1:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(FILES), help="comma-separated names")
    ap.add_argument("--chunks", type=int, default=0, help="first N chunks of 512 (0: all, 14)")
    ap.add_argument("--dir", type=Path, default=Path.home() / ".cache/combs/kld")
    ap.add_argument("--combs", type=Path,
                    default=Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release" / "combs")
    ap.add_argument("--numerics", default="exact,llama.cpp")
    ap.add_argument("--llama-only", action="store_true", help="only llama.cpp's files (steps 1-2)")
    ap.add_argument("--vulkan", metavar="PYTHON", help="python3.12 with cyllama-vulkan + numpy")
    ap.add_argument("--no-reference", action="store_true", help="skip the exact forward")
    ap.add_argument("--no-cpu", action="store_true",
                    help="no llama.cpp CPU runs (with --vulkan, on a machine without its tools)")
    a = ap.parse_args()
    a.numerics = [n for n in a.numerics.split(",") if n]
    names = [n for n in a.models.split(",") if n]
    if bad := [n for n in names if n not in FILES]:
        raise SystemExit(f"unknown models {bad}: {list(FILES)}")
    a.cpu = not a.no_cpu
    if a.cpu and not PERPLEXITY.exists():
        raise SystemExit(f"{PERPLEXITY} missing: scripts/setup-llamacpp.sh --no-venv "
                         "(or --no-cpu with --vulkan)")
    if not (a.cpu or a.vulkan):
        raise SystemExit("--no-cpu leaves nothing to compare with: add --vulkan PYTHON")
    if not a.llama_only and not a.combs.exists():
        raise SystemExit(f"{a.combs} missing: cargo build --release --bin combs (or --combs)")
    a.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        log(name)
        rows.append(one_model(name, a, a.dir))
        (a.dir / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    md = table(rows, a)
    (a.dir / "table.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
