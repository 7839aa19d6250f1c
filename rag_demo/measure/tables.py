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
from rag_demo.measure.run_rows import in_split, load_meta, load_rows, with_answerable

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "assets" / "results"
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md")
MARK = re.compile(r"(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
EXTERNAL = ("qa_open_vital", "qa_train_vital")  # the two files of questions written by others
PRESETS = ("paper", "aided", "trained")


def _rows(name: str, split: str | None) -> pd.DataFrame:
    path = RESULTS / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the sweep its meta file names (or the README's Results commands).")
    rows = load_rows(path)
    return in_split(rows, split) if split else rows


def question_sets() -> list[tuple[str, pd.DataFrame]]:
    """The sets every table reports, each titled with its split and how many of its questions are
    answerable: the external files' report split, its answerable questions (the headline) and all
    of them, and the dev set (written here; where the aids were chosen: in-sample)."""
    report = with_answerable(pd.concat([_rows(n, "report") for n in EXTERNAL], ignore_index=True))
    ids = report.drop_duplicates(["qa", "question_id"])
    n, a = len(ids), int(ids["answerable"].sum())
    dev = _rows("qa_dev", None)
    return [(f"external report split, answerable ({a})", report[report["answerable"]]),
            (f"external report split, all ({n}: {a} answerable)", report),
            (f"dev ({dev['question_id'].nunique()} written here, in-sample)", dev)]


def _result(name: str) -> dict:
    """A JSON result file of assets/results/ (a bench's, the estimates', the identical answers')."""
    path = RESULTS / name
    if not path.is_file():
        raise ValueError(f"{path} is missing: run the command the text beside its table names.")
    return json.loads(path.read_text(encoding="utf-8"))


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def answers(k: int = 5) -> str:
    """EM and contains at K per preset and mode on each question set, over all its questions and
    over those whose K passages hold a gold answer ("given retrieval"), and how many answers run on
    past a complete short answer (metrics.runs_on)."""
    from rag_demo.measure.metrics import runs_on

    lines = ["| questions | preset | mode | n | EM | contains | given retrieval: n | EM | contains | run on |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for title, rows in question_sets():
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
                run_on = sum(runs_on(str(a)) for a in part["answer"].fillna(""))
                lines.append(f"| {title} | {preset} | {MODE_TITLES[mode]} | {len(part)} | {_pct(part['em'].mean())} "
                             f"| {_pct(part['contains'].mean())} | {cells} | {run_on} |")
    return "\n".join(lines)


def recall() -> str:
    """Dense recall@K (a passage in the top K holds a gold answer) of the question tower on each
    question set: the paper's Table 6 measures the same for its retrievers."""
    lines = ["| questions | n | " + " | ".join(f"@{k}" for k in (1, 3, 5, 10)) + " |", "|---|---:|" + "---:|" * 4]
    for title, rows in question_sets():
        ret = rows[(rows["mode"] == "retrieval") & (rows["retriever"] == "dense") & rows["preset"].isna()]
        if ret.empty:
            continue
        by_k = ret.groupby("k")["gold_in_top_k"].mean()
        cells = " | ".join(_pct(by_k.get(k, float("nan"))) for k in (1, 3, 5, 10))
        lines.append(f"| {title} | {ret['question_id'].nunique()} | {cells} |")
    return "\n".join(lines)


def confidence() -> str:
    """The confidence on the report split, its answerable questions and all of them, per preset and
    mode (assets/confidence.json)."""
    from rag_demo.measure.calibration import format_confidence

    about = json.loads((ROOT / "assets" / "confidence.json").read_text(encoding="utf-8"))["about"]
    n = about["report_questions"]
    a = {r["questions"] for r in about["report_answerable"]}
    rows = [{**r, "set": f"report, answerable ({max(a)})"} for r in about["report_answerable"]]
    rows += [{**r, "set": f"report, all ({n})"} for r in about["report"]]
    return format_confidence(rows)


def training() -> str:
    """Each training stage: what it trained on, where and how long, its held-out loss, and what ships
    (the rank the change is stored at, and the held-out loss of what ships beside the trained one)."""
    meta = json.loads((ROOT / "assets" / "trained" / "meta.json").read_text(encoding="utf-8"))
    lines = ["| stage | tuned | examples trained on | held out | precision | minutes | machine "
             "| held-out loss first → last | ships | held-out loss of what ships |",
             "|---|---|---:|---:|---|---:|---|---|---|---:|"]
    for s in meta["stages"].values():
        h, stored = s["heldout_loss"], s.get("stored", {})
        shipped = next((v for k, v in stored.get("heldout_loss", {}).items() if "shipped" in k), h["last"])
        ships = (f"rank-{stored['rank']} change, {stored['bytes'] / 1e6:.1f} MB, {100 * stored['energy_kept']:.0f}% "
                 "of its energy" if stored.get("tune") == "full" else f"LoRA r={stored['rank']}"
                 if stored.get("tune") == "lora" else "question map")
        lines.append(f"| {s['stage']} | {stored.get('tune', 'question map')} | {s['data']['trained_on']} "
                     f"| {s['data']['heldout']} | {s['precision']} | {s['seconds_training_all_processes'] / 60:.0f} "
                     f"| {s['device']} | {h['first']:.3f} → {h['last']:.3f} | {ships} | {shipped:.3f} |")
    return "\n".join(lines)


def pairs() -> str:
    """How the training pairs were made, by kind, and how many kept an answer in their passages."""
    meta = json.loads((ROOT / "assets" / "trained" / "meta.json").read_text(encoding="utf-8"))
    reader = meta["stages"]["reader"]["data"]
    made = reader["pairs_meta"]
    lines = ["| kind | how it was made | pairs | kept (an answer in the top K) |", "|---|---|---:|---:|"]
    for kind, how in made["how"].items():
        if kind == "dedupe":
            continue
        n = (sum(q["pairs"] for q in made["qa"]) if kind == "external"
             else made["corpus_rules"].get(kind, {}).get("sampled", 0))
        lines.append(f"| {kind} | {how} | {n} | {reader['examples'].get(kind, 0)} |")
    return "\n".join(lines)


def bench() -> str:
    """Each mode's time per answer against its two lower bounds on this CPU (assets/results/bench.json):
    torch's rate at the model's shapes, and the machine's own peak (bound.machine_peak), where measured."""
    r = _result("bench.json")
    lines = ["| CPU | precision | mode | p50 s | p95 s | bound s | p50 / bound | p95 / bound | peak bound s "
             "| p50 / peak | p95 / peak |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for dtype, modes in r["bound"].items():
        for mode, b in modes.items():
            peak = (f"{b['peak_bound_p50']:.2f} | {b['peak_multiple_p50']:.2f} | {b['peak_multiple_p95']:.2f}"
                    if "peak_bound_p50" in b else "- | - | -")
            lines.append(f"| {r['machine']['processor']} | {dtype} | {MODE_TITLES.get(mode, mode)} | {b['p50']:.2f} "
                         f"| {b['p95']:.2f} | {b['bound_p50']:.2f} | {b['multiple_p50']:.2f} | {b['multiple_p95']:.2f} "
                         f"| {peak} |")
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
