#!/usr/bin/env bash
# Several GPUs in one process (issue 22), on a machine with two (or more):
#
#   bench/multi-gpu.sh [--combs BIN] [--wheel CYLLAMA_VULKAN.whl] [--dir DIR] [--devices 0,1]
#                      [-r REPS] [--batch 64] [--budget MIB] [PRESET:TYPE ...]
#
# For each case (default llama-8b:q4_0 llama-8b:q4_k), on a file made by
# `combs synth`:
#  1. numerics: `combs perplexity` of README.md on the first device and split
#     by layers over --devices (even shares) must print the same PPL line
#     (on lavapipe the split's logits are bit-identical: tests/multi_device.rs);
#  2. layer split speed: `combs bench -p 512 -n 128` on the first device and
#     split over --devices; target tg split >= 0.90 x one GPU;
#  3. too big for one: with a device-memory budget of --budget MiB per device
#     (default: 60% of the file), the load on one device must fail (out of
#     memory) and the split must load and decode;
#  4. replicas: `combs bench -p 0 -n 64 --batch B` (default 64 sessions) on
#     one device and with --split-mode replica over --devices (the sessions
#     spread round-robin, each device's batch at once); target >= 1.8x;
#  5. llama.cpp side by side (with --wheel, or cyllama already importable):
#     bench/llamacpp_bench.py on the first GPU alone (GGML_VK_VISIBLE_DEVICES)
#     and with --split-mode layer --tensor-split over the same GPUs.
# Prints one table per case and PASS/FAIL against the targets.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="${COMBS_BIN:-$here/../target/release/combs}"
wheel=""
dir="${TMPDIR:-/tmp}/combs-bench"
devices=0,1
reps=3
batch=64
budget=""
cases=()
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        --wheel) wheel="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --devices) devices="$2"; shift 2 ;;
        -r) reps="$2"; shift 2 ;;
        --batch) batch="$2"; shift 2 ;;
        --budget) budget="$2"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
((${#cases[@]})) || cases=(llama-8b:q4_0 llama-8b:q4_k)
mkdir -p "$dir"
IFS=, read -r -a devs <<<"$devices"
first="${devs[0]}"
n_dev="${#devs[@]}"
shares="$(printf '1,%.0s' "${devs[@]}")"
shares="${shares%,}"
split=(--devices "$devices" --split "$shares")

py=python3
if [[ -n $wheel ]]; then
    [[ -d $dir/py/cyllama ]] || python3 -m pip install -q --no-deps --no-index --target "$dir/py" "$wheel"
    export PYTHONPATH="$dir/py${PYTHONPATH:+:$PYTHONPATH}"
fi
have_llamacpp=0
"$py" -c 'import cyllama.llama.llama_cpp' 2>/dev/null && have_llamacpp=1

"$combs" info --devices
fail=0
for c in "${cases[@]}"; do
    preset="${c%%:*}" type="${c##*:}"
    f="$dir/$preset-$type.gguf"
    [[ -f $f ]] || "$combs" synth --preset "$preset" --type "$type" -o "$f" >&2
    echo "== $c ($(du -h "$f" | cut -f1)) over devices $devices"

    # 1. numerics
    ppl_one="$("$combs" perplexity -m "$f" -f "$here/../README.md" --ctx 256 --device "$first" 2>/dev/null | grep '^PPL')"
    ppl_split="$("$combs" perplexity -m "$f" -f "$here/../README.md" --ctx 256 "${split[@]}" 2>/dev/null | grep '^PPL')"
    if [[ $ppl_one == "$ppl_split" ]]; then r=PASS; else r=FAIL; fail=1; fi
    echo "numerics   $r  one: $ppl_one  split: $ppl_split"

    # 2. layer split speed
    one="$("$combs" bench -m "$f" -p 512 -n 128 -r "$reps" --device "$first" --json)"
    spl="$("$combs" bench -m "$f" -p 512 -n 128 -r "$reps" "${split[@]}" --json)"

    # 3. too big for one device under a budget
    mib=$budget
    [[ -n $mib ]] || mib=$(($(stat -c %s "$f") * 6 / 10 / 1048576 + 1))
    if "$combs" bench -m "$f" -p 0 -n 8 -r 1 --device "$first" --memory-budget "$mib" --json >/dev/null 2>"$dir/too-big-one.log"; then
        big="FAIL (one device loaded under ${mib} MiB)"; fail=1
    elif "$combs" bench -m "$f" -p 0 -n 8 -r 1 "${split[@]}" --memory-budget "$mib" --json >/dev/null 2>"$dir/too-big-split.log"; then
        big="PASS (${mib} MiB per device: one device out of memory, split over $n_dev loads and decodes)"
    else
        big="FAIL (split did not load: $dir/too-big-split.log)"; fail=1
    fi

    # 4. replicas
    rep_one="$("$combs" bench -m "$f" -p 0 -n 64 -r "$reps" --batch "$batch" --device "$first" --json)"
    rep_all="$("$combs" bench -m "$f" -p 0 -n 64 -r "$reps" --batch "$batch" --devices "$devices" --split-mode replica --json)"

    # 5. llama.cpp
    lc_one='{}' lc_split='{}'
    if ((have_llamacpp)); then
        lc_one="$(GGML_VK_VISIBLE_DEVICES="$first" "$py" "$here/llamacpp_bench.py" "$f" -p 512 -n 128 -r "$reps" --split-mode none 2>"$dir/llamacpp-one.log" | tail -1)"
        lc_split="$(GGML_VK_VISIBLE_DEVICES="$devices" "$py" "$here/llamacpp_bench.py" "$f" -p 512 -n 128 -r "$reps" --split-mode layer --tensor-split "$shares" 2>"$dir/llamacpp-split.log" | tail -1)"
    fi
    "$py" - "$one" "$spl" "$rep_one" "$rep_all" "$lc_one" "$lc_split" "$batch" "$big" <<'PY' || fail=1
import json, sys
one, spl, rep_one, rep_all, lc_one, lc_split = (json.loads(s) for s in sys.argv[1:7])
batch, big = int(sys.argv[7]), sys.argv[8]
ok = True
def b(o):
    return next((x["tps"] for x in o.get("batch", []) if x["batch"] == batch), 0.0)
print(f"{'':22} {'pp512 t/s':>10} {'tg128 t/s':>10}")
print(f"{'combs 1 GPU':22} {one['pp']['tps']:10.1f} {one['tg']['tps']:10.1f}")
print(f"{'combs layer split':22} {spl['pp']['tps']:10.1f} {spl['tg']['tps']:10.1f}   ({'; '.join(spl.get('devices', []))})")
if lc_one:
    print(f"{'llama.cpp 1 GPU':22} {lc_one['pp']['tps']:10.1f} {lc_one['tg']['tps']:10.1f}")
    print(f"{'llama.cpp -sm layer':22} {lc_split['pp']['tps']:10.1f} {lc_split['tg']['tps']:10.1f}")
r = spl["tg"]["tps"] / max(one["tg"]["tps"], 1e-9)
ok &= r >= 0.90
print(f"split decode  {'PASS' if r >= 0.90 else 'FAIL'}  tg split / one GPU = {r:.3f} (target >= 0.90)")
print(f"too big       {big}")
r = b(rep_all) / max(b(rep_one), 1e-9)
ok &= r >= 1.8
print(f"replicas      {'PASS' if r >= 1.8 else 'FAIL'}  {batch} sessions: {b(rep_all):.1f} t/s over "
      f"{len(rep_all.get('devices', []))} GPUs / {b(rep_one):.1f} on one = {r:.2f}x (target >= 1.8)")
sys.exit(0 if ok else 1)
PY
done
exit $fail
