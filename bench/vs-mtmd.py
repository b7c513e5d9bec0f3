#!/usr/bin/env python3
"""Side-by-side speed of `combs run --image` and llama.cpp's mtmd on the same
SmolVLM GGUF pair, the same image and the same prompt, in one run, on the GPU:

    bench/vs-mtmd.py --combs BIN -m TEXT.gguf --mmproj MMPROJ.gguf --image IMG
                     [-n 128] [-r 5] [--prompt "Can you describe this image?"]

mtmd runs through the `cyllama-vulkan` wheel (llama.cpp + libmtmd with ggml's
Vulkan backend; `PYTHONPATH` must reach it; Python 3.12): the text model
(all layers on the GPU) and the projector loaded once, one warm-up pass, then
N timed passes, each as llama-mtmd-cli does it:
  - preprocess: `MtmdBitmap.from_file` (stb_image decode) + `MtmdContext.tokenize`
    (mtmd's idefics3 resize/tiling/normalization and the text tokenization),
    wall time;
  - encode: `encode_chunk` of every image chunk (mtmd makes one chunk per
    tile, 64 tokens each; each call returns after the embeddings are read
    back), summed, and divided by the tile count for ms/tile;
  - encode + prefill: `eval_chunks` (mtmd_helper_eval_chunks: text chunks
    decoded, each image chunk encoded then decoded as embeddings into the KV
    cache, logits of the last token) from an empty cache, then
    `synchronize`; prefill = that minus the encode sum of the same pass
    (the helper interleaves the two, so prefill is not timed on its own);
  - decode: N greedy steps with llama.cpp's greedy sampler in C
    (`LlamaSampler.add_greedy`; sampling reads the logits, which waits for
    the device after every token: llama-mtmd-cli's loop), no stop on EOS.
    llama.cpp's own counter (`get_perf_data`: t_eval_ms / n_eval) is
    printed beside it.
combs runs `combs run -m TEXT --mmproj MMPROJ --image IMG -p "<image>PROMPT"
--chat -n N --temp 0` N times after one warm-up run and parses the two lines
it prints on stderr:
    image: 13 tiles (3x4 + global), decode 4.1 ms, preprocess 12.3 ms, encode 45.6 ms (3.51 ms/tile), ...
    seed ...; prompt 876 tokens in 20.1 ms (43582.1 tok/s); generated 128 tokens in 250.0 ms (512.0 tok/s); ...
(its preprocess row is decode + preprocess, as mtmd's includes stb_image's decode).
mtmd gets the same turn as SmolVLM's chat template writes it for an
[image, text] user message (transformers' form, no space after "User:"):
    <|im_start|>User:<__media__>PROMPT<end_of_utterance>\\nAssistant:
(special tokens parsed, no BOS added); the bench warns when combs' prompt
token count differs from mtmd's. For the 1024x768 image of the issue
(tests/fixtures/vlm/images/photo_1024x768.jpg) both should be 13 tiles and 876
tokens.
Prints one markdown table of medians with the ratios mtmd / combs for times
(and combs / mtmd for rates): above 1, combs is faster.

On the GPU machine, with a SmolVLM-256M-sized random pair made there by
scripts/make-vlm-speed-model.py (its docstring: carry `.gguf-py`), the
cyllama wheel in `.whl/` and the combs binary, e.g. carry
[".gguf-py", ".whl", "target/release/combs"] and run:

    pip install -q --no-deps --no-index --target /tmp/cy .whl/cyllama_vulkan-*.whl
    PYTHONPATH=.gguf-py python3 scripts/make-vlm-speed-model.py --out /tmp/vlm --no-sha
    PYTHONPATH=/tmp/cy python3 bench/vs-mtmd.py --combs target/release/combs \\
        -m /tmp/vlm/smolvlm-256m-random.gguf --mmproj /tmp/vlm/mmproj-smolvlm-256m-random.gguf \\
        --image tests/fixtures/vlm/images/photo_1024x768.jpg -n 128 -r 5

(`--no-combs` / `--no-mtmd` run one side only; `--parse-test` checks the
parser on the two example lines above.)
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

IMAGE_LINE = re.compile(
    r"image: (\d+) tiles \((\d+)x(\d+)(?: \+ global)?\), decode ([\d.]+) ms, preprocess ([\d.]+) ms, "
    r"encode ([\d.]+) ms \(([\d.]+) ms/tile\)")
GEN_LINE = re.compile(
    r"prompt (\d+) tokens in ([\d.]+) ms \(([\d.]+) tok/s\); generated (\d+) tokens in ([\d.]+) ms "
    r"\(([\d.]+) tok/s\)")


def parse_combs(log: str) -> dict | None:
    im, gen = IMAGE_LINE.search(log), GEN_LINE.search(log)
    if not (im and gen):
        return None
    return {
        "tiles": int(im.group(1)), "grid": f"{im.group(2)}x{im.group(3)}",
        "preprocess_ms": float(im.group(4)) + float(im.group(5)), "encode_ms": float(im.group(6)),
        "encode_tile_ms": float(im.group(7)),
        "prompt_tokens": int(gen.group(1)), "prefill_ms": float(gen.group(2)),
        "gen_tokens": int(gen.group(4)), "gen_ms": float(gen.group(5)),
    }


def combs(a) -> dict:
    cmd = [a.combs, "run", "-m", a.model, "--mmproj", a.mmproj, "--image", a.image,
           "-p", "<image>" + a.prompt, "--chat", "-n", str(a.n), "--temp", "0", "--seed", "0"] + a.combs_arg
    runs = []
    for i in range(a.reps + 1):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"combs failed ({' '.join(cmd)}):\n{out.stderr}")
        r = parse_combs(out.stderr)
        if r is None:
            raise SystemExit(f"combs printed no timings:\n{out.stderr}")
        if i:  # the first run warms the driver's pipeline cache
            runs.append(r)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
    last = runs[-1]
    med.update(tiles=last["tiles"], grid=last["grid"], prompt_tokens=last["prompt_tokens"],
               gen_tokens=last["gen_tokens"], decode_ms_tok=statistics.median(r["gen_ms"] / r["gen_tokens"]
                                                                              for r in runs))
    med["encode_prefill_ms"] = statistics.median(r["encode_ms"] + r["prefill_ms"] for r in runs)
    return med


class QuietStderr:
    """Sends fd 2 (C loggers) to /dev/null while active."""

    def __init__(self, active: bool):
        self.active = active

    def __enter__(self):
        if self.active:
            sys.stderr.flush()
            self.saved = os.dup(2)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        return self

    def __exit__(self, *exc):
        if self.active:
            sys.stderr.flush()
            os.dup2(self.saved, 2)
            os.close(self.saved)


def mtmd(a) -> dict:
    import cyllama.llama.llama_cpp as cy

    if not a.verbose:
        cy.disable_logging()
    cy.llama_backend_init()
    cy.ggml_backend_load_all()
    mp = cy.LlamaModelParams()
    mp.n_gpu_layers = 999
    model = cy.LlamaModel(a.model, mp)
    cp = cy.LlamaContextParams()
    cp.n_ctx = a.ctx_size  # n_batch 2048 / n_ubatch 512: llama.cpp's defaults, as in llama-mtmd-cli
    cp.no_perf = False  # keep llama.cpp's own decode counters (off by default)
    ctx = cy.LlamaContext(model, cp)
    mparams = cy.MtmdContextParams()
    mparams.use_gpu = True
    mparams.print_timings = False
    mparams.n_threads = a.threads
    mctx = cy.MtmdContext(a.mmproj, model, mparams)
    text = "<|im_start|>User:" + cy.get_default_media_marker() + a.prompt + "<end_of_utterance>\nAssistant:"
    sampler = cy.LlamaSampler(cy.LlamaSamplerChainParams())
    sampler.add_greedy()
    image_type = cy.MtmdInputChunkType.IMAGE

    def one_pass() -> dict:
        t0 = time.perf_counter()
        bmp = cy.MtmdBitmap.from_file(mctx, a.image)
        chunks = mctx.tokenize(text, [bmp], False, True)
        pre = time.perf_counter() - t0
        images = [chunks[i] for i in range(len(chunks)) if chunks[i].type == image_type]
        enc = 0.0
        for ch in images:
            t = time.perf_counter()
            if mctx.encode_chunk(ch) != 0:
                raise SystemExit("mtmd encode failed")
            enc += time.perf_counter() - t
        ctx.kv_cache_clear()
        t = time.perf_counter()
        n_past = mctx.eval_chunks(ctx, chunks, 0, 0, None, True)
        ctx.synchronize()
        enc_pre = time.perf_counter() - t
        sampler.reset()
        p0 = ctx.get_perf_data()
        t = time.perf_counter()
        tok = sampler.sample(ctx, -1)
        toks = [tok]
        for i in range(a.n):
            ctx.decode(cy.llama_batch_get_one([tok], n_past + i))
            tok = sampler.sample(ctx, -1)
            toks.append(tok)
        dec = time.perf_counter() - t
        p1 = ctx.get_perf_data()
        n_eval = p1["n_eval"] - p0["n_eval"]
        return {
            "tiles": len(images), "prompt_tokens": chunks.total_tokens, "n_past": n_past,
            "preprocess_ms": pre * 1e3, "encode_ms": enc * 1e3, "encode_tile_ms": enc * 1e3 / max(len(images), 1),
            "encode_prefill_ms": enc_pre * 1e3, "prefill_ms": (enc_pre - enc) * 1e3,
            "decode_ms_tok": dec * 1e3 / a.n,
            "perf_decode_ms_tok": (p1["t_eval_ms"] - p0["t_eval_ms"]) / n_eval if n_eval > 0 else float("nan"),
            "tokens": toks,
        }

    with QuietStderr(not a.verbose):  # mtmd's helper logs every chunk through its own logger
        one_pass()  # warm-up: pipelines, buffers
        runs = [one_pass() for _ in range(a.reps)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
    med.update(tiles=runs[-1]["tiles"], prompt_tokens=runs[-1]["prompt_tokens"], gen_tokens=a.n,
               tokens=runs[-1]["tokens"])
    return med


def table(o: dict | None, t: dict | None) -> str:
    def cell(d, k, fmt="{:.2f}"):
        return fmt.format(d[k]) if d and k in d else "-"

    def ratio(num, den):
        return f"{num / den:.2f}" if num and den else "-"

    rows = []
    for label, k in (("preprocess (decode + tiles), ms", "preprocess_ms"),
                     ("encode per tile, ms", "encode_tile_ms"),
                     ("encode all tiles, ms", "encode_ms"),
                     ("prefill of the expanded prompt, ms", "prefill_ms"),
                     ("encode + prefill, ms", "encode_prefill_ms"),
                     ("decode, ms/token", "decode_ms_tok")):
        rows.append(f"| {label} | {cell(o, k)} | {cell(t, k)} | {ratio(t and t.get(k), o and o.get(k))} |")
    pt = lambda d: d["prompt_tokens"] / d["prefill_ms"] * 1e3 if d else None  # noqa: E731
    dt = lambda d: 1e3 / d["decode_ms_tok"] if d else None  # noqa: E731
    num = lambda v, fmt: fmt.format(v) if v else "-"  # noqa: E731
    rows.append(f"| prefill, tok/s | {num(pt(o), '{:.0f}')} | {num(pt(t), '{:.0f}')} | {ratio(pt(o), pt(t))} |")
    rows.append(f"| decode, tok/s | {num(dt(o), '{:.1f}')} | {num(dt(t), '{:.1f}')} | {ratio(dt(o), dt(t))} |")
    head = ("| step | combs | mtmd | ratio mtmd/combs (rates: combs/mtmd) |\n"
            "| --- | --- | --- | --- |")
    return head + "\n" + "\n".join(rows)


PARSE_EXAMPLE = ("image: 13 tiles (3x4 + global), decode 4.1 ms, preprocess 8.2 ms, encode 45.6 ms (3.51 ms/tile), "
                 "832 embeddings\n"
                 "seed 1; prompt 876 tokens in 20.1 ms (43582.1 tok/s); generated 128 tokens in 250.0 ms "
                 "(512.0 tok/s); stop: MaxTokens\n")


def parse_test() -> int:
    r = parse_combs("some output\n" + PARSE_EXAMPLE)
    want = {"tiles": 13, "grid": "3x4", "preprocess_ms": 4.1 + 8.2, "encode_ms": 45.6, "encode_tile_ms": 3.51,
            "prompt_tokens": 876, "prefill_ms": 20.1, "gen_tokens": 128, "gen_ms": 250.0}
    assert r == want, r
    assert parse_combs(PARSE_EXAMPLE.splitlines()[0]) is None
    print("parser ok:", r)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--combs", help="the combs binary")
    ap.add_argument("-m", "--model", help="text GGUF")
    ap.add_argument("--mmproj", help="projector GGUF")
    ap.add_argument("--image", default="tests/fixtures/vlm/images/photo_1024x768.jpg")
    ap.add_argument("--prompt", default="Can you describe this image?")
    ap.add_argument("-n", type=int, default=128, help="greedy tokens to generate")
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096, help="mtmd's context (combs run's default)")
    ap.add_argument("--threads", type=int, default=4, help="mtmd's CPU threads (preprocessing)")
    ap.add_argument("--combs-arg", action="append", default=[], help="extra argument for combs run")
    ap.add_argument("--no-combs", action="store_true")
    ap.add_argument("--no-mtmd", action="store_true")
    ap.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    ap.add_argument("--parse-test", action="store_true", help="check the combs line parser and exit")
    a = ap.parse_args()
    if a.parse_test:
        return parse_test()
    if not (a.model and a.mmproj) or (not a.no_combs and not a.combs):
        ap.error("need -m, --mmproj and --combs (or --no-combs)")
    print(f"image {a.image}, prompt {a.prompt!r}, {a.n} greedy tokens; medians of {a.reps} runs after a warm-up")
    ours = None if a.no_combs else combs(a)
    theirs = None if a.no_mtmd else mtmd(a)
    for name, d in (("combs", ours), ("mtmd", theirs)):
        if d:
            print(f"  {name}: {d['tiles']} tiles, {d['prompt_tokens']} prompt tokens, {d['gen_tokens']} generated")
    if theirs:
        print(f"  mtmd: llama.cpp's own decode counter {theirs['perf_decode_ms_tok']:.3f} ms/token; "
              f"first tokens {theirs['tokens'][:8]}")
    if ours and theirs:
        for k in ("tiles", "prompt_tokens", "gen_tokens"):
            if ours[k] != theirs[k]:
                print(f"  WARNING: {k} differ: combs {ours[k]}, mtmd {theirs[k]}")
    print()
    print(table(ours, theirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
