#!/usr/bin/env bash
# Runs matmul_coop.comp (the cooperative-matrix tiles of prompts and
# batches) on the CPU, where no GPU is at hand:
#
#   scripts/coop-lavapipe.sh [TEST_FILTER...]   (default: the tile, epilogue
#                                                and f16-input tests)
#
# Mesa 26's lavapipe offers VK_KHR_cooperative_matrix, but only 8x8x8 f16
# matrices on subgroups of 8 (256-bit vectors), and Debian bookworm's Mesa
# is too old. So this (1) keeps a Debian sid chroot with Mesa's Vulkan
# drivers (debootstrap; ~300 MB; root needed for chroot), (2) makes a copy
# of HEAD in a git worktree whose kernel and tile geometry are scaled from
# 16x16 matrices and 32-lane subgroups to 8x8 and 8 (every pattern it
# rewrites must be found, or it stops; matmul_skinny.comp through its MS and
# LANES constants), (3) builds tests/ops_gpu.rs there and runs the
# filtered tests in the chroot, the workgroup-scope (`VK_NV_cooperative_matrix2`)
# tiles left out of the tile, f16-input and epilogue tests (their kernel
# is not scaled), and the skinny tiles' sums of squares
# (skinny_norm_between_products_matches_ref: 16-row groups). Tile logic, staging and
# epilogues run as on a GPU; the 16x16 code generation of a
# real driver does not. Not part of the default test run (~10 min the
# first time).
#
# COMBS_COOP_VALIDATE=1 runs the tests under the Khronos validation layer
# (installed in the chroot on first use) and fails on any validation
# error. Core validation only: the layer's GPU-assisted validation crashes
# sid's lavapipe on every kernel (plain ones too, one test thread or
# more), so out-of-range accesses are checked by scripts/validate.sh on
# bookworm's lavapipe, where the cooperative tiles do not run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
sid="${COMBS_SID_CHROOT:-/var/tmp/combs-sid}"
work="${COMBS_COOP_WORKTREE:-/var/tmp/combs-coop8}"
target="${COMBS_COOP_TARGET:-/var/tmp/combs-coop8-target}"
filters=("$@")
((${#filters[@]})) || filters=(coop_tiles_match_ref coop_epilogue_matches_ref coop_f16_activations_match_ref)

if [[ ! -x $sid/usr/bin/vulkaninfo ]]; then
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >&2
    debootstrap --variant=minbase --include=mesa-vulkan-drivers,libvulkan1,vulkan-tools \
        sid "$sid" http://deb.debian.org/debian >&2
fi

git -C "$root" worktree remove --force "$work" 2>/dev/null || true
git -C "$root" worktree add -q --detach "$work" HEAD
trap 'git -C "$root" worktree remove --force "$work" 2>/dev/null || true' EXIT

python3 - "$work" <<'EOF'
import sys
work = sys.argv[1]

def scale(path, pairs):
    p = f"{work}/{path}"
    s = open(p).read()
    for a, b in pairs:
        if a not in s:
            sys.exit(f"coop-lavapipe: `{a}` not found in {path}: update this script")
        s = s.replace(a, b)
    open(p, "w").write(s)

scale("glsl/matmul_coop.comp", [
    ("TM * 16u", "TM * 8u"), ("TN * 16u", "TN * 8u"),
    ("NSG * 32u", "NSG * 8u"),
    ("16, 16,", "8, 8,"), ("c += 16u", "c += 8u"),
    ("16u * i", "8u * i"), ("16u * j", "8u * j"),
    ("sg * 256u", "sg * 64u"), ("e < 256u", "e < 64u"),
    ("e % 16u", "e % 8u"), ("e / 16u", "e / 8u"), ("base, 16,", "base, 8,"),
])
scale("glsl/matmul_skinny.comp", [
    ("const uint MS = 16u;", "const uint MS = 8u;"), ("const uint LANES = 32u;", "const uint LANES = 8u;"),
    ("const bool UNIFORM_CHUNKS = false;", "const bool UNIFORM_CHUNKS = true;"),
])
scale("src/ops/linear/coop.rs", [
    ("(self.wm * self.tm * 16) as usize", "(self.wm * self.tm * 8) as usize"),
    ("(self.wn * self.tn * 16) as usize", "(self.wn * self.tn * 8) as usize"),
    ("32 * self.wm * self.wn * self.wk", "8 * self.wm * self.wn * self.wk"),
    ("            256 * self.wm * self.wn\n", "            64 * self.wm * self.wn\n"),
    ("self.wm * self.tm * self.tn * 256", "self.wm * self.tm * self.tn * 64"),
    ("* subgroups * 16 * (1 + self.tn as usize)", "* subgroups * 8 * (1 + self.tn as usize)"),
    ("                self.invocations(),\n                32,\n                self.wm,\n                self.wn,",
     "                self.invocations(),\n                8,\n                self.wm,\n                self.wn,"),
    ("                self.invocations(),\n                32,\n                self.wm,\n                self.wk,",
     "                self.invocations(),\n                8,\n                self.wm,\n                self.wk,"),
])
scale("src/ops/linear/mod.rs", [("kernel_subgroup(ctx) == 32", "kernel_subgroup(ctx) == 8")])
scale("src/gpu/caps.rs", [(".any(|s| s.m == 16 && s.n == 16 && s.k == 16)",
                           ".any(|s| s.m == 8 && s.n == 8 && s.k == 8)")])
scale("tests/ops_gpu.rs", [("    for tile in tiles {\n        for (t, rows, cols, n) in [",
                            "    for tile in tiles.into_iter().filter(|t| !t.nv2) {\n        for (t, rows, cols, n) in ["),
                           ("    for tile in tiles {\n        for (t, n) in [",
                            "    for tile in tiles.into_iter().filter(|t| !t.nv2) {\n        for (t, n) in [")])
EOF

(cd "$work" && CARGO_TARGET_DIR="$target" cargo build --release --test ops_gpu >&2)
bin="$(ls -t "$target"/release/deps/ops_gpu-* | grep -v '\.d$' | head -n1)"
mkdir -p "$sid/combs"
cp "$bin" "$sid/combs/ops_gpu"
mountpoint -q "$sid/proc" || mount --bind /proc "$sid/proc"
if [[ ${COMBS_COOP_VALIDATE:-0} == 1 ]]; then
    if [[ ! -f $sid/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json ]]; then
        cp /etc/resolv.conf "$sid/etc/resolv.conf"
        # The chroot's sid snapshot ages: its Release file's expiry is not checked.
        chroot "$sid" apt-get -o Acquire::Check-Valid-Until=false update -qq >&2
        chroot "$sid" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false \
            install -y -qq vulkan-validationlayers >&2
    fi
    # with-validation.sh sets the layer and counts its errors; the
    # environment it sets passes through chroot to the chroot's layer.
    "$root/scripts/with-validation.sh" chroot "$sid" /combs/ops_gpu "${filters[@]}"
else
    chroot "$sid" /combs/ops_gpu "${filters[@]}"
fi
