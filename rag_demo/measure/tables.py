"""Every table of measured numbers in README.md and docs/ is written from the result files that ship
(assets/results/, assets/confidence.json, assets/trained/meta.json), never typed by hand:

    <!-- table: answers -->
    | ... the table `answers` renders ... |
    <!-- /table -->

`python -m rag_demo tables` rewrites every marked table; `--check` only says which differ (a test
runs it, so a number edited by hand, or a run replaced without its tables, fails the suite). No
model runs: pandas over the files.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import pandas as pd

from rag_demo.config import MODE_TITLES
from rag_demo.measure.run_rows import in_split, load_meta, load_rows

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "assets" / "results"
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md")
MARK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
SETS = (("qa_dev", None, "dev (80, written here)"), ("qa_train_vital", "report", "external, report split"))
PRESETS = ("paper", "aided", "trained")


def _rows(name: str, split: str | None) -> pd.DataFrame:
    path = RESULTS / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the sweep its meta file names (or the README's Results commands).")
    rows = load_rows(path)
    return in_split(rows, split) if split else rows


def _result(name: str) -> dict:
    """A JSON result file of assets/results/ (a bench's, the estimates', the identical answers')."""
    path = RESULTS / name
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the command the text beside its table names.")
    return json.loads(path.read_text(encoding="utf-8"))


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def answers(k: int = 5) -> str:
    """EM and contains at K per preset and mode, on the dev set and the external report split, over
    all questions and over those whose K passages hold a gold answer ("given retrieval")."""
    lines = ["| questions | preset | mode | n | EM | contains | given retrieval: n | EM | contains |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, split, title in SETS:
        rows = _rows(name, split)
        rag = rows[(rows["k"] == k) & (rows["retriever"] == "dense") & rows["mode"].isin(["sequence", "token"])]
        answered = pd.concat([rows[rows["mode"] == "closed-book"], rag])
        for preset in PRESETS:
            for mode in ("closed-book", "sequence", "token"):
                part = answered[(answered["preset"] == preset) & (answered["mode"] == mode)]
                if part.empty:
                    continue
                given = part[part["gold_in_top_k"] == True]  # noqa: E712 - a nullable column
                cells = (f"{len(given)} | {_pct(given['em'].mean())} | {_pct(given['contains'].mean())}"
                         if mode != "closed-book" else "- | - | -")
                lines.append(f"| {title} | {preset} | {MODE_TITLES[mode]} | {len(part)} | {_pct(part['em'].mean())} "
                             f"| {_pct(part['contains'].mean())} | {cells} |")
    return "\n".join(lines)


def recall() -> str:
    """Dense recall@K of the frozen question tower and of the trained one (the paper's Table 6),
    on the dev set and the external report split."""
    lines = ["| questions | question tower | n | " + " | ".join(f"@{k}" for k in (1, 3, 5, 10)) + " |",
             "|---|---|---:|" + "---:|" * 4]
    for name, split, title in SETS:
        rows = _rows(name, split)
        ret = rows[(rows["mode"] == "retrieval") & (rows["retriever"] == "dense")]
        for tower, part in (("frozen", ret[ret["preset"].isna()]), ("trained", ret[ret["preset"] == "trained"])):
            if part.empty:
                continue
            by_k = part.groupby("k")["gold_in_top_k"].mean()
            cells = " | ".join(_pct(by_k.get(k, float("nan"))) for k in (1, 3, 5, 10))
            lines.append(f"| {title} | {tower} | {part['question_id'].nunique()} | {cells} |")
    return "\n".join(lines)


def confidence() -> str:
    """The confidence on the report split, per preset and mode (assets/confidence.json)."""
    from rag_demo.measure.calibration import format_confidence

    about = json.loads((ROOT / "assets" / "confidence.json").read_text(encoding="utf-8"))["about"]
    return format_confidence(about["report"])


def training() -> str:
    """Each training stage: what it trained on, how long, where, and its held-out numbers."""
    meta = json.loads((ROOT / "assets" / "trained" / "meta.json").read_text(encoding="utf-8"))
    lines = ["| stage | examples trained on | held out | precision | minutes | CPU | held-out loss first → last |",
             "|---|---:|---:|---|---:|---|---|"]
    for s in meta["stages"].values():
        h = s["heldout_loss"]
        lines.append(f"| {s['stage']} | {s['data']['trained_on']} | {s['data']['heldout']} | {s['precision']} "
                     f"| {s['train_seconds'] / 60:.0f} | {s['cpu']} | {h['first']:.3f} → {h['last']:.3f} |")
    return "\n".join(lines)


def pairs() -> str:
    """How the training pairs were made, by rule, and how many kept an answer in their passages."""
    meta = json.loads((ROOT / "assets" / "trained" / "meta.json").read_text(encoding="utf-8"))
    reader = meta["stages"]["reader"]["data"]
    made = reader["pairs_meta"]
    lines = ["| kind | how it was made | pairs | kept (an answer in the top K) |", "|---|---|---:|---:|"]
    for kind, how in made["how"].items():
        n = made["qa"]["pairs"] if kind == "external" else made["corpus_rules"][kind]["sampled"]
        lines.append(f"| {kind} | {how} | {n} | {reader['examples'].get(kind, 0)} |")
    return "\n".join(lines)


def bench() -> str:
    """Each mode's time per answer against its lower bound on this CPU (assets/results/bench.json)."""
    r = _result("bench.json")
    lines = ["| CPU | precision | mode | p50 s | p95 s | bound s | p50 / bound | p95 / bound |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for dtype, modes in r["bound"].items():
        for mode, b in modes.items():
            lines.append(f"| {r['machine']['processor']} | {dtype} | {MODE_TITLES.get(mode, mode)} | {b['p50']:.2f} "
                         f"| {b['p95']:.2f} | {b['bound_p50']:.2f} | {b['multiple_p50']:.2f} | {b['multiple_p95']:.2f} |")
    return "\n".join(lines)


def trained_speed() -> str:
    """Time per answer with the trained weights against the base weights, the same plain preset, the
    same questions and CPU (assets/results/bench_paper.json and bench_trained.json: `bench --preset`)."""
    base, trained = (_result(f"bench_{p}.json") for p in ("paper", "trained"))
    lines = ["| CPU | precision | mode | base p50 s | trained p50 s | trained / base | base p50 / bound "
             "| trained p50 / bound |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for dtype, modes in base["bound"].items():
        for mode, b in modes.items():
            t = trained["bound"][dtype][mode]
            lines.append(f"| {base['machine']['processor']} | {dtype} | {MODE_TITLES.get(mode, mode)} | {b['p50']:.2f} "
                         f"| {t['p50']:.2f} | {t['p50'] / b['p50']:.2f} | {b['multiple_p50']:.2f} "
                         f"| {t['multiple_p50']:.2f} |")
    return "\n".join(lines)


def under_load() -> str:
    """The cards' expected seconds against the measured ones, quiet and with a second process busy
    (assets/results/estimates.json, scripts/estimates.py)."""
    r = _result("estimates.json")
    lines = ["| machine | mode | answers | median expected / took | within ±30% |", "|---|---|---:|---:|---:|"]
    for load, modes in r["ratios"].items():
        for mode, x in modes.items():
            lines.append(f"| {load} | {MODE_TITLES.get(mode, mode)} | {x['n']} | {x['median']:.2f} "
                         f"| {x['within']}/{x['n']} |")
    return "\n".join(lines)


def identical() -> str:
    """Answers identical token for token before and after this round's changes (assets/results/identical.json)."""
    r = _result("identical.json")
    lines = ["| questions | preset | answers | identical |", "|---|---|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['questions']} | {row['preset']} | {row['answers']} | {row['identical']} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[], str]] = {f.__name__: f for f in (answers, recall, confidence, training, pairs,
                                                                bench, trained_speed, under_load, identical)}


def render(text: str) -> str:
    """`text` with every marked table rendered afresh (a ValueError names an unknown table)."""
    def one(m: re.Match) -> str:
        name = m["name"].replace("-", "_")
        if name not in TABLES:
            raise ValueError(f"table {m['name']!r} is unknown: use one of {', '.join(TABLES)}.")
        return f"{m.group(1)}{TABLES[name]()}\n{m.group(4)}"
    return MARK.sub(one, text)


def update(paths=DOCS, check: bool = False) -> list[Path]:
    """Rewrite (or with `check` only compare) every marked table in `paths`; -> the files whose
    tables differ from what the runs give."""
    stale = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        new = render(text)
        if new != text:
            stale.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return stale


__all__ = ["TABLES", "load_meta", "render", "update"]
