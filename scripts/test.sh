#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: system packages, Python packages, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v ffmpeg >/dev/null || need+=(ffmpeg)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi

python -m pip install -q -r requirements-dev.txt
export HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
python -m pytest "$@"
