#!/usr/bin/env python3
"""Write a llama.cpp KL-divergence base file from llama.cpp run through the
cyllama wheel (cyllama-vulkan on a GPU machine: llama.cpp's Vulkan backend),
for the tokens of an existing base file (normally the one `llama-perplexity
--kl-divergence-base` wrote on the CPU, so that every engine scores the same
tokens):

    python3.12 scripts/llamacpp_kld_base.py MODEL.gguf (--tokens-from CPU.kld | -f TEXT [-c 512])
        -o VULKAN.kld [--compare BASE.kld] [--chunks N] [--flash-attn auto|on|off] [--gpu-layers 999]

-f TEXT tokenizes the text as `llama-perplexity -f` does (llama_tokenize with
add_special, chunks of -c tokens, at least two), for a machine without
llama.cpp's CPU tools.

Each chunk is evaluated as `llama-perplexity` does (tools/perplexity,
`perplexity()`): an empty cache, the chunk in one batch of n_ctx tokens
(n_ctx = n_batch = n_ubatch), its first token replaced by BOS where the
vocabulary adds one, logits requested from position n_ctx/2 on; the rows are
stored with llama.cpp's quantization (`log_softmax(n_vocab, logits,
log_prob, tok)`: 16 nats below the largest logit on a u16 grid) computed in
float32 with numpy, so a row can differ from llama.cpp's own writer by one
step of the grid where numpy's exp or summation order rounds differently.
Compare with `combs perplexity -m MODEL.gguf --kl-divergence-base VULKAN.kld
--kl-divergence` (or llama.cpp's own `llama-perplexity --kl-divergence`).

--compare BASE also compares these logits with BASE's (llama.cpp's CPU base
file, say) as `llama-perplexity --kl-divergence` would, and prints the main
lines of its final statistics with its labels (PPL(Q), PPL(base), mean and
99% KLD, RMS Δp, same top p), computed with numpy in float32/float64 after
llama.cpp's formulas: llama.cpp Vulkan against llama.cpp CPU.

Needs Python 3.12 with numpy and the cyllama wheel on PYTHONPATH, e.g.
`python3.12 -m pip install --no-deps --target /tmp/cy cyllama_vulkan-0.7.0-*.whl`.
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
from pathlib import Path


def read_header(path: Path):
    data = path.read_bytes()
    if data[:8] != b"_logits_":
        raise SystemExit(f"{path}: not a KL-divergence base file")
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<iii", data, 8)
    tokens = list(struct.unpack_from(f"<{n_ctx * n_chunk}i", data, 20))
    return n_ctx, n_vocab, n_chunk, tokens


def quantize_rows(logits, np):
    """llama.cpp's row quantization of a (rows × n_vocab) float32 matrix:
    (rows × nv) uint16, nv = 2·⌈n_vocab/2⌉ + 4."""
    rows, n_vocab = logits.shape
    nv = 2 * ((n_vocab + 1) // 2) + 4
    out = np.zeros((rows, nv), dtype=np.uint16)
    f32 = np.float32
    for r in range(rows):
        x = logits[r]
        mx, mn = f32(x.max()), f32(x.min())
        mn = max(mn, f32(mx - f32(16)))
        sum_exp = float(np.exp(x - mx, dtype=np.float32).astype(np.float64).sum())
        lse = f32(np.log(sum_exp))
        min_lp = f32(f32(mn - mx) - lse)
        scale = f32(f32(mx - mn) / f32(65535))
        out[r, :4] = np.array([scale, min_lp], dtype=np.float32).view(np.uint16)
        if scale != 0:
            inv = f32(f32(1) / scale)
            q = np.rint(inv * (x - mn), dtype=np.float32)
            out[r, 4:4 + n_vocab] = np.where(x > mn, q, 0).astype(np.uint16)
    return out


class Compare:
    """llama.cpp's KL-divergence statistics of live logits against a base
    file's rows (tools/perplexity `log_softmax(…, base_log_prob, …)` and the
    final block of `kl_divergence()`), vectorized per chunk."""

    def __init__(self, path: Path, n_vocab: int, np) -> None:
        self.np, self.f = np, open(path, "rb")
        n_ctx, nv_file, n_chunk, _ = read_header(path)
        if nv_file != n_vocab:
            raise SystemExit(f"{path} is for {nv_file} tokens, not {n_vocab}")
        self.f.seek(20 + 4 * n_ctx * n_chunk)
        self.nv = 2 * ((n_vocab + 1) // 2) + 4
        self.nll, self.nll_base, self.kld, self.same, self.p_diff = [], [], [], [], []

    def add(self, logits, targets) -> None:
        np = self.np
        rows, n_vocab = logits.shape
        raw = np.frombuffer(self.f.read(2 * rows * self.nv), dtype="<u2").reshape(rows, self.nv)
        head = np.ascontiguousarray(raw[:, :4]).view(np.float32)
        scale, min_lp = head[:, :1], head[:, 1:2]
        lpb = (scale * raw[:, 4:4 + n_vocab].astype(np.float32) + min_lp).astype(np.float32)
        mx = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - mx).astype(np.float64).sum(axis=1, keepdims=True))
        lq = logits.astype(np.float64) - (mx + lse)
        pb = np.where(lpb > -16, np.exp(lpb.astype(np.float64)), 0.0)
        kld = (pb * (lpb - lq)).sum(axis=1)
        t = np.asarray(targets)
        r = np.arange(rows)
        self.nll.append(-lq[r, t])
        self.nll_base.append(-lpb[r, t].astype(np.float64))
        self.kld.append(kld)
        self.same.append(logits.argmax(axis=1) == lpb.argmax(axis=1))
        self.p_diff.append(np.exp(lq[r, t]) - np.exp(lpb[r, t].astype(np.float64)))

    def report(self) -> str:
        np = self.np
        nll, nb, kld = (np.concatenate(x) for x in (self.nll, self.nll_base, self.kld))
        same, dp = np.concatenate(self.same), np.concatenate(self.p_diff)
        n = len(kld)

        def mu(v):
            f = v.mean()
            df = (v * v).mean() - f * f
            return f, (np.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)
        lq, lb = mu(nll), mu(nb)
        srt = np.sort(kld.astype(np.float32))
        p = np.float32(0.99) * np.float32(n - 1)
        i = int(p)
        w = p - np.float32(i)
        k99 = (1 - w) * srt[i] + w * srt[min(i + 1, n - 1)]
        mse = mu(dp * dp)
        top = same.mean()
        return "\n".join([
            f"Mean PPL(Q)                   : {np.exp(lq[0]):10.6f} ± {np.exp(lq[0]) * lq[1]:10.6f}",
            f"Mean PPL(base)                : {np.exp(lb[0]):10.6f} ± {np.exp(lb[0]) * lb[1]:10.6f}",
            f"Mean    KLD: {mu(kld)[0]:10.6f} ± {mu(kld)[1]:10.6f}",
            f"99.0%   KLD: {k99:10.6f}",
            f"RMS Δp    : {100 * np.sqrt(mse[0]):6.3f} ± {100 * 0.5 / np.sqrt(mse[0]) * mse[1]:5.3f} %",
            f"Same top p: {100 * top:6.3f} ± {100 * np.sqrt(top * (1 - top) / (n - 1)):5.3f} %",
            ""])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens-from", type=Path, help="base file whose tokens to score")
    src.add_argument("-f", "--file", type=Path, help="text to tokenize and score")
    ap.add_argument("-c", "--ctx", type=int, default=512, help="tokens per chunk (with -f)")
    ap.add_argument("-o", "--output", required=True, type=Path)
    ap.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0: all)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--gpu-layers", type=int, default=999)
    ap.add_argument("--compare", type=Path, help="base file to compare these logits with")
    a = ap.parse_args()

    import numpy as np
    import cyllama.llama.llama_cpp as cy

    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = a.gpu_layers
    model = cy.LlamaModel(a.model, mp)
    vocab = model.get_vocab()
    if a.tokens_from:
        n_ctx, n_vocab, n_chunk, tokens = read_header(a.tokens_from)
        if vocab.n_vocab != n_vocab:
            raise SystemExit(f"{a.tokens_from} is for {n_vocab} tokens, {a.model} has {vocab.n_vocab}")
    else:
        n_ctx, n_vocab = a.ctx, vocab.n_vocab
        tokens = list(vocab.tokenize(a.file.read_text(errors="replace"), True, False))
        if len(tokens) < 2 * n_ctx:
            raise SystemExit(f"{a.file}: {len(tokens)} tokens, at least 2 × {n_ctx} needed")
        n_chunk = len(tokens) // n_ctx
    if a.chunks > 0:
        n_chunk = min(n_chunk, a.chunks)
    cp = cy.LlamaContextParams()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[a.flash_attn]
    ctx = cy.LlamaContext(model, cp)
    bos = vocab.token_bos() if vocab.get_add_bos() else None
    compare = Compare(a.compare, n_vocab, np) if a.compare else None
    first = n_ctx // 2
    n_rows = n_ctx - 1 - first
    t0 = time.time()
    with open(a.output, "wb") as out:
        out.write(b"_logits_" + struct.pack("<iii", n_ctx, n_vocab, n_chunk))
        out.write(struct.pack(f"<{n_chunk * n_ctx}i", *tokens[:n_chunk * n_ctx]))
        for c in range(n_chunk):
            chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
            ctx.kv_cache_clear()
            batch = cy.LlamaBatch(n_tokens=n_ctx, embd=0, n_seq_max=1)
            for i, t in enumerate(chunk):
                batch.add(bos if (i == 0 and bos is not None) else t, i, [0], i >= first)
            ctx.decode(batch)
            logits = np.array([ctx.get_logits_ith(first + j) for j in range(n_rows)],
                              dtype=np.float32)
            out.write(quantize_rows(logits, np).astype("<u2").tobytes())
            if compare:
                compare.add(logits, chunk[first + 1:])
            print(f"[{c + 1}/{n_chunk}] {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"wrote {a.output} ({n_chunk} chunks of {n_ctx}, n_vocab {n_vocab})", file=sys.stderr)
    if compare:
        print(compare.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
