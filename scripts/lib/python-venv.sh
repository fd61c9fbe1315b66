# Sourced by the ensure-*.sh scripts of Python tools the tests drive.
#
#   ensure_python_venv <dir> <pinned requirement>...
#
# Makes sure <dir> is a virtual environment with exactly these pins
# installed (recreated when the pins change), installing Debian's python3
# and python3-venv first when they are missing; prints its python.

ensure_python_venv() {
    local venv="$1"
    shift
    local pins=("$@")
    local stamp="$venv/.pins"
    if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "${pins[*]}" ]]; then
        echo "$PWD/$venv/bin/python"
        return 0
    fi
    # A fresh Debian has no python3, or one without venv's pip (ensurepip,
    # in python3-venv).
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        local install=(apt-get install -y --no-install-recommends python3 python3-venv)
        echo "python3 with venv not found; installing: ${install[*]}" >&2
        if [[ "$(id -u)" == 0 ]]; then
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2
        elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
            sudo env DEBIAN_FRONTEND=noninteractive "${install[@]}" >&2
        else
            echo "Run this as root, then try again:  ${install[*]}" >&2
            return 1
        fi
    fi
    echo "installing ${pins[*]} into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
    echo "${pins[*]}" >"$stamp"
    echo "$PWD/$venv/bin/python"
}
