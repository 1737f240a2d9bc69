#!/bin/sh
# A four-host shoal deployment on one machine: the head node (server and
# push root) in one network namespace, three workers (agents and replicas)
# in three others, joined by veth pairs to a bridge on the head, each link
# limited with tc (a token bucket on both ends).  It follows docs/deploy.md step by step
# and checks that
#   1. the server, bound to the head's address only, registers three agents
#      that reach it over the links, each with its own node credential;
#   2. a 3-node gang runs across the hosts and its ranks rendezvous at
#      MASTER_ADDR:MASTER_PORT (rank 0 hears ranks 1 and 2 from their hosts);
#   3. a client on a worker submits and lists over the network;
#   4. two versions pushed from the head through a UCX tree over the limited
#      links reach all three replicas byte for byte.
# Needs root (ip netns), iproute2 and tc.  Usage: tests/netns.sh SHOAL_BIN DIR
# Exit 0 when everything held, 1 on a failure (with the logs' last lines),
# 77 when this machine cannot make namespaces.
set -u
BIN=$(realpath "$1")
DIR=$2
TAG=s18$$              # unique per run: namespaces and links are global names
HEAD=${TAG}h
IP=10.18.0
PORT=8470
RATE=${NETNS_RATE:-400mbit}
PIDS=""
mkdir -p "$DIR"

fail() {
    echo "netns: FAIL: $*"
    for f in "$DIR"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
    exit 1
}
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    sleep 0.5
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    for n in $HEAD ${TAG}w1 ${TAG}w2 ${TAG}w3; do ip netns del "$n" 2>/dev/null; done
}
trap cleanup EXIT INT TERM
# Runs "$@" in namespace $1 in the background, output to $DIR/$2.log.
bg() { ns=$1; log=$2; shift 2; ip netns exec "$ns" "$@" >"$DIR/$log.log" 2>&1 & PIDS="$PIDS $!"; }
in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }
jget() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    t=$1; what=$2; shift 2
    i=0
    while ! "$@" >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -gt $((t * 5)) ] && fail "waited ${t}s for $what"
        sleep 0.2
    done
}

# ---- The network: a bridge on the head, one limited veth link per worker.
ip netns add $HEAD 2>/dev/null || { echo "netns: cannot create network namespaces here (need root)"; exit 77; }
in_ns $HEAD ip link set lo up
in_ns $HEAD ip link add br0 type bridge
in_ns $HEAD ip addr add $IP.1/24 dev br0
in_ns $HEAD ip link set br0 up
for i in 1 2 3; do
    W=${TAG}w$i
    ip netns add $W
    in_ns $W ip link set lo up
    ip link add ${TAG}a$i type veth peer name ${TAG}b$i
    ip link set ${TAG}a$i netns $HEAD
    ip link set ${TAG}b$i netns $W
    in_ns $HEAD ip link set ${TAG}a$i master br0
    in_ns $HEAD ip link set ${TAG}a$i up
    in_ns $W ip link set ${TAG}b$i name eth0
    in_ns $W ip addr add $IP.1$i/24 dev eth0
    in_ns $W ip link set eth0 up
    # Both directions of the link: a token bucket of $RATE.
    in_ns $W tc qdisc add dev eth0 root tbf rate $RATE burst 64kb latency 100ms || fail "tc on worker $i"
    in_ns $HEAD tc qdisc add dev ${TAG}a$i root tbf rate $RATE burst 64kb latency 100ms || fail "tc on the head"
done
echo "netns: network up (head $IP.1, workers $IP.11-13, links of $RATE each way)"

# ---- The head node: tokens, server bound to the head's address only.
JOIN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
TENANT=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
ADMIN=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n')
umask 077
printf '{"admin":"%s","agent":"%s","tenants":{"alice":"%s"}}\n' "$ADMIN" "$JOIN" "$TENANT" > "$DIR/tokens.json"
umask 022
mkdir -p "$DIR/head"
bg $HEAD server "$BIN" server --bind $IP.1 --port $PORT --tokens "$DIR/tokens.json" --db "$DIR/head/shoal.db"
URL=http://$IP.1:$PORT
wait_for 30 "the server on $URL" in_ns ${TAG}w1 "$BIN" nodes --server $URL --token "$ADMIN"
in_ns $HEAD "$BIN" nodes --server http://127.0.0.1:$PORT --token "$ADMIN" >/dev/null 2>&1 &&
    fail "the server also answers on loopback; --bind was ignored"

# ---- Three workers: one agent each, registering with the join token.
for i in 1 2 3; do
    mkdir -p "$DIR/w$i"
    bg ${TAG}w$i agent$i "$BIN" agent --server $URL --token "$JOIN" --name w$i --addr $IP.1$i \
        --gpu-type H100 --gpus 1 --zone z1 --fabric eth --price 2.5 --work-dir "$DIR/w$i/work"
done
i=0; until in_ns ${TAG}w2 "$BIN" nodes --server $URL --token "$ADMIN" --json 2>/dev/null | grep -o '"state":"alive"' | wc -l | grep -qx 3; do
    i=$((i + 1)); [ $i -gt 300 ] && fail "the three agents did not register"; sleep 0.2; done
echo "netns: three agents registered over the links"

# ---- A 3-node gang across the hosts: rank 0 listens on MASTER_ADDR:MASTER_PORT.
cat > "$DIR/gang.json" <<'EOF'
{"name": "rendezvous", "nodes": 3, "gpus_per_node": 1,
 "command": ["python3", "-c", "import os, socket, time\nr = int(os.environ['RANK']); n = int(os.environ['WORLD_SIZE'])\na = os.environ['MASTER_ADDR']; p = int(os.environ['MASTER_PORT'])\nif r == 0:\n    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((a, p)); s.listen(n)\n    got = []\n    for _ in range(n - 1):\n        c, peer = s.accept(); got.append('%s@%s' % (c.recv(16).decode(), peer[0]))\n    print('rank 0 at %s:%d heard %s' % (a, p, ' '.join(sorted(got))), flush=True)\nelse:\n    for _ in range(150):\n        try:\n            c = socket.create_connection((a, p)); break\n        except OSError:\n            time.sleep(0.2)\n    c.sendall(str(r).encode()); print('rank %d sent from %s' % (r, c.getsockname()[0]), flush=True)\n"]}
EOF
OUT=$(in_ns ${TAG}w3 "$BIN" submit "$DIR/gang.json" --server=$URL --token=$TENANT --json) || fail "submit from worker 3: $OUT"
ID=$(echo "$OUT" | jget id)
i=0; while :; do
    ST=$(in_ns ${TAG}w3 "$BIN" job "$ID" --server $URL --token $TENANT --json | jget state)
    case "$ST" in succeeded) break ;; failed|cancelled) fail "the gang $ST: $(in_ns ${TAG}w3 "$BIN" job "$ID" --server $URL --token $TENANT)" ;; esac
    i=$((i + 1)); [ $i -gt 600 ] && fail "the gang did not finish in 120s (state $ST)"; sleep 0.2
done
LOG0=$(in_ns ${TAG}w3 "$BIN" logs "$ID" --rank 0 --server $URL --token $TENANT)
echo "netns: gang: $(echo "$LOG0" | grep 'heard')"
# Rank 0's node is the one whose address is MASTER_ADDR; the others spoke from theirs.
M=$(echo "$LOG0" | sed -n 's/rank 0 at \([0-9.]*\):.*/\1/p')
case "$M" in $IP.11|$IP.12|$IP.13) ;; *) fail "MASTER_ADDR \"$M\" is not a worker's address: $LOG0" ;; esac
for r in 1 2; do
    echo "$LOG0" | grep -q "$r@$IP.1[123]" || fail "rank 0 did not hear rank $r from a worker's address: $LOG0"
    echo "$LOG0" | grep -q "$r@$M" && fail "rank $r spoke from rank 0's own host: $LOG0"
done

# ---- A push: two versions from the head through the tree to three replicas.
"$BIN" ckpt synth --params 4M --seed 1 -o "$DIR/v1.safetensors" >/dev/null || fail "ckpt synth"
"$BIN" ckpt step "$DIR/v1.safetensors" --lr 1e-4 -o "$DIR/v2.safetensors" >/dev/null || fail "ckpt step"
"$BIN" store publish "$DIR/head/store" "$DIR/v1.safetensors" >/dev/null || fail "store publish v1"
bg $HEAD root env UCX_TLS=tcp UCX_NET_DEVICES=br0 "$BIN" push serve --store "$DIR/head/store" \
    --listen $IP.1:0 --addr-file "$DIR/root.addr" --fanout 1 --chunk 512KiB
wait_for 30 "the push root's address" test -s "$DIR/root.addr"
ROOT=$(cat "$DIR/root.addr")
T0=$(date +%s.%N)
for i in 1 2 3; do
    bg ${TAG}w$i replica$i env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$BIN" replica --dir "$DIR/w$i/replica" \
        --parent "$ROOT" --listen $IP.1$i --fanout 1 --until 2 --seconds 120 --json
done
sleep 1
"$BIN" store publish "$DIR/head/store" "$DIR/v2.safetensors" >/dev/null || fail "store publish v2"
for i in 1 2 3; do
    wait_for 120 "replica $i on version 2" grep -q '^{"version":2,' "$DIR/replica$i.log"
done
T1=$(date +%s.%N)
for i in 1 2 3; do
    cmp -s "$DIR/w$i/replica/models/0000000002.safetensors" "$DIR/v2.safetensors" ||
        fail "replica $i's version 2 differs from the published checkpoint"
done
R=$(cat "$DIR"/replica?.log | python3 -c 'import json, sys
r = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print(sum(x["redirects"] for x in r), sum(x["reattaches"] for x in r))')
set -- $R
# A replica redirected to a sibling that listens on its own loopback cannot
# attach and falls back (a reattach) again and again: that happened, dozens
# of times, before replicas took --listen.  A few may still race a sibling
# that is not yet accepting children.
[ "$2" -le 3 ] || fail "replicas had to reattach $2 times: redirects name addresses children cannot reach"
echo "netns: push: versions 1 and 2 on three replicas over $RATE links in $(echo "$T1 - $T0" | bc) s ($1 redirects, $2 reattaches)"
echo "netns: ok"
