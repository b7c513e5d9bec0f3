#!/usr/bin/env bash
# Runs the libFuzzer targets under fuzz/ (outside the default test run).
#
#   fuzz/run.sh [SECONDS] [TARGET...]
#
# Each target runs SECONDS (default 60) over its corpus: fuzz/corpus/<target>
# (what the fuzzer found, not committed), fuzz/corpus/seed-<target>
# (committed, from fuzz/make-seeds.py committed) and fuzz/corpus/gen-<target>
# (generated here). Crashes land in fuzz/artifacts/<target>/; a report line
# per target (execs, coverage, corpus) is appended to fuzz/reports.log.
# Needs: the nightly toolchain, cargo-fuzz (installed if missing), the real
# models (scripts/fetch-models.sh), and a Vulkan device (lavapipe does).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
ALL=(gguf_parse gguf_load tokenize chat_template requantize audio image whisper_load hf_dir)
TARGETS=("${@:-${ALL[@]}}")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")

rustup toolchain list | grep -q nightly || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
[ -f "${COMBS_MODELS:-$HOME/.cache/combs/models}/gemma-3-270m-q4_k_m.gguf" ] || scripts/fetch-models.sh

# The kernels' SPIR-V comes from a normal build (the fuzz build has no
# shaderc); redone before every target, so that sources edited during a
# long run give kernels of the same revision (the build checks a stamp).
spirv() {
    cargo build --release --lib --example fuzz_seeds
    local stamp
    stamp=$(ls -t target/release/build/combs-*/out/kernels.stamp | head -1)
    export COMBS_SPIRV_DIR="$PWD/$(dirname "$stamp")"
}
spirv
target/release/examples/fuzz_seeds fuzz/corpus >/dev/null
python3 fuzz/make-seeds.py generated

for t in "${TARGETS[@]}"; do
    spirv
    # -a: debug assertions and overflow checks, so that arithmetic on sizes
    # from a file that wraps is a crash, not a silent wrong answer.
    (cd fuzz && cargo +nightly fuzz build -a "$t")
    mkdir -p "fuzz/corpus/$t" "fuzz/corpus/seed-$t" "fuzz/corpus/gen-$t" "fuzz/artifacts/$t"
    log="fuzz/artifacts/$t/last-run.log"
    # Lavapipe and the tokenizers' tables are allocated once per process;
    # leaks are checked by valgrind on the tests, not per input here.
    (cd fuzz && cargo +nightly fuzz run -a "$t" "corpus/$t" "corpus/seed-$t" "corpus/gen-$t" -- \
        -max_total_time="$SECONDS_EACH" -rss_limit_mb=4096 -timeout=60 -detect_leaks=0 \
        -print_final_stats=1) >"$log" 2>&1 && status=ok || status="FAILED (see $log)"
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
    corpus=$(ls "fuzz/corpus/$t" | wc -l)
    line="$(date -u +%FT%TZ) $t ${SECONDS_EACH}s execs=$execs cov=$cov corpus=$corpus $status"
    echo "$line" | tee -a fuzz/reports.log
done
