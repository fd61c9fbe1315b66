#!/usr/bin/env bash
# The README's demo command: installs the PostgreSQL server binaries if
# needed, then builds and runs the service on an embedded Postgres
# (./.data/pg), applying migrations, seeding demo data on first start, and
# serving on 127.0.0.1:8080. Extra arguments go to the server
# (see `--help`), for example `./scripts/demo.sh --read-path naive`.
set -euo pipefail
cd "$(dirname "$0")/.."
# PGBATCH_PG_VERSION=18 uses PostgreSQL 18 (see ensure-postgres.sh).
if [[ "${PGBATCH_PG_VERSION:-15}" == 15 ]]; then
    ./scripts/ensure-postgres.sh
else
    PG_BIN_DIR="$(./scripts/ensure-postgres.sh)"
    export PG_BIN_DIR
fi
exec cargo run --release -p server -- "$@"
