#!/usr/bin/env bash
# Makes sure lakeFS's own Python clients, pinned, are installed in a private
# virtual environment (target/lakefs-venv), for the tests that drive them
# against the server's /lakefs API; prints the environment's python.
#
#   PYTHON="$(./scripts/ensure-lakefs-clients.sh)"
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LAKEFS_VENV:-target/lakefs-venv}"
pins=(lakefs-sdk==1.88.0 lakefs==0.16.0)
stamp="$venv/.pins"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "${pins[*]}" ]]; then
    echo "$PWD/$venv/bin/python"
    exit 0
fi
echo "installing ${pins[*]} into $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
echo "${pins[*]}" >"$stamp"
echo "$PWD/$venv/bin/python"
