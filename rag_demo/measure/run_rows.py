"""A sweep's rows and its meta file, read back: `eval --sweep` writes RUN.jsonl (one tidy row per
question and setting) and RUN.meta.json (the commands, CPU and dates that filled it). The
figures, the confidence fit and the cost fit read them through here; `caption` is the line every
figure carries.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from rag_demo.config import MODES

ROW_MODES = (*MODES, "retrieval")  # "retrieval": a retrieval-only row, no answer
REQUIRED = ("qa", "question_id", "mode")
NUMBERS = ("em", "f1", "contains", "logprob", "seconds", "confidence")
INTEGERS = ("k", "n_tokens", "order")
COLUMNS = (*REQUIRED, "preset", "retriever", "k", *NUMBERS[:3], "gold_in_top_k", "logprob", "n_tokens", "seconds",
           "answer", "order", "confidence", "cues")

TYPE_NAMES = {"float64": "a number", "Int64": "an integer", "boolean": "true or false"}


# ---------------------------------------------------------------- reading a run

def load_rows(path: str | Path) -> pd.DataFrame:
    """A tidy run (RUN.jsonl, one JSON object per line) as a DataFrame with every schema column.

    A sweep that was killed can leave its last line half written: that line is skipped and
    `attrs["skipped_last_line"]` says so. Anything else that is not a tidy row is a ValueError
    naming the file and the line. `attrs["source"]` is the file's name, which the "no rows"
    charts name.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the run {str(path)!r} ({e}): give the RUN.jsonl that "
                         "`python -m rag_demo eval --sweep` wrote.") from None
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    rows, skipped = [], False
    for n, (i, line) in enumerate(numbered):
        try:
            row = json.loads(line)
        except ValueError:
            if 0 < n == len(numbered) - 1:
                skipped = True
                continue
            raise ValueError(f"{path} line {i} is not JSON: a tidy run has one JSON object per line; give the "
                             "RUN.jsonl of `eval --sweep`, not an `eval --out` report.") from None
        missing = [f for f in REQUIRED if f not in row] if isinstance(row, dict) else list(REQUIRED)
        if missing:
            raise ValueError(f"{path} line {i} is not a tidy row (it lacks {', '.join(missing)}): give the RUN.jsonl "
                             "of `eval --sweep`, one row per question and setting.")
        if row["mode"] not in ROW_MODES:
            raise ValueError(f"{path} line {i}: mode {row['mode']!r} is none of {', '.join(ROW_MODES)}: the file is "
                             "not a tidy run of this version; rerun `eval --sweep`.")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows: run `python -m rag_demo eval --sweep` and give the RUN.jsonl it "
                         "writes.")
    try:
        df = tidy(pd.DataFrame(rows))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    df.attrs.update(source=path.name, skipped_last_line=skipped)
    return df


def tidy(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of rows with every schema column present and typed: numbers as floats (null = NaN),
    K and counts as nullable integers, gold_in_top_k as nullable booleans, cues as lists.

    The figures call it on what they are given, so the page can pass `pd.DataFrame(rows)` of a
    live sweep as it is.
    """
    out = df.copy()
    for col in COLUMNS:
        if col not in out:
            out[col] = None
    for col, dtype in [*((c, "float64") for c in NUMBERS), *((c, "Int64") for c in INTEGERS),
                       ("gold_in_top_k", "boolean")]:
        try:
            out[col] = (out[col] if dtype == "boolean" else pd.to_numeric(out[col])).astype(dtype)
        except (TypeError, ValueError):
            bad = next((v for v in out[col] if v is not None and not _fits(v, dtype)), "?")
            raise ValueError(f"field {col!r} holds {bad!r}, which is not {TYPE_NAMES[dtype]} or null: rerun "
                             "`eval --sweep`, whose rows hold that type there.") from None
    out["cues"] = [c if isinstance(c, list) else [] for c in out["cues"]]
    out.attrs = dict(df.attrs)
    return out


def _fits(value, dtype: str) -> bool:
    """Whether a row's value is of the column's type (the one that broke a conversion is named)."""
    if dtype == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return dtype != "Int64" or float(value).is_integer()


def run_meta_path(run: str | Path) -> Path:
    """RUN.jsonl -> RUN.meta.json beside it (a .meta.json path is returned as it is)."""
    run = Path(run)
    return run if run.name.endswith(".meta.json") else run.with_name(run.stem + ".meta.json")


def load_meta(path: str | Path) -> dict:
    """The run's RUN.meta.json (given the run or the meta file); {} when there is none."""
    meta_path = run_meta_path(path)
    if not meta_path.exists():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{meta_path} is not readable JSON ({e}): delete it (the figures then say the command is "
                         "unknown) or rerun `eval --sweep`.") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} is not a JSON object: delete it or rerun `eval --sweep`.")
    return meta


def with_answerable(rows: pd.DataFrame, folder: str | Path | None = None) -> pd.DataFrame:
    """The rows with an `answerable` column: whether a person reading one summary would give a gold
    answer (questions.answerable_ids), looked up in the QA file each row's `qa` names, in
    `folder` (default assets/). A file labelled neither way (the dev set, written from passages)
    counts as answerable."""
    from rag_demo.questions import answerable_ids

    folder = Path(folder) if folder is not None else Path(__file__).resolve().parents[2] / "assets"
    labels: dict[str, dict[str, bool] | None] = {}
    for qa in rows["qa"].unique():
        path = folder / f"{qa}.jsonl"
        labels[qa] = answerable_ids(path) if path.is_file() else None
    answerable = [True if labels.get(qa) is None else labels[qa].get(str(q), False)
                  for qa, q in zip(rows["qa"], rows["question_id"])]
    return rows.assign(answerable=answerable)


def in_split(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """The rows whose question is in split `name` (rag_demo/splits.py, by the question's id)."""
    from rag_demo.splits import check_split, split_of

    check_split(name)
    return rows[[split_of(str(q)) == name for q in rows["question_id"]]]


def caption(meta: dict, questions: int | None = None, split: str | None = None) -> str:
    """The line under every figure: the question set, its split where the figure reads one, and its
    size (`questions`: those the figure draws, where it knows them), the CPU, the date and the command."""
    if not meta:
        return "No RUN.meta.json beside this run: the command, CPU and date that made it are unknown."
    qa, n = meta.get("qa"), meta.get("questions") if questions is None else questions
    if split and qa:
        qa = f"the {split} split (rag_demo/splits.py) of {qa}"
    parts = [f"{n} questions of {qa}." if qa and n is not None else
             f"Questions of {qa}." if qa else f"{n} questions." if n is not None else "Question set not recorded."]
    runs = meta.get("runs") or [meta]
    cpus = list(dict.fromkeys(r["cpu"] for r in runs if r.get("cpu")))
    dates = sorted({r["date"] for r in runs if r.get("date")})
    # a file filled by several commands (another K list, recall rows only) needs each of them to remake it
    commands = list(dict.fromkeys(r["command"] for r in runs if r.get("command")))
    parts.append(f"CPU: {'; '.join(cpus)}." if cpus else "CPU not recorded.")
    parts.append(("Run on " + (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") + ".") if dates
                 else "Date not recorded.")
    parts.append(("Rerun: " + " then ".join(commands)) if commands else "Command not recorded.")
    return " ".join(parts)


def questions_drawn(rows: pd.DataFrame, retrieval: bool) -> int:
    """How many questions a figure draws: those with retrieval rows (recall) or with answers."""
    part = rows[rows["mode"] == "retrieval"] if retrieval else rows[rows["mode"] != "retrieval"]
    return int(part["question_id"].nunique())
