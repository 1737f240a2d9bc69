#!/bin/sh
# Checks `shoal sim push` against `shoal bench push` at N = 1, 4, 16
# (docs/push-scale.md, "Checked against shoal bench push"): runs the bench
# at a link speed where it is link-bound (GBPS, default 0.1) with 4 and 16
# replicas (each run also measures one replica), takes the one-replica
# apply time (last chunk to active) from the bench's own --json, runs the
# model with the bench's link model (one zone, a chain of fan-out 1, every
# node's sending at GBPS, loopback latency, 100 us per chunk and hop: the
# same per-chunk cost the root's chunk rule assumes, so the model cuts the
# payload into the bench's chunks) and that apply time, and prints a
# markdown table with the error of the model against the bench.
# Timing: run it on an idle machine; it prints the load and the share of
# each timed window the bench's nodes spent waiting for a core (cpu_wait).
set -eu
SHOAL=${SHOAL_BIN:-build/shoal}
GBPS=${GBPS:-0.1}
OUT=${OUT:-build/push-validate}
mkdir -p "$OUT"
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD 2>/dev/null || echo ?)"
for n in 4 16; do
    "$SHOAL" bench push --replicas "$n" --link-gbps "$GBPS" --json >"$OUT/bench-$n.json"
done
python3 - "$SHOAL" "$GBPS" "$OUT" <<'EOF'
import json, subprocess, sys
shoal, gbps, out = sys.argv[1], sys.argv[2], sys.argv[3]
def sim(n, payload, apply_s):
    j = subprocess.run([shoal, "sim", "push", "--replicas", str(n), "--zones", "1", "--fanout", "1",
                        "--zone-gbps", gbps, "--nic-gbps", gbps, "--zone-latency-us", "30",
                        "--overhead-us", "100", "--apply-ms", "%.3f" % (apply_s * 1e3),
                        "--payload", str(payload), "--json"], check=True, capture_output=True, text=True)
    return json.loads(j.stdout)
print("| N | bench converge s | nodes waiting for a core | chunk | apply s (N = 1) | sim converge s | sim / bench |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for n in (4, 16):
    b = json.load(open("%s/bench-%d.json" % (out, n)))
    one = b["one_replica"]
    r = one["breakdown"]["replicas"][0]
    apply_s = r["active"] - r["last_chunk"]
    rows = [(1, one["converge_s"], one["cpu_wait"])] if n == 4 else []
    rows.append((n, b["converge_s"], b["cpu_wait"]))
    for m, conv, wait in rows:
        s = sim(m, b["payload_bytes"], apply_s)
        print("| %d | %.3f | %.1f %% | %d | %.3f | %.3f | %.3f |" % (
            m, conv, wait * 100, s["chunk"], apply_s, s["converge_s"], s["converge_s"] / conv))
EOF
