#!/usr/bin/env bash
# Installs what the HTTP and latency benchmarks drive, when missing:
# - wrk, the HTTP load generator (Debian's package).
# The latency benchmark's proxy is in the benches crate (benches::delay_proxy):
# nothing to install, no Go.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v wrk >/dev/null 2>&1; then
    echo "wrk not found; installing Debian's wrk package" >&2
    if [[ "$(id -u)" == 0 ]]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y --no-install-recommends wrk
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
        sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk
    else
        echo "cannot install wrk: run as root, or install it (apt-get install wrk)" >&2
        exit 1
    fi
fi
