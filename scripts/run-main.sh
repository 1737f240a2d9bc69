#!/bin/sh
# The main job (`make run`, docs/mainjob.md): a local mixed fleet from
# fleets/local-mixed.csv under `shoal up`; the RL trainer as a 2-node H100
# gang (gradients all-reduced over a UCX ring) and the rollout workers as an
# elastic job the scheduler places by price per unit of rollout throughput;
# every version goes to the store once and down a push tree (one relay per
# zone) to the workers, which are its replicas.  Live
# progress on the terminal, then an HTML report; the fleet-cost experiment
# (`shoal rl fleet-cost`) is summarised in it.  Everything started here is
# stopped on exit.
#
# When a job it started fails, it stops at once with the job's reason and
# its failed ranks' last log lines, and exits 1.
#
# Knobs: SHOAL_BIN (build/shoal), SHOAL_RUN_TRANSPORT (push; direct: the
# workers take every version from the trainer over the RL socket, the
# baseline), SHOAL_RUN_STEPS (40), SHOAL_RUN_PORT (8479), SHOAL_RUN_DIR
# (build/mainrun, or /var/tmp/shoal-mainrun.UID for a clone under /tmp),
# SHOAL_RUN_SPEEDS (the speed table), SHOAL_RUN_FLEET_COST=0 to skip the
# cost experiment.
set -eu

ROOT=$(pwd)
BIN=${SHOAL_BIN:-$ROOT/build/shoal}
# Ranks see a private /tmp: a clone under /tmp runs from a directory elsewhere.
case $ROOT/ in
    /tmp/*) RUN=${SHOAL_RUN_DIR:-/var/tmp/shoal-mainrun.$(id -u)} ;;
    *) RUN=${SHOAL_RUN_DIR:-$ROOT/build/mainrun} ;;
esac
PORT=${SHOAL_RUN_PORT:-8479}
STEPS=${SHOAL_RUN_STEPS:-40}
# The same options reach the workers through the store's trainer.json.
RLOPTS="--steps $STEPS --warm 70 --eval-every 5 --eval-n 48 --max-lag 2 --loss decoupled --gen-cost 12 --ordered"

case $RUN/ in /tmp/*) echo "run-main: SHOAL_RUN_DIR must be outside /tmp (ranks get a private /tmp)" >&2; exit 2 ;; esac
# A port another process listens on (a second `make run`?) stops this one
# before it touches $RUN, which may be the other run's.
if [ "$PORT" != 0 ] && ! python3 -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' "$PORT" 2>/dev/null; then
    echo "run-main: port $PORT is in use (another make run?): SHOAL_RUN_PORT=P picks another port, and SHOAL_RUN_DIR=DIR another folder than $RUN" >&2
    exit 1
fi
rm -rf "$RUN"
mkdir -p "$RUN/store" "$RUN/push" "$RUN/bin"
# Everything the ranks run or read lives in $RUN, wherever the clone is: the
# binaries (the client and shoal-core beside it) and the fleet's files.
cp "$BIN" "$RUN/bin/shoal"
cp "$(dirname "$BIN")/shoal-core" "$RUN/bin/shoal-core"
cp "$ROOT/fleets/local-mixed.csv" "$RUN/fleet.csv"
cp "${SHOAL_RUN_SPEEDS:-$ROOT/fleets/local-mixed.speeds.csv}" "$RUN/speeds.csv"
SHOAL=$RUN/bin/shoal
FLEET=$RUN/fleet.csv
SPEEDS=$RUN/speeds.csv
# The push root sits beside the store, in the trainer's zone.
ROOT_ZONE=us-east-1a

PIDS=""
cleanup() {
    status=$?
    trap - EXIT INT TERM
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $PIDS; do wait "$p" 2>/dev/null || true; done
    [ -e "$RUN/failed" ] && status=1
    exit $status
}
trap cleanup EXIT INT TERM

# Watches the jobs ids given; when one fails or is cancelled, prints why and
# the last lines of each rank that did not exit 0, marks the run failed and
# stops this script (whose cleanup stops everything it started).
watch_jobs() {
    while sleep 1; do
        for id in "$@"; do
            "$SHOAL" job "$id" --json >"$RUN/watch.json" 2>/dev/null || continue
            python3 - "$RUN/watch.json" >"$RUN/watch.txt" <<'PY' || continue
import json, re, sys
j = json.load(open(sys.argv[1]))
if j["state"] not in ("failed", "cancelled"):
    sys.exit(1)
print("%d %s %s %s" % (j["id"], j["name"], j["state"], j.get("reason", "")))
# The rank the reason names first, then others that exited with an error of
# their own (not those stopped by a signal when the job failed).
m = re.search(r"rank (\d+)", j.get("reason", ""))
ranks = [int(m.group(1))] if m else []
ranks += [x["rank"] for x in j.get("members", []) if 0 < x.get("exit_code", 0) < 128 and x["rank"] not in ranks]
for r in ranks[:3]:
    print("rank %d" % r)
PY
            read -r jid name state reason <"$RUN/watch.txt"
            echo "run-main: job $jid ($name) $state: $reason" >&2
            for r in $(sed -n 's/^rank //p' "$RUN/watch.txt"); do
                echo "run-main: last lines of job $jid rank $r:" >&2
                "$SHOAL" logs "$jid" --rank "$r" 2>&1 | tail -n 15 | sed 's/^/    /' >&2
            done
            echo "run-main: stopping everything; the logs are in $RUN" >&2
            : >"$RUN/failed"
            kill -TERM $$
            return
        done
    done
}

echo "run-main: starting the fleet ($FLEET) on port $PORT; logs in $RUN"
# The jobs write $RUN (their "writable"): as the fleet's admin, allow it.
"$SHOAL" up --fleet "$FLEET" --db "$RUN/fleet/shoal.db" --port "$PORT" --allow-writable "$RUN" >"$RUN/up.log" 2>&1 &
UP=$!
PIDS="$PIDS $UP"
i=0
while [ ! -s "$RUN/fleet/env" ]; do
    i=$((i + 1))
    if [ $i -ge 100 ] || ! kill -0 "$UP" 2>/dev/null; then
        echo "run-main: shoal up did not start ($RUN/up.log):" >&2
        tail -n 5 "$RUN/up.log" | sed 's/^/    /' >&2
        exit 1
    fi
    sleep 0.1
done
set -a
. "$RUN/fleet/env"
set +a

# The run's secret: its trainer, workers, replicas and push root prove to
# each other that they belong to this run with it, so that another tenant's
# process on the same network can neither join the push tree (and read the
# weights) nor hand the trainer trajectories (docs/security.md).  In the
# job files' env, which only this tenant and the admin can read.
SHOAL_RUN_SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export SHOAL_RUN_SECRET

PUSHOPT="--push $RUN/push"
[ "${SHOAL_RUN_TRANSPORT:-push}" = direct ] && PUSHOPT=""
json_args() { # prints its arguments as a JSON array of strings
    printf '['; sep=''
    for a in "$@"; do printf '%s"%s"' "$sep" "$a"; sep=','; done
    printf ']'
}
# shellcheck disable=SC2086
cat >"$RUN/trainer.json" <<EOF
{"name": "rl-trainer", "kind": "gang", "nodes": 2, "gpus_per_node": 1, "gpu_types": ["H100"],
 "priority": 10, "on_failure": "fail", "writable": ["$RUN"],
 "env": {"SHOAL_RUN_SECRET": "$SHOAL_RUN_SECRET"},
 "command": $(json_args "$SHOAL" rl trainer --store "$RUN/store" --events "$RUN/events.jsonl" --result "$RUN/result.json" $RLOPTS)}
EOF
cat >"$RUN/rollouts.json" <<EOF
{"name": "rl-rollouts", "kind": "elastic", "min_nodes": 1, "max_nodes": 7, "gpus_per_node": 1,
 "gpu_types": ["H100", "A100", "L40S", "L4"],
 "gpu_speeds": {"H100": 1.0, "A100": 0.70, "L40S": 0.55, "L4": 0.30},
 "writable": ["$RUN"], "env": {"SHOAL_RUN_SECRET": "$SHOAL_RUN_SECRET"},
 "command": $(json_args "$SHOAL" rl worker --store "$RUN/store" --fleet "$FLEET" --speeds "$SPEEDS" $PUSHOPT)}
EOF
NODES=$(grep -v -e '^#' -e '^name,' -e '^$' "$FLEET" | wc -l)
i=0
until [ "$("$SHOAL" nodes | grep -c alive)" -ge "$NODES" ]; do
    i=$((i + 1)); [ $i -lt 200 ] || { echo "run-main: the agents did not register; see $RUN/up.log" >&2; exit 1; }
    sleep 0.1
done
TRAINER=$("$SHOAL" submit "$RUN/trainer.json" --json | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
ROLLOUTS=$("$SHOAL" submit "$RUN/rollouts.json" --json | sed -n 's/.*"id":\([0-9]*\).*/\1/p')
echo "run-main: submitted the trainer (job $TRAINER) and the rollouts (job $ROLLOUTS)"
watch_jobs "$TRAINER" "$ROLLOUTS" &
WATCH=$!
PIDS="$PIDS $WATCH"

# The push tree: a root serving the store (once the trainer has published
# its first version) in the trainer's zone; every rollout worker attaches to
# it as a replica, and the first one of each zone relays to the others.
i=0
while [ ! -e "$RUN/store/main/LATEST" ]; do
    i=$((i + 1)); [ $i -lt 1200 ] || { echo "run-main: no version published after 120 s; see \`shoal logs 1\`" >&2; exit 1; }
    sleep 0.1
done
"$SHOAL" push serve --store "$RUN/store" --zone "$ROOT_ZONE" --addr-file "$RUN/push/push.tmp" >"$RUN/push.log" 2>&1 &
PIDS="$PIDS $!"
i=0
while [ ! -s "$RUN/push/push.tmp" ]; do
    i=$((i + 1)); [ $i -lt 100 ] || { echo "run-main: push root did not start; see $RUN/push.log" >&2; exit 1; }
    sleep 0.1
done
printf '{"name": "root", "zone": "%s", "addr": "%s"}\n' "$ROOT_ZONE" "$(cat "$RUN/push/push.tmp")" >"$RUN/push/root.json"
mv "$RUN/push/push.tmp" "$RUN/push/push.addr"

# Live progress until the trainer's result is written, then the report.  In
# the background, so that the watcher's signal interrupts the wait.
"$SHOAL" rl report --dir "$RUN" --watch --timeout 900 &
REPORT=$!
PIDS="$PIDS $REPORT"
wait "$REPORT"
kill "$WATCH" 2>/dev/null || true

"$SHOAL" jobs >"$RUN/jobs.txt" 2>&1 || true
"$SHOAL" nodes >"$RUN/nodes.txt" 2>&1 || true

if [ "${SHOAL_RUN_FLEET_COST:-1}" != 0 ]; then
    echo "run-main: the fleet-cost experiment (uniform H100 vs mixed vs per-type tuned pools, 16 seeds each, ordered: about 5 minutes on 2 idle cores; SHOAL_RUN_FLEET_COST=0 skips it)"
    "$SHOAL" rl fleet-cost --fleet "$FLEET" --speeds "$SPEEDS" --json >"$RUN/fleet-cost.json"
    "$SHOAL" rl report --dir "$RUN" --quiet
fi
echo "run-main: report: $RUN/report.html"
