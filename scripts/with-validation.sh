#!/usr/bin/env bash
# Runs a command with Khronos' validation layer on every Vulkan instance it
# creates and fails if the layer reported an error (invalid API usage or
# SPIR-V the device's enabled features do not allow), even where the command
# itself passed: drivers let much invalid usage pass that another driver
# rejects or miscompiles.
#
#   scripts/with-validation.sh cargo test --release [ARGS...]
#
# The layer (Debian's vulkan-validationlayers, installed by
# scripts/install-deps.sh) prints its messages on standard output; they are
# kept in a log and counted. Its API and SPIR-V checks only, not the
# GPU-assisted bounds checks of scripts/validate.sh (ten times slower): the
# test suite takes ~1.5x its time on lavapipe, so scripts/test.sh runs it
# this way.
set -euo pipefail
layer=VK_LAYER_KHRONOS_validation
if ! grep -qs "\"$layer\"" /usr/share/vulkan/explicit_layer.d/*.json; then
    echo "with-validation: $layer is not installed (apt-get install vulkan-validationlayers)" >&2
    exit 1
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
VK_INSTANCE_LAYERS="$layer${VK_INSTANCE_LAYERS:+:$VK_INSTANCE_LAYERS}" "$@" 2>&1 | tee "$log" || status=$?
errors="$(grep -c 'Validation Error' "$log" || true)"
if ((errors > 0)); then
    echo "with-validation: $errors validation errors; by VUID:" >&2
    grep -o 'VUID-[A-Za-z0-9_-]*' "$log" | sort | uniq -c | sort -rn | head -20 >&2
    exit 1
fi
exit "$status"
