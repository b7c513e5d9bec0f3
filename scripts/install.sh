#!/usr/bin/env bash
# Builds combs (release) and installs the C library as a package under PREFIX:
#
#   scripts/install.sh PREFIX            # e.g. /usr/local, ~/.local, /opt/combs
#   scripts/install.sh --no-build PREFIX # install what target/release already holds
#
# Installs
#   PREFIX/lib/libcombs.so.<version>          the library (soname libcombs.so.<major>)
#   PREFIX/lib/libcombs.so.<major> -> libcombs.so.<version>
#   PREFIX/lib/libcombs.so -> libcombs.so.<major>
#   PREFIX/include/combs.h
#   PREFIX/lib/pkgconfig/combs.pc             pkg-config --cflags --libs combs
#   PREFIX/lib/cmake/combs/combsConfig.cmake  find_package(combs) -> combs::combs
#   PREFIX/lib/cmake/combs/combsConfigVersion.cmake
#
# Then: cmake -DCMAKE_PREFIX_PATH=PREFIX ..., or PKG_CONFIG_PATH=PREFIX/lib/pkgconfig.
# For a prefix outside the loader's paths, link with -Wl,-rpath,PREFIX/lib (CMake
# does it for build trees) or set LD_LIBRARY_PATH. At run time the library
# needs a Vulkan loader (libvulkan.so.1) and a driver; it opens them itself.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

build=1
if [[ ${1:-} == --no-build ]]; then build=0; shift; fi
if [[ $# -ne 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,21p' "$0" >&2
    exit 2
fi
mkdir -p "$1"
prefix="$(cd "$1" && pwd)"

version="$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$root/Cargo.toml" | head -n1)"
[[ $version =~ ^([0-9]+)\.([0-9]+)\.([0-9]+) ]] || { echo "install.sh: cannot read the version from Cargo.toml" >&2; exit 1; }
major="${BASH_REMATCH[1]}" minor="${BASH_REMATCH[2]}"

if ((build)); then
    (cd "$root" && cargo build --release --lib)
fi
lib="${CARGO_TARGET_DIR:-$root/target}/release/libcombs.so"
[[ -f $lib ]] || { echo "install.sh: $lib not found (build first, or drop --no-build)" >&2; exit 1; }
if command -v readelf >/dev/null && ! readelf -d "$lib" | grep -q "SONAME.*\[libcombs.so.$major\]"; then
    echo "install.sh: $lib lacks the soname libcombs.so.$major (is build.rs up to date?)" >&2
    exit 1
fi

install -d "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/combs"
install -m 0755 "$lib" "$prefix/lib/libcombs.so.$version"
ln -sfn "libcombs.so.$version" "$prefix/lib/libcombs.so.$major"
ln -sfn "libcombs.so.$major" "$prefix/lib/libcombs.so"
install -m 0644 "$root/include/combs.h" "$prefix/include/combs.h"

subst() {
    sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@MAJOR@|$major|g" \
        -e "s|@MINOR@|$minor|g" "$1" >"$2"
    chmod 0644 "$2"
}
subst "$root/cmake/combs.pc.in" "$prefix/lib/pkgconfig/combs.pc"
subst "$root/cmake/combsConfig.cmake.in" "$prefix/lib/cmake/combs/combsConfig.cmake"
subst "$root/cmake/combsConfigVersion.cmake.in" "$prefix/lib/cmake/combs/combsConfigVersion.cmake"

echo "installed combs $version into $prefix" >&2
