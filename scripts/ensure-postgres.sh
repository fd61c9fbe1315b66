#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries (initdb, postgres) are installed,
# installing Debian's `postgresql` package when they are not. The demo and
# the tests start their own private cluster from these binaries; nothing
# needs to be running.
set -euo pipefail

have_binaries() {
    if [[ -n "${PG_BIN_DIR:-}" ]]; then
        [[ -x "$PG_BIN_DIR/initdb" && -x "$PG_BIN_DIR/postgres" ]]
        return
    fi
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [[ -x "$dir/initdb" && -x "$dir/postgres" ]] && return 0
    done
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1
}

# As root, Postgres must run as another user: Debian's package creates
# `postgres`.
have_run_as_user() {
    [[ "$(id -u)" != 0 ]] || id postgres >/dev/null 2>&1
}

if have_binaries && have_run_as_user; then
    exit 0
fi
if [[ -n "${DATABASE_URL:-}" ]]; then
    exit 0 # an existing server is used; no local binaries needed
fi

install=(apt-get install -y --no-install-recommends postgresql)
echo "PostgreSQL server binaries not found; installing: ${install[*]}" >&2
if [[ "$(id -u)" == 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    "${install[@]}"
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo env DEBIAN_FRONTEND=noninteractive "${install[@]}"
else
    echo "Run this as root, then try again:  ${install[*]}" >&2
    echo "(or set DATABASE_URL to use a running Postgres server)" >&2
    exit 1
fi
have_binaries || { echo "postgresql installed, but initdb/postgres still not found" >&2; exit 1; }
