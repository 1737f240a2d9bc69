#!/bin/sh
# `make bench`: every benchmark, one after the other, each printing its own
# table.  Set SHOAL_BENCH_JSON=1 to get one JSON object per line instead.
set -eu
J=""; [ "${SHOAL_BENCH_JSON:-}" = 1 ] && J=--json
for b in $(build/shoal bench --help | awk 'NR > 2 && NF {print $1}'); do
    echo "== shoal bench $b"
    build/shoal bench "$b" $J
done
# The RL sweep (docs/rl.md, "The sweep"): paced runs, so the figures do not
# depend on the machine's load, only the time the sweep takes does.
echo "== shoal rl sweep"
nice build/shoal rl sweep --out build/rl-sweep $J
for e in md json svg; do cp build/rl-sweep/sweep.$e docs/rl-sweep.$e; done
