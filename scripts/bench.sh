#!/bin/sh
# `make bench`: every benchmark, one after the other, each printing its own
# table.  Set SHOAL_BENCH_JSON=1 to get one JSON object per line instead.
set -eu
J=""; [ "${SHOAL_BENCH_JSON:-}" = 1 ] && J=--json
for b in $(build/shoal bench --help | awk 'NR > 2 && NF {print $1}'); do
    echo "== shoal bench $b"
    build/shoal bench "$b" $J
done
