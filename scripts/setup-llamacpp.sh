#!/usr/bin/env bash
# Build llama.cpp's CPU tools (reference outputs for combs' tests) from the
# sources vendored in the llama-cpp-python sdist on PyPI, install the Python
# binding into a venv, and requantize the SmolLM2 test model into other types.
#
#   scripts/setup-llamacpp.sh            # everything (idempotent, re-runs are fast)
#   scripts/setup-llamacpp.sh --no-venv  # only the CLI tools (+ requantize)
#
# Environment:
#   COMBS_TOOLS   where things go (default ~/.cache/combs/tools)
#   COMBS_MODELS  model cache (default ~/.cache/combs/models), see fetch-models.sh
#   JOBS          parallel compile jobs (default: nproc)
#
# Layout under $COMBS_TOOLS:
#   src/llama_cpp_python-<ver>/vendor/llama.cpp   sources
#   build/bin/                                    llama-* tools + libllama.so, libggml*.so
#   bin -> build/bin                              (symlink; put it on PATH if you like)
#   venv/                                         python: llama_cpp, gguf, numpy
#   llama.cpp-version.txt                         llama-cpp-python version + llama.cpp commit
#   logs/                                         build logs
#
# The build is portable x86-64 with AVX2/FMA/F16C: a -march=native build
# crashed with an illegal instruction on one of the project's machines.
set -euo pipefail

LCP_VERSION=0.3.36          # llama-cpp-python; vendors llama.cpp 0c1e57098
TOOLS="${COMBS_TOOLS:-$HOME/.cache/combs/tools}"
MODELS="${COMBS_MODELS:-$HOME/.cache/combs/models}"
JOBS="${JOBS:-$(nproc)}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"

WANT_VENV=1
for a in "$@"; do
    case "$a" in
        --no-venv) WANT_VENV=0 ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a" >&2; exit 2 ;;
    esac
done

GGML_FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
            -DGGML_AVX512=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
            -DCMAKE_BUILD_TYPE=Release)
# llama-mtmd-cli (and libmtmd.so with it) is the multimodal reference of the SmolVLM tests
TARGETS=(llama-quantize llama-perplexity llama-tokenize llama-completion llama-simple
         llama-eval-callback llama-bench llama-gguf llama-mtmd-cli)

log() { printf '[setup-llamacpp] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# run CMD... with output to a log file; on failure show its tail
logged() {
    local logf="$1"; shift
    if ! "$@" >"$logf" 2>&1; then
        tail -n 40 "$logf" >&2
        die "command failed: $* (full log: $logf)"
    fi
}

mkdir -p "$TOOLS/src" "$TOOLS/logs"

# ---------------------------------------------------------------- sources
SRC="$TOOLS/src/llama_cpp_python-$LCP_VERSION"
SDIST="$TOOLS/src/llama_cpp_python-$LCP_VERSION.tar.gz"
if [[ ! -f "$SDIST" ]]; then
    log "downloading llama-cpp-python==$LCP_VERSION sdist from PyPI (pip prepares its metadata: ~2 min)"
    tmp="$(mktemp -d "$TOOLS/src/dl.XXXXXX")"
    logged "$TOOLS/logs/sdist-download.log" \
        "$PY" -m pip download --no-binary :all: --no-deps -d "$tmp" "llama-cpp-python==$LCP_VERSION"
    mv "$tmp/llama_cpp_python-$LCP_VERSION.tar.gz" "$SDIST"
    rm -rf "$tmp"
fi
if [[ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]]; then
    log "extracting $SDIST"
    rm -rf "$SRC"
    tar -xzf "$SDIST" -C "$TOOLS/src"
fi
LLAMA_SRC="$SRC/vendor/llama.cpp"
LLAMA_COMMIT="$(grep -m1 -o 'llama.cpp@[0-9a-f]*' "$SRC/CHANGELOG.md" | cut -d@ -f2 || true)"
printf 'llama-cpp-python %s\nllama.cpp %s\n' "$LCP_VERSION" "${LLAMA_COMMIT:-unknown}" \
    > "$TOOLS/llama.cpp-version.txt"
log "llama-cpp-python $LCP_VERSION, vendored llama.cpp commit ${LLAMA_COMMIT:-unknown}"

# ---------------------------------------------------------------- venv (+ cmake/ninja if missing)
VENV="$TOOLS/venv"
VPY="$VENV/bin/python"
if [[ ! -x "$VPY" ]]; then
    log "creating venv $VENV"
    "$PY" -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    logged "$TOOLS/logs/venv-pip.log" "$VPY" -m pip install --upgrade pip
fi

CMAKE="$(command -v cmake || true)"
NINJA="$(command -v ninja || true)"
cmake_ok() {  # llama.cpp wants cmake >= 3.14, llama-cpp-python >= 3.21
    [[ -n "$1" ]] || return 1
    local v; v="$("$1" --version 2>/dev/null | head -n1 | grep -o '[0-9][0-9.]*' | head -n1)"
    [[ -n "$v" ]] && printf '3.21\n%s\n' "$v" | sort -V -C
}
if ! cmake_ok "$CMAKE" || [[ -z "$NINJA" ]]; then
    if [[ ! -x "$VENV/bin/cmake" || ! -x "$VENV/bin/ninja" ]]; then
        log "installing cmake + ninja into the venv from PyPI"
        logged "$TOOLS/logs/venv-cmake.log" "$VPY" -m pip install cmake ninja
    fi
    CMAKE="$VENV/bin/cmake"; NINJA="$VENV/bin/ninja"
fi

# ---------------------------------------------------------------- CLI tools
BUILD="$TOOLS/build"
STAMP="$BUILD/.combs-stamp"
want_stamp="$LCP_VERSION ${GGML_FLAGS[*]} ${TARGETS[*]}"
have_all=1
for t in "${TARGETS[@]}"; do [[ -x "$BUILD/bin/$t" ]] || have_all=0; done
if [[ $have_all == 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
    log "llama.cpp tools already built in $BUILD/bin"
else
    log "configuring llama.cpp (log: $TOOLS/logs/cmake-configure.log)"
    logged "$TOOLS/logs/cmake-configure.log" \
        "$CMAKE" -S "$LLAMA_SRC" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
        "${GGML_FLAGS[@]}" -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON
    log "building ${TARGETS[*]} with -j$JOBS (log: $TOOLS/logs/cmake-build.log; ~28 min on 2 cores)"
    t0=$SECONDS
    logged "$TOOLS/logs/cmake-build.log" \
        "$CMAKE" --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}"
    log "tools built in $((SECONDS - t0)) s"
    echo "$want_stamp" > "$STAMP"
fi
ln -sfn "$BUILD/bin" "$TOOLS/bin"

# ---------------------------------------------------------------- python binding
if [[ $WANT_VENV == 1 ]]; then
    if "$VPY" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$LCP_VERSION')" 2>/dev/null; then
        log "llama-cpp-python $LCP_VERSION already in $VENV"
    else
        log "pip-installing llama-cpp-python $LCP_VERSION into $VENV from the sdist (log: $TOOLS/logs/pip-llama-cpp-python.log; ~22 min on 2 cores)"
        t0=$SECONDS
        # same portable flags as the tools; no multimodal lib (mtmd_cpp is imported lazily, text
        # models work without it); the ninja/cmake found above are used by scikit-build-core
        CMAKE_ARGS="${GGML_FLAGS[*]} -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
        PATH="$(dirname "$CMAKE"):$(dirname "$NINJA"):$PATH" \
            logged "$TOOLS/logs/pip-llama-cpp-python.log" \
            "$VPY" -m pip install -v --no-cache-dir "$SDIST"
        log "python binding built in $((SECONDS - t0)) s"
    fi
    if ! "$VPY" -c "import gguf, numpy" 2>/dev/null; then
        log "installing gguf (+numpy) into $VENV"
        logged "$TOOLS/logs/venv-gguf.log" "$VPY" -m pip install gguf numpy
    fi
fi

# ---------------------------------------------------------------- models: SmolLM2 + requantized variants
"$HERE/fetch-models.sh" --smollm2 >/dev/null
SMOL="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
[[ -f "$SMOL" ]] || die "missing $SMOL after fetch-models.sh"
for TYPE in Q8_0 Q4_0 Q5_0 Q4_K_M; do
    out="$MODELS/SmolLM2-135M-Instruct.$TYPE.gguf"
    if [[ -f "$out" ]] && [[ "$(head -c4 "$out")" == GGUF ]]; then
        continue
    fi
    log "requantizing Q4_1 -> $TYPE"
    logged "$TOOLS/logs/quantize-$TYPE.log" \
        "$TOOLS/bin/llama-quantize" --allow-requantize "$SMOL" "$out.tmp" "$TYPE" "$JOBS"
    mv "$out.tmp" "$out"
done

# ---------------------------------------------------------------- verify
log "verifying"
ntok="$("$TOOLS/bin/llama-tokenize" -m "$SMOL" -p "Hello world, this is a test." --ids --log-disable 2>/dev/null | tail -n1)"
[[ "$ntok" == \[*\] ]] || die "llama-tokenize printed no ids: $ntok"
log "llama-tokenize ok: $ntok"
if [[ $WANT_VENV == 1 ]]; then
    "$VPY" - "$SMOL" <<'EOF' || die "python binding check failed"
import sys, numpy as np
from llama_cpp import Llama
m = Llama(model_path=sys.argv[1], logits_all=True, n_ctx=512, n_threads=2, verbose=False)
toks = m.tokenize(b"The capital of France is", add_bos=True)
m.eval(toks)
lg = np.asarray(m.scores[: m.n_tokens])
assert lg.shape == (len(toks), m.n_vocab()) and np.isfinite(lg).all(), lg.shape
top = int(lg[-1].argmax())
print(f"[setup-llamacpp] llama_cpp ok: {len(toks)} tokens -> logits {lg.shape}, "
      f"next token {top} {m.detokenize([top])!r}", file=sys.stderr)
EOF
fi

echo "$TOOLS/bin"
for TYPE in Q4_1 Q8_0 Q4_0 Q5_0 Q4_K_M; do echo "$MODELS/SmolLM2-135M-Instruct.$TYPE.gguf"; done
