#!/usr/bin/env bash
# Reproduces every benchmark figure in BENCHMARKS.md: the criterion benches
# and same-run reports (batcher overhead, cache, writes), then the seed
# benchmark in process (loadgen), behind added round-trip time (latency)
# and over HTTP (httpload). All three share one embedded cluster in
# .data/bench-pg, whose 10M rows are loaded once and kept. Then
# cross-instance invalidation (coherence, on a throwaway database) and
# several instances with a read replica (replicas, on a throwaway primary
# and replica). Takes
# tens of minutes; run it on an otherwise idle machine.
#
#   ./scripts/bench.sh            # everything
#   ./scripts/bench.sh loadgen    # only the named parts: criterion, loadgen,
#                                 # latency, http, coherence, replicas
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-postgres.sh
./scripts/ensure-bench-tools.sh

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(criterion loadgen latency http coherence replicas)
cargo build --release -p benches --bins
for part in "${parts[@]}"; do
    echo "=== $part" >&2
    case "$part" in
    criterion) cargo bench -p benches ;;
    loadgen) ./target/release/loadgen ;;
    latency) ./target/release/latency ;;
    http) ./target/release/httpload ;;
    coherence) ./target/release/coherence ;;
    replicas) ./target/release/replicas ;;
    *)
        echo "unknown part '$part' (criterion, loadgen, latency, http, coherence, replicas)" >&2
        exit 2
        ;;
    esac
done
