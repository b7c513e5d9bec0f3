#!/usr/bin/env bash
# Installs the system packages combs needs on Debian/Ubuntu: the Vulkan loader
# and Mesa's lavapipe (a Vulkan device on the CPU, so everything runs without a
# GPU), the C/C++ toolchain, cmake + ninja (shaderc is built from source),
# python3 with pip (models come from PyPI wheels) and valgrind / pkg-config for
# the C examples, espeak-ng and sox with its MP3 handler for the test
# audio, Khronos' validation layer (the tests run under it). Skips apt when
# everything is already there.
set -euo pipefail
pkgs=(libvulkan1 mesa-vulkan-drivers vulkan-tools build-essential cmake ninja-build
      python3 python3-pip git pkg-config valgrind curl ca-certificates espeak-ng sox libsox-fmt-mp3
      vulkan-validationlayers)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
    echo "installing: ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
