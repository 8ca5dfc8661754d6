#!/usr/bin/env bash
# Makes .venv with everything distlab needs, once. Safe to run again: it does nothing when the
# requirements have not changed since the last successful install.
#
#   --with-browser   also installs Debian's chromium when it is missing (the test suite renders
#                    the HTML report in it; needs root and apt-get, else the test is skipped)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

if [ "${1:-}" = "--with-browser" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing Debian's chromium for the report's browser test (about a minute)..." >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends chromium >/dev/null; } \
      || echo "could not install chromium: the browser test will be skipped" >&2
  else
    echo "chromium is missing and this is not a root Debian shell: the browser test will be skipped" >&2
  fi
fi
python="${PYTHON:-python3}"
stamp=".venv/.distlab-installed"
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x .venv/bin/distlab ]; then
  exit 0
fi
echo "setting up .venv (first run takes about 40 s)..." >&2
[ -x .venv/bin/python ] || "$python" -m venv .venv
# --no-compile: pip would byte-compile every file of torch (20 s of the set-up's 57); the imports
# below compile what distlab's processes import, and Python caches the rest on its first use.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.txt 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import distlab.cli, mpi4py, numpy, torch, typer, rich, \
torch.distributed, torch.fx.experimental.symbolic_shapes, matplotlib.pyplot, pytest, xdist" \
  || { echo "setup failed: distlab does not import" >&2; exit 1; }
echo "$want" > "$stamp"
