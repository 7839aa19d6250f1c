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


def contracts() -> tuple[list[str], list[str]]:
    """(.importlinter's contract sections, its layers top to bottom, each line as written)."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / ".importlinter")
    names = [s for s in cfg.sections() if s.startswith("importlinter:contract:")]
    layers = [x.strip() for x in cfg["importlinter:contract:layers"]["layers"].splitlines() if x.strip()]
    return names, layers


def test_the_import_contracts_hold():
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    text = " ".join(out.stdout.split())  # import-linter wraps long contract names
    names, _ = contracts()
    assert text.count(" KEPT") == len(names) and " BROKEN" not in text, out.stdout


def test_design_draws_the_layers_and_counts_the_contracts_of_importlinter():
    """docs/DESIGN.md §2's layer diagram lists .importlinter's layers in its order, and the text
    gives the number of contracts: a layer or contract added to one is added to the other."""
    design = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    names, layers = contracts()
    drawn = design.split("```", 2)[1] if "## 2" not in design else design.split("## 2", 1)[1].split("```")[1]
    lines = [x.split("  ")[0].strip() for x in drawn.strip().splitlines()]
    assert lines == layers, (lines, layers)
    words = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"The {words[len(names)]} contracts" in design, len(names)


def test_plain_data_importing_torch_breaks_the_contracts(tmp_path):
    work = _copy(tmp_path)
    runs = work / "rag_demo" / "runs.py"
    runs.write_text(runs.read_text() + "\nimport torch  # noqa\n")
    out = lint(work)
    assert out.returncode != 0 and "BROKEN" in out.stdout and "Plain data" in out.stdout


def test_a_handler_part_importing_another_breaks_the_contracts(tmp_path):
    work = _copy(tmp_path)
    part = work / "rag_demo" / "web" / "ask_events.py"
    part.write_text(part.read_text() + "\nimport rag_demo.web.pricing_events  # noqa\n")
    out = lint(work)
    assert out.returncode != 0 and "BROKEN" in out.stdout and "handler parts" in out.stdout


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


def test_a_page_build_reads_top_down_entering_each_module_at_most_twice():
    """scripts/page_stays.py: the modules web.page.build_app calls into, in call order. The page is
    built as app.py builds it; a build that went back and forth between its helpers (a module
    entered three times or more) would fail here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("page_stays", ROOT / "scripts" / "page_stays.py")
    stays_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stays_script)
    stays = stays_script.stays(stays_script.module_calls(depth=1))
    assert {"web.handlers", "web.controls", "web.results", "web.api"} <= set(stays), stays  # it saw the build
    over = {m: stays.count(m) for m in set(stays) if stays.count(m) > 2}
    assert not over, (over, stays)
    assert stays_script.stays(["a", "a", "b", "a"]) == ["a", "b", "a"]
