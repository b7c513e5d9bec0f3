#!/usr/bin/env bash
# Two combs binaries against each other on the GPU machine, alternating so
# that clock and thermal drift fall on both (what every "before → after"
# figure in docs/perf-notes.md needs):
#
#   bench/ab.sh --old BIN --new BIN [--dir DIR] [--rounds N] [--pp 512,2048]
#               [--tg N] [-r REPS] [PRESET:TYPE ...]
#
# For each case (default llama-1b:q4_0 llama-1b:q4_k llama-8b:q4_0
# llama-8b:q4_k) makes the file with `combs synth` once, then for each of
# N rounds (default 2) runs `combs bench -m FILE -p P -n 0 -r REPS --json`
# for each prompt length P, and with --tg N `-p 0 -n N`, old binary first,
# then new. Prints every run's tokens/s and the ratio of the medians
# (new / old). Synthetic weights: speed only, the outputs mean nothing.
set -euo pipefail
old="" new="" dir="${TMPDIR:-/tmp}/combs-bench" rounds=2 pps=512,2048 tg=0 reps=4
cases=()
while (($#)); do
    case "$1" in
        --old) old="$2"; shift 2 ;;
        --new) new="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --pp) pps="$2"; shift 2 ;;
        --tg) tg="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "unknown argument $1" >&2; exit 2 ;;
        *) cases+=("$1"); shift ;;
    esac
done
[[ -n $old && -n $new ]] || { echo "--old and --new are needed" >&2; exit 2; }
((${#cases[@]})) || cases=(llama-1b:q4_0 llama-1b:q4_k llama-8b:q4_0 llama-8b:q4_k)
mkdir -p "$dir"
tests=()
IFS=, read -ra pp_list <<<"$pps"
for p in "${pp_list[@]}"; do tests+=("-p $p -n 0"); done
((tg > 0)) && tests+=("-p 0 -n $tg")
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
for c in "${cases[@]}"; do
    f="$dir/${c%%:*}-${c##*:}.gguf"
    [[ -f $f ]] || "$old" synth --preset "${c%%:*}" --type "${c##*:}" -o "$f" >&2
done
tps() { # json test-kind
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d[sys.argv[1]]["tps"])' "$1"
}
for ((r = 0; r < rounds; r++)); do
    for c in "${cases[@]}"; do
        f="$dir/${c%%:*}-${c##*:}.gguf"
        for t in "${tests[@]}"; do
            kind=pp
            [[ $t == "-p 0 "* ]] && kind=tg
            for side in old new; do
                bin="$old"
                [[ $side == new ]] && bin="$new"
                # shellcheck disable=SC2086
                v="$(timeout 300 "$bin" bench -m "$f" $t -r "$reps" --json 2>/dev/null | tail -n1 | tps "$kind" || echo nan)"
                echo "$c|$t|$side|$v" >>"$results"
            done
        done
    done
done
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    case, test, side, v = line.strip().split("|")
    rows.setdefault((case, test), {"old": [], "new": []})[side].append(float(v))
print(f"{'case':18} {'test':14} {'old tok/s':>24} {'new tok/s':>24} {'new/old':>8}")
for (case, test), v in rows.items():
    o, n = statistics.median(v["old"]), statistics.median(v["new"])
    fmt = lambda xs: " / ".join(f"{x:.1f}" for x in xs)
    print(f"{case:18} {test:14} {fmt(v['old']):>24} {fmt(v['new']):>24} {n / o:8.3f}")
PY
