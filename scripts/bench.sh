#!/usr/bin/env bash
# Reproduces every benchmark figure in BENCHMARKS.md: the criterion benches
# and same-run reports (batcher overhead, cache, writes), then the seed
# benchmark in process (loadgen), behind added round-trip time (latency)
# and over HTTP (httpload). All three share one embedded cluster in
# .data/bench-pg18 (.data/bench-pg for 15), whose 10M rows are loaded once
# and kept; every report names the server version it ran on. Then
# cross-instance invalidation (coherence, on a throwaway database) and
# several instances with a read replica (replicas, on a throwaway primary
# and replica). Takes
# tens of minutes; run it on an otherwise idle machine.
#
#   ./scripts/bench.sh            # everything
#   ./scripts/bench.sh loadgen    # only the named parts: criterion, loadgen,
#                                 # autotune, latency, http, randomread, pooler,
#                                 # dataloader, openloop, bulk, scopes, pages,
#                                 # coherence, replicas
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL 18 unless PGBATCH_PG_VERSION says otherwise (15 is Debian's).
# Each version keeps its own cluster: a data directory only starts with the
# major version that made it.
PGBATCH_PG_VERSION="${PGBATCH_PG_VERSION:-18}"
export PGBATCH_PG_VERSION
if [[ "$PGBATCH_PG_VERSION" == 15 ]]; then
    ./scripts/ensure-postgres.sh
    export PGBATCH_BENCH_DATA_DIR="${PGBATCH_BENCH_DATA_DIR:-.data/bench-pg}"
else
    PG_BIN_DIR="$(./scripts/ensure-postgres.sh)"
    export PG_BIN_DIR
    export PGBATCH_BENCH_DATA_DIR="${PGBATCH_BENCH_DATA_DIR:-.data/bench-pg$PGBATCH_PG_VERSION}"
fi
./scripts/ensure-bench-tools.sh
./scripts/ensure-pgbouncer.sh

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(criterion loadgen autotune latency http randomread pooler dataloader openloop bulk scopes pages coherence replicas)
cargo build --release -p benches --bins
for part in "${parts[@]}"; do
    echo "=== $part" >&2
    case "$part" in
    criterion) cargo bench -p benches ;;
    loadgen) ./target/release/loadgen ;;
    autotune) ./target/release/autotune ;;
    pooler) ./target/release/pooler ;;
    dataloader) ./target/release/dataloader ;;
    openloop) ./target/release/openloop ;;
    bulk) ./target/release/bulk ;;
    scopes) ./target/release/scopes ;;
    pages) ./target/release/pages ;;
    randomread) ./target/release/randomread ;;
    latency) ./target/release/latency ;;
    http) ./target/release/httpload ;;
    coherence) ./target/release/coherence ;;
    replicas) ./target/release/replicas ;;
    *)
        echo "unknown part '$part' (criterion, loadgen, autotune, latency, http, randomread, pooler, dataloader, openloop, bulk, scopes, pages, coherence, replicas)" >&2
        exit 2
        ;;
    esac
done
