#!/usr/bin/env python3
"""llama-bench style pp/tg of one GGUF file through llama.cpp (the cyllama
wheel: cyllama-vulkan on a GPU machine), printed as one JSON line in the
shape `combs bench --json` uses for the fields the comparison reads.

    python3 bench/llamacpp_bench.py MODEL.gguf [-p 512] [-n 128] [-r 3]
        [--split-mode none|layer] [--tensor-split 0.5,0.5]

pp: one batch of -p tokens from an empty context; tg: -n single-token
decodes from an empty context. Timed as llama-bench times it: the context
is synchronized (`llama_synchronize`) after the prompt and after every
token, and nothing is copied out inside the timed region (reading the
logits through the wheel copies 128k floats into Python and under-reads
llama.cpp by 20-50%). Where a wheel has no way to synchronize, the
timings end by reading the logits once and the JSON says so ("sync").
llama.cpp's own per-context counters (decode start to synchronize) are
reported beside them as "perf". Each test (pp, then tg) has one warm-up
run before its timed ones; medians.

`--split-mode layer` spreads the model over every GPU the Vulkan backend
sees (as `llama-bench -sm layer`), `--tensor-split` gives each one's share
(`-ts`); `none` keeps it on the first (`GGML_VK_VISIBLE_DEVICES` picks
which GPUs are seen). A wheel whose model parameters lack these fields
fails here rather than measuring something else.
"""
import argparse
import json
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--split-mode", choices=["none", "layer"], default=None)
    ap.add_argument("--tensor-split", default=None)
    a = ap.parse_args()

    import cyllama.llama.llama_cpp as cy

    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    # Load: the file to weights on the device and a context; first token:
    # to the end of the first prefill of the prompt (as combs bench).
    t_start = time.perf_counter()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 999
    if a.split_mode is not None:
        # llama.h: LLAMA_SPLIT_MODE_NONE 0, LLAMA_SPLIT_MODE_LAYER 1.
        if not hasattr(mp, "split_mode"):
            raise SystemExit("this wheel's LlamaModelParams has no split_mode")
        mp.split_mode = {"none": 0, "layer": 1}[a.split_mode]
    if a.tensor_split:
        if not hasattr(mp, "tensor_split"):
            raise SystemExit("this wheel's LlamaModelParams has no tensor_split")
        mp.tensor_split = [float(v) for v in a.tensor_split.split(",")]
    model = cy.LlamaModel(a.model, mp)
    cp = cy.LlamaContextParams()
    cp.n_ctx = a.p + a.n + 16
    cp.n_batch = max(a.p, 1)
    cp.n_ubatch = max(a.p, 1)
    ctx = cy.LlamaContext(model, cp)
    load_ms = (time.perf_counter() - t_start) * 1e3
    first_token_ms = None
    n_vocab = model.get_vocab().n_vocab if hasattr(model.get_vocab(), "n_vocab") else 32000

    x = 0x2545F4914F6CDD1D
    def tok():
        nonlocal x
        x ^= (x << 13) & (2**64 - 1)
        x ^= x >> 7
        x ^= (x << 17) & (2**64 - 1)
        return x % min(n_vocab, 32000)

    prompt = [tok() for _ in range(a.p)]
    gen = [tok() for _ in range(a.n)]
    def perf():
        try:
            d = ctx.get_perf_data()
            return {k: d[k] for k in ("t_p_eval_ms", "n_p_eval", "t_eval_ms", "n_eval")}
        except Exception:  # an older wheel without the counters
            return None

    if hasattr(ctx, "synchronize"):
        sync, how = ctx.synchronize, "llama_synchronize"
    elif hasattr(cy, "llama_synchronize"):
        sync, how = (lambda: cy.llama_synchronize(ctx)), "llama_synchronize"
    else:
        sync, how = None, "get_logits"
    # What ends a timed region: a synchronize, or (no way to synchronize)
    # nothing per token and one read of the logits at the end.
    step_end = sync or (lambda: None)
    region_end = sync or ctx.get_logits

    pp, tg, pp_perf, tg_perf = [], [], [], []
    # As llama-bench (and `combs bench`): the prompt test's warm-up and
    # repetitions, then the decode test's, not the two interleaved.
    for rep in range(a.r + 1):
        if a.p:
            ctx.kv_cache_clear()
            before = perf()
            t0 = time.perf_counter()
            ctx.decode(cy.llama_batch_get_one(prompt, 0))
            region_end()
            dt = time.perf_counter() - t0
            if first_token_ms is None:
                first_token_ms = (time.perf_counter() - t_start) * 1e3
            after = perf()
            if rep:
                pp.append(a.p / dt)
                if before and after and after["t_p_eval_ms"] > before["t_p_eval_ms"]:
                    pp_perf.append((after["n_p_eval"] - before["n_p_eval"]) * 1e3
                                   / (after["t_p_eval_ms"] - before["t_p_eval_ms"]))
    for rep in range(a.r + 1):
        if a.n:
            ctx.kv_cache_clear()
            before = perf()
            t0 = time.perf_counter()
            for i, t in enumerate(gen):
                ctx.decode(cy.llama_batch_get_one([t], i))
                step_end()
            region_end()
            dt = time.perf_counter() - t0
            after = perf()
            if rep:
                tg.append(a.n / dt)
                if before and after and after["t_eval_ms"] > before["t_eval_ms"]:
                    tg_perf.append((after["n_eval"] - before["n_eval"]) * 1e3
                                   / (after["t_eval_ms"] - before["t_eval_ms"]))
    out = {
        "model": a.model.rsplit("/", 1)[-1],
        "engine": "llama.cpp (cyllama-vulkan)",
        "split_mode": a.split_mode,
        "tensor_split": a.tensor_split,
        "sync": how,
        "load_ms": load_ms,
        "first_token_ms": first_token_ms or 0.0,
        "pp": {"n": a.p, "tps": statistics.median(pp) if pp else 0.0, "samples": pp,
               "perf_tps": statistics.median(pp_perf) if pp_perf else None},
        "tg": {"n": a.n, "tps": statistics.median(tg) if tg else 0.0, "samples": tg,
               "perf_tps": statistics.median(tg_perf) if tg_perf else None},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
