#!/usr/bin/env python3
"""Print a short summary of GGUF files: architecture, hyperparameters, tokenizer,
tensor types (with counts, overall and per tensor role) and the largest tensor.

    scripts/gguf-summary.py FILE.gguf [...]

Needs the `gguf` package (scripts/setup-llamacpp.sh puts it in
${COMBS_TOOLS:-~/.cache/combs/tools}/venv; or `pip install gguf`).
"""
import collections
import sys

try:
    from gguf import GGUFReader
except ImportError:
    sys.exit("needs the gguf package: pip install gguf "
             "(or run with ~/.cache/combs/tools/venv/bin/python)")


def summarize(path):
    r = GGUFReader(path)

    def get(key):
        field = r.fields.get(key)
        return None if field is None else field.contents()

    arch = get("general.architecture")
    print(f"== {path}")
    print(f"  arch {arch}  name {get('general.name')!r}  file_type {get('general.file_type')}"
          f"  gguf v{get('GGUF.version')}  alignment {get('general.alignment') or 32}")
    hp = {}
    for k in r.fields:
        if k.startswith(f"{arch}."):
            v = get(k)
            if not isinstance(v, list) or len(v) <= 8:
                hp[k[len(arch) + 1:]] = v
    print(f"  hparams {hp}")
    tokens = r.fields.get("tokenizer.ggml.tokens")
    merges = r.fields.get("tokenizer.ggml.merges")
    print(f"  tokenizer {get('tokenizer.ggml.model')} (pre {get('tokenizer.ggml.pre')})"
          f"  n_vocab {len(tokens.data) if tokens else None}"
          f"  merges {len(merges.data) if merges else 0}"
          f"  bos {get('tokenizer.ggml.bos_token_id')} eos {get('tokenizer.ggml.eos_token_id')}"
          f"  add_bos {get('tokenizer.ggml.add_bos_token')}")
    types = collections.Counter(t.tensor_type.name for t in r.tensors)
    total = sum(int(t.n_bytes) for t in r.tensors)
    print(f"  {len(r.tensors)} tensors, {total} bytes: {dict(types.most_common())}")
    roles = collections.defaultdict(collections.Counter)
    for t in r.tensors:
        role = ".".join(p for p in t.name.split(".") if not p.isdigit())
        roles[role][t.tensor_type.name] += 1
    for role, c in roles.items():
        print(f"    {role:32s} {dict(c)}")
    big = max(r.tensors, key=lambda t: int(t.n_bytes))
    print(f"  largest {big.name} ne={[int(x) for x in big.shape]} {big.tensor_type.name}"
          f" {int(big.n_bytes)} bytes")
    print(f"  output.weight present: {any(t.name == 'output.weight' for t in r.tensors)}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarize(p)
