#!/usr/bin/env bash
# Aggregate decode throughput against batch size, on the GPU machine:
#
#   bench/batch-scaling.sh [--combs BIN] [--dir DIR] [-n STEPS] [-r REPS] [--batch B,B,...]
#                          [--sampler logits|greedy|default]
#                          [--devices 0,1 [--split-mode replica|layer]] [PRESET:TYPE ...]
#
# For each case (default: smollm2-135m:q4_0 llama-1b:q4_0) makes the file
# with `combs synth`, then runs `combs bench -p 0 -n STEPS --batch BATCHES
# (default 1,4,16,64,128,256)
# --json` (each sequence holds 16 prompt tokens, then STEPS decode steps of
# all sequences together are timed) and prints aggregate tokens/s per batch
# size, its ratio to batch 1, and the plain single-session decode (tg) for
# comparison. `--sampler greedy|default` makes each step draw every
# sequence's next token (`combs bench --sampler`: the best logits
# selected on the device) instead of reading whole rows of logits for given
# tokens (`logits`, the default). `--devices` passes the devices (and `--split-mode`, default
# replica: one model per device, each device's sessions batched at once)
# to `combs bench`.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="${COMBS_BIN:-$here/../target/release/combs}"
dir="${TMPDIR:-/tmp}/combs-bench"
steps=64
reps=3
batches=1,4,16,64,128,256
devices=()
sampler=logits
cases=()
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        -n) steps="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --batch) batches="$2"; shift 2 ;;
        --sampler) sampler="$2"; shift 2 ;;
        --devices) devices+=(--devices "$2"); shift 2 ;;
        --split-mode) devices+=(--split-mode "$2"); shift 2 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
((${#cases[@]})) || cases=(smollm2-135m:q4_0 llama-1b:q4_0)
# Several devices: replicas unless a split mode was named.
if ((${#devices[@]})) && [[ " ${devices[*]} " != *" --split-mode "* ]]; then
    devices+=(--split-mode replica)
fi
mkdir -p "$dir"
rows=()
for c in "${cases[@]}"; do
    preset="${c%%:*}" type="${c##*:}"
    f="$dir/$preset-$type.gguf"
    [[ -f $f ]] || "$combs" synth --preset "$preset" --type "$type" -o "$f" >&2
    rows+=("$preset|$type|$("$combs" bench -m "$f" -p 0 -n "$steps" -r "$reps" --batch "$batches" --sampler "$sampler" ${devices[@]+"${devices[@]}"} --json)")
done
python3 - "${rows[@]}" <<'PY'
import json, sys
print(f"{'model':14} {'type':5} {'tg (1 session)':>15} {'batch':>6} {'aggregate t/s':>14} {'x batch 1':>10}")
for row in sys.argv[1:]:
    preset, ty, ours = row.split("|", 2)
    o = json.loads(ours)
    b1 = next(b["tps"] for b in o["batch"] if b["batch"] == 1)
    for b in o["batch"]:
        print(f"{preset:14} {ty:5} {o['tg']['tps']:15.1f} {b['batch']:6} {b['tps']:14.1f} {b['tps'] / b1:10.2f}")
PY
