"""The layout's rules a newcomer relies on: no module imports another module's private name, and
every file a docstring or help text names exists."""
from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "rag_demo"


def test_no_module_imports_another_modules_private_name():
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rag_demo"):
                found += [f"{path.relative_to(PACKAGE.parent)}: {node.module}.{a.name}"
                          for a in node.names if a.name.startswith("_")]
    assert not found, found


def test_every_package_path_the_code_names_exists():
    stale = []
    for path in PACKAGE.rglob("*.py"):
        for named in re.findall(r"\brag_demo/[\w/]+\.py\b", path.read_text(encoding="utf-8")):
            if not (PACKAGE.parent / named).is_file():
                stale.append(f"{path.relative_to(PACKAGE.parent)} names {named}")
    assert not stale, stale


def test_the_pipeline_branches_on_no_reader_aid():
    """Which aids are on is the reader's business (reader/reading.py, reader/aided.py): the answer
    flow asks it what the generator reads and which hooks run, and names no aid itself."""
    text = (PACKAGE / "pipeline.py").read_text(encoding="utf-8")
    assert re.findall(r"\baids\.\w+", text) == []


def test_the_design_documents_every_module_and_none_is_over_600_lines():
    """docs/DESIGN.md's layout names every module of the package (a newcomer finds each room
    there), and each room stays small enough to read."""
    design = (PACKAGE.parent / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    missing, long = [], []
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if path.name not in design:
            missing.append(str(path.relative_to(PACKAGE)))
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > 600:
            long.append(f"{path.relative_to(PACKAGE)}: {n} lines")
    assert not missing, f"not in docs/DESIGN.md: {missing}"
    assert not long, long


def test_ruff_finds_nothing():
    """ruff (ruff.toml: pyflakes and pycodestyle) is clean over the whole repository."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=PACKAGE.parent, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:]
