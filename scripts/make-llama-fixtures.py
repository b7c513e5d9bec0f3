#!/usr/bin/env python3
"""Write llama.cpp reference outputs for SmolLM2-135M-Instruct under tests/fixtures/llama/.

tests/parity_smollm2.rs compares combs against these files. Every expected
value comes from llama.cpp (commit in llama.cpp-version.txt, CPU build by
scripts/setup-llamacpp.sh), run on the same GGUF files combs loads:

* perplexity: the `llama-perplexity` tool itself (`-c 512 -b 512 -t 2`, all
  chunks of /usr/share/common-licenses/GPL-3, llama.cpp's defaults otherwise:
  f16 KV cache, flash attention "auto" = on for the CPU backend); its final
  `PPL = x +/- y` and the running value printed after every chunk;
* teacher forcing and greedy generation: libllama through the llama-cpp-python
  binding in $COMBS_TOOLS/venv (same llama.cpp commit, same portable CPU flags),
  with the context set up like the tools: n_ctx 512, n_batch = n_ubatch 512,
  f16 KV cache, flash attention on, 2 threads.

Files written:

  inputs.json        shared by all quant types (one tokenizer): the text files
                     (name, sha256), llama.cpp's tokens of the whole GPL-3 file
                     (what `llama-perplexity` scores), the teacher-forcing
                     windows (first 512 tokens of GPL-3 and of Apache-2.0) and
                     the greedy prompts (text, chat messages, llama.cpp's tokens).
  smollm2-<TYPE>.json  per file (Q4_1 Q8_0 Q4_0 Q5_0 Q4_K_M): file name, size,
                     sha256, llama.cpp version, and
    "perplexity": {"n_ctx", "n_chunks", "n_tokens", "ppl", "ppl_err",
                   "per_chunk": running PPL after chunk 1..n (4 decimals, as printed),
                   "fa_off": the same with `-fa off` (baseline, see below)}
    "teacher": {window: {"lse": [logsumexp of the row, per position],
                         "top_ids": [[8 token ids, best first] per position],
                         "top_logits": [[their 8 logits] per position]}}
               Row p holds the logits llama.cpp computes at position p of the
               window (all 512 tokens evaluated in one batch from an empty
               context, every row requested), i.e. its prediction of token p+1.
               top_ids[p][0] is llama.cpp's argmax (ties: lower id first).
               Logits are rounded to 1e-4. Baselines beside them:
               "argmax_fa_off": llama.cpp's argmax per position with flash
               attention off; "ref_argmax", "ref_logits": an exact forward in
               f64 (numpy) of the same weights dequantized by the `gguf`
               package — its argmax, and its logits at top_ids[p].
    "greedy": {prompt: [64 token ids]}: temperature 0 (argmax of the raw
               logits, no penalties), from an empty context, the prompt in one
               batch then one token per step, not stopped at end-of-generation
               tokens (the model keeps going after <|im_end|> like any token).
    "greedy_fa_off": the same with flash attention off (baseline);
    "greedy_ref": the same from the f64 reference forward (baseline).

Why the baselines: llama.cpp's CPU backend rounds the activations to 8 bits
(q8_0 / q8_1 / q8_K blocks) before every quantized matmul and keeps
attention in f16, so its logits sit ~0.2 (mean, over the top-8) from exact
arithmetic on the same weights, and switching its flash attention on or off
alone changes the argmax at 3-6% of these positions. The test prints both
baselines beside combs' numbers so a disagreement with llama.cpp can be
told apart from an error in combs (the f64 reference shows which).

What the test compares per position p of a window: combs' argmax vs
top_ids[p][0] (agreement = equal positions / all positions), and
|combs_logit[id] - top_logits[p][k]| over the 8 ids of llama.cpp's top-8
(max and mean reported), and |combs_logsumexp - lse[p]|.

Usage:
    ~/.cache/combs/tools/venv/bin/python scripts/make-llama-fixtures.py [--types Q4_1,Q8_0] [--keep]
    (--keep: keep the sections existing files already have, compute only the missing ones)
    (run with another python3 it re-executes itself with the venv's python)
Environment:
    COMBS_TOOLS   llama.cpp build + venv (default ~/.cache/combs/tools)
    COMBS_MODELS  model cache (default ~/.cache/combs/models); the requantized
                  files come from scripts/setup-llamacpp.sh
Needs: scripts/setup-llamacpp.sh done (llama-perplexity, venv with llama_cpp,
numpy, jinja2, gguf), Debian's base-files (/usr/share/common-licenses). Takes
~1 hour on 2 cores (llama-perplexity: ~3 min per file and setting).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "fixtures" / "llama"
TOOLS = Path(os.environ.get("COMBS_TOOLS", Path.home() / ".cache/combs/tools"))
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))
VENV_PY = TOOLS / "venv" / "bin" / "python"

TYPES = ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q4_K_M"]
MODEL_FILE = "SmolLM2-135M-Instruct.{}.gguf"
N_CTX = 512
THREADS = 2
TOP_K = 8
N_GEN = 64

TEXTS = {
    "gpl3": Path("/usr/share/common-licenses/GPL-3"),
    "apache2": Path("/usr/share/common-licenses/Apache-2.0"),
}

# Greedy prompts: plain text of several kinds and one chat turn rendered with
# the model's own template (explicit system message, generation prompt on).
PROMPTS = [
    ("capital", "The capital of France is", None),
    ("story", "Once upon a time, in a small village by the sea, there lived", None),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", None),
    ("science", "Photosynthesis is the process by which plants", None),
    ("chat", None, [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain in a few sentences why the sky is blue."},
    ]),
]


def ensure_venv() -> None:
    try:
        import llama_cpp  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        # the venv's python is a symlink to the system one: tell them apart by prefix
        if VENV_PY.exists() and Path(sys.prefix).resolve() != VENV_PY.parent.parent.resolve():
            os.execv(str(VENV_PY), [str(VENV_PY), __file__, *sys.argv[1:]])
        raise SystemExit(f"needs llama_cpp + numpy: run scripts/setup-llamacpp.sh ({VENV_PY})")


def tokenizer_fixtures_module():
    """scripts/make-tokenizer-fixtures.py (GGUF metadata reader, HF-style chat rendering)."""
    spec = importlib.util.spec_from_file_location("tokfix", HERE / "make-tokenizer-fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def llama_version() -> dict:
    import llama_cpp
    info = {"llama_cpp_python": llama_cpp.__version__}
    vf = TOOLS / "llama.cpp-version.txt"
    if vf.exists():
        for line in vf.read_text().splitlines():
            if line.startswith("llama.cpp "):
                info["llama_cpp_commit"] = line.split()[1]
    info["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    return info


# ---------------------------------------------------------------- llama.cpp runs

def run_perplexity(model: Path, text: Path, extra: tuple[str, ...] = ()) -> dict:
    exe = TOOLS / "bin" / "llama-perplexity"
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(N_CTX), "-b", str(N_CTX),
           "-t", str(THREADS), *extra]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    both = p.stdout + "\n" + p.stderr
    per_chunk = [float(v) for _, v in re.findall(r"\[(\d+)\]([0-9.]+),", p.stdout)]
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", both)
    n = re.search(r"calculating perplexity over (\d+) chunks", both)
    if not m or not n or len(per_chunk) != int(n.group(1)):
        raise SystemExit(f"could not parse llama-perplexity output:\n{both[-3000:]}")
    print(f"  perplexity {m.group(1)} +/- {m.group(2)} over {n.group(1)} chunks "
          f"({time.time() - t0:.0f} s)", flush=True)
    return {"tool": "llama-perplexity " + " ".join(cmd[3:]).replace(str(text), text.name),
            "n_ctx": N_CTX, "n_chunks": int(n.group(1)),
            "ppl": float(m.group(1)), "ppl_err": float(m.group(2)), "per_chunk": per_chunk}


def load_llama(model: Path, logits_all: bool, flash_attn: bool = True):
    from llama_cpp import Llama
    return Llama(model_path=str(model), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                 n_threads=THREADS, n_threads_batch=THREADS, logits_all=logits_all,
                 flash_attn=flash_attn, verbose=False)


def all_logits(llm, tokens: list[int]):
    import numpy as np
    llm.reset()
    llm.eval(tokens)
    return np.asarray(llm.scores[: len(tokens)], dtype=np.float64)


def teacher(llm, tokens: list[int]) -> dict:
    import numpy as np
    lg = all_logits(llm, tokens)
    m = lg.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(lg - m).sum(axis=1)))
    # best first, ties by lower id (stable sort on -logit)
    order = np.argsort(-lg, axis=1, kind="stable")[:, :TOP_K]
    top = np.take_along_axis(lg, order, axis=1)
    return {"lse": [round(float(x), 4) for x in lse],
            "top_ids": order.astype(int).tolist(),
            "top_logits": [[round(float(x), 4) for x in row] for row in top]}


def common(a: list, b: list) -> int:
    """Length of the common prefix."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def greedy(llm, prompt: list[int]) -> list[int]:
    import numpy as np
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(N_GEN):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        if len(out) < N_GEN:
            llm.eval([t])
    return out


class Reference:
    """An exact forward pass in f64 of a llama-architecture GGUF: the weights
    dequantized by the `gguf` package, f64 activations, no KV cache rounding.
    The same graph as llama.cpp's `llm_build_llama` for this model: RMS norm,
    rope on adjacent pairs (LLAMA_ROPE_TYPE_NORM, as the GGUF converter
    permutes Q and K for), grouped-query attention with a causal mask, SwiGLU,
    tied output embedding when there is no output.weight."""

    def __init__(self, path: Path) -> None:
        import numpy as np
        from gguf import GGUFReader
        from gguf.quants import dequantize
        r = GGUFReader(str(path))
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
        meta = {k: f.parts[f.data[0]][0] for k, f in r.fields.items()
                if k.startswith("llama.") and f.data}
        self.n_layer = int(meta["llama.block_count"])
        self.n_head = int(meta["llama.attention.head_count"])
        self.n_head_kv = int(meta["llama.attention.head_count_kv"])
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.base = float(meta["llama.rope.freq_base"])
        self.n_embd = int(meta["llama.embedding_length"])

    def logits(self, tokens: list[int], cache: list | None = None):
        """Logits of every token of `tokens`, which follow the positions held
        in `cache` (a list of per-layer (k, v), extended in place) if given."""
        import numpy as np
        w, n, H, HK, E = self.w, len(tokens), self.n_head, self.n_head_kv, self.n_embd
        D = E // H
        if cache is None:
            cache = []
        pos0 = cache[0][0].shape[0] if cache else 0

        def rms(x, g):
            return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * g

        pos = np.arange(pos0, pos0 + n)
        ang = pos[:, None] * (self.base ** (-np.arange(0, D, 2) / D))[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        def rope(x):
            out = np.empty_like(x)
            out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
            out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
            return out

        # query i (position pos0 + i) sees keys 0 ..= pos0 + i
        mask = np.where(np.arange(pos0 + n)[None, :] > pos[:, None], -np.inf, 0.0)
        x = w["token_embd.weight"][tokens]
        for layer in range(self.n_layer):
            p = f"blk.{layer}."
            h = rms(x, w[p + "attn_norm.weight"])
            q = rope((h @ w[p + "attn_q.weight"].T).reshape(n, H, D))
            k = rope((h @ w[p + "attn_k.weight"].T).reshape(n, HK, D))
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, HK, D)
            if len(cache) <= layer:
                cache.append((k, v))
            else:
                cache[layer] = (np.concatenate([cache[layer][0], k]),
                                np.concatenate([cache[layer][1], v]))
            k, v = cache[layer]
            o = np.empty((n, H, D))
            for hh in range(H):
                kv = hh // (H // HK)
                s = q[:, hh] @ k[:, kv].T / np.sqrt(D) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                o[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv]
            x = x + o.reshape(n, E) @ w[p + "attn_output.weight"].T
            h = rms(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
        out = w.get("output.weight", w["token_embd.weight"])
        return rms(x, w["output_norm.weight"]) @ out.T

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """Greedy tokens as `greedy()` makes them with llama.cpp, in f64."""
        cache: list = []
        lg = self.logits(prompt, cache)[-1]
        out = []
        for _ in range(n):
            out.append(int(lg.argmax()))
            if len(out) < n:
                lg = self.logits([out[-1]], cache)[-1]
        return out


def baselines(teacher_rows: dict, llm_fa_off, ref: Reference, tokens: list[int]) -> None:
    """Adds llama.cpp's flash-attention-off argmax and the f64 reference to a window's rows."""
    import numpy as np
    ids = np.array(teacher_rows["top_ids"])
    teacher_rows["argmax_fa_off"] = [int(x) for x in all_logits(llm_fa_off, tokens).argmax(axis=1)]
    lg = ref.logits(tokens)
    teacher_rows["ref_argmax"] = [int(x) for x in lg.argmax(axis=1)]
    teacher_rows["ref_logits"] = [[round(float(x), 4) for x in row]
                                  for row in np.take_along_axis(lg, ids, axis=1)]


# ---------------------------------------------------------------- output

def dump(obj, indent: int = 0) -> str:
    """JSON with dicts spread over lines and lists of numbers (or of such lists)
    one row per line: compact, diffable."""
    one = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    pad = " " * indent
    if isinstance(obj, dict):
        items = [f"{pad} {one(k)}:{dump(v, indent + 1).lstrip()}" for k, v in obj.items()]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, (list, dict)) for x in obj):
        rows = [dump(x, indent + 1) if isinstance(x, dict) else pad + " " + one(x) for x in obj]
        return pad + "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return pad + one(obj)


def write(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(dump(obj) + "\n")
    tmp.replace(path)  # a test reading the file meanwhile sees the old or the new one
    print(f"  wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)", flush=True)


# ---------------------------------------------------------------- main

def make_inputs(tokfix, base_model: Path) -> dict:
    llm = load_llama(base_model, logits_all=False)
    tok = lambda b, special=False: llm.tokenize(b, add_bos=True, special=special)  # noqa: E731
    add_bos = bool(llm._model.add_bos_token()) if hasattr(llm._model, "add_bos_token") else None
    texts = {}
    for name, path in TEXTS.items():
        if not path.exists():
            raise SystemExit(f"{path} missing (Debian package base-files)")
        texts[name] = {"path": str(path), "sha256": sha256(path), "bytes": path.stat().st_size}
    gpl = tok(TEXTS["gpl3"].read_bytes())
    windows = {name: tok(TEXTS[name].read_bytes())[:N_CTX] for name in TEXTS}
    meta = tokfix.read_gguf_metadata(base_model)
    vocab = meta["tokenizer.ggml.tokens"]
    template = meta["tokenizer.chat_template"].decode()
    bos = vocab[meta["tokenizer.ggml.bos_token_id"]].decode()
    eos = vocab[meta["tokenizer.ggml.eos_token_id"]].decode()
    prompts = []
    for name, text, messages in PROMPTS:
        entry = {"name": name}
        if messages is not None:
            text = tokfix.render_chat(template, messages, True, bos, eos)
            entry["messages"] = messages
            entry["add_generation_prompt"] = True
        entry["text"] = text
        # as llama.cpp's tools tokenize a prompt: add_special on, and special
        # tokens parsed (<|im_start|> is one token) for the chat-formatted one
        entry["tokens"] = tok(text.encode(), special=messages is not None)
        prompts.append(entry)
    print(f"  GPL-3: {len(gpl)} tokens; windows "
          + ", ".join(f"{k} {len(v)}" for k, v in windows.items())
          + "; prompts " + ", ".join(f"{p['name']} {len(p['tokens'])}" for p in prompts), flush=True)
    return {
        "generated_by": "scripts/make-llama-fixtures.py",
        "tokenized_by": "llama.cpp (llama_tokenize, add_special on) on " + base_model.name,
        "add_bos": add_bos,
        "texts": texts,
        "perplexity_tokens": {"text": "gpl3", "tokens": gpl},
        "windows": windows,
        "prompts": prompts,
    }


def main() -> None:
    ensure_venv()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated quant types")
    ap.add_argument("--keep", action="store_true",
                    help="keep the sections existing files have; compute only missing ones")
    args = ap.parse_args()
    types = [t for t in args.types.split(",") if t]
    tokfix = tokenizer_fixtures_module()
    OUT.mkdir(parents=True, exist_ok=True)
    version = llama_version()

    base = MODELS / MODEL_FILE.format("Q4_1")
    print("inputs", flush=True)
    inputs = make_inputs(tokfix, base)
    write(OUT / "inputs.json", inputs)

    for ty in types:
        path = MODELS / MODEL_FILE.format(ty)
        if not path.exists():
            raise SystemExit(f"{path} missing: run scripts/setup-llamacpp.sh")
        print(ty, flush=True)
        out_path = OUT / f"smollm2-{ty}.json"
        old = json.loads(out_path.read_text()) if args.keep and out_path.exists() else {}
        fixture = {
            "model": path.name,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
            "llama_cpp": version,
            "settings": {"n_ctx": N_CTX, "n_batch": N_CTX, "n_ubatch": N_CTX, "threads": THREADS,
                         "kv_cache": "f16", "flash_attn": True, "top_k": TOP_K, "n_gen": N_GEN},
        }
        if old and old.get("sha256") != fixture["sha256"]:
            raise SystemExit(f"{path.name} changed since {out_path.name} was made: drop --keep")
        ppl = old.get("perplexity")
        if ppl is None:
            ppl = run_perplexity(path, TEXTS["gpl3"])
            ppl["n_tokens"] = len(inputs["perplexity_tokens"]["tokens"])
        if "fa_off" not in ppl:
            off = run_perplexity(path, TEXTS["gpl3"], ("-fa", "off"))
            ppl["fa_off"] = {k: off[k] for k in ("tool", "ppl", "ppl_err", "per_chunk")}
        fixture["perplexity"] = ppl

        t0 = time.time()
        llm = load_llama(path, logits_all=True)
        # every file carries the same vocabulary: the shared token ids hold for all
        check = llm.tokenize(inputs["prompts"][0]["text"].encode(), add_bos=True, special=False)
        if check != inputs["prompts"][0]["tokens"]:
            raise SystemExit(f"{path.name} tokenizes differently from Q4_1")
        fixture["teacher"] = old.get("teacher") or {
            name: teacher(llm, toks) for name, toks in inputs["windows"].items()}
        fixture["greedy"] = old.get("greedy") or {
            p["name"]: greedy(llm, p["tokens"]) for p in inputs["prompts"]}
        del llm
        print(f"  teacher forcing + greedy ({time.time() - t0:.0f} s)", flush=True)

        t0 = time.time()
        llm_off = load_llama(path, logits_all=True, flash_attn=False)
        ref = None
        for name, toks in inputs["windows"].items():
            rows = fixture["teacher"][name]
            if "ref_logits" not in rows or "argmax_fa_off" not in rows:
                ref = ref or Reference(path)
                baselines(rows, llm_off, ref, toks)
        fixture["greedy_fa_off"] = old.get("greedy_fa_off") or {
            p["name"]: greedy(llm_off, p["tokens"]) for p in inputs["prompts"]}
        if "greedy_ref" not in old:
            ref = ref or Reference(path)
        fixture["greedy_ref"] = old.get("greedy_ref") or {
            p["name"]: ref.greedy(p["tokens"], N_GEN) for p in inputs["prompts"]}
        del llm_off, ref
        print(f"  baselines ({time.time() - t0:.0f} s)", flush=True)
        for p in inputs["prompts"]:
            on, off = fixture["greedy"][p["name"]], fixture["greedy_fa_off"][p["name"]]
            print(f"  greedy {p['name']}: flash-attn off equals on for {common(on, off)}/{len(on)}"
                  f" tokens, f64 reference for {common(on, fixture['greedy_ref'][p['name']])}")
        write(out_path, fixture)


if __name__ == "__main__":
    main()
