#!/bin/sh
# `make bench`: every benchmark, one after the other, each printing its own
# table, then recorded in bench/results/DATE-COMMIT.jsonl and .md
# (bench/results/README.md).  SHOAL_BENCH_JSON=1 prints the JSON lines too.
set -eu
rec=bench/results/$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD 2>/dev/null || echo local).jsonl
mkdir -p bench/results
for b in $(build/shoal bench --help | awk 'NR > 2 && NF {print $1}'); do
    echo "== shoal bench $b"
    out=$(build/shoal bench "$b" --json)
    [ "${SHOAL_BENCH_JSON:-}" = 1 ] && echo "$out"
    echo "$out" | python3 scripts/bench-record.py add "$rec" "$b" "build/shoal bench $b --json"
done
# The RL sweep (docs/rl.md, "The sweep"): paced runs, so the figures do not
# depend on the machine's load, only the time the sweep takes does.
echo "== shoal rl sweep"
nice build/shoal rl sweep --out build/rl-sweep
for e in md json svg; do cp build/rl-sweep/sweep.$e docs/rl-sweep.$e; done
python3 scripts/bench-record.py render "$rec"
