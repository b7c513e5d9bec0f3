#!/usr/bin/env python3
"""A tiny random SmolVLM (HF Idefics3) at SmolVLM-256M's vision geometry, its
llama.cpp GGUF pair, test images, and reference outputs of HF transformers and
llama.cpp's mtmd, under tests/fixtures/vlm/ (see the README written there).

Stages (run in this order; each is seeded and reproducible):

  make-vlm-fixtures.py make    --hf-dir DIR [--fixtures tests/fixtures/vlm]
      tokenizer (SmolLM2's vocabulary and merges, read from the SmolLM2 GGUF,
      plus SmolVLM's added tokens at SmolVLM's ids), the HF model dir DIR/
      (config, safetensors, tokenizer, processor, chat template), the test
      images, and transformers' references: processor output, prompt
      expansion and token ids, per-tile image embeddings (f32 and f64),
      last-token logits (f32 and f64) and 16 greedy tokens.
  make-vlm-fixtures.py extra   --hf-dir DIR [...]
      expansion.json (the processor's prompt expansion for many grids) and
      processor_alt.json (the processor at longest_edge 512 and 1536: the
      one-tile and 2x3 grids SmolVLM-256M's 2048 never produces), and
      vision/: the encoder's intermediate tensors for one tile.
  make-vlm-fixtures.py convert --hf-dir DIR --llama-cpp LLAMA_CPP_DIR [...]
      llama.cpp's convert_hf_to_gguf.py --outtype f16 on DIR for the text
      GGUF and again with --mmproj for the projector GGUF; sha256s recorded.
  make-vlm-fixtures.py mtmd    --llama-cpp LLAMA_CPP_DIR --llama-build BUILD [...]
      builds scripts/vlm_refs/{mtmd_ref,mtmd_preproc}.cpp against
      libmtmd/libllama from BUILD (scripts/setup-llamacpp.sh) and records, per
      image, mtmd's tiles, decoded pixels, chunks (token ids), image
      embeddings, last-token logits and 16 greedy tokens on the converted
      GGUFs, with their distance to transformers, and what llama-mtmd-cli
      itself formats and prints.
  make-vlm-fixtures.py speed   --out DIR --llama-cpp LLAMA_CPP_DIR
      a SmolVLM-256M-sized random model (vision 768 wide, 12 layers, 12
      heads, ffn 3072; text SmolLM2-135M: 576 wide, 30 layers, 9 heads, 3 KV
      heads, ffn 1536) converted the same way into DIR (not committed;
      ~1 min, 313 + 181 MiB of F16 GGUF).

Versions: scripts/setup-vlm-refs.sh pins transformers 5.17.0 and Pillow
11.3.0 (Pillow 13's LANCZOS rounds some downscales differently from the
Pillow code mtmd ports); llama.cpp is the commit vendored in
llama-cpp-python 0.3.36 (scripts/setup-llamacpp.sh).

Weights: seeded torch init, then every weight redrawn (matrices ~ N(0,
1/fan_in), embeddings ~ N(0, 0.5^2), norm weights ~ 1 + N(0, 0.25^2), biases
~ N(0, 0.1^2)) so no norm is the identity, then rounded to float16 and back:
the f16 GGUFs hold exactly the weights transformers runs in f32/f64.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMOLLM2_GGUF = Path.home() / ".cache/combs/models/SmolLM2-135M-Instruct.Q8_0.gguf"

# SmolVLM-256M's tokenizer: SmolLM2's 49152 tokens, then these at these ids.
N_BASE_VOCAB = 49152
IMAGE_TOKEN_ID = 49190
EOU_TOKEN_ID = 49279


def smolvlm_added_tokens() -> list[str]:
    toks = ["<global-img>"]  # 49152
    toks += [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]  # 49153..49188
    toks += ["<fake_token_around_image>", "<image>"]  # 49189, 49190
    toks += [f"<|reserved_special_token_{i}|>" for i in range(88)]  # 49191..49278
    toks += ["<end_of_utterance>"]  # 49279
    assert len(toks) == 128 and toks.index("<image>") + N_BASE_VOCAB == IMAGE_TOKEN_ID
    return toks


# SmolVLM's chat template (its tokenizer_config.json / chat_template.json).
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

TINY = dict(
    vision=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4),
    text=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2),
    seed=1801,
    # lm_head drawn from its own seed, picked (among 0..59, with the other
    # weights fixed) as the one whose greedy runs of all three prompts keep the
    # top-2 logit gap >= 0.19 at every step in f64: random heads over 49280
    # tokens typically leave near-ties of ~0.01, well inside the noise of an
    # engine that rounds activations to f16 (mtmd's CPU path: ~0.03)
    head_seed=32,
)
SPEED = dict(
    vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
    text=dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
              num_key_value_heads=3),
    seed=1802,
)

# name -> (width, height, format, what it exercises). Grids are for
# longest_edge 2048 / tile 512: the longer side is always resized to 2048,
# so one side always has 4 tiles (no 1-tile or 2x3 grid exists at this
# geometry; see the README).
IMAGES = {
    "square_640": (640, 640, "png", "upscaled to 2048x2048: 4x4 tiles"),
    "photo_1024x768": (1024, 768, "jpg", "upscaled to 2048x1536: 3 rows x 4 cols = 12 tiles + global = 13"),
    "exact_2048x1024": (2048, 1024, "png", "no resize: tiles are exact crops (global view is resized)"),
    "wide_1000x300": (1000, 300, "jpg", "wide: 2048x614 -> 2048x1024, 2 rows x 4 cols"),
    "tall_300x900": (300, 900, "png", "tall: 682x2048 -> 1024x2048, 4 rows x 2 cols"),
    "odd_333x517": (333, 517, "png", "odd sides: 1320x2048 (rounded up to even) -> 1536x2048, 4 rows x 3 cols"),
    "big_3000x1000": (3000, 1000, "jpg", "downscaled: 2048x682 -> 2048x1024, 2 rows x 4 cols"),
}
# the image of the logits / greedy references: a PNG, so every engine starts
# from the same pixels (JPEG decoders differ by a few levels), and a small
# grid keeps the prompt short
GEN_IMAGE = "tall_300x900"
# JPEGs whose PIL decode is committed as a PNG (the others: its sha256 only)
PIL_DECODED_PNG = ("photo_1024x768",)
PROMPTS = {
    "chat": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Can you describe this image?"}]}],
    "raw": "<image>What is in this picture?",
    # what llama-mtmd-cli's chat formatting makes of the same user turn (it
    # passes the content as one string, so the template writes "User: ")
    "chat_cli": "<|im_start|>User: <image>Can you describe this image?<end_of_utterance>\nAssistant:",
}
N_GREEDY = 16


def machine() -> str:
    import socket

    return f"{socket.gethostname()} (CPU, {platform.machine()})"


# ---------------------------------------------------------------- tokenizer
def build_tokenizer(out_dir: Path):
    """SmolLM2's byte-level BPE as an HF tokenizer.json, plus SmolVLM's tokens."""
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    r = gguf.GGUFReader(str(SMOLLM2_GGUF))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = r.fields["tokenizer.ggml.merges"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    assert len(tokens) == N_BASE_VOCAB
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[tuple(m.split(" ")) for m in merges],
        fuse_unk=False,
        byte_fallback=False,
    )
    tk = Tokenizer(bpe)
    # SmolLM's pre-tokenizer: digits one by one, then GPT-2's byte-level split
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)]
    )
    tk.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tk.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    control = [t for t, ty in zip(tokens, types) if ty == 3]  # SmolLM2's 17 special tokens (ids 0..16)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in smolvlm_added_tokens()])
    assert tk.get_vocab_size() == N_BASE_VOCAB + 128
    assert tk.token_to_id("<image>") == IMAGE_TOKEN_ID and tk.token_to_id("<end_of_utterance>") == EOU_TOKEN_ID
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        model_max_length=8192,
        add_bos_token=False,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


# ---------------------------------------------------------------- model
def build_config(geo: dict):
    from transformers import Idefics3Config

    v, t = geo["vision"], geo["text"]
    return Idefics3Config(
        vision_config=dict(
            model_type="idefics3_vision", image_size=512, patch_size=16, num_channels=3,
            hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, **v,
        ),
        text_config=dict(
            model_type="llama", architectures=["VLlama3ForCausalLM"], vocab_size=N_BASE_VOCAB + 128,
            max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, hidden_act="silu",
            tie_word_embeddings=False, bos_token_id=1, eos_token_id=EOU_TOKEN_ID, pad_token_id=2,
            attention_bias=False, mlp_bias=False, **t,
        ),
        scale_factor=4,
        image_token_id=IMAGE_TOKEN_ID,
        pad_token_id=2,
        # untied: with a random tied head the last input token's own embedding
        # dominates the logits and greedy decoding repeats one token forever
        tie_word_embeddings=False,
        attn_implementation="eager",
    )


def randomize(model, geo: dict) -> None:
    """Redraws every weight (HF's init leaves norms at 1, biases at 0), f16-exact."""
    import torch

    g = torch.Generator().manual_seed(geo["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "lm_head.weight" and "head_seed" in geo:
                gh = torch.Generator().manual_seed(geo["head_seed"])
                w = torch.randn(p.shape, generator=gh) / p.shape[1] ** 0.5
            elif p.dim() == 1 and ("norm" in name):
                w = 1.0 + 0.25 * torch.randn(p.shape, generator=g)
            elif p.dim() == 1:
                w = 0.1 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name or "position_embedding" in name:
                w = 0.5 * torch.randn(p.shape, generator=g)
            else:
                fan_in = p[0].numel()
                w = torch.randn(p.shape, generator=g) / fan_in**0.5
            p.copy_(w.to(torch.float16).to(torch.float32))


def build_processor(tokenizer):
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ip = Idefics3ImageProcessorPil(
        do_resize=True, size={"longest_edge": 2048}, max_image_size={"longest_edge": 512},
        do_image_splitting=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, do_pad=True,
    )
    return Idefics3Processor(image_processor=ip, tokenizer=tokenizer, image_seq_len=64, chat_template=CHAT_TEMPLATE)


def make_hf_model(hf_dir: Path, geo: dict):
    import torch
    from transformers import Idefics3ForConditionalGeneration

    hf_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(hf_dir)
    config = build_config(geo)
    torch.manual_seed(geo["seed"])
    model = Idefics3ForConditionalGeneration(config).eval()
    randomize(model, geo)
    model.save_pretrained(hf_dir, safe_serialization=True)
    # The converter reads the vision layer-norm eps from config.json and falls
    # back to 1e-5 when absent (transformers' default is 1e-6): always write it.
    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["vision_config"]["layer_norm_eps"] = config.vision_config.layer_norm_eps
    cfg["vision_config"]["hidden_act"] = config.vision_config.hidden_act
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    proc = build_processor(tok)
    proc.save_pretrained(hf_dir)
    # SmolLM2's GGUF says add_bos_token = false and the prompts carry
    # <|im_start|> themselves; transformers 5 does not save the flag, so the
    # converter would leave llama.cpp's BPE default (add a BOS) in the GGUF
    tc_path = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc.update(add_bos_token=False, add_eos_token=False)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    return model, proc


# ---------------------------------------------------------------- images
def make_image(w: int, h: int, seed: int):
    """Smooth synthetic RGB content (compresses well, no flat regions)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    u, v = x / w, y / h
    chans = []
    for c in range(3):
        a = rng.uniform(0.5, 3.0, size=4)
        ph = rng.uniform(0, 2 * np.pi, size=4)
        f = (np.sin(2 * np.pi * a[0] * u + ph[0]) * np.cos(2 * np.pi * a[1] * v + ph[1])
             + 0.5 * np.sin(2 * np.pi * (a[2] * u + a[3] * v) + ph[2])
             + 0.8 * (u - 0.5) * (c - 1) + 0.3 * np.cos(ph[3] + 9 * u * v))
        chans.append(f)
    img = np.stack(chans, axis=-1)
    # a few sharp-edged discs so resampling filters show their differences
    for _ in range(3):
        cx, cy, rad = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.05, 0.15)
        col = rng.uniform(-1.5, 1.5, size=3)
        mask = ((u - cx) ** 2 + ((v - cy) * h / w) ** 2) < rad**2
        img[mask] = col
    img = (img - img.min()) / (img.max() - img.min())
    return (img * 255.0 + 0.5).clip(0, 255).astype(np.uint8)


def write_images(fixtures: Path) -> dict:
    from PIL import Image

    out = {}
    for i, (name, (w, h, fmt, what)) in enumerate(IMAGES.items()):
        arr = make_image(w, h, 5000 + i)
        path = fixtures / "images" / f"{name}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        im = Image.fromarray(arr)
        if fmt == "png":
            im.save(path, optimize=True)
        else:
            im.save(path, quality=90, subsampling=0)
        out[name] = path
    return out


# ---------------------------------------------------------------- references
def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def f7(x: float) -> float:
    return float(f"{x:.7g}")


def processor_refs(proc, img_path: Path, name: str, out_dir: Path, rng) -> dict:
    """Processor output of one image: grid, tiles (as lossless PNG), samples, sums."""
    import numpy as np
    from PIL import Image

    pil = Image.open(img_path).convert("RGB")
    enc = proc.image_processor(images=[pil], return_tensors="np", return_row_col_info=True)
    pv = enc["pixel_values"][0].astype(np.float32)  # [n_tiles, 3, 512, 512]
    rows, cols = int(enc["rows"][0][0]), int(enc["cols"][0][0])
    n_tiles = pv.shape[0]
    assert n_tiles == (rows * cols + 1 if rows * cols else 1), (rows, cols, n_tiles)
    # (x/255 - 0.5)/0.5 inverted; the processor's resizes work on uint8, so
    # these round back to exact integers (checked)
    u8 = (pv * 0.5 + 0.5) * 255.0
    u8r = np.rint(u8)
    max_dev = float(np.abs(u8 - u8r).max())
    assert max_dev < 1e-3, max_dev
    u8r = u8r.astype(np.uint8)
    tdir = out_dir / "tiles" / name
    tdir.mkdir(parents=True, exist_ok=True)
    tiles = []
    for k in range(n_tiles):
        png = tdir / f"tile_{k:02d}.png"
        Image.fromarray(np.ascontiguousarray(u8r[k].transpose(1, 2, 0))).save(png, optimize=True)
        idx = rng.integers(0, [3, 512, 512], size=(64, 3))
        tiles.append({
            "png": str(png.relative_to(out_dir)),
            "kind": "global" if k == n_tiles - 1 else f"row {k // cols + 1} col {k % cols + 1}",
            "sum": float(pv[k].astype(np.float64).sum()),
            "sum_abs": float(np.abs(pv[k].astype(np.float64)).sum()),
            "samples": [[int(c), int(y), int(x), float(pv[k, c, y, x])] for c, y, x in idx],
        })
    return {"rows": rows, "cols": cols, "n_tiles": n_tiles, "tiles": tiles,
            "u8_roundtrip_max_dev": max_dev}, pv


def image_embeddings(model, pv, dtype):
    import torch

    m = model.to(dtype)
    with torch.no_grad():
        out = m.model.get_image_features(pixel_values=torch.from_numpy(pv)[None].to(dtype))
    feats = out.pooler_output  # [n_tiles, 64, n_embd_text]
    model.to(torch.float32)
    return feats.to(torch.float64).numpy()


def forward_logits(model, inputs, dtype):
    import torch

    m = model.to(dtype)
    kw = {k: (v.to(dtype) if k == "pixel_values" else v) for k, v in inputs.items()}
    with torch.no_grad():
        out = m(**kw, use_cache=False)
    model.to(torch.float32)
    return out.logits[0, -1].to(torch.float64).numpy()


def greedy(model, inputs, n: int) -> tuple[list[int], list[dict]]:
    """n argmax steps in f32 with the KV cache; no stop token (always n).

    Also returns, per step, the 8 largest logits (ids, values) the argmax
    was taken from: step 0 is the prefill's last position, step k the decode
    of the k-th generated token."""
    import torch

    ids = inputs["input_ids"]
    out_ids, steps = [], []
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
        past = out.past_key_values
        for _ in range(n):
            top = torch.topk(out.logits[0, -1], 8)
            steps.append({"top8_ids": [int(i) for i in top.indices],
                          "top8_logits": [f7(float(v)) for v in top.values],
                          "top2_gap": float(top.values[0] - top.values[1])})
            nxt = int(out.logits[0, -1].argmax())
            out_ids.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True,
                        attention_mask=torch.ones_like(ids))
            past = out.past_key_values
    return out_ids, steps


def prompt_text(proc, kind: str) -> str:
    if kind == "chat":
        return proc.apply_chat_template(PROMPTS["chat"], add_generation_prompt=True, tokenize=False)
    return PROMPTS[kind]


def stage_make(args) -> None:
    import numpy as np
    import PIL
    import torch
    import transformers
    from PIL import Image

    torch.set_num_threads(2)
    fixtures = Path(args.fixtures)
    fixtures.mkdir(parents=True, exist_ok=True)
    model, proc = make_hf_model(Path(args.hf_dir), TINY)
    images = write_images(fixtures)
    rng = np.random.default_rng(TINY["seed"])
    tok = proc.tokenizer

    meta = {
        "made_with": {
            "transformers": transformers.__version__, "torch": torch.__version__, "pillow": PIL.__version__,
            "python": platform.python_version(), "machine": machine(),
            "image_processor": "Idefics3ImageProcessorPil (PIL LANCZOS, uint8 between resizes)",
            "attention": "eager",
        },
        "hf_config": json.loads(model.config.to_json_string()),
        "image_seq_len": 64, "image_token_id": IMAGE_TOKEN_ID, "eou_token_id": EOU_TOKEN_ID,
        "n_vocab": N_BASE_VOCAB + 128, "n_embd_text": TINY["text"]["hidden_size"],
        "preprocess": {"tile_size": 512, "longest_edge": 2048, "mean": [0.5] * 3, "std": [0.5] * 3,
                       "resample": "lanczos (PIL)"},
        "chat_template": CHAT_TEMPLATE,
        "images": {},
    }
    emb_dir = fixtures / "embd"
    emb_dir.mkdir(exist_ok=True)
    for name, path in images.items():
        w, h, fmt, what = IMAGES[name]
        pref, pv = processor_refs(proc, path, name, fixtures, rng)
        entry = {"file": str(path.relative_to(fixtures)), "width": w, "height": h, "format": fmt,
                 "sha256": sha256(path), "what": what, **pref}
        if fmt == "jpg":
            rgb = np.asarray(Image.open(path).convert("RGB"))
            entry["pil_decode"] = {"rgb_sha256": hashlib.sha256(rgb.tobytes()).hexdigest(),
                                   "mean": float(rgb.mean())}
            if name in PIL_DECODED_PNG:
                dp = fixtures / "images" / "pil_decoded" / f"{name}.png"
                dp.parent.mkdir(exist_ok=True)
                Image.fromarray(rgb).save(dp, optimize=True)
                entry["pil_decode"]["png"] = str(dp.relative_to(fixtures))
        # embeddings of every tile after the connector: f64 reference file + f32 distance
        e64 = image_embeddings(model, pv, torch.float64)
        e32 = image_embeddings(model, pv, torch.float32)
        ef = emb_dir / f"{name}.f32"
        e64.astype("<f4").tofile(ef)
        rel = np.abs(e32 - e64).max() / np.abs(e64).max()
        entry["embeddings"] = {
            "file": str(ef.relative_to(fixtures)), "shape": list(e64.shape),
            "dtype": "f32 little-endian, float64 forward rounded to f32, tile order as tiles",
            "f32_vs_f64_max_rel": float(rel), "max_abs": float(np.abs(e64).max()),
            "row_norms_tile0": [f7(x) for x in np.linalg.norm(e64[0], axis=-1)[:8]],
        }
        # prompt expansion + ids for both prompt kinds, through the processor
        entry["prompts"] = {}
        for kind in PROMPTS:
            text = prompt_text(proc, kind)
            enc = proc(text=[text], images=[[Image.open(path).convert("RGB")]], return_tensors="pt")
            ids = [int(t) for t in enc["input_ids"][0]]
            expanded = proc.tokenizer.decode(ids, skip_special_tokens=False)
            n_img = sum(1 for t in ids if t == IMAGE_TOKEN_ID)
            assert n_img == 64 * pref["n_tiles"], (n_img, pref["n_tiles"])
            entry["prompts"][kind] = {"text": text, "expanded_text": expanded, "input_ids": ids}
        meta["images"][name] = entry
        print(name, pref["rows"], pref["cols"], pref["n_tiles"], f"emb f32/f64 rel {rel:.2e}", flush=True)

    # logits and greedy tokens on the generation image, both prompts
    gen = {}
    pil = Image.open(images[GEN_IMAGE]).convert("RGB")
    for kind in PROMPTS:
        text = prompt_text(proc, kind)
        inputs = dict(proc(text=[text], images=[[pil]], return_tensors="pt"))
        inputs.pop("rows", None)
        inputs.pop("cols", None)
        l64 = forward_logits(model, inputs, torch.float64)
        l32 = forward_logits(model, inputs, torch.float32)
        lf = fixtures / f"logits_{kind}.f32"
        l64.astype("<f4").tofile(lf)
        g, steps = greedy(model, inputs, N_GREEDY)
        gen[kind] = {
            "image": GEN_IMAGE, "text": text, "n_prompt_tokens": int(inputs["input_ids"].shape[1]),
            "last_logits_file": lf.name, "last_logits_dtype": "f32 little-endian (float64 forward), n_vocab values",
            "f32_vs_f64_max_abs": float(np.abs(l32 - l64).max()), "max_abs_logit": float(np.abs(l64).max()),
            "top5": [int(i) for i in np.argsort(-l64)[:5]],
            "top2_gap": float(np.sort(l64)[-1] - np.sort(l64)[-2]),
            "greedy_f32": g, "greedy_text": tok.decode(g, skip_special_tokens=False),
            "greedy_min_top2_gap": min(st["top2_gap"] for st in steps), "greedy_steps": steps,
        }
        print(kind, gen[kind]["n_prompt_tokens"], g, flush=True)
    meta["generation"] = gen
    (fixtures / "transformers.json").write_text(json.dumps(meta, indent=1) + "\n")


# ---------------------------------------------------------------- other geometries
# Grids SmolVLM-256M's geometry never produces (one tile, 2x3), from the same
# processor with another longest_edge: (longest_edge, image name, w, h, format).
ALT = [
    (512, "alt_640x640", 640, 640, "png"),      # fits one tile after resizing: global view only
    (1536, "alt_1536x1024", 1536, 1024, "png"),  # no resize at 1536: 2 rows x 3 cols, exact crops
    (1536, "alt_640x640", 640, 640, "png"),      # 3x3
    (1536, "tall_300x900", 300, 900, "png"),     # 512x1536: 3 rows x 1 col
]
EXPANSION_GRIDS = [(0, 0), (1, 1), (1, 2), (2, 3), (3, 2), (2, 4), (4, 1), (4, 4), (6, 6)]


def stage_extra(args) -> None:
    """Prompt expansions for many grids and the processor at other longest_edge values."""
    import numpy as np
    from PIL import Image

    fixtures = Path(args.fixtures)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.hf_dir)
    proc = build_processor(tok)
    exp = []
    for rows, cols in EXPANSION_GRIDS:
        text = proc.replace_image_token({"rows": [[rows]], "cols": [[cols]]}, 0)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        exp.append({"rows": rows, "cols": cols, "image_seq_len": 64, "text": text, "ids": ids})
    (fixtures / "expansion.json").write_text(json.dumps(
        {"source": "Idefics3Processor.replace_image_token (transformers), ids from the tiny model's tokenizer "
                   "(add_special_tokens=False); rows = cols = 0 is the global-only form", "grids": exp}, indent=1) + "\n")

    rng = np.random.default_rng(1803)
    out = []
    for i, (edge, name, w, h, fmt) in enumerate(ALT):
        path = fixtures / "images" / f"{name}.{fmt}"
        if not path.exists():
            Image.fromarray(make_image(w, h, 6000 + i)).save(path, optimize=True)
        ip = build_processor(tok).image_processor
        ip.size = {"longest_edge": edge}
        enc = ip(images=[Image.open(path).convert("RGB")], return_tensors="np", return_row_col_info=True)
        pv = enc["pixel_values"][0].astype(np.float32)
        rows, cols = int(enc["rows"][0][0]), int(enc["cols"][0][0])
        tiles = []
        for k in range(pv.shape[0]):
            idx = rng.integers(0, [3, 512, 512], size=(256, 3))
            tiles.append({"sum": float(pv[k].astype(np.float64).sum()),
                          "sum_abs": float(np.abs(pv[k].astype(np.float64)).sum()),
                          "samples": [[int(c), int(y), int(x), float(pv[k, c, y, x])] for c, y, x in idx]})
        out.append({"longest_edge": edge, "tile_size": 512, "file": str(path.relative_to(fixtures)),
                    "sha256": sha256(path), "width": w, "height": h, "rows": rows, "cols": cols,
                    "n_tiles": int(pv.shape[0]), "tiles": tiles})
        print(edge, name, rows, cols, pv.shape[0])
    vision_intermediates(Path(args.hf_dir), proc, fixtures)
    (fixtures / "processor_alt.json").write_text(json.dumps(
        {"source": "Idefics3ImageProcessorPil, mean = std = 0.5, LANCZOS; samples are [c, y, x, value]",
         "cases": out}, indent=1) + "\n")


def vision_intermediates(hf_dir: Path, proc, fixtures: Path) -> None:
    """The SigLIP encoder's and connector's intermediate tensors for one tile
    (float64 forward), to find which step of an encoder goes wrong."""
    import numpy as np
    import torch
    from PIL import Image
    from transformers import Idefics3ForConditionalGeneration

    name, tile = "exact_2048x1024", 0
    model = Idefics3ForConditionalGeneration.from_pretrained(hf_dir, dtype=torch.float64,
                                                             attn_implementation="eager").eval()
    pil = Image.open(fixtures / "images" / f"{name}.png").convert("RGB")
    pv = proc.image_processor(images=[pil], return_tensors="np")["pixel_values"][0][tile]
    x = torch.from_numpy(pv.astype(np.float64))[None]
    out_dir = fixtures / "vision"
    out_dir.mkdir(exist_ok=True)
    with torch.no_grad():
        vo = model.model.vision_model(pixel_values=x, output_hidden_states=True, return_dict=True)
        shuffled = model.model.connector.pixel_shuffle(vo.last_hidden_state, model.config.scale_factor)
        proj = model.model.connector.modality_projection(shuffled)
    tensors = {"embeddings": vo.hidden_states[0]}  # patch conv + position embedding
    for i in range(1, len(vo.hidden_states)):
        tensors[f"block{i - 1}"] = vo.hidden_states[i]  # residual stream after block i-1
    tensors["post_ln"] = vo.last_hidden_state
    tensors["pixel_shuffle"] = shuffled
    tensors["connector"] = proj
    files = {}
    for key, t in tensors.items():
        f = out_dir / f"{name}_tile{tile}_{key}.f32"
        a = t[0].numpy()
        a.astype("<f4").tofile(f)
        files[key] = {"file": str(f.relative_to(fixtures)), "shape": list(a.shape)}
    (out_dir / "README.json").write_text(json.dumps({
        "source": f"transformers float64 forward of tile {tile} (row 1 col 1) of images/{name}.png; f32 little-endian, "
                  "row-major; rows of the [1024, n_embd] tensors are patches in row-major order over the 32x32 grid",
        "tensors": files}, indent=1) + "\n")


# ---------------------------------------------------------------- conversion
def convert(hf_dir: Path, llama_cpp: Path, text_out: Path, mmproj_out: Path, label: str) -> dict:
    conv = llama_cpp / "convert_hf_to_gguf.py"
    env_py = sys.executable
    for extra, out in (([], text_out), (["--mmproj"], mmproj_out)):
        cmd = [env_py, str(conv), str(hf_dir), "--outtype", "f16", "--outfile", str(out), *extra]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256(p),
                 "converter": f"convert_hf_to_gguf.py --outtype f16 {'--mmproj ' if p == mmproj_out else ''}"
                              f"(llama.cpp vendored in {label})"}
        for p in (text_out, mmproj_out)
    }


def gguf_summary(path: Path) -> dict:
    import gguf

    r = gguf.GGUFReader(str(path))
    kv = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer.ggml.") and k.split(".")[-1] in ("tokens", "merges", "token_type"):
            continue
        try:
            v = f.contents()
        except Exception:  # noqa: BLE001 - a field gguf-py cannot render is skipped
            continue
        if isinstance(v, str) and len(v) > 200:
            v = v[:200] + "..."
        kv[k] = v
    tensors = {t.name: {"type": t.tensor_type.name, "shape": [int(x) for x in t.shape]} for t in r.tensors}
    out = {"kv": kv, "tensors": tensors}
    if "tokenizer.ggml.token_type" in r.fields:
        tt = r.fields["tokenizer.ggml.token_type"].contents()
        toks = r.fields["tokenizer.ggml.tokens"].contents()
        out["added_token_types"] = {toks[i]: int(tt[i]) for i in
                                    [0, 1, 2, 49152, 49153, 49188, 49189, 49190, 49191, 49278, 49279]}
    return out


def stage_convert(args) -> None:
    fixtures = Path(args.fixtures)
    info = convert(Path(args.hf_dir), Path(args.llama_cpp), fixtures / "smolvlm-tiny.gguf",
                   fixtures / "mmproj-smolvlm-tiny.gguf", args.llama_cpp_label)
    for name in list(info):
        info[name]["summary"] = gguf_summary(fixtures / name)
    (fixtures / "gguf.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
    for k, v in info.items():
        print(k, v["bytes"], v["sha256"])


def stage_speed(args) -> None:
    import torch

    torch.set_num_threads(2)
    out = Path(args.out)
    hf_dir = out / "hf"
    model, proc = make_hf_model(hf_dir, SPEED)
    del model
    info = convert(hf_dir, Path(args.llama_cpp), out / "smolvlm-256m-random.gguf",
                   out / "mmproj-smolvlm-256m-random.gguf", args.llama_cpp_label)
    (out / "gguf.json").write_text(json.dumps(info, indent=1) + "\n")
    if not args.keep_hf:
        import shutil

        shutil.rmtree(hf_dir)  # ~1 GB of f32 safetensors, only the converter's input
    print(json.dumps(info, indent=1))


# ---------------------------------------------------------------- mtmd
def stage_mtmd(args) -> None:
    sys.path.insert(0, str(HERE / "vlm_refs"))
    import mtmd_stage

    mtmd_stage.run(args, image_token_id=IMAGE_TOKEN_ID, n_greedy=N_GREEDY, gen_image=GEN_IMAGE)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="stage", required=True)
    for stage in ("make", "extra", "convert", "mtmd", "speed"):
        s = sub.add_parser(stage)
        s.add_argument("--fixtures", default="tests/fixtures/vlm")
        s.add_argument("--llama-cpp-label", default="llama_cpp_python-0.3.36")
        if stage in ("make", "extra", "convert"):
            s.add_argument("--hf-dir", required=True)
        if stage in ("convert", "mtmd", "speed"):
            s.add_argument("--llama-cpp", required=True)
        if stage == "mtmd":
            s.add_argument("--llama-build", required=True)
            s.add_argument("--work", default="/tmp/vlm-mtmd-work")
        if stage == "speed":
            s.add_argument("--out", required=True)
            s.add_argument("--keep-hf", action="store_true", help="keep the HF model dir OUT/hf")
    args = p.parse_args()
    stages = {"make": stage_make, "extra": stage_extra, "convert": stage_convert, "mtmd": stage_mtmd,
              "speed": stage_speed}
    stages[args.stage](args)


if __name__ == "__main__":
    main()
