#!/usr/bin/env python3
"""Write a llama.cpp KL-divergence base file from llama.cpp run through the
cyllama wheel (cyllama-vulkan on a GPU machine: llama.cpp's Vulkan backend),
for the tokens of an existing base file (normally the one `llama-perplexity
--kl-divergence-base` wrote on the CPU, so that every engine scores the same
tokens):

    python3.12 scripts/llamacpp_kld_base.py MODEL.gguf --tokens-from CPU.kld -o VULKAN.kld \
        [--chunks N] [--flash-attn auto|on|off] [--gpu-layers 999]

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens-from", required=True, type=Path, help="base file whose tokens to score")
    ap.add_argument("-o", "--output", required=True, type=Path)
    ap.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0: all)")
    ap.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--gpu-layers", type=int, default=999)
    a = ap.parse_args()

    import numpy as np
    import cyllama.llama.llama_cpp as cy

    n_ctx, n_vocab, n_chunk, tokens = read_header(a.tokens_from)
    if a.chunks > 0:
        n_chunk = min(n_chunk, a.chunks)
    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = a.gpu_layers
    model = cy.LlamaModel(a.model, mp)
    vocab = model.get_vocab()
    if vocab.n_vocab != n_vocab:
        raise SystemExit(f"{a.tokens_from} is for {n_vocab} tokens, {a.model} has {vocab.n_vocab}")
    cp = cy.LlamaContextParams()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[a.flash_attn]
    ctx = cy.LlamaContext(model, cp)
    bos = vocab.token_bos() if vocab.get_add_bos() else None
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
            print(f"[{c + 1}/{n_chunk}] {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"wrote {a.output} ({n_chunk} chunks of {n_ctx}, n_vocab {n_vocab})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
