#!/usr/bin/env bash
# Reproduces every benchmark figure in BENCHMARKS.md: the criterion benches
# and same-run reports (batcher overhead, cache, writes), then the seed
# benchmark's load generator (10M rows, 300 initiators; the rows are loaded
# once into .data/bench-pg and kept). Takes tens of minutes; run it on an
# otherwise idle machine. Extra arguments go to the load generator.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-postgres.sh
cargo bench -p benches
cargo run --release -p benches --bin loadgen -- "$@"
