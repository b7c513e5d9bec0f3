#!/usr/bin/env python3
"""A SentencePiece-style tokenizer.json (BPE with byte fallback, `\u2581` for
spaces, `<0xXX>` byte tokens) and the ids transformers and sentencepiece give
for varied texts, under tests/fixtures/hf/spm_tokenizer/.

tests/hf_tokenizer.rs maps the tokenizer.json onto GGUF SPM metadata
(formats::hf::tokenizer) and checks combs' ids against transformers' fast
tokenizer's on every text.

  make-spm-tokenizer-fixture.py [--out tests/fixtures/hf/spm_tokenizer]

Steps: train a 600-piece BPE SentencePiece model with `byte_fallback=True`
(sentencepiece's trainer, one thread, so it is deterministic) on the local
license texts in /usr/share/common-licenses plus the non-ASCII lines below;
convert it with transformers' `LlamaTokenizerFast.from_pretrained` on a
directory holding only that tokenizer.model (the slow->fast conversion
Llama 2 / Mistral tokenizer.json files come from) and
save tokenizer.json + tokenizer_config.json; write cases.json: for each text
transformers' ids without and with special tokens, sentencepiece's own ids
(`encode(text)`, no BOS) and transformers' decode of its ids.

The committed fixture: Python 3, transformers 5.17.0, tokenizers 0.23.3,
sentencepiece 0.2.3 (~/.cache/combs/vlm-refs/venv), as cases.json's
"made_with" says. CJK and emoji never occur in the training text, so they
take the byte-fallback path.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
from pathlib import Path

LICENSES = ["GPL-3", "Apache-2.0", "BSD", "MPL-2.0", "Artistic"]

EXTRA = """\
Ça coûte 12,50 € — déjà payé? Über die Brücke gehen wir zu Fuß.
El niño comió una piña en la mañana; ¡qué rápido!
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 -42 +7%
code:   indent   with    spaces	and	tabs;  (a + b) * c == d
"""

TEXTS = [
    "Hello world",
    "The license grants you permission to copy the software.",
    " leading space",
    "   three leading spaces and  double  inside",
    "line one\nline two\n\nafter a blank line",
    "digits 12345 and 3.14159 and 2024-01-31",
    "emoji 🙂🚀 and CJK 漢字かな 한국어",
    "Ελληνικά: αλφα, βήτα. Москва.",
    "Ça coûte 12,50 € — déjà payé?",
    "tabs\tand\tmixed \t whitespace",
    "    ",
    "\n",
    "",
    "aaaaaaaa ========== ---------- ..........",
    "<s> is bos and </s> is eos as plain text",
]


def train(path: Path) -> None:
    import sentencepiece as spm

    lines = []
    for name in LICENSES:
        lines += Path("/usr/share/common-licenses", name).read_text().splitlines()
    lines += EXTRA.splitlines()
    lines = [line for line in lines if line.strip()]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        model_type="bpe",
        vocab_size=600,
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=1,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        pad_id=-1,
        # Llama 2's trainer settings: no normalization (so sentencepiece's
        # ids and the converted tokenizer.json, which has no normalizer
        # but the `\u2581` one, can agree), whitespace kept as is, digits
        # split, whitespace-only pieces allowed
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        minloglevel=2,
    )
    path.write_bytes(buf.getvalue())


def main() -> None:
    import sentencepiece as spm
    import tokenizers
    import transformers
    from transformers import AutoTokenizer, LlamaTokenizerFast

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf/spm_tokenizer")
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tokenizer.model"
        train(model)
        sp = spm.SentencePieceProcessor(model_file=str(model))
        # transformers 5 converts a tokenizer.model in from_pretrained
        # (convert_to_native_format); `LlamaTokenizerFast(vocab_file=...)`
        # no longer does and gives an empty vocabulary.
        fast = LlamaTokenizerFast.from_pretrained(tmp, legacy=False, add_bos_token=True)
        fast.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    cases = []
    for text in TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_special": tok(text, add_special_tokens=True)["input_ids"],
                "spm_ids": sp.encode(text),
                "decoded": tok.decode(ids),
            }
        )
    made_with = {
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "sentencepiece": spm.__version__,
        "vocab_size": sp.get_piece_size(),
    }
    doc = {"made_with": made_with, "cases": cases}
    (out / "cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    for c in cases:
        same = "same" if c["ids"] == c["spm_ids"] else "DIFFER"
        print(f"{same:6} {len(c['ids']):3} {c['text']!r}")


if __name__ == "__main__":
    main()
