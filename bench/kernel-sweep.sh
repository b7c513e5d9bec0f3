#!/usr/bin/env bash
# Times single kernels at every matrix shape of the speed presets on this
# machine's GPU (`combs kernel-bench`): the matvec layouts in SHAPES and the
# tiled linear kernels at the token counts in TOKENS, one table per case.
#
#   bench/kernel-sweep.sh [--combs BIN] [PRESET:TYPE ...]
#
# SHAPES (TPRxNR[xKS[xUN[xWG]]][s], comma-separated; `auto` = combs' own
# choice), TOKENS and COOP_TILES (WMxWNxWKxTMxTNxBK[s]) come from the
# environment; the defaults sweep the layouts tried so far.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
combs="${COMBS_BIN:-$here/../target/release/combs}"
cases=()
while (($#)); do
    case "$1" in
        --combs) combs="$2"; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) cases+=("$1"); shift ;;
    esac
done
((${#cases[@]})) || cases=(smollm2-135m:q4_0 smollm2-135m:q8_0 llama-1b:q4_0 llama-1b:q4_k llama-8b:q4_0 llama-8b:q4_k)
shapes="${SHAPES:-auto,32x1,32x2,32x4,64x8,16x2,16x4,8x1,8x2,8x4,8x8,8x1x4,8x2x4,8x4x2,8x2x2,8x1x2,16x1x4,32x1x4}"
tokens="${TOKENS:-16,512}"
tiles="${COOP_TILES:-auto}"
for c in "${cases[@]}"; do
    "$combs" kernel-bench --preset "${c%%:*}" --type "${c##*:}" --shapes "$shapes" --tokens "$tokens" --coop-tiles "$tiles"
done
