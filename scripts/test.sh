#!/usr/bin/env bash
# The test command: builds combs (release: shaderc is compiled from source
# once, ~15 min on 2 cores), fetches the real test models into the cache,
# runs every Rust test on the first Vulkan device (lavapipe on a machine
# without a GPU), lints, and checks that include/combs.h matches the code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-models.sh >/dev/null
scripts/fetch-test-audio.sh >/dev/null  # speech clips for tests/whisper_audio.rs (~1 MB)
cargo build --release --all-targets
cargo test --release
# The portable host kernels, which aarch64 and x86-64 without AVX2 run.
COMBS_HOST_SIMD=portable cargo test --release --test ops_host
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
git diff --exit-code -- include/combs.h || {
    echo "include/combs.h differs from the header cbindgen generates: commit the regenerated file" >&2
    exit 1
}
scripts/test-c.sh  # C API: install, examples/c with CMake + pkg-config, ctest, valgrind
echo "all tests passed"
