#!/usr/bin/env bash
# Installs what the HTTP and latency benchmarks drive, when missing:
# - wrk, the HTTP load generator (Debian's package);
# - toxiproxy (server and CLI), the TCP proxy that adds round-trip time,
#   built with `go install` at a pinned version into target/tools/bin
#   (this kernel has no netem, so latency has to come from a proxy).
set -euo pipefail
cd "$(dirname "$0")/.."

TOXIPROXY_VERSION=v2.5.0
tools=target/tools/bin

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

if [[ ! -x "$tools/toxiproxy-server" || ! -x "$tools/toxiproxy-cli" ]]; then
    if ! command -v go >/dev/null 2>&1; then
        echo "toxiproxy is built with Go, which is not installed (apt-get install golang-go)" >&2
        exit 1
    fi
    echo "building toxiproxy $TOXIPROXY_VERSION into $tools" >&2
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    for cmd in server cli; do
        GOBIN="$build" go install "github.com/Shopify/toxiproxy/v2/cmd/$cmd@$TOXIPROXY_VERSION"
    done
    mkdir -p "$tools"
    mv "$build/server" "$tools/toxiproxy-server"
    mv "$build/cli" "$tools/toxiproxy-cli"
fi
