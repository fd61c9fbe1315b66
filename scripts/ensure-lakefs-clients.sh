#!/usr/bin/env bash
# Makes sure lakeFS's own Python clients, pinned, are installed in a private
# virtual environment (target/lakefs-venv), for the tests that drive them
# against the server's /lakefs API; prints the environment's python.
#
#   PYTHON="$(./scripts/ensure-lakefs-clients.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/python-venv.sh
ensure_python_venv "${LAKEFS_VENV:-target/lakefs-venv}" lakefs-sdk==1.88.0 lakefs==0.16.0
