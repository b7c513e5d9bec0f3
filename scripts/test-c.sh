#!/usr/bin/env bash
# The C API end to end, as a C/C++ user meets it: builds libcombs and the
# combs CLI (release), installs the library into a temporary prefix with
# scripts/install.sh, builds examples/c against the installed package — with
# CMake (find_package(combs)) and with pkg-config (the README example) — and
# runs ctest: generate.c and chat.cpp against `combs run --temp 0`, errors.c
# (every error path), sessions.c (independent sessions, two threads),
# devices.c (one model split over two devices and replicated on them: the
# first device opened twice) and
# generate.c under valgrind memcheck (when valgrind is installed).
#
#   scripts/test-c.sh            # model: SmolLM2-135M-Instruct from the cache
#   COMBS_TEST_C_KEEP=1 scripts/test-c.sh   # keep the temporary directory
#
# Runs on the first Vulkan device (lavapipe without a GPU); ~16 tokens per example.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

models="${COMBS_MODELS:-$HOME/.cache/combs/models}"
model="$models/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -f $model ]] || scripts/fetch-models.sh --smollm2 >/dev/null

start=$SECONDS
cargo build --release --lib --bin combs
target="${CARGO_TARGET_DIR:-$root/target}"

work="$(mktemp -d "${TMPDIR:-/tmp}/combs-test-c.XXXXXX")"
if [[ -z ${COMBS_TEST_C_KEEP:-} ]]; then trap 'rm -rf "$work"' EXIT; else echo "keeping $work" >&2; fi
prefix="$work/prefix"
scripts/install.sh --no-build "$prefix"

# The installed layout: soname links, header, pkg-config and CMake files.
[[ $(readlink "$prefix/lib/libcombs.so") == libcombs.so.0 ]]
[[ -f $prefix/lib/libcombs.so.0 && -f $prefix/include/combs.h ]]
[[ -f $prefix/lib/cmake/combs/combsConfig.cmake && -f $prefix/lib/cmake/combs/combsConfigVersion.cmake ]]

# pkg-config: the README's build line, C99 and C++ (the header is valid in both).
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
[[ $(pkg-config --modversion combs) == "$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)" ]]
# shellcheck disable=SC2046  # pkg-config output is meant to split
cc -std=c99 -Wall -Wextra -Werror -pedantic examples/c/hello.c -o "$work/hello" \
    $(pkg-config --cflags --libs combs) -Wl,-rpath,"$prefix/lib"
# shellcheck disable=SC2046
c++ -std=c++11 -Wall -Wextra -Werror -pedantic -x c++ -fsyntax-only - $(pkg-config --cflags combs) \
    <<<'#include <combs.h>
int main() { combs_session_options o = combs_session_default_options(); return (int)o.n_ctx; }'
"$work/hello" "$model" | tee "$work/hello.out"
grep -q "^The three primary colors are." "$work/hello.out"

# CMake: find_package(combs) against the prefix, then ctest.
cmake -S examples/c -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$prefix" -DCOMBS_MODEL="$model" -DCOMBS_CLI="$target/release/combs"
cmake --build "$work/build" -j "$(nproc)"
ctest --test-dir "$work/build" --output-on-failure --timeout 1800 "$@"

echo "C API tests passed in $((SECONDS - start)) s"
