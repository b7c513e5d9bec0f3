#!/usr/bin/env python3
"""Write llama.cpp reference outputs for real models under tests/fixtures/llama/.

Two models (`--model`): SmolLM2-135M-Instruct in five quant types (the
default; tests/parity_smollm2.rs) and Gemma-3-270M Q4_K_M
(tests/parity_gemma3.rs). Every expected value comes from llama.cpp (commit
in llama.cpp-version.txt, CPU build by scripts/setup-llamacpp.sh), run on the
same GGUF files combs loads:

* perplexity: the `llama-perplexity` tool itself (`-c 512 -b 512 -t 2`, all
  chunks of /usr/share/common-licenses/GPL-3, llama.cpp's defaults otherwise:
  f16 KV cache, flash attention "auto" = on for the CPU backend); its final
  `PPL = x +/- y` and the running value printed after every chunk;
* teacher forcing and greedy generation: libllama through the llama-cpp-python
  binding in $COMBS_TOOLS/venv (same llama.cpp commit, same portable CPU flags),
  with the context set up like the tools: n_ctx = n_batch = n_ubatch (512 for
  SmolLM2, 1024 for Gemma 3 so that a window longer than its 512-token
  sliding window fits in one batch), f16 KV cache, flash attention on,
  2 threads.

Files written (<model> is `smollm2` or `gemma3`):

  inputs.json / gemma3-inputs.json
                     shared by all quant types of a model (one tokenizer): the
                     text files (name, sha256), llama.cpp's tokens of the whole
                     GPL-3 file (what `llama-perplexity` scores), the
                     teacher-forcing windows (the first 512 tokens of GPL-3 and
                     of Apache-2.0 for SmolLM2, the first 640 for Gemma 3, so
                     that 128 positions lie past its sliding window) and the
                     greedy prompts (text, chat messages, whether control
                     tokens are parsed, llama.cpp's tokens). Gemma 3's prompts
                     include one of ~600 tokens (longer than the window).
  <model>-<TYPE>.json  per file (SmolLM2: Q4_1 Q8_0 Q4_0 Q5_0 Q4_K_M; Gemma 3:
                     Q4_K_M): file name, size, sha256, llama.cpp version, and
    "perplexity": {"n_ctx", "n_chunks", "n_tokens", "ppl", "ppl_err",
                   "per_chunk": running PPL after chunk 1..n (4 decimals, as printed),
                   "fa_off": the same with `-fa off` (baseline, see below),
                   "ref": {"ppl", "per_chunk"} the same method on the f64
                          reference forward (baseline; not in the SmolLM2
                          files, made before it)}
    "teacher": {window: {"lse": [logsumexp of the row, per position],
                         "top_ids": [[8 token ids, best first] per position],
                         "top_logits": [[their 8 logits] per position]}}
               Row p holds the logits llama.cpp computes at position p of the
               window (all its tokens evaluated in one batch from an empty
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
attention in f16 (and evaluates GELU through an f16 table), so its logits
sit ~0.2 (mean, over the top-8) from exact arithmetic on the same weights,
and switching its flash attention on or off alone changes the argmax at
3-6% of SmolLM2's positions. The test prints both baselines beside combs'
numbers so a disagreement with llama.cpp can be told apart from an error in
combs (the f64 reference shows which).

What the test compares per position p of a window: combs' argmax vs
top_ids[p][0] (agreement = equal positions / all positions), and
|combs_logit[id] - top_logits[p][k]| over the 8 ids of llama.cpp's top-8
(max and mean reported), and |combs_logsumexp - lse[p]|.

Usage:
    ~/.cache/combs/tools/venv/bin/python scripts/make-llama-fixtures.py \
        [--model smollm2|gemma3] [--types Q4_1,Q8_0] [--keep]
    (--keep: keep the sections existing files already have, compute only the missing ones)
    (run with another python3 it re-executes itself with the venv's python)
Environment:
    COMBS_TOOLS   llama.cpp build + venv (default ~/.cache/combs/tools)
    COMBS_MODELS  model cache (default ~/.cache/combs/models); the requantized
                  SmolLM2 files come from scripts/setup-llamacpp.sh, Gemma 3
                  from scripts/fetch-models.sh --gemma
Needs: scripts/setup-llamacpp.sh done (llama-perplexity, venv with llama_cpp,
numpy, jinja2, gguf), Debian's base-files (/usr/share/common-licenses). Takes
~1 hour on 2 cores for SmolLM2 (llama-perplexity: ~3 min per file and
setting), about as long for Gemma 3.
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
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "fixtures" / "llama"
TOOLS = Path(os.environ.get("COMBS_TOOLS", Path.home() / ".cache/combs/tools"))
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))
VENV_PY = TOOLS / "venv" / "bin" / "python"

PPL_CTX = 512  # llama-perplexity's chunk size (-c), for every model
THREADS = 2
TOP_K = 8
N_GEN = 64

TEXTS = {
    "gpl3": Path("/usr/share/common-licenses/GPL-3"),
    "apache2": Path("/usr/share/common-licenses/Apache-2.0"),
}

# Greedy prompts: plain text of several kinds and one chat turn. SmolLM2's
# chat turn is rendered with the model's own template (explicit system
# message, generation prompt on); the Gemma 3 file carries no chat template
# (llama.cpp would fall back to ChatML, which Gemma does not know), so its
# turn is written out in Gemma's format and its control tokens parsed. Gemma 3
# also gets a prompt longer than its 512-token sliding window.
CAPITAL = ("capital", "The capital of France is")
STORY = ("story", "Once upon a time, in a small village by the sea, there lived")
CODE = ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
SCIENCE = ("science", "Photosynthesis is the process by which plants")
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Explain in a few sentences why the sky is blue."},
]
GEMMA_TURN = ("<start_of_turn>user\nYou are a helpful assistant.\n\n"
              "Explain in a few sentences why the sky is blue.<end_of_turn>\n"
              "<start_of_turn>model\n")
LONG_FROM = "  0. Definitions."  # the long prompt: GPL-3 from this line on,
LONG_TOKENS = 600                 # whole lines until at least this many tokens


def long_prompt(tokenize) -> str:
    """GPL-3 from section 0 on, whole lines, until the text is at least
    LONG_TOKENS tokens long (past Gemma 3's 512-token window)."""
    text = TEXTS["gpl3"].read_text()
    lines = text[text.index(LONG_FROM):].splitlines(keepends=True)
    out = ""
    for line in lines:
        out += line
        if len(tokenize(out.encode())) >= LONG_TOKENS:
            return out
    raise SystemExit(f"GPL-3 has fewer than {LONG_TOKENS} tokens after {LONG_FROM!r}")


@dataclass(frozen=True)
class Prompt:
    name: str
    # the text, or a function of llama.cpp's tokenizer making it
    text: object = None
    # chat messages to render with the model's template (instead of text)
    messages: list | None = None
    # parse control tokens written in the text (always for rendered messages)
    special: bool = False


@dataclass(frozen=True)
class Setup:
    """One model's fixtures."""
    name: str                   # fixture file prefix
    files: dict                 # quant type -> file name in the model cache
    inputs: str                 # the shared inputs file
    n_ctx: int                  # llama.cpp context = n_batch = n_ubatch (teacher, greedy)
    window: int                 # tokens per teacher-forcing window
    prompts: list = field(default_factory=list)


SETUPS = {
    "smollm2": Setup(
        name="smollm2",
        files={t: f"SmolLM2-135M-Instruct.{t}.gguf"
               for t in ["Q4_1", "Q8_0", "Q4_0", "Q5_0", "Q4_K_M"]},
        inputs="inputs.json", n_ctx=512, window=512,
        prompts=[Prompt(*CAPITAL), Prompt(*STORY), Prompt(*CODE), Prompt(*SCIENCE),
                 Prompt("chat", messages=CHAT_MESSAGES)]),
    "gemma3": Setup(
        name="gemma3",
        files={"Q4_K_M": "gemma-3-270m-q4_k_m.gguf"},
        inputs="gemma3-inputs.json", n_ctx=1024, window=640,
        prompts=[Prompt(*CAPITAL), Prompt(*STORY), Prompt(*CODE),
                 Prompt("chat", GEMMA_TURN, special=True), Prompt("long", long_prompt)]),
}


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
    cmd = [str(exe), "-m", str(model), "-f", str(text), "-c", str(PPL_CTX), "-b", str(PPL_CTX),
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
            "n_ctx": PPL_CTX, "n_chunks": int(n.group(1)),
            "ppl": float(m.group(1)), "ppl_err": float(m.group(2)), "per_chunk": per_chunk}


def load_llama(model: Path, n_ctx: int, logits_all: bool, flash_attn: bool = True):
    from llama_cpp import Llama
    return Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
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
    """An exact forward pass in f64 of a llama or gemma3 GGUF: the weights
    dequantized by the `gguf` package, f64 activations, no KV cache rounding.

    llama: the graph of llama.cpp's `llm_build_llama` for this model — RMS
    norm, rope on adjacent pairs (LLAMA_ROPE_TYPE_NORM, as the GGUF converter
    permutes Q and K for), grouped-query attention with a causal mask,
    SwiGLU, tied output embedding when there is no output.weight.

    gemma3: the graph of llama.cpp's `llama_model_gemma3::graph` — embeddings
    times sqrt(n_embd); per block RMS norm, Q/K projections, RMS norm of each
    head of Q and K, NEOX rope (halves), Q scaled by 1/sqrt(head_dim),
    attention (sliding over the last `sliding_window` positions on five of
    every six layers, whose rope base is 10000, llama.cpp's default for
    them, full on every sixth, whose base is rope.freq_base), output
    projection, RMS norm (post-attention), residual; RMS norm, GELU (tanh)
    gated FFN, RMS norm (post-FFN), residual; final RMS norm, tied output,
    final-logit softcapping where the metadata sets it. The norm weights are
    used as stored: Gemma's x̂·(1+w) has its 1 folded into the GGUF weights by
    the converter (`norm_shift` in llama.cpp's conversion/gemma.py)."""

    def __init__(self, path: Path) -> None:
        import numpy as np
        from gguf import GGUFReader
        from gguf.quants import dequantize
        r = GGUFReader(str(path))
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64) for t in r.tensors}
        arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
        if arch not in ("llama", "gemma3"):
            raise SystemExit(f"{path.name}: no f64 reference for architecture {arch}")
        self.gemma = arch == "gemma3"
        meta = {k[len(arch) + 1:]: f.parts[f.data[0]][0] for k, f in r.fields.items()
                if k.startswith(arch + ".") and f.data}
        self.n_layer = int(meta["block_count"])
        self.n_head = int(meta["attention.head_count"])
        self.n_head_kv = int(meta["attention.head_count_kv"])
        self.eps = float(meta["attention.layer_norm_rms_epsilon"])
        self.base = float(meta["rope.freq_base"])
        self.n_embd = int(meta["embedding_length"])
        self.head_dim = int(meta.get("attention.key_length", self.n_embd // self.n_head))
        # gemma3 only: sliding window on layers il % 6 < 5 (llama.cpp's swa
        # pattern 6), their rope base, final-logit softcapping
        self.window = int(meta.get("attention.sliding_window", 0)) if self.gemma else 0
        self.base_local = float(meta.get("rope.freq_base_swa", 10000.0))
        self.final_softcap = float(meta.get("final_logit_softcapping", 0.0))
        if self.gemma and self.n_layer == 62:
            raise SystemExit("gemma3 27B scales Q by 1/sqrt(n_embd/n_head): not in the f64 reference")
        if self.gemma and "attn_logit_softcapping" in meta:
            raise SystemExit("gemma3 with attention softcapping: llama.cpp ignores it, so do not compare")
        if "rope.scaling.type" in meta or "rope_freqs.weight" in self.w:
            raise SystemExit(f"{path.name}: rope scaling is not in the f64 reference")

    def local(self, layer: int) -> bool:
        """Whether a layer attends over the sliding window only."""
        return self.window > 0 and layer % 6 < 5

    def logits(self, tokens: list[int], cache: list | None = None, from_row: int = 0):
        """Logits of every token of `tokens` from index `from_row` on (the
        output head is the costly part), which follow the positions held in
        `cache` (a list of per-layer (k, v), extended in place) if given."""
        import numpy as np
        w, n, H, HK, E = self.w, len(tokens), self.n_head, self.n_head_kv, self.n_embd
        D = self.head_dim
        if cache is None:
            cache = []
        pos0 = cache[0][0].shape[0] if cache else 0

        def rms(x, g):
            return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * g

        pos = np.arange(pos0, pos0 + n)

        def rope_tables(base):
            ang = pos[:, None] * (base ** (-np.arange(0, D, 2) / D))[None, :]
            return np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

        tables = {b: rope_tables(b) for b in {self.base, self.base_local}}

        def rope(x, base):
            cos, sin = tables[base]
            out = np.empty_like(x)
            if self.gemma:  # NEOX: element i pairs with i + D/2
                x0, x1 = x[..., : D // 2], x[..., D // 2:]
                out[..., : D // 2] = x0 * cos - x1 * sin
                out[..., D // 2:] = x0 * sin + x1 * cos
            else:  # adjacent pairs
                out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
                out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
            return out

        # query i (position pos0 + i) sees keys 0 ..= pos0 + i, and on sliding
        # layers only those less than `window` positions back
        kpos = np.arange(pos0 + n)[None, :]
        causal = np.where(kpos > pos[:, None], -np.inf, 0.0)
        sliding = np.where(pos[:, None] - kpos >= max(self.window, 1), -np.inf, causal)
        x = w["token_embd.weight"][tokens]
        if self.gemma:
            x = x * np.sqrt(E)
        for layer in range(self.n_layer):
            p = f"blk.{layer}."
            base = self.base_local if self.local(layer) else self.base
            mask = sliding if self.local(layer) else causal
            h = rms(x, w[p + "attn_norm.weight"])
            q = (h @ w[p + "attn_q.weight"].T).reshape(n, H, D)
            k = (h @ w[p + "attn_k.weight"].T).reshape(n, HK, D)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, HK, D)
            if self.gemma:
                q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
            q, k = rope(q, base), rope(k, base)
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
            o = o.reshape(n, H * D) @ w[p + "attn_output.weight"].T
            if self.gemma:
                o = rms(o, w[p + "post_attention_norm.weight"])
            x = x + o
            h = rms(x, w[p + "ffn_norm.weight"])
            g, u = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            if self.gemma:  # GELU, tanh approximation (ggml_gelu)
                act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))
            else:  # SiLU
                act = g / (1 + np.exp(-g))
            f = (act * u) @ w[p + "ffn_down.weight"].T
            if self.gemma:
                f = rms(f, w[p + "post_ffw_norm.weight"])
            x = x + f
        out = w.get("output.weight", w["token_embd.weight"])
        lg = rms(x[from_row:], w["output_norm.weight"]) @ out.T
        if self.final_softcap > 0:
            lg = self.final_softcap * np.tanh(lg / self.final_softcap)
        return lg

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


def ref_perplexity(ref: Reference, tokens: list[int], bos: int | None) -> dict:
    """`llama-perplexity -c 512` computed with the f64 reference: chunks of
    PPL_CTX tokens, BOS replacing each chunk's first token where the model
    adds one, the second half of each chunk scored; the running PPL after
    every chunk (4 decimals, as llama.cpp prints it)."""
    import numpy as np
    first, nll, count, per_chunk = PPL_CTX // 2, 0.0, 0, []
    t0 = time.time()
    for c in range(len(tokens) // PPL_CTX):
        chunk = list(tokens[c * PPL_CTX:(c + 1) * PPL_CTX])
        if bos is not None:
            chunk[0] = bos
        lg = ref.logits(chunk, from_row=first)[:-1]  # rows first .. PPL_CTX-2
        target = np.array(tokens[c * PPL_CTX + first + 1:(c + 1) * PPL_CTX])
        m = lg.max(axis=1)
        lse = m + np.log(np.exp(lg - m[:, None]).sum(axis=1))
        nll += float((lse - lg[np.arange(len(target)), target]).sum())
        count += len(target)
        per_chunk.append(round(float(np.exp(nll / count)), 4))
    print(f"  f64 reference perplexity {per_chunk[-1]} over {len(per_chunk)} chunks "
          f"({time.time() - t0:.0f} s)", flush=True)
    return {"ppl": per_chunk[-1], "per_chunk": per_chunk}


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

def make_inputs(tokfix, setup: Setup, base_model: Path) -> dict:
    llm = load_llama(base_model, setup.n_ctx, logits_all=False)
    tok = lambda b, special=False: llm.tokenize(b, add_bos=True, special=special)  # noqa: E731
    add_bos = bool(llm._model.add_bos_token()) if hasattr(llm._model, "add_bos_token") else None
    texts = {}
    for name, path in TEXTS.items():
        if not path.exists():
            raise SystemExit(f"{path} missing (Debian package base-files)")
        texts[name] = {"path": str(path), "sha256": sha256(path), "bytes": path.stat().st_size}
    gpl = tok(TEXTS["gpl3"].read_bytes())
    windows = {name: tok(TEXTS[name].read_bytes())[:setup.window] for name in TEXTS}
    meta = tokfix.read_gguf_metadata(base_model)
    vocab = meta["tokenizer.ggml.tokens"]
    bos = vocab[meta["tokenizer.ggml.bos_token_id"]].decode()
    eos = vocab[meta["tokenizer.ggml.eos_token_id"]].decode()
    prompts = []
    for prompt in setup.prompts:
        entry = {"name": prompt.name}
        text = prompt.text(tok) if callable(prompt.text) else prompt.text
        if prompt.messages is not None:
            if "tokenizer.chat_template" not in meta:
                raise SystemExit(f"{base_model.name} has no chat template for prompt {prompt.name}")
            template = meta["tokenizer.chat_template"].decode()
            text = tokfix.render_chat(template, prompt.messages, True, bos, eos)
            # as llama.cpp's common_chat_templates_apply: a leading BOS text
            # goes, tokenizing adds the token
            if add_bos and text.startswith(bos):
                text = text[len(bos):]
            entry["messages"] = prompt.messages
            entry["add_generation_prompt"] = True
        elif prompt.special:
            entry["parse_special"] = True
        entry["text"] = text
        # as llama.cpp's tools tokenize a prompt: add_special on, and special
        # tokens parsed (<|im_start|> is one token) for the chat-formatted one
        entry["tokens"] = tok(text.encode(), special=prompt.messages is not None or prompt.special)
        prompts.append(entry)
    print(f"  GPL-3: {len(gpl)} tokens; windows "
          + ", ".join(f"{k} {len(v)}" for k, v in windows.items())
          + "; prompts " + ", ".join(f"{p['name']} {len(p['tokens'])}" for p in prompts), flush=True)
    return {
        "generated_by": "scripts/make-llama-fixtures.py" + ("" if setup.name == "smollm2"
                                                            else f" --model {setup.name}"),
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
    ap.add_argument("--model", default="smollm2", choices=sorted(SETUPS),
                    help="which model's fixtures")
    ap.add_argument("--types", help="comma-separated quant types (default: all of the model's)")
    ap.add_argument("--keep", action="store_true",
                    help="keep the sections existing files have; compute only missing ones")
    args = ap.parse_args()
    setup = SETUPS[args.model]
    types = [t for t in (args.types or ",".join(setup.files)).split(",") if t]
    if unknown := [t for t in types if t not in setup.files]:
        raise SystemExit(f"{setup.name} has no files of type {unknown}: {list(setup.files)}")
    tokfix = tokenizer_fixtures_module()
    OUT.mkdir(parents=True, exist_ok=True)
    version = llama_version()

    base = MODELS / next(iter(setup.files.values()))
    print("inputs", flush=True)
    inputs = make_inputs(tokfix, setup, base)
    write(OUT / setup.inputs, inputs)

    for ty in types:
        path = MODELS / setup.files[ty]
        if not path.exists():
            raise SystemExit(f"{path} missing: run scripts/setup-llamacpp.sh / scripts/fetch-models.sh")
        print(ty, flush=True)
        out_path = OUT / f"{setup.name}-{ty}.json"
        old = json.loads(out_path.read_text()) if args.keep and out_path.exists() else {}
        n_ctx = setup.n_ctx
        fixture = {
            "model": path.name,
            "bytes": path.stat().st_size,
            "sha256": sha256(path),
            "llama_cpp": version,
            "settings": {"n_ctx": n_ctx, "n_batch": n_ctx, "n_ubatch": n_ctx, "threads": THREADS,
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
        if "ref" not in ppl:
            bos = tokfix.read_gguf_metadata(path)["tokenizer.ggml.bos_token_id"]
            ppl["ref"] = ref_perplexity(Reference(path), inputs["perplexity_tokens"]["tokens"],
                                        bos if inputs["add_bos"] else None)
        fixture["perplexity"] = ppl

        t0 = time.time()
        llm = load_llama(path, n_ctx, logits_all=True)
        # every file carries the same vocabulary: the shared token ids hold for all
        check = llm.tokenize(inputs["prompts"][0]["text"].encode(), add_bos=True, special=False)
        if check != inputs["prompts"][0]["tokens"]:
            raise SystemExit(f"{path.name} tokenizes differently from {base.name}")
        fixture["teacher"] = old.get("teacher") or {
            name: teacher(llm, toks) for name, toks in inputs["windows"].items()}
        fixture["greedy"] = old.get("greedy") or {
            p["name"]: greedy(llm, p["tokens"]) for p in inputs["prompts"]}
        del llm
        print(f"  teacher forcing + greedy ({time.time() - t0:.0f} s)", flush=True)

        t0 = time.time()
        llm_off = load_llama(path, n_ctx, logits_all=True, flash_attn=False)
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
