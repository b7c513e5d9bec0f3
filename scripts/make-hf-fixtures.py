#!/usr/bin/env python3
"""Tiny random-weight Llama, Qwen2, Qwen3, Gemma 3 and Phi-3 models made with
HF transformers, each with a byte-level BPE tokenizer.json, and
transformers' logits for fixed prompts, under tests/fixtures/hf/.

tests/hf_tiny.rs runs each GGUF through combs and compares every logit with
the ones transformers computed here. Two stages, so the model-making stage
can run where torch/transformers live (the GPU machine) and the conversion
where llama.cpp's converter and its dependencies live:

  make-hf-fixtures.py make    --hf-dir DIR [--fixtures tests/fixtures/hf]
      builds each model from its config below (seeded torch init, then every
      weight redrawn: matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 0.5^2),
      norm weights ~ 1 + N(0, 0.25^2) so no norm is the identity), saves it
      as an HF model dir DIR/<name>/ (config.json, model.safetensors, f32)
      with a tiny SentencePiece tokenizer.model (see below), and writes
      <fixtures>/<name>.json: the config, the prompts and transformers'
      logits for every position of every prompt.
  make-hf-fixtures.py convert --hf-dir DIR --llama-cpp LLAMA_CPP_DIR [--fixtures ...]
      runs llama.cpp's own `convert_hf_to_gguf.py --outtype f32` on each
      DIR/<name>/ into <fixtures>/<name>.gguf and records the converter and
      the file's sha256 in <name>.json.

The committed fixtures: both stages ran on the GPU machine (Python 3.12.3,
torch 2.11.0, transformers 5.17.0, sentencepiece 0.2.2; the converter and
gguf-py copied there from llama-cpp-python 0.3.36's sdist), as each JSON's
"made_with" / "gguf" say. Run on a CPU-only machine with the same versions
(`pip install torch==2.11.0 transformers==5.17.0 sentencepiece pyyaml`),
they come out the same byte for byte.

Logits: the model in float64 on the CPU, eager attention, one forward over
the whole prompt from an empty cache (`logits[p]` is the prediction after
token p). float64 so the reference carries no rounding of its own beyond
what transformers itself does in f32 (its rope angles); the f32 forward's
distance from it is recorded beside it ("f32_vs_f64_max_abs") to show the
scale of plain f32 noise. Values are written with 7 significant digits.

Tokenizer: both converters read a SentencePiece `tokenizer.model` when the
dir has one (Qwen3's falls back to it before asking for a BPE
tokenizer.json whose pre-tokenizer hash it must know; Phi-3's requires it).
A 160-piece BPE SentencePiece model is trained here on a short fixed text
with the `sentencepiece` trainer; the converters pad the vocabulary to the
model's `vocab_size` with `[PADn]` tokens, as for real models. Prompts are
fixed token ids, not text, so the tokenizer never affects the logits.

Models (the `CONFIGS` table):
  qwen3_tiny     Qwen3: per-head Q/K RMSNorm, head_dim 32 != hidden/heads (16),
                 GQA 4/2, tied output, rope theta 1e6.
  phi3_longrope  Phi-3 the way Phi-3.5 / Phi-4-mini are configured: fused QKV
                 and gate/up, LongRoPE (short/long factors, original context 32
                 < max_position_embeddings 128, so attention factor
                 sqrt(1 + ln 4 / ln 32)), partial rotary 0.75, tied output.
                 transformers picks the long factors when the sequence is
                 longer than 32 positions (prompt of 40) and the short ones
                 otherwise (prompts of 7 and 32).
  phi3_swa       Phi-3 the way Phi-3-mini-4k is configured: no rope scaling,
                 sliding window 16 (every layer), untied output.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import platform
import socket
import subprocess
import sys
from pathlib import Path

SPM_TEXT = """\
The quick brown fox jumps over the lazy dog. A small model reads a short text
and predicts the next word, one token at a time, from left to right. Rotary
position embeddings rotate pairs of query and key dimensions by an angle that
grows with the position; long contexts stretch the slow frequencies. Sliding
windows keep only the most recent positions in view. Every layer normalizes
its input, attends to the past, and mixes the result through a gated network.
Numbers like 12, 345 and 6789 appear too, with punctuation: commas, colons;
question marks? and exclamation marks! Tests compare engines on fixed inputs.
"""

# name -> (HF class, config kwargs, seed, prompt lengths)
CONFIGS = {
    "qwen3_tiny": (
        "Qwen3ForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=128,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1001,
        [7, 40],
    ),
    "phi3_longrope": (
        "Phi3ForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            original_max_position_embeddings=32,
            rope_theta=10000.0,
            partial_rotary_factor=0.75,
            rope_scaling={
                "rope_type": "longrope",
                # 6 = (16 * 0.75) / 2 factors; far enough apart that the
                # wrong choice moves the logits well past the tolerance.
                "short_factor": [1.0, 1.25, 1.6, 2.2, 3.0, 4.0],
                "long_factor": [1.0, 2.5, 4.5, 8.0, 14.0, 24.0],
            },
            sliding_window=None,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1002,
        [7, 32, 40],
    ),
    "phi3_swa": (
        "Phi3ForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=128,
            original_max_position_embeddings=128,
            rope_theta=10000.0,
            sliding_window=16,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1003,
        [7, 40],
    ),
    "llama_tiny": (
        "LlamaForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1004,
        [7, 40],
    ),
    "qwen2_tiny": (
        "Qwen2ForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1005,
        [7, 40],
    ),
    "gemma3_tiny": (
        "Gemma3ForCausalLM",
        dict(
            vocab_size=320,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=16,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        1006,
        [7, 40],
    ),
}


def machine() -> str:
    """Where a stage ran: host name and CUDA GPU, if any."""
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA GPU"
    return f"{socket.gethostname()} ({gpu})"


def train_tokenizer(path: Path) -> None:
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SPM_TEXT.splitlines()),
        model_writer=buf,
        model_type="bpe",
        vocab_size=160,
        character_coverage=1.0,
        num_threads=1,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        normalization_rule_name="identity",
        minloglevel=2,
    )
    path.write_bytes(buf.getvalue())


def randomize(model, seed: int) -> None:
    """Redraws every weight so none is trivial (HF's init leaves norms at 1)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)


def logits_of(model, tokens, dtype):
    import torch

    m = model.to(dtype)
    with torch.no_grad():
        out = m(input_ids=torch.tensor([tokens]), use_cache=False)
    return out.logits[0].to(torch.float64)


TOKENIZER_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, trailing spaces  ",
    "Numbers: 12, 345 and 6789; 3.14159!",
    "new\nlines\n\nand\ttabs",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600",
    "<|im_start|>user\nHi there<|im_end|>",
    "don't won't they're I'll we've",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

def train_bpe(out_dir: Path) -> None:
    """A 300-token byte-level BPE trained on SPM_TEXT, saved with its
    tokenizer_config.json (specials, chat template) by transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SPM_TEXT.splitlines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def tokenizer_cases(out_dir: Path) -> list:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out_dir)
    cases = []
    for text in TOKENIZER_TEXTS:
        cases.append(
            {
                "text": text,
                "ids": tok(text, add_special_tokens=False)["input_ids"],
                "ids_special": tok(text, add_special_tokens=True)["input_ids"],
            }
        )
    return cases


def stage_make(args) -> None:
    import numpy as np
    import torch
    import transformers

    hf_root = Path(args.hf_dir)
    fixtures = Path(args.fixtures)
    fixtures.mkdir(parents=True, exist_ok=True)
    where = machine()
    for name, (cls_name, kwargs, seed, lengths) in CONFIGS.items():
        cls = getattr(transformers, cls_name)
        cfg_name = "Gemma3TextConfig" if cls_name.startswith("Gemma3") else cls_name.replace("ForCausalLM", "Config")
        cfg_cls = getattr(transformers, cfg_name)
        # transformers edits nested dicts it is given (rope_scaling): pass a copy
        config = cfg_cls(attn_implementation="eager", **copy.deepcopy(kwargs))
        torch.manual_seed(seed)
        model = cls(config).eval()
        randomize(model, seed)
        # the committed HF directory (f32 safetensors, tokenizer.json) ...
        out_dir = fixtures / name
        out_dir.mkdir(parents=True, exist_ok=True)
        model.to(torch.float32).save_pretrained(out_dir, safe_serialization=True)
        (out_dir / "generation_config.json").unlink(missing_ok=True)
        # ... and the converter's copy, with the SentencePiece tokenizer.model
        # llama.cpp's converter reads (it cannot name the pre-tokenizer of a
        # tokenizer.json it has no hash for)
        conv_dir = hf_root / name
        conv_dir.mkdir(parents=True, exist_ok=True)
        model.to(torch.float32).save_pretrained(conv_dir, safe_serialization=True)
        train_tokenizer(conv_dir / "tokenizer.model")
        # the committed directory's own byte-level BPE (SentencePiece-style
        # tokenizer.json files: scripts/make-spm-tokenizer-fixture.py)
        train_bpe(out_dir)

        rng = np.random.default_rng(seed)
        prompts = []
        for n in lengths:
            # ids below 160: tokens of both tokenizers (Gemma 3's converter
            # cuts the embedding to its tokenizer's 160 pieces)
            tokens = [int(t) for t in rng.integers(3, 160, size=n)]
            ref = logits_of(model, tokens, torch.float64)
            f32 = logits_of(model, tokens, torch.float32)
            model.to(torch.float32)
            prompts.append(
                {
                    "tokens": tokens,
                    "logits": [[float(f"{v:.7g}") for v in row] for row in ref.tolist()],
                    "f32_vs_f64_max_abs": float((f32 - ref).abs().max()),
                    "max_abs_logit": float(ref.abs().max()),
                }
            )
        fixture = {
            "name": name,
            "hf_class": cls_name,
            "hf_config": json.loads(config.to_json_string()),
            "script_config": {"kwargs": kwargs, "seed": seed, "prompt_lengths": lengths},
            "made_with": {
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "python": platform.python_version(),
                "machine": where,
                "logits": "float64 forward on the CPU, eager attention, use_cache=False",
            },
            "n_vocab": kwargs["vocab_size"],
            "hf_dir": name,
            # every directory's tokenizer.json is the byte-level BPE below
            "tokenizer_kind": "bpe",
            "tokenizer_cases": tokenizer_cases(out_dir),
            "prompts": prompts,
        }
        (fixtures / f"{name}.json").write_text(json.dumps(fixture, indent=1) + "\n")
        print(name, [(len(p["tokens"]), p["f32_vs_f64_max_abs"], p["max_abs_logit"]) for p in prompts])


def stage_convert(args) -> None:
    llama_cpp = Path(args.llama_cpp)
    fixtures = Path(args.fixtures)
    fixtures.mkdir(parents=True, exist_ok=True)
    # one converter process per model, side by side (each spends most of its
    # time importing torch)
    procs = {}
    for name in CONFIGS:
        cmd = [
            sys.executable,
            str(llama_cpp / "convert_hf_to_gguf.py"),
            str(Path(args.hf_dir) / name),
            "--outtype",
            "f32",
            "--outfile",
            str(fixtures / f"{name}.gguf"),
        ]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    where = machine()
    for name, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"{name}: convert_hf_to_gguf.py failed ({proc.returncode})")
        dst = fixtures / f"{name}.gguf"
        meta_path = fixtures / f"{name}.json"
        meta = json.loads(meta_path.read_text())
        data = dst.read_bytes()
        meta["gguf"] = {
            "file": dst.name,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "converter": "convert_hf_to_gguf.py --outtype f32 (llama.cpp vendored in "
            f"the llama-cpp-python sdist: {args.llama_cpp_label})",
            "machine": where,
        }
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(name, dst, len(data))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="stage", required=True)
    for stage in ("make", "convert"):
        s = sub.add_parser(stage)
        s.add_argument("--hf-dir", required=True)
        s.add_argument("--fixtures", default="tests/fixtures/hf")
        if stage == "convert":
            s.add_argument("--llama-cpp", required=True)
            s.add_argument("--llama-cpp-label", default="llama_cpp_python-0.3.36")
    args = p.parse_args()
    {"make": stage_make, "convert": stage_convert}[args.stage](args)


if __name__ == "__main__":
    main()
