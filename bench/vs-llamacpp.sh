#!/usr/bin/env bash
# Side-by-side speed of combs and llama.cpp's Vulkan backend on the same
# synthetic GGUF files, in one run, on the GPU machine:
#
#   bench/vs-llamacpp.sh [--combs BIN] [--wheel CYLLAMA_VULKAN.whl] [--dir DIR] [CASE...]
#
# CASE is PRESET:TYPE (default: the six of the speed issue: smollm2-135m:q4_0
# smollm2-135m:q8_0 llama-1b:q4_0 llama-1b:q4_k llama-8b:q4_0 llama-8b:q4_k).
# Each file is made by `combs synth`, then `combs bench -p 512 -n 128 --json`
# and bench/llamacpp_bench.py (llama.cpp through the cyllama-vulkan wheel,
# installed from the wheel file into DIR/py; Python 3.12) run on it, both
# timed as llama-bench times (synchronized after the prompt and each
# token). `--pp 2048,8192` adds prefill-only rows of those prompt lengths.
# Prints one table: pp512 and tg128 tokens/s of both and the ratio
# combs/llama.cpp, then load time and first token of the 512-token prompt:
# once from each row's first run (pipelines the driver has not cached yet
# are compiled there, so a row pays for what no earlier row compiled), and
# again from a fresh process of each engine after all rows (driver caches
# warm: what every run but an application's very first sees).
# For Q4_0 / Q8_0 / Q4_K files a second combs tg128 runs under `--numerics
# llama.cpp` (activations quantized to 8-bit blocks, integer dot products:
# what llama.cpp's own GPU matvecs do); `--no-q8` skips it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="${COMBS_BIN:-$here/../target/release/combs}"
wheel=""
dir="${TMPDIR:-/tmp}/combs-bench"
reps=3
cases=()
long=()
q8=1
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        --wheel) wheel="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --pp) IFS=, read -r -a long <<<"$2"; shift 2 ;;
        --no-q8) q8=0; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
((${#cases[@]})) || cases=(smollm2-135m:q4_0 smollm2-135m:q8_0 llama-1b:q4_0 llama-1b:q4_k llama-8b:q4_0 llama-8b:q4_k)
mkdir -p "$dir"

py=python3
if [[ -n $wheel ]]; then
    # a private target folder: no venv module needed, nothing outside $dir touched
    [[ -d $dir/py/cyllama ]] || python3 -m pip install -q --no-deps --no-index --target "$dir/py" "$wheel"
    export PYTHONPATH="$dir/py${PYTHONPATH:+:$PYTHONPATH}"
fi

rows=()
longrows=()
files=()
for c in "${cases[@]}"; do
    preset="${c%%:*}" type="${c##*:}"
    f="$dir/$preset-$type.gguf"
    [[ -f $f ]] || "$combs" synth --preset "$preset" --type "$type" -o "$f" >&2
    ours="$("$combs" bench -m "$f" -p 512 -n 128 -r "$reps" --json)"
    theirs="$("$py" "$here/llamacpp_bench.py" "$f" -p 512 -n 128 -r "$reps" 2>"$dir/llamacpp-$preset-$type.log" | tail -1)"
    int='{}'
    if ((q8)) && [[ $type == q4_0 || $type == q8_0 || $type == q4_k ]]; then
        int="$("$combs" bench -m "$f" -p 0 -n 128 -r "$reps" --numerics llama.cpp --json)"
    fi
    rows+=("$preset|$type|$ours|$theirs|$int")
    files+=("$f")
    for p in "${long[@]}"; do
        o="$("$combs" bench -m "$f" -p "$p" -n 0 -r "$reps" --json)"
        t="$("$py" "$here/llamacpp_bench.py" "$f" -p "$p" -n 0 -r "$reps" 2>>"$dir/llamacpp-$preset-$type.log" | tail -1)"
        longrows+=("$preset|$type|$o|$t")
    done
done

# First token again, each engine in a fresh process, now that the rows
# above have compiled (and the drivers cached) every pipeline.
warm=()
for f in "${files[@]}"; do
    o="$("$combs" bench -m "$f" -p 512 -n 0 -r 1 --json)"
    t="$("$py" "$here/llamacpp_bench.py" "$f" -p 512 -n 0 -r 1 2>>"$dir/llamacpp-warm.log" | tail -1)"
    warm+=("$o|$t")
done

"$py" - "${rows[@]}" -- "${longrows[@]}" -- "${warm[@]}" <<'PY'
import json, sys
args = sys.argv[1:]
cut = args.index("--")
short, rest = args[:cut], args[cut + 1:]
cut = rest.index("--")
longs, warm = rest[:cut], rest[cut + 1:]
print(f"{'model':14} {'type':5} {'pp512 combs':>12} {'llama.cpp':>10} {'(perf)':>8} {'ratio':>6}   {'tg128 combs':>12} {'llama.cpp':>10} {'(perf)':>8} {'ratio':>6}   {'tg128 q8_1':>10} {'ratio':>6}")
pf = lambda v: f"{v:8.0f}" if v else f"{'-':>8}"
syncs = set()
for row in short:
    preset, ty, ours, theirs, q8 = row.split("|", 4)
    o, t, i = json.loads(ours), json.loads(theirs), json.loads(q8)
    pr = o["pp"]["tps"] / t["pp"]["tps"] if t["pp"]["tps"] else float("nan")
    tr = o["tg"]["tps"] / t["tg"]["tps"] if t["tg"]["tps"] else float("nan")
    it = i["tg"]["tps"] if i else 0.0
    ir = f"{it / t['tg']['tps']:6.2f}" if it and t["tg"]["tps"] else f"{'-':>6}"
    iv = f"{it:10.1f}" if it else f"{'-':>10}"
    print(f"{preset:14} {ty:5} {o['pp']['tps']:12.0f} {t['pp']['tps']:10.0f} {pf(t['pp'].get('perf_tps'))} {pr:6.2f}   "
          f"{o['tg']['tps']:12.1f} {t['tg']['tps']:10.1f} {pf(t['tg'].get('perf_tps'))} {tr:6.2f}   {iv} {ir}")
    syncs.add(t.get("sync", "get_logits"))
for row in longs:
    preset, ty, ours, theirs = row.split("|", 3)
    o, t = json.loads(ours), json.loads(theirs)
    n = o["pp"]["n"]
    pr = o["pp"]["tps"] / t["pp"]["tps"] if t["pp"]["tps"] else float("nan")
    print(f"{preset:14} {ty:5} {'pp' + str(n):>6} {o['pp']['tps']:12.0f} {t['pp']['tps']:10.0f} {pr:6.2f}")
print(f"{'model':14} {'type':5} {'load ms combs':>14} {'llama.cpp':>10} {'first token ms combs':>21} {'llama.cpp':>10}"
      f"   {'again: load ms combs':>21} {'llama.cpp':>10} {'first token ms combs':>21} {'llama.cpp':>10}")
for i, row in enumerate(short):
    preset, ty, ours, theirs, _ = row.split("|", 4)
    o, t = json.loads(ours), json.loads(theirs)
    wo, wt = (json.loads(v) for v in warm[i].split("|", 1)) if i < len(warm) else ({}, {})
    print(f"{preset:14} {ty:5} {o.get('load_ms', 0):14.0f} {t.get('load_ms', 0):10.0f} "
          f"{o.get('first_token_ms', 0):21.0f} {t.get('first_token_ms', 0):10.0f}   "
          f"{wo.get('load_ms', 0):21.0f} {wt.get('load_ms', 0):10.0f} "
          f"{wo.get('first_token_ms', 0):21.0f} {wt.get('first_token_ms', 0):10.0f}")
print("first token = from the start of the process's load to the 512-token prompt's logits; "
      "again = a fresh process per engine after all rows (pipelines in the drivers' caches)")
print(f"llama.cpp's timed regions end with: {', '.join(sorted(syncs))} (llama-bench: llama_synchronize)")
print("tokens/s, medians; ratio = combs / llama.cpp wall-clock; (perf) = llama.cpp's own counters;")
print("tg128 q8_1 = combs --numerics llama.cpp (8-bit activations, integer dot products)")
PY
