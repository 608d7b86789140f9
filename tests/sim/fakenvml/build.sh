#!/usr/bin/env bash
# Builds the fake NVIDIA driver library tests/sim/build/libnvidia-ml.so.1 from fakenvml.c, and its
# variant without the _v3 process-list symbols, tests/sim/build/no-v3/libnvidia-ml.so.1, and the early-R535
# variant with 32-byte _v3 entries, tests/sim/build/v3-32/libnvidia-ml.so.1.
# Usage: build.sh [--force]
# Idempotent: rebuilds only when fakenvml.c or this script is newer than the library (or with
# --force). The library is replaced by rename, so processes that have it loaded keep their copy.
# Prints the library's path. Environment: CC (default gcc).
set -euo pipefail

source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build_dir=$(cd "$source_dir/.." && pwd)/build
source=$source_dir/fakenvml.c
library=$build_dir/libnvidia-ml.so.1
force=${1:-}
if [[ -n $force && $force != --force ]]; then
    echo "usage: $0 [--force]" >&2
    exit 2
fi

# The variant without the _v3 process-list symbols (gpunode up --no-v3): build/no-v3/.
library_no_v3=$build_dir/no-v3/libnvidia-ml.so.1
# The early-R535 variant with 32-byte _v3 entries (gpunode up --v3-32): build/v3-32/.
library_v3_32=$build_dir/v3-32/libnvidia-ml.so.1

build() {  # build OUTPUT [CFLAGS...]
    local output=$1 tmp
    shift
    mkdir -p "$(dirname "$output")"
    tmp=$(mktemp "$(dirname "$output")/.libnvidia-ml.so.1.XXXXXX")
    "${CC:-gcc}" -O2 -Wall -Wextra -fvisibility=hidden -shared -fPIC -pthread "$@" \
        -Wl,-soname,libnvidia-ml.so.1 -o "$tmp" "$source" || { rm -f "$tmp"; return 1; }
    chmod 0755 "$tmp"
    mv -f "$tmp" "$output"
}

if [[ -n $force || ! -e $library || $source -nt $library || ${BASH_SOURCE[0]} -nt $library ]]; then
    build "$library"
fi
if [[ -n $force || ! -e $library_no_v3 || $source -nt $library_no_v3 || ${BASH_SOURCE[0]} -nt $library_no_v3 ]]; then
    build "$library_no_v3" -DFAKENVML_NO_V3
fi
if [[ -n $force || ! -e $library_v3_32 || $source -nt $library_v3_32 || ${BASH_SOURCE[0]} -nt $library_v3_32 ]]; then
    build "$library_v3_32" -DFAKENVML_V3_LEGACY
fi
echo "$library"
