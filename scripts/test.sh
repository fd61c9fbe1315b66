#!/usr/bin/env bash
# The project's test command, as given in the README quick start; CI calls
# it too. It installs what the tests need (the PostgreSQL server binaries:
# every database test starts its own private cluster, or uses DATABASE_URL
# when set), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure-postgres.sh
cargo test --workspace --all-features "$@"
