#!/usr/bin/env bash
# Packs what a run on the GPU machine needs into one small folder, built here
# (the device tool carries at most 64 MiB, the working tree included):
#
#   bench/gpu-pack.sh [--out DIR] [--wheel CYLLAMA_VULKAN.whl] [--test NAME ...]
#                     [--extra NAME=BINARY ...]
#
# DIR (default .gpu/, git-ignored) then holds
#   combs.xz, <test>.xz   the release binaries, stripped and xz-compressed
#                         (--test ops_gpu adds target/release/deps/ops_gpu-*)
#   <NAME>.xz             other binaries (--extra combs-old=PATH: the binary
#                         of another commit for bench/ab.sh)
#   debs/                 the Vulkan loader and the GL vendor libraries, which
#                         the NVIDIA driver needs to load at all
#   wheel.tar.xz          the llama.cpp wheel without its stable-diffusion
#                         module (33 -> 8 MB), for bench/vs-llamacpp.sh
#   env.sh                to source first on the GPU machine: unpacks the
#                         above (binaries into /root/bin, the wheel to
#                         $W) and points Vulkan at the NVIDIA driver
# Carry it with `carry: [".gpu"]`; on the GPU machine:
#   source .gpu/env.sh && bench/vs-llamacpp.sh --combs /root/bin/combs --wheel "$W" ...
# Write logs under $OUT as the run goes (`exec > $OUT/log 2>&1`) and put each
# step under `timeout`: a run cut at its time limit returns nothing else.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
out="$root/.gpu"
wheel=""
tests=()
extras=()
while (($#)); do
    case "$1" in
        --out) out="$2"; shift 2 ;;
        --wheel) wheel="$2"; shift 2 ;;
        --test) tests+=("$2"); shift 2 ;;
        --extra) extras+=("$2"); shift 2 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-$root/target}/release"
mkdir -p "$out/debs"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

pack() { # binary name
    strip -o "$tmp/$2" "$1"
    xz -6 -T0 -c "$tmp/$2" >"$out/$2.xz"
}
pack "$target/combs" combs
for t in "${tests[@]}"; do
    bin="$(ls -t "$target/deps/$t"-* 2>/dev/null | grep -v '\.d$' | head -n1 || true)"
    [[ -n $bin ]] || { echo "no test binary $t (cargo test --release --no-run first)" >&2; exit 1; }
    pack "$bin" "$t"
done
for e in "${extras[@]}"; do
    [[ $e == *=* && -f ${e#*=} ]] || { echo "--extra wants NAME=BINARY, got $e" >&2; exit 2; }
    pack "${e#*=}" "${e%%=*}"
done

if ! ls "$out/debs/"libvulkan1_*.deb >/dev/null 2>&1; then
    (cd "$out/debs" && apt-get download -q libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2 >&2)
fi

if [[ -n $wheel ]]; then
    mkdir "$tmp/wheel"
    (cd "$tmp/wheel" && python3 -m zipfile -e "$(realpath "$wheel")" .)
    rm -rf "$tmp/wheel/cyllama/sd"
    record="$(ls "$tmp"/wheel/*.dist-info/RECORD)"
    grep -v '^cyllama/sd/' "$record" >"$tmp/record" && cp "$tmp/record" "$record"
    basename "$wheel" >"$tmp/wheel/.name"
    tar -C "$tmp/wheel" -cf - . | xz -9 -T0 >"$out/wheel.tar.xz"
fi

cat >"$out/env.sh" <<'EOF'
# Sourced on the GPU machine from the repository root (bench/gpu-pack.sh).
gpu="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for f in "$gpu"/debs/*.deb; do dpkg -x "$f" / >/dev/null; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
mkdir -p /root/bin
for f in "$gpu"/*.xz; do
    n="$(basename "$f" .xz)"
    [[ $n == wheel.tar ]] && continue
    xz -dc "$f" >/root/bin/"$n" && chmod +x /root/bin/"$n"
done
if [[ -f $gpu/wheel.tar.xz ]]; then
    mkdir -p /root/wheel && tar -C /root/wheel -xJf "$gpu/wheel.tar.xz"
    W="/root/$(cat /root/wheel/.name)"
    rm -f /root/wheel/.name
    [[ -f $W ]] || (cd /root/wheel && python3 -m zipfile -c "$W" $(ls -A))
    export W
fi
EOF
du -sh "$out"
