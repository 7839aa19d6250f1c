"""Every shipped run can be rerun from a clone: each command its meta file records (and the Results
tab prints) reads only files in the repository, parsed by the CLI's own parser."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from rag_demo.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
METAS = sorted((ROOT / "assets" / "results").glob("*.meta.json")) + [ROOT / "assets" / "confidence.json",
                                                                      ROOT / "assets" / "trained" / "meta.json"]


def commands(meta) -> list[str]:
    """Every "command" in a meta file, at any depth (a run's, its earlier runs', a stage's)."""
    found = []
    if isinstance(meta, dict):
        if isinstance(meta.get("command"), str):
            found.append(meta["command"])
        for v in meta.values():
            found += commands(v)
    elif isinstance(meta, list):
        for v in meta:
            found += commands(v)
    return found


def inputs(command: str) -> list[str]:
    """The files a `python -m rag_demo ...` command reads, as the CLI parses it."""
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "rag_demo"], command
    args = build_parser().parse_args(argv[3:])
    read = []
    for name in ("qa", "labels"):
        v = getattr(args, name, None)
        if isinstance(v, str) and v:
            read += v.split(",") if name == "qa" else [v]
    for name in ("fit_confidence", "corpus_file"):
        read += list(getattr(args, name, None) or [])
    return read


def outside(command: str) -> list[str]:
    return [p for p in inputs(command) if Path(p).is_absolute() or ".." in Path(p).parts or not (ROOT / p).is_file()]


@pytest.mark.parametrize("meta", METAS, ids=lambda p: p.name)
def test_every_shipped_command_reads_only_files_in_the_repository(meta):
    found = commands(json.loads(meta.read_text(encoding="utf-8")))
    assert found, f"{meta} records no command"
    bad = {c: outside(c) for c in found if outside(c)}
    assert not bad, bad


def test_a_command_that_reads_outside_the_repository_is_caught():
    assert outside("python -m rag_demo eval --sweep --qa /tmp/tail/qa_open_vital.jsonl --split report") == [
        "/tmp/tail/qa_open_vital.jsonl"]
    assert outside("python -m rag_demo eval --fit-confidence assets/results/qa_dev.jsonl runs/evals/gone.jsonl") == [
        "runs/evals/gone.jsonl"]
    assert outside("python -m rag_demo eval --sweep --qa assets/qa_dev.jsonl") == []


def test_a_trained_stage_reads_what_its_recorded_preparation_writes():
    """`train --prepared FILE` reads a file no clone has until the stage's `prepared_by` command
    (recorded beside it, printed before it on the Results tab) writes it into the same --work folder."""
    stages = json.loads((ROOT / "assets" / "trained" / "meta.json").read_text(encoding="utf-8")).get("stages", {})
    assert stages
    for stage in stages.values():
        args = build_parser().parse_args(shlex.split(stage["command"])[3:])
        if getattr(args, "prepared", None):
            prep = build_parser().parse_args(shlex.split(stage["prepared_by"]["command"])[3:])
            assert Path(args.prepared).parent == Path(prep.work), (stage["command"], stage["prepared_by"])
