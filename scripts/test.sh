#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: system packages, Python packages, then pytest (random order).
#
#   bash scripts/test.sh [PYTEST ARGS…]    e.g. -q, -x, -m "not slow", -p randomly --randomly-seed=N -n 0 (replay an order)
#   bash scripts/test.sh --install-only    only the installs (.ci/run does this first, to tell install from test errors)
#
# System packages (Debian): packages.txt (what the app needs: ffmpeg) plus what the tests drive: chromium and
# chromium-driver (Playwright uses Debian's chromium; it never downloads a browser). Python 3.11 with pip: the
# interpreter in use, or a .venv made here when it is Debian's own, externally managed python3.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

install_system_packages() {
  local wanted=() missing=() name
  mapfile -t wanted < <(grep -vE '^\s*(#|$)' packages.txt)
  wanted+=(chromium chromium-driver)
  command -v python3 >/dev/null || command -v python >/dev/null || wanted+=(python3 python3-venv python3-pip)
  for name in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed" && continue
    # installed some other way (a container image, a pyenv machine) counts too
    case $name in
      ffmpeg) command -v ffmpeg >/dev/null && continue ;;
      chromium) command -v chromium >/dev/null && continue ;;
      chromium-driver) command -v chromedriver >/dev/null && continue ;;
    esac
    missing+=("$name")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "test.sh: installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

choose_python() {
  PY=$(command -v python || command -v python3)
  local stdlib
  stdlib=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
  if [ -e "$stdlib/EXTERNALLY-MANAGED" ] && [ -z "${VIRTUAL_ENV:-}" ]; then
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    PY=.venv/bin/python
  fi
  "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), "h3app is pinned for Python 3.11"' ||
    echo "test.sh: warning: $("$PY" --version) is not Python 3.11, the version the pins were verified on" >&2
}

choose_python
if [ -z "${H3APP_SKIP_INSTALL:-}" ]; then
  install_system_packages
  "$PY" -m pip install -q -r requirements-dev.txt
fi
[ "${1:-}" = "--install-only" ] && exit 0

export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
# Two worker processes (pytest-xdist), each with one torch thread (OMP_NUM_THREADS, inherited by the apps, CLIs and
# ranks the tests start): on 2 cores, OpenMP threads of two processes that wait on each other spin away the time
# (h3app/model/tiny_training/recipe.py found the same), while two single-threaded workers share the cores well.
# --dist loadfile keeps a file's tests on one worker, so a module fixture (a full-size rehearsal, a launched app) is
# built once; each worker builds its session fixtures (the tiny model, the app, chromium). An -n given after these
# wins: -n 0 runs everything in this one process.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Bytecode caches on (a container may set PYTHONDONTWRITEBYTECODE): each worker and each of the ~30 CLI, app and
# rank processes the tests start would otherwise compile h3app and pytest would re-rewrite every test file again
# (measured on 2 cores: collection 37 s → 27 s per worker; importing the app stack 14.7 s → 10.8 s per process).
unset PYTHONDONTWRITEBYTECODE
exec "$PY" -m pytest -n 2 --dist loadfile --no-loadscope-reorder "$@"
