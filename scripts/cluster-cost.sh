#!/usr/bin/env bash
# Measures what a three-node cluster asks of an S3-compatible bucket (moto,
# from `scripts/setup.sh --test`), as README "What the bucket costs" reports:
# three `wasmkeep serve --examples` processes on one moto bucket, then
#   idle: nothing but the nodes' own work for WINDOW seconds, or
#   load: 50 counters each sent about one `replicated` increment a second,
#         every request through a node chosen at random (two in three are
#         forwarded), for WARM seconds unmeasured and then WINDOW measured.
# Prints each kind of bucket request (wasmkeep_bucket_*_total summed over
# the nodes) in the window, per minute per node, and with load per request.
#
#   scripts/cluster-cost.sh idle|load [CONFIG.toml]
#
# CONFIG: a node configuration file for all three (say, a longer
# `cluster_owner_cache_ttl_ms`). Needs a built `target/release/wasmkeep`
# (BIN= to use another) and ports 9181-9183 and 5299 free.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?idle or load}
CONFIG=${2:-}
BIN=${BIN:-target/release/wasmkeep}
WINDOW=${WINDOW:-120}
WARM=${WARM:-30}
export PATH="$PWD/.venv/bin:$PATH"
export LC_ALL=C
for port in 5299 9181 9182 9183; do
  if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
    echo "cluster-cost: port $port is taken; stop what listens there first" >&2
    exit 1
  fi
done
DIR=$(mktemp -d)
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR"; }
trap cleanup EXIT

moto_server -H 127.0.0.1 -p 5299 > "$DIR/moto.log" 2>&1 &
PIDS+=($!)
export AWS_ENDPOINT_URL=http://127.0.0.1:5299 AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=test \
  AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
# Waits for `what` (a command) for at most 60 s, while every process
# started so far still runs.
wait_for() {
  local what=$1 deadline=$((SECONDS + 60))
  until eval "$what"; do
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "cluster-cost: a process exited:" >&2; tail -n 5 "$DIR"/*.log >&2; exit 1; }
    done
    [ $SECONDS -lt $deadline ] || { echo "cluster-cost: gave up waiting for: $what" >&2; exit 1; }
    sleep 0.5
  done
}
wait_for "curl -sf -o /dev/null -X PUT http://127.0.0.1:5299/costs"
PORTS=(9181 9182 9183)
for port in "${PORTS[@]}"; do
  flags=(serve --data "$DIR/wk-$port" --listen "127.0.0.1:$port" --bucket s3://costs/wk
    --advertise "http://127.0.0.1:$port" --examples)
  [ -n "$CONFIG" ] && flags+=(--config "$CONFIG")
  "$BIN" "${flags[@]}" > "$DIR/node-$port.log" 2>&1 &
  PIDS+=($!)
done
for port in "${PORTS[@]}"; do
  wait_for "curl -s http://127.0.0.1:$port/admin/v1/node | grep -q '\"serving\":true'"
done

snap() {
  for port in "${PORTS[@]}"; do
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^wasmkeep_bucket_[a-z]+s_total '
  done | awk '{ n[$1] += $2 } END { for (k in n) print k, n[k] }' | sort
}

# The load: one thread per counter, each on its own clock of one request a
# second; prints the requests answered 200 and the others.
load() {
  python3 - "$1" <<'PY'
import random, sys, threading, time, urllib.request
secs = float(sys.argv[1]); ports = [9181, 9182, 9183]
ok, failed, lock = [0], [0], threading.Lock()
def counter(i):
    rnd = random.Random(i); end = time.time() + secs; at = time.time() + rnd.random()
    while time.time() < end:
        time.sleep(max(0.0, at - time.time())); at += 1.0
        url = (f"http://127.0.0.1:{rnd.choice(ports)}/v1/demo/examples/counter/c{i}"
               "/increment?wasmkeep-durability=replicated")
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=30).read()
            with lock: ok[0] += 1
        except Exception:
            with lock: failed[0] += 1
threads = [threading.Thread(target=counter, args=(i,)) for i in range(50)]
for t in threads: t.start()
for t in threads: t.join()
print(ok[0], failed[0])
PY
}

if [ "$MODE" = load ]; then
  load "$WARM" > /dev/null
  load "$WINDOW" > "$DIR/load.txt" &
  LOAD=$!
  PIDS+=("$LOAD")
  snap > "$DIR/before.txt"
  wait $LOAD
else
  sleep "$WARM"
  snap > "$DIR/before.txt"
  sleep "$WINDOW"
fi
snap > "$DIR/after.txt"
read -r OK FAILED < <(cat "$DIR/load.txt" 2>/dev/null || echo "0 0")
echo "mode=$MODE window_s=$WINDOW nodes=3 requests_ok=$OK requests_failed=$FAILED"
join "$DIR/before.txt" "$DIR/after.txt" | while read -r name before after; do
  n=$((after - before))
  kind=${name#wasmkeep_bucket_}; kind=${kind%_total}
  per_min=$(awk -v n="$n" -v w="$WINDOW" 'BEGIN { printf "%.1f", n / 3 / (w / 60) }')
  line="$kind=$n per_node_per_min=$per_min"
  if [ "$OK" -gt 0 ]; then
    line="$line per_request=$(awk -v n="$n" -v r="$OK" 'BEGIN { printf "%.3f", n / r }')"
  fi
  echo "$line"
done
