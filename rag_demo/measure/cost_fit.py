"""Fitting what a card expects an answer to take: `python -m rag_demo bench --fit-cost`.

The cost model prices the worst case (every answer runs to max new tokens), which the budget
needs and a learner should not be shown as "what this takes": a short answer ends after a few
tokens, and a re-ask reads kept states. `CostModel.expected` prices the typical length instead,
times a factor per preset and mode; this fits both on the dev questions, asked as the page asks
them (the three modes in one call, the stack's warm-up and calibration first):

    typical tokens   the median answer length of the preset and mode, from a sweep run (RUN)
    factor f         median(seconds measured / seconds priced at that length), first asks
    re-ask factor    the same over the same question asked again at once (every prompt kept)

fitted on the file's calibrate questions and reported on its report questions (rag_demo/splits.py):
the median relative error per mode, (expected − measured) / measured, of the worst-case estimate
before and of the fitted expectation after. Writes assets/cost_fit.json (models/cost.CostFit).
"""
from __future__ import annotations

import datetime
import json
import statistics
from pathlib import Path
from typing import Callable

from rag_demo.config import MODES, RagSettings
from rag_demo.measure.evaluate import machine_info
from rag_demo.questions import read_qa
from rag_demo.splits import split_of


def typical_tokens(run: str | Path, k: int = 5) -> dict[str, float]:
    """The median answer length per "preset|mode" in a sweep run, at the default K, dense retrieval."""
    from rag_demo.measure.run_rows import load_rows

    rows = load_rows(run)
    rows = rows[rows["mode"].isin(MODES) & (rows["k"].isna() | (rows["k"] == k))
                & (rows["retriever"].isna() | (rows["retriever"] == "dense"))]
    return {f"{p}|{m}": float(part["n_tokens"].median()) for (p, m), part in rows.groupby(["preset", "mode"])}


def measure(pipe, questions: list, presets: tuple[str, ...], say: Callable[[str], None]) -> list[dict]:
    """Each question asked twice per preset (the second a re-ask of the first, every state kept), the
    three modes in one call: per answer its preset, mode, whether a re-ask, seconds taken, seconds
    the worst case priced (`RagPipeline.estimate`, before retrieval) and seconds expected."""
    out = []
    for i, (qid, q) in enumerate(questions, start=1):
        for preset in presets:
            s = RagSettings(preset=preset)
            worst = pipe.estimate(q, list(MODES), s).per_mode
            for again in (False, True):
                answers = pipe.answers(q, list(MODES), s)
                for m, a in answers.items():
                    out.append({"question_id": qid, "preset": preset, "mode": m, "reask": again,
                                "seconds": a.timings["total"], "worst": worst[m], "expected": a.expected_seconds,
                                "n_tokens": len(a.token_ids), "answer": a.text})
        say(f"{i}/{len(questions)} questions measured")
    return out


def _errors(rows: list[dict], key: str) -> dict[str, float]:
    """Median relative error (key − measured) / measured per "preset|mode"."""
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(f"{r['preset']}|{r['mode']}", []).append((r[key] - r["seconds"]) / r["seconds"])
    return {k: statistics.median(v) for k, v in by.items()}


def fit_cost(pipe, qa: str, run: str, presets: tuple[str, ...], out: str, command: str, limit: int | None = None,
             say: Callable[[str], None] = print, rows_out: str | None = None) -> dict:
    """Measure, fit on the calibrate questions, report on the report ones, save (see the module
    docstring); `limit`: the first N questions of those two splits; `rows_out`:
    every answer measured (question id, preset, mode, seconds, its text) as JSON Lines too."""
    from rag_demo.models.cost import CostFit

    items = [it for it in read_qa(qa).items if split_of(str(it.meta["id"])) in ("calibrate", "report")][:limit]
    questions = [(str(it.meta["id"]), it.question) for it in items]
    pipe.cost_fit = CostFit(typical_tokens(run), {}, {})  # factors 1: what is measured is the price itself
    say("Warming up and calibrating the cost model, as the app does ...")
    pipe.warm_up()
    rows = measure(pipe, questions, presets, say)
    if rows_out:
        Path(rows_out).parent.mkdir(parents=True, exist_ok=True)
        Path(rows_out).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    fit_rows = [r for r in rows if split_of(r["question_id"]) == "calibrate"]
    test_rows = [r for r in rows if split_of(r["question_id"]) == "report"]

    def factor(reask: bool) -> dict[str, float]:
        by: dict[str, list[float]] = {}
        for r in fit_rows:
            if r["reask"] == reask and r["expected"]:
                by.setdefault(f"{r['preset']}|{r['mode']}", []).append(r["seconds"] / r["expected"])
        return {k: statistics.median(v) for k, v in by.items()}

    first, again = factor(False), factor(True)
    for r in test_rows:
        r["fitted"] = r["expected"] * (again if r["reask"] else first).get(f"{r['preset']}|{r['mode']}", 1.0)
    report = {
        "first": {"before": _errors([r for r in test_rows if not r["reask"]], "worst"),
                  "after": _errors([r for r in test_rows if not r["reask"]], "fitted"),
                  "answers": sum(not r["reask"] for r in test_rows)},
        "reask": {"before": _errors([r for r in test_rows if r["reask"]], "worst"),
                  "after": _errors([r for r in test_rows if r["reask"]], "fitted"),
                  "answers": sum(r["reask"] for r in test_rows)},
    }
    m = machine_info()
    about = {"command": command, "date": datetime.date.today().isoformat(), "cpu": m.get("processor"),
             "load_avg": m.get("load_avg"), "qa": qa, "questions": len(questions), "typical_from": run,
             "held_out": report}
    fit = CostFit(pipe.cost_fit.typical_tokens, first, again, about)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(fit.to_dict(), indent=1) + "\n", encoding="utf-8")
    return about


def format_report(about: dict) -> str:
    """The held-out table: median relative error per preset and mode, worst case against fitted."""
    lines = ["| ask | preset | mode | median error, worst-case estimate | median error, fitted expectation |",
             "|---|---|---|---:|---:|"]
    for ask in ("first", "reask"):
        r = about["held_out"][ask]
        for key in sorted(r["before"]):
            preset, mode = key.split("|")
            lines.append(f"| {'first ask' if ask == 'first' else 'asked again'} | {preset} | {mode} "
                         f"| {100 * r['before'][key]:+.0f}% | {100 * r['after'].get(key, float('nan')):+.0f}% |")
    return "\n".join(lines)
