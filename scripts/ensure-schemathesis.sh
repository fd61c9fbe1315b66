#!/usr/bin/env bash
# Makes sure schemathesis (the OpenAPI-driven fuzzer), pinned, is installed
# in a private virtual environment (target/schemathesis-venv), for the test
# that points it at the server's /api/openapi.json; prints the
# environment's python (run it as `python -m schemathesis.cli`).
#
#   PYTHON="$(./scripts/ensure-schemathesis.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/python-venv.sh
ensure_python_venv "${SCHEMATHESIS_VENV:-target/schemathesis-venv}" schemathesis==4.32.5
