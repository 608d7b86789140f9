#!/usr/bin/env bash
# Builds the fake NVIDIA driver library tests/sim/build/libnvidia-ml.so.1 from fakenvml.c.
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

if [[ -n $force || ! -e $library || $source -nt $library || ${BASH_SOURCE[0]} -nt $library ]]; then
    mkdir -p "$build_dir"
    tmp=$(mktemp "$build_dir/.libnvidia-ml.so.1.XXXXXX")
    trap 'rm -f "$tmp"' EXIT
    "${CC:-gcc}" -O2 -Wall -Wextra -fvisibility=hidden -shared -fPIC -pthread \
        -Wl,-soname,libnvidia-ml.so.1 -o "$tmp" "$source"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$library"
fi
echo "$library"
