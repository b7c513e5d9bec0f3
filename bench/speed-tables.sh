#!/usr/bin/env bash
# The two tables of the speed issue, one run each, on the GPU machine:
#
#   bench/speed-tables.sh --combs BIN --wheel CYLLAMA_VULKAN.whl [--dir DIR]
#
# 1. bench/vs-llamacpp.sh on its six rows with --pp 2048,8192 (pp512,
#    tg128 exact and under --numerics llama.cpp, pp2048, pp8192, load and
#    first token), medians of 2;
# 2. bench/batch-scaling.sh with greedy draws on the device: llama-1b Q4_0
#    at 1, 4, 16, 64, 128, 256 sequences, llama-8b and SmolLM2 Q4_0 at 1,
#    64, 128.
# The files are made once in DIR (default /root/b) and shared by both.
# Carry what bench/gpu-pack.sh packs (with --wheel) and source its env.sh
# first; ~7 min on an H200 with no files made yet, ~2.5 min with them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="" wheel="" dir=/root/b
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        --wheel) wheel="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ -n $combs && -n $wheel ]] || { echo "--combs and --wheel are needed" >&2; exit 2; }
"$combs" info --devices 2>&1 | head -3
date -u
"$here/vs-llamacpp.sh" --combs "$combs" --wheel "$wheel" --dir "$dir" -r 2 --pp 2048,8192
date -u
"$here/batch-scaling.sh" --combs "$combs" --dir "$dir" -n 32 -r 2 --sampler greedy llama-1b:q4_0
"$here/batch-scaling.sh" --combs "$combs" --dir "$dir" -n 32 -r 2 --sampler greedy --batch 1,64,128 \
    llama-8b:q4_0 smollm2-135m:q4_0
date -u
