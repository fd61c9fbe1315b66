#!/usr/bin/env bash
# Makes sure PgBouncer is installed (Debian's `pgbouncer` package), which
# the tests of the server behind a connection pooler start in front of
# their own cluster; nothing needs to be running. The package enables a
# system service on port 6432 where systemd runs: it is stopped and
# disabled, since the tests start their own on free ports.
set -euo pipefail
if [[ -x /usr/sbin/pgbouncer ]] || command -v pgbouncer >/dev/null 2>&1; then
    exit 0
fi
install=(apt-get install -y --no-install-recommends pgbouncer)
echo "pgbouncer not found; installing: ${install[*]}" >&2
if [[ "$(id -u)" == 0 ]]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    "${install[@]}" >&2
    systemctl=(systemctl)
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo env DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2
    systemctl=(sudo systemctl)
else
    echo "Run this as root, then try again:  ${install[*]}" >&2
    exit 1
fi
if [[ -d /run/systemd/system ]]; then
    "${systemctl[@]}" disable --now pgbouncer >/dev/null 2>&1 || true
fi
