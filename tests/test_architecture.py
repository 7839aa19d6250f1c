"""The package's layering (.importlinter) holds, and its contracts really catch a violation.

The layers, top to bottom: the CLI and the web page; measurement; serving; the pipeline; the
reader aids; the paper's core (rag/) beside the knowledge (corpora, indexes); the models;
settings. docs/DESIGN.md §2 draws them.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    verdicts = {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in out.stdout.splitlines()
                if line.endswith((" KEPT", " BROKEN"))}
    assert len(verdicts) == 5 and set(verdicts.values()) == {"KEPT"}, verdicts


def _copy(tmp_path: Path) -> Path:
    work = tmp_path / "repo"
    shutil.copytree(ROOT / "rag_demo", work / "rag_demo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", work / ".importlinter")
    return work


def test_the_paper_core_importing_the_page_or_an_aid_breaks_the_contracts(tmp_path):
    for forbidden in ("rag_demo.web.render", "rag_demo.reader.echo", "rag_demo.measure.evaluate"):
        work = _copy(tmp_path / forbidden)
        engine = work / "rag_demo" / "rag" / "engine.py"
        engine.write_text(engine.read_text() + f"\nimport {forbidden}  # noqa\n")
        out = lint(work)
        assert out.returncode != 0 and "BROKEN" in out.stdout and forbidden in out.stdout, forbidden


def test_an_import_cycle_breaks_the_contracts(tmp_path):
    work = _copy(tmp_path)
    stopping = work / "rag_demo" / "models" / "stopping.py"  # models importing the paper's decoding: a cycle
    stopping.write_text(stopping.read_text() + "\nimport rag_demo.rag.decoding  # noqa\n")
    out = lint(work)
    assert out.returncode != 0 and "No import cycle anywhere in the package BROKEN" in out.stdout
