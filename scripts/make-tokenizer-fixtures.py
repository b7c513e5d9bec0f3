#!/usr/bin/env python3
"""Write the tokenizer and chat-template fixtures under tests/fixtures/tokenizer/.

The expected values come from engines independent of combs:

* token ids, detokenized text and token pieces from llama.cpp itself: its
  `libllama.so` (built by scripts/setup-llamacpp.sh) called through ctypes,
  the same C functions llama-cpp-python wraps (`llama_tokenize`,
  `llama_detokenize`, `llama_token_to_piece`, `llama_vocab_is_eog`);
* rendered chat templates from Python's jinja2, set up the way Hugging Face
  transformers' `apply_chat_template` sets it up (trim_blocks, lstrip_blocks,
  loopcontrols, `raise_exception`, `strftime_now`, `tojson`).

Files: {smollm2,gemma3}.json (ids in all four add_special/parse_special
modes, detokenized text, token pieces, EOG set), chat_{smollm2,gemma3}.json,
and variants.json (every supported `tokenizer.ggml.pre` on SmolLM2's
vocabulary, Gemma's vocabulary with `add_space_prefix` on), the variants
made by copying a model's metadata into a tensor-less GGUF with keys changed.

Usage:
    scripts/make-tokenizer-fixtures.py            # both models
Environment:
    COMBS_TOOLS   llama.cpp build (default ~/.cache/combs/tools); the library
                  is looked up in $COMBS_TOOLS/build/bin/libllama.so
    COMBS_MODELS  model cache (default ~/.cache/combs/models, see fetch-models.sh)
Needs: python3 with jinja2 (Debian: python3-jinja2, or `pip install jinja2`).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import random
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
TOOLS = Path(os.environ.get("COMBS_TOOLS", Path.home() / ".cache/combs/tools"))
MODELS = Path(os.environ.get("COMBS_MODELS", Path.home() / ".cache/combs/models"))

MODEL_FILES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

# llama.cpp's fallback when a model carries no template (common/chat.cpp).
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)

CORPUS = [
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\t",
    " \n \n",
    "Hello world",
    " Hello world",
    "Hello World!",
    "The quick brown fox jumps over the lazy dog. It wasn't the dog's fault; they're fine, I'm sure we'll see.",
    "I'M SHOUTING, YOU'RE NOT, THEY'VE GONE, HE'D SAY, SHE'LL GO, IT'S OK.",
    "'s 't 're 've 'm 'll 'd '",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet x: Vec<u32> = (0..10).collect();\n\tprintln!(\"{:?}\", x);\n}\n",
    "if (a && b || !c) { x += 1; } // comment\r\n  /* block */",
    "1234567 and 3.14159 and -0.5e-10 and 1,000,000.00 and 007",
    "12345678901234567890",
    "Numbers: ١٢٣٤ ١٢ ۴۵۶ １２３ ½ ² Ⅻ",
    "café naïve résumé Ångström Ærøskøbing façade jalapeño",
    "e\u0301 a\u0308 combining marks",
    "日本語のテキストです。東京は大きい。",
    "中文文本，包含标点符号！",
    "한국어 텍스트입니다",
    "مرحبا بالعالم، كيف حالك؟",
    "Привет, мир! Ελληνικά κείμενο.",
    "हिन्दी पाठ और ภาษาไทย",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ family",
    "🤖🤖🤖",
    "tabs\tand\t\ttabs\t\t\t",
    "many     spaces      here",
    "trailing spaces   ",
    "line one\nline two\n\nline four\n\n\n\nline eight",
    "windows\r\nline\r\nendings\r\n",
    "\n\n\n\n",
    "unicode\u00a0nbsp\u3000ideographic\u2009thin\u2028sep",
    "math ∑∫≠≤≥ √2 ∞ € £ ¥ $100 ©®™",
    "!!!???...,,,;;;:::---___+++===",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "<table><tr><td>cell</td></tr></table> <b>bold</b> </s>",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_start|><|im_end|>",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <pad> <unk> <mask>",
    "<0x41> <0xFF> <0x0A>",
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 3,
    "a" * 300,
    "x" + "y" * 64 + "z",
    "control\x00chars\x01\x7f here \ufffd \ue000 private",
    "new in Unicode 16: \U0001fae9 \U00010d40 \u1c89 done",
    "mixedCASE camelCaseWord snake_case_word kebab-case-word CONSTANT_CASE",
    "abc123def456 v2.0.1-rc3 x86_64 utf-8",
    "She said, \"Hello!\" — and then… left. «Quoted» ‘single’ “double”",
    "  leading and trailing  ",
    "a\u200db\u200cc\ufeffd",
]

# Pieces for the randomized stress texts: everything above, glued with
# separators in random order, so splits meet at every kind of boundary.
STRESS_POOL = [
    "the", "The", "quick", "dog's", "we'll", "I'M", " ", "  ", "   ", "\t", "\n", "\r\n",
    "\n\n", "0", "42", "1234567", "3.14", "-", "_", ".", ",", "!", "?", "...", "(", ")",
    "{", "}", "<", ">", "</s>", "<b>", "é", "ñ", "ß", "日本", "语", "한", "ب", "й", "α",
    "😀", "👨‍👩‍👧", "🏽", "\u0301", "\u00a0", "\u3000", "١٢", "１", "∑", "€", "'s", "'",
    "\"", "\\", "/", "#", "@", "<|im_start|>", "<|im_end|>", "<start_of_turn>",
    "<end_of_turn>", "<bos>", "<0x41>", "▁", "Ġ", "ĊĠ", "aaaa", "Zz",
]


def stress_texts() -> list[str]:
    rng = random.Random(20240607)
    out = []
    for n in (120, 240, 480):
        out.append("".join(rng.choice(STRESS_POOL) for _ in range(n)))
    return out


# ---------------------------------------------------------------- GGUF metadata

def read_gguf_metadata(path: Path) -> dict:
    """Metadata key/values of a GGUF file (strings as bytes); tensors are not read."""
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
              10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))

        def rstr():
            (n,) = rd("Q")
            return f.read(n)

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                (at,) = rd("I")
                (n,) = rd("Q")
                if at in scalar:
                    fmt = scalar[at]
                    return list(struct.unpack("<%d%s" % (n, fmt), f.read(n * struct.calcsize(fmt))))
                return [rval(at) for _ in range(n)]
            return rd(scalar[t])[0]

        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        rd("I")
        _, n_kv = rd("QQ")
        meta = {}
        for _ in range(n_kv):
            key = rstr().decode()
            (t,) = rd("I")
            meta[key] = rval(t)
        return meta


# ---------------------------------------------------------------- llama.cpp

class LlamaParams(ctypes.Structure):
    # struct llama_model_params of the vendored llama.cpp (include/llama.h)
    _fields_ = [
        ("devices", ctypes.c_void_p),
        ("tensor_buft_overrides", ctypes.c_void_p),
        ("n_gpu_layers", ctypes.c_int32),
        ("split_mode", ctypes.c_int),
        ("load_mode", ctypes.c_int),
        ("lazy_mode", ctypes.c_int),
        ("main_gpu", ctypes.c_int32),
        ("tensor_split", ctypes.c_void_p),
        ("progress_callback", ctypes.c_void_p),
        ("progress_callback_user_data", ctypes.c_void_p),
        ("kv_overrides", ctypes.c_void_p),
        ("vocab_only", ctypes.c_bool),
        ("check_tensors", ctypes.c_bool),
        ("use_extra_bufts", ctypes.c_bool),
        ("no_host", ctypes.c_bool),
        ("no_alloc", ctypes.c_bool),
        ("load_mtp", ctypes.c_bool),
    ]


LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def _silent_log(_level, _text, _user):
    pass


_SILENT = LOG_CB(_silent_log)


class Llama:
    """The few libllama entry points the fixtures need."""

    def __init__(self) -> None:
        libdir = TOOLS / "build" / "bin"
        lib_path = libdir / "libllama.so"
        if not lib_path.exists():
            raise SystemExit(f"{lib_path} missing: run scripts/setup-llamacpp.sh first")
        for dep in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
            if (libdir / dep).exists():
                ctypes.CDLL(str(libdir / dep), mode=ctypes.RTLD_GLOBAL)
        lib = ctypes.CDLL(str(lib_path))
        p, i32, b = ctypes.c_void_p, ctypes.c_int32, ctypes.c_bool
        lib.llama_log_set.argtypes = [LOG_CB, p]
        lib.llama_log_set(_SILENT, None)
        lib.llama_backend_init.argtypes = []
        lib.llama_backend_init()
        lib.llama_model_default_params.restype = LlamaParams
        lib.llama_model_load_from_file.argtypes = [ctypes.c_char_p, LlamaParams]
        lib.llama_model_load_from_file.restype = p
        lib.llama_model_get_vocab.argtypes = [p]
        lib.llama_model_get_vocab.restype = p
        lib.llama_vocab_n_tokens.argtypes = [p]
        lib.llama_vocab_n_tokens.restype = i32
        lib.llama_vocab_is_eog.argtypes = [p, i32]
        lib.llama_vocab_is_eog.restype = b
        lib.llama_vocab_bos.argtypes = [p]
        lib.llama_vocab_bos.restype = i32
        lib.llama_vocab_eos.argtypes = [p]
        lib.llama_vocab_eos.restype = i32
        lib.llama_vocab_get_add_bos.argtypes = [p]
        lib.llama_vocab_get_add_bos.restype = b
        lib.llama_tokenize.argtypes = [p, ctypes.c_char_p, i32, ctypes.POINTER(i32), i32, b, b]
        lib.llama_tokenize.restype = i32
        lib.llama_detokenize.argtypes = [p, ctypes.POINTER(i32), i32, ctypes.c_char_p, i32, b, b]
        lib.llama_detokenize.restype = i32
        lib.llama_token_to_piece.argtypes = [p, i32, ctypes.c_char_p, i32, i32, b]
        lib.llama_token_to_piece.restype = i32
        self.lib = lib

    def load_vocab(self, path: Path):
        params = self.lib.llama_model_default_params()
        params.vocab_only = True
        model = self.lib.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise SystemExit(f"llama.cpp could not load {path}")
        return self.lib.llama_model_get_vocab(model)

    def tokenize(self, vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(text) + 16
        buf = (ctypes.c_int32 * cap)()
        n = self.lib.llama_tokenize(vocab, text, len(text), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError("token buffer too small")
        return list(buf[:n])

    def detokenize(self, vocab, ids: list[int]) -> bytes:
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        out = ctypes.create_string_buffer(cap)
        n = self.lib.llama_detokenize(vocab, arr, len(ids), out, cap, False, True)
        if n < 0:
            raise RuntimeError("text buffer too small")
        return out.raw[:n]

    def piece(self, vocab, token: int) -> bytes:
        out = ctypes.create_string_buffer(512)
        n = self.lib.llama_token_to_piece(vocab, token, out, 512, 0, True)
        if n < 0:
            raise RuntimeError("piece buffer too small")
        return out.raw[:n]


# ---------------------------------------------------------------- chat templates

def render_chat(template: str, messages, add_generation_prompt: bool, bos: str, eos: str) -> str:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template).render(
        messages=messages, add_generation_prompt=add_generation_prompt,
        bos_token=bos, eos_token=eos)


CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "system", "content": "You are terse."},
      {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?"}], True),
    ([{"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello, how can I help?"}], False),
    ([{"role": "user", "content": "  Unicode: 日本語 😀\nnew line\ttab  "}], True),
]


# ---------------------------------------------------------------- main

def text_field(raw: bytes):
    """JSON-safe form of bytes: a string when valid UTF-8, else hex."""
    try:
        return {"text": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": raw.hex()}


def dump_compact(obj: dict) -> str:
    """JSON with one top-level key, case or piece per line: small and diffable."""
    def one(v):
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))

    lines = ["{"]
    items = list(obj.items())
    for i, (k, v) in enumerate(items):
        end = "," if i + 1 < len(items) else ""
        if isinstance(v, list) and v and isinstance(v[0], dict):
            lines.append(f"{one(k)}:[")
            lines += [one(x) + ("," if j + 1 < len(v) else "") for j, x in enumerate(v)]
            lines.append("]" + end)
        elif isinstance(v, dict):
            lines.append(f"{one(k)}:{{")
            kv = list(v.items())
            lines += [f"{one(a)}:{one(b)}" + ("," if j + 1 < len(kv) else "") for j, (a, b) in enumerate(kv)]
            lines.append("}" + end)
        else:
            lines.append(f"{one(k)}:{one(v)}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def make_model_fixture(llama: Llama, name: str, path: Path) -> None:
    meta = read_gguf_metadata(path)
    vocab = llama.load_vocab(path)
    n_vocab = llama.lib.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if llama.lib.llama_vocab_is_eog(vocab, t)]

    cases = []
    pieces_wanted = set(eog) | set(range(0, min(n_vocab, 600)))
    for text in CORPUS + stress_texts():
        raw = text.encode("utf-8")
        case = {"input": text, "ids": {}}
        for add_special in (True, False):
            for parse_special in (True, False):
                ids = llama.tokenize(vocab, raw, add_special, parse_special)
                case["ids"][f"{int(add_special)}{int(parse_special)}"] = ids
                pieces_wanted.update(ids)
        detok = llama.detokenize(vocab, case["ids"]["11"])
        case["decoded"] = text_field(detok)
        cases.append(case)

    rng = random.Random(7)
    pieces_wanted.update(rng.randrange(n_vocab) for _ in range(300))
    pieces = {str(t): llama.piece(vocab, t).hex() for t in sorted(pieces_wanted)}

    fixture = {
        "model": MODEL_FILES[name],
        "generated_by": "scripts/make-tokenizer-fixtures.py (llama.cpp via libllama)",
        "n_vocab": n_vocab,
        "bos": llama.lib.llama_vocab_bos(vocab),
        "eos": llama.lib.llama_vocab_eos(vocab),
        "add_bos": bool(llama.lib.llama_vocab_get_add_bos(vocab)),
        "eog": eog,
        "cases": cases,
        "pieces_hex": pieces,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(dump_compact(fixture))

    tokens = meta["tokenizer.ggml.tokens"]
    template = meta.get("tokenizer.chat_template")
    template = template.decode() if template else None
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]].decode()
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]].decode()
    chat = {
        "model": MODEL_FILES[name],
        "generated_by": "scripts/make-tokenizer-fixtures.py (Python jinja2 %s)" % __import__("jinja2").__version__,
        "model_template": template,
        "template_used": template or CHATML_TEMPLATE,
        "bos": bos,
        "eos": eos,
        "conversations": [
            {"messages": msgs, "add_generation_prompt": agp,
             "expected": render_chat(template or CHATML_TEMPLATE, msgs, agp, bos, eos)}
            for msgs, agp in CONVERSATIONS
        ],
    }
    (OUT / f"chat_{name}.json").write_text(json.dumps(chat, ensure_ascii=False, indent=1) + "\n")
    print(f"{name}: {len(cases)} cases, {len(pieces)} pieces, {len(eog)} EOG tokens")


# Pre-tokenizer types checked on SmolLM2's vocabulary with `tokenizer.ggml.pre`
# swapped (llama.cpp loads such a copy like any other vocab-only model).
PRE_TYPES = [
    "default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "falcon", "starcoder", "jais-2", "poro-chat", "viking", "tekken",
    "chameleon", "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder",
    "ufakzeka", "laguna", "exaone-moe", "minicpm5", "spark2_5", "youtu", "command-r",
    "bloom", "chatglm-bpe",
]
PRE_CORPUS = [
    "The quick brown fox's tail, they're sure; I'M SHOUTING, WE'LL see 'RE 'Ve.",
    "def fib(n):\n    if n < 2:\n        return n\n\n\n  x  \t y\r\n",
    "1234567 and 3.14159, -0.5e-10, 1,000,000 ١٢٣٤ １２３ ½",
    "日本語のテキスト、中文文本！한국어 텍스트 ｶﾀｶﾅ",
    "مرحبا بالعالم، Привет мир! Ελληνικά e\u0301 a\u0308 हिन्दी ภาษาไทย",
    "emoji 😀👍🏽 👨\u200d👩\u200d👧 ❤️ !!!???... «q» “d” — …",
    "mixedCASE camelCaseWord HTTPServer snake_case <b>x</b> @user #tag $5 +1 a/b",
    "unicode\u00a0nbsp\u3000ideographic\u2009thin \u2028 end   ",
]


def make_variant_fixture(llama: Llama) -> None:
    """Metadata variants no real model here has, on copies of the real vocabularies:
    every pre-tokenizer type on SmolLM2's BPE vocabulary, and Gemma's
    SentencePiece vocabulary with `add_space_prefix` turned on (as Llama 2 has)."""
    import tempfile

    bpe_base = MODELS / MODEL_FILES["smollm2"]
    spm_base = MODELS / MODEL_FILES["gemma3"]
    out = {"texts": PRE_CORPUS, "bpe_base": bpe_base.name, "pre_types": {},
           "spm_base": spm_base.name, "spm_space_prefix": {}}
    with tempfile.TemporaryDirectory() as tmp:
        spans = gguf_kv_spans(bpe_base.read_bytes())
        for pre in PRE_TYPES:
            path = Path(tmp) / f"{pre}.gguf"
            write_vocab_only_copy(path, spans, {"tokenizer.ggml.pre": pre})
            vocab = llama.load_vocab(path)
            out["pre_types"][pre] = [llama.tokenize(vocab, t.encode(), False, False) for t in PRE_CORPUS]
        with open(spm_base, "rb") as f:
            spans = gguf_kv_spans(f.read(64 << 20))
        path = Path(tmp) / "spm_space_prefix.gguf"
        write_vocab_only_copy(path, spans, {}, {"tokenizer.ggml.add_space_prefix": True})
        vocab = llama.load_vocab(path)
        for mode, add, parse in (("11", True, True), ("00", False, False)):
            out["spm_space_prefix"][mode] = [llama.tokenize(vocab, t.encode(), add, parse)
                                             for t in PRE_CORPUS + SPM_EXTRA]
        out["spm_texts"] = PRE_CORPUS + SPM_EXTRA
        out["spm_space_prefix"]["decoded"] = [
            llama.detokenize(vocab, ids).decode("utf-8", "replace")
            for ids in out["spm_space_prefix"]["11"]]
    (OUT / "variants.json").write_text(dump_compact(out))
    print(f"variants: {len(PRE_TYPES)} pre types x {len(PRE_CORPUS)} texts, SPM space prefix")


# Special tokens between texts: the space prefix follows each one.
SPM_EXTRA = ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", " lead", "", " "]


def gguf_kv_spans(data: bytes) -> list[tuple[str, bytes]]:
    """Each metadata key with the raw bytes of its whole key/value record."""
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t, off):
        if t == 8:
            (n,) = struct.unpack_from("<Q", data, off)
            return off + 8 + n
        if t == 9:
            (at,) = struct.unpack_from("<I", data, off)
            (n,) = struct.unpack_from("<Q", data, off + 4)
            off += 12
            if at in sizes:
                return off + n * sizes[at]
            for _ in range(n):
                off = skip(at, off)
            return off
        return off + sizes[t]

    (n_kv,) = struct.unpack_from("<Q", data, 16)
    off = 24
    spans = []
    for _ in range(n_kv):
        start = off
        (n,) = struct.unpack_from("<Q", data, off)
        key = data[off + 8:off + 8 + n].decode()
        off += 8 + n
        (t,) = struct.unpack_from("<I", data, off)
        off = skip(t, off + 4)
        spans.append((key, data[start:off]))
    return spans


def write_vocab_only_copy(path: Path, spans, strings: dict[str, str],
                          bools: dict[str, bool] | None = None) -> None:
    """A GGUF with the metadata of `spans` (some keys replaced) and no tensors."""
    bools = bools or {}

    def key(k):
        kb = k.encode()
        return struct.pack("<Q", len(kb)) + kb

    kvs = [b for k, b in spans if k not in strings and k not in bools]
    kvs += [key(k) + struct.pack("<IQ", 8, len(v.encode())) + v.encode() for k, v in strings.items()]
    kvs += [key(k) + struct.pack("<IB", 7, int(v)) for k, v in bools.items()]
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))
        for b in kvs:
            f.write(b)


def main() -> None:
    llama = Llama()
    for name, file in MODEL_FILES.items():
        path = MODELS / file
        if not path.exists():
            raise SystemExit(f"{path} missing: run scripts/fetch-models.sh first")
        make_model_fixture(llama, name, path)
    make_variant_fixture(llama)


if __name__ == "__main__":
    main()
