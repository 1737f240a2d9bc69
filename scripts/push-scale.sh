#!/bin/sh
# The converge-time table of docs/push-scale.md: `shoal sim push` for
# N = 16 .. 16384 replicas across 1-8 zones, a full 717 GB checkpoint and
# deltas at the two ratios measured in this project, on 400 Gb/s in-fabric
# RDMA (fabrics of 64), 100 Gb/s in-zone and 25 Gb/s across zones.
# Prints a markdown table.  The model is deterministic: the figures do not
# depend on the machine's load.
set -eu
SHOAL=${SHOAL_BIN:-build/shoal}
FULL=717000000000
# Delta ratios: the main job's trainer (78.1 KB deltas of a 213 KB image,
# build/mainrun/summary.json) and `shoal bench delta` (4.33 MB of 512 MB).
D1=$((FULL * 367 / 1000))
D2=$((FULL * 85 / 10000))
LINKS="--fabric-gbps 400 --fabric-latency-us 5 --zone-gbps 100 --zone-latency-us 50 --cross-gbps ${CROSS_GBPS:-25} --cross-latency-us 1000 --fabric-size 64 --overhead-us 20"
printf '| replicas | zones | full 717 GB (s) | delta 0.367 (s) | delta 0.0085 (s) | depth |\n'
printf '|---:|---:|---:|---:|---:|---:|\n'
for n in ${NS:-16 64 256 1024 4096 16384}; do
    for z in ${ZS:-1 2 4 8}; do
        [ "$z" -le "$n" ] || continue
        row="| $n | $z"
        depth=0
        for p in $FULL $D1 $D2; do
            # shellcheck disable=SC2086
            j=$("$SHOAL" sim push --replicas "$n" --zones "$z" --payload "$p" $LINKS --json)
            c=$(printf '%s' "$j" | sed 's/.*"converge_s":\([0-9.e+-]*\).*/\1/')
            depth=$(printf '%s' "$j" | sed 's/.*"depth":\([0-9]*\).*/\1/')
            row="$row | $(printf '%.2f' "$c")"
        done
        printf '%s | %s |\n' "$row" "$depth"
    done
done
