#!/usr/bin/env bash
# Reference environment for the SmolVLM (Idefics3) tests: HF transformers on
# the PyPI torch wheel (run on the CPU), pillow, and what llama.cpp's
# convert_hf_to_gguf.py needs (its own gguf-py, from the llama-cpp-python
# sdist that scripts/setup-llamacpp.sh unpacks). Only PyPI is used.
#
#   scripts/setup-vlm-refs.sh          # idempotent; prints the venv's python
#
# Layout under ${COMBS_CACHE:-~/.cache/combs}/vlm-refs:
#   venv/          python venv (torch, transformers, pillow, numpy, ...)
#   versions.txt   the versions installed, for the fixtures' "made_with"
set -euo pipefail
cache="${COMBS_CACHE:-$HOME/.cache/combs}"
refs="$cache/vlm-refs"
venv="$refs/venv"
py="${PYTHON:-python3}"
# transformers 5 keeps Idefics3 (SmolVLM-256M's class) and its slow PIL image
# processor; pinned so the committed fixtures can be remade byte for byte.
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-5.17.0}"
# Pillow 11.3's LANCZOS is the resampler llama.cpp's mtmd ports bit for bit;
# Pillow 13 rounds downscales differently (up to 3 levels on a few % of pixels)
PILLOW_VERSION="${PILLOW_VERSION:-11.3.0}"
LCP_VERSION=0.3.36
gguf_py="$cache/tools/src/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp/gguf-py"
mkdir -p "$refs"

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
fi
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  # the PyPI wheel is a CUDA build; it runs on the CPU once its nvidia-*
  # dependency wheels are present (~5.6 GB in all)
  "$venv/bin/pip" install --quiet torch
fi
if ! "$venv/bin/python" -c "import transformers, PIL, sys; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION' or PIL.__version__ != '$PILLOW_VERSION')" 2>/dev/null; then
  "$venv/bin/pip" install --quiet "transformers==$TRANSFORMERS_VERSION" "pillow==$PILLOW_VERSION" numpy safetensors \
    tokenizers sentencepiece jinja2 pyyaml
fi
if ! "$venv/bin/python" -c 'import gguf' 2>/dev/null; then
  [ -d "$gguf_py" ] || { echo "missing $gguf_py: run scripts/setup-llamacpp.sh first" >&2; exit 1; }
  # the converter and this gguf-py come from the same llama.cpp commit
  "$venv/bin/pip" install --quiet "$gguf_py"
fi
"$venv/bin/python" - > "$refs/versions.txt" <<'PY'
import importlib.metadata as md, platform
print("python", platform.python_version())
for p in ("torch", "transformers", "tokenizers", "pillow", "numpy", "safetensors", "sentencepiece", "gguf"):
    print(p, md.version(p))
PY
cat "$refs/versions.txt" >&2
echo "$venv/bin/python"
