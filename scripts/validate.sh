#!/usr/bin/env bash
# Runs test binaries under the Khronos validation layer with GPU-assisted
# validation, which instruments every kernel and reports each storage-buffer
# access outside its descriptor's range (and API misuse). Slow (ten times a
# normal run on lavapipe or more: ops_gpu takes over an hour), so not part of
# scripts/test.sh:
#
#   scripts/validate.sh [TEST ...]      (default: the kernel suites below)
#
# Builds the release tests first. Prints each binary's distinct messages and
# exits 1 if any binary reported a validation error or failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! dpkg-query -W -f='${Status}' vulkan-validationlayers 2>/dev/null | grep -q "install ok installed"; then
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq vulkan-validationlayers >/dev/null
fi
tests=("$@")
((${#tests[@]})) || tests=(ops_q8 fusion ops_topk recording_barriers gpu_threads kv_paged ops_speech model_steps vlm_runtime ops_gpu)
target="${CARGO_TARGET_DIR:-target}/release/deps"
cargo build --release --tests -q
export VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation
export VK_LAYER_ENABLES=VK_VALIDATION_FEATURE_ENABLE_GPU_ASSISTED_EXT
log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT
status=0
for t in "${tests[@]}"; do
    bin="$(ls -t "$target/$t"-* 2>/dev/null | grep -v '\.d$' | head -n1 || true)"
    [[ -n $bin ]] || { echo "$t: no test binary" >&2; status=1; continue; }
    rc=0
    "$bin" --test-threads 2 >"$log/$t" 2>&1 || rc=$?
    errors="$(grep -c 'Validation Error' "$log/$t" || true)"
    echo "$t: exit $rc, $errors validation errors"
    grep -o 'Validation Error: \[ [A-Za-z0-9_-]* \]' "$log/$t" | sort | uniq -c || true
    grep -o 'Descriptor size is [0-9]* and highest byte accessed was [0-9]*' "$log/$t" | sort | uniq -c | head -5 || true
    ((rc == 0 && errors == 0)) || status=1
done
exit $status
