#!/usr/bin/env bash
# Goodput under overload (the hardening issue's defect 4): the demo server
# on its embedded Postgres, first at its capacity (8 connections of
# 1,000-path `POST .../objects/stat`), then 10x overloaded (200 such
# connections plus 20 of single `GET /api/v1/kv`). Prints completed
# lookups/s and the status counts of each run.
#
#   ./scripts/overload.sh                 # builds and runs this tree's server
#   SERVER_BIN=path/to/server ./scripts/overload.sh   # another build
#   DURATION=10 ./scripts/overload.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-postgres.sh
command -v wrk >/dev/null || ./scripts/ensure-bench-tools.sh
if [[ -z "${SERVER_BIN:-}" ]]; then
    cargo build --release -p server
    SERVER_BIN=target/release/pgbatch-server
fi
DURATION=${DURATION:-10}
PORT=${PORT:-18089}
TOKEN=overload-bench-token
DATA=${DATA_DIR:-target/overload-pg}
URL="http://127.0.0.1:$PORT"

"$SERVER_BIN" --data-dir "$DATA" --admin-token "$TOKEN" \
    --admin-token-file "$DATA.token" --listen "127.0.0.1:$PORT" \
    --seed-objects 1000000 --seed-kv-rows 1000000 >"$DATA.out" 2>&1 &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    curl -sf "$URL/readyz" >/dev/null 2>&1 && break
    kill -0 $server 2>/dev/null || { cat "$DATA.out"; exit 1; }
    sleep 0.5
done

lookups() { # <wrk output> <paths per request>
    local ok secs
    ok=$(grep -o '"200":[0-9]*' <<<"$1" | cut -d: -f2)
    secs=$(grep -o '"duration_us":[0-9]*' <<<"$1" | cut -d: -f2)
    echo "$(( ${ok:-0} * $2 * 1000000 / secs )) lookups/s in 200s; $(grep WRK_STATUS <<<"$1"); $(grep WRK_LATENCY <<<"$1")"
}

echo "== capacity: 8 connections of 1,000-path stats, ${DURATION}s"
out=$(wrk -t2 -c8 -d"${DURATION}s" --timeout 5s -s benches/wrk/stat_many.lua "$URL" -- "$TOKEN" 1000 1000000 1)
lookups "$out" 1000

echo "== overload: 200 connections of 1,000-path stats + 20 of single kv GETs, ${DURATION}s"
wrk -t1 -c20 -d"${DURATION}s" --timeout 5s -s benches/wrk/read.lua "$URL" -- "$TOKEN" kv 1000000 2 >"$DATA.kv" 2>&1 &
kv=$!
out=$(wrk -t2 -c200 -d"${DURATION}s" --timeout 5s -s benches/wrk/stat_many.lua "$URL" -- "$TOKEN" 1000 1000000 3)
wait $kv
lookups "$out" 1000
echo "single GETs alongside: $(grep WRK_RESULT "$DATA.kv")"
