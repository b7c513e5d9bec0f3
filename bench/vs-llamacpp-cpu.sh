#!/usr/bin/env bash
# Side-by-side speed of combs' CPU path (the native host kernels on the CPU
# device) and llama.cpp's CPU backend, on the same GGUF files, on this
# machine, in one run, with the same number of threads:
#
#   bench/vs-llamacpp-cpu.sh [--combs BIN] [--llama-bench BIN] [-p N] [-n N] [-r R] [-t THREADS] [FILE...]
#
# FILE defaults to SmolLM2-135M-Instruct Q4_1 and Q8_0 and Gemma-3-270M
# Q4_K_M from the model cache (scripts/fetch-models.sh). combs runs `combs
# bench --device cpu -p N -n N -r R --json` with RAYON_NUM_THREADS=THREADS;
# llama.cpp runs its own `llama-bench -t THREADS -p N -n N -r R -o json`
# (scripts/setup-llamacpp.sh --no-venv builds it), which times its prompt
# and its tokens itself. Each file's two runs follow each other. Prints one
# table: prompt and decode tokens/s of both and the ratio combs/llama.cpp.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="${COMBS_BIN:-$here/../target/release/combs}"
tools="${COMBS_TOOLS:-$HOME/.cache/combs/tools}"
lbench="$tools/build/bin/llama-bench"
models="${COMBS_MODELS:-$HOME/.cache/combs/models}"
pp=128 tg=32 reps=3 threads="$(nproc)"
files=()
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        --llama-bench) lbench="$2"; shift 2 ;;
        -p) pp="$2"; shift 2 ;;
        -n) tg="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -t) threads="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) files+=("$1"); shift ;;
    esac
done
((${#files[@]})) || files=("$models/SmolLM2-135M-Instruct.Q4_1.gguf"
                           "$models/SmolLM2-135M-Instruct.Q8_0.gguf"
                           "$models/gemma-3-270m-q4_k_m.gguf")
[[ -x $lbench ]] || { echo "no llama-bench at $lbench: run scripts/setup-llamacpp.sh --no-venv" >&2; exit 1; }

rows=()
for f in "${files[@]}"; do
    ours="$(RAYON_NUM_THREADS="$threads" "$combs" bench -m "$f" --device cpu -p "$pp" -n "$tg" -r "$reps" --json)"
    theirs="$("$lbench" -m "$f" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -o json 2>/dev/null)"
    rows+=("$(basename "$f")|$ours|$(printf '%s' "$theirs" | tr -d '\n')")
done

python3 - "$pp" "$tg" "$threads" "${rows[@]}" <<'PY'
import json, sys
pp, tg, threads = sys.argv[1:4]
print(f"{threads} threads; tokens/s, combs median of its repetitions, llama.cpp llama-bench's average")
print(f"{'model':36} {'pp'+pp+' combs':>12} {'llama.cpp':>10} {'ratio':>6}   {'tg'+tg+' combs':>11} {'llama.cpp':>10} {'ratio':>6}")
for row in sys.argv[4:]:
    name, ours, theirs = row.split("|", 2)
    o = json.loads(ours)
    t = json.loads(theirs)
    lpp = next((r["avg_ts"] for r in t if r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0), float("nan"))
    ltg = next((r["avg_ts"] for r in t if r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0), float("nan"))
    cpp, ctg = o["pp"]["tps"], o["tg"]["tps"]
    print(f"{name:36} {cpp:12.1f} {lpp:10.1f} {cpp / lpp:6.2f}   {ctg:11.1f} {ltg:10.1f} {ctg / ltg:6.2f}")
PY
