#!/usr/bin/env bash
# Set up a fresh machine: a virtualenv in .venv with everything from the package registries.
#   scripts/setup.sh          runtime only (run the app / CLI)
#   scripts/setup.sh --dev    plus test tools and Debian's chromium for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
scripts/space_build.sh                            # the runtime, exactly as a Space installs it
if [ "${1:-}" = "--dev" ]; then
  python -m pip install -q -r requirements-dev.txt
  if [ ! -x /usr/bin/chromium ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q && $SUDO apt-get install -y -q chromium
  fi
fi
echo "setup done: $(python -c 'import torch, transformers, gradio; print("torch", torch.__version__, "transformers", transformers.__version__, "gradio", gradio.__version__)')"
