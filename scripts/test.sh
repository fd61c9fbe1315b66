#!/usr/bin/env bash
# The project's test command, as given in the README quick start; CI calls
# it too. It installs what the tests need (the PostgreSQL server binaries:
# every database test starts its own private cluster, or uses DATABASE_URL
# when set; PgBouncer, which the pooler tests start in front of one;
# lakeFS's Python clients and schemathesis, each in a private virtual
# environment), then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# PGBATCH_PG_VERSION=18 uses PostgreSQL 18 (see ensure-postgres.sh).
if [[ "${PGBATCH_PG_VERSION:-15}" == 15 ]]; then
    ./scripts/ensure-postgres.sh
else
    PG_BIN_DIR="$(./scripts/ensure-postgres.sh)"
    export PG_BIN_DIR
fi
./scripts/ensure-pgbouncer.sh
./scripts/ensure-lakefs-clients.sh >/dev/null
./scripts/ensure-schemathesis.sh >/dev/null
cargo test --workspace --all-features "$@"
