"""The sweep: a grid of settings over a QA file, one tidy row per question and setting.

`python -m rag_demo eval --sweep` runs K (default 1, 2, 3, 5, 10, 20) × modes × presets ×
retrievers over a QA file and appends each row to a JSON Lines file as soon as it is made, so a
killed run loses at most the answer it was computing: run the same command again and the rows
already there are not recomputed (`done_keys`). The figures (measure/figures.py) and the page's
Results tab read the file with pandas. Beside RUN.jsonl, RUN.meta.json records the command, the
date, the CPU and the grid of every invocation that wrote to it.

A row (the tidy schema every reader of a run relies on):

    qa, question_id            the QA file's stem and the question's id (its "id", else "<stem>:<line>")
    mode                       "sequence", "token", "closed-book", or "retrieval" (no answer)
    preset, retriever, k       null where the setting does not apply (retrieval rows of the base
                               question tower have no preset, a trained tower's name the preset that
                               reads it; closed-book reads no passages, so has no retriever and no K)
    em, f1, contains           the answer's scores (measure/evaluate.py), null for retrieval rows
    gold_in_top_k              whether one of the K passages holds a gold answer (null for closed-book)
    logprob, n_tokens, seconds, answer, decoding, stopped
    order                      the position of this K among the K values this invocation ran for the
                               question, preset and retriever: 0 ran with nothing kept from the
                               question's other K values; later ones read its kept states (faster)
    confidence, signals, cues  rag_demo/confidence.py; the cue kinds shown on the card

Reuse across K is exact: a question's K values share its passages' keys and values and the hidden
states kept of every prompt and answer prefix run (models/passage_kv.py), so K = 5 after K = 3 runs
only the two new passages' rows; the default K runs first for each question, so that its `order`
0 rows time an answer the way a visitor's first question runs.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from rag_demo.config import KNOBS, MODES, PRESETS, RagSettings
from rag_demo.knowledge.retrievers import RETRIEVERS
from rag_demo.questions import QAItem
from rag_demo.measure.evaluate import machine_info
from rag_demo.measure.metrics import contains_answer, exact_match, f1_score, first_hit, passage_text

DEFAULT_KS = (1, 2, 3, 5, 10, 20)
FIELDS = ("qa", "question_id", "mode", "preset", "retriever", "k", "em", "f1", "contains", "gold_in_top_k",
          "logprob", "n_tokens", "seconds", "answer", "decoding", "stopped", "order", "confidence", "signals", "cues")
Key = tuple  # (question_id, mode, preset, retriever, k): what identifies a row


def parse_list(text: str | int | Iterable, what: str, kind: Callable = str, allowed: Iterable | None = None) -> list:
    """"1,3,5" (or one number, or a list) -> [1, 3, 5]: distinct, in the order given; a ValueError
    naming the bad value and the fix."""
    items = list(text) if isinstance(text, (list, tuple)) else [x.strip() for x in str(text).split(",") if x.strip()]
    try:
        out = [kind(x) for x in items]
    except ValueError:
        raise ValueError(f"--{what} {text!r} is not a comma-separated list: write e.g. "
                         f"{'1,3,5' if kind is int else ','.join(list(allowed or ['a', 'b'])[:2])}.") from None
    bad = [x for x in out if allowed is not None and x not in allowed]
    if bad or not out:
        raise ValueError(f"--{what} {text!r}: use a comma-separated list of {', '.join(map(str, allowed or []))}.")
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Grid:
    """What a sweep runs: answers for every (mode, preset, retriever, K), and retrieval rows
    (recall) for every (recall retriever, K). `knobs` apply on top of every preset."""

    ks: tuple[int, ...] = DEFAULT_KS
    modes: tuple[str, ...] = MODES
    presets: tuple[str, ...] = tuple(PRESETS)
    retrievers: tuple[str, ...] = ("dense",)
    recall_retrievers: tuple[str, ...] = RETRIEVERS
    knobs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k in self.ks:
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= KNOBS["k"].hi:
                raise ValueError(f"K={k!r} is out of range: use whole numbers from 1 to {KNOBS['k'].hi:g}.")
        for name, values, allowed in (("modes", self.modes, MODES), ("presets", self.presets, PRESETS),
                                      ("retrievers", self.retrievers, RETRIEVERS),
                                      ("recall retrievers", self.recall_retrievers, RETRIEVERS)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"{name} {bad} unknown: use some of {', '.join(allowed)}.")
        if not self.ks or not (self.modes or self.recall_retrievers):
            raise ValueError("an empty grid: give at least one K and one mode or recall retriever.")
        unknown = sorted(set(self.knobs) - set(KNOBS))
        if unknown or "k" in self.knobs or "retriever" in self.knobs:
            raise ValueError(f"knobs {unknown or ['k', 'retriever']}: K and the retriever are the grid's own; "
                             f"other knobs are {', '.join(n for n in KNOBS if n not in ('k', 'retriever'))}.")

    def ordered_ks(self, default: int) -> list[int]:
        """The K values in the order a question runs them: the default first (timed as a first
        ask), then the others ascending."""
        return sorted(self.ks, key=lambda k: (k != default, k))

    def settings(self, preset: str) -> RagSettings:
        return RagSettings(preset=preset, **self.knobs)

    def answers_per_question(self) -> int:
        rag = [m for m in self.modes if m != "closed-book"]
        return len(self.presets) * (len(rag) * len(self.retrievers) * len(self.ks) + ("closed-book" in self.modes))


def row_key(row: dict) -> Key:
    return (row["question_id"], row["mode"], row.get("preset"), row.get("retriever"), row.get("k"))


SIGNIFICANT = 6  # digits a row's floats keep: far finer than any figure or fit reads, a third of the bytes


def _rounded(v):
    if isinstance(v, float):
        return float(f"{v:.{SIGNIFICANT}g}")
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    return v


def compact(row: dict) -> dict:
    """A row as it is written: fields with nothing in them (null, an empty list) left out, which
    the readers fill back in (run_rows.tidy), and floats to SIGNIFICANT digits: a retrieval row is a
    third of its full size.

    >>> compact({"k": 5, "cues": [], "logprob": -1.4445610046386719, "signals": {"margin": 1.1947872638702393}})
    {'k': 5, 'logprob': -1.44456, 'signals': {'margin': 1.19479}}
    """
    return {k: _rounded(v) for k, v in row.items() if v is not None and v != []}


def question_id(item: QAItem) -> str:
    return str(item.meta.get("id"))


def read_rows(path: str | Path, repair: bool = False) -> list[dict]:
    """The rows of a run file. A last line cut short (a killed run) is skipped, and with `repair`
    cut off the file, so that rows appended after it stay whole lines; any other line that is not
    a row is a ValueError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    rows, good_end, offset = [], 0, 0
    for n, line in enumerate(lines, start=1):
        end = offset + len(line) + 1
        if line.strip():
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or "question_id" not in row or "mode" not in row:
                    raise ValueError
            except ValueError:
                if n == len(lines) or (n == len(lines) - 1 and not lines[-1]):  # the last line: a killed write
                    break
                raise ValueError(f"{path} line {n} is not a sweep row: pass the JSONL file a sweep wrote "
                                 "(or delete the file to start again).") from None
            rows.append(row)
            good_end = min(end, len(raw))
        offset = end
    if repair and good_end < len(raw):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return rows


def done_keys(rows: Iterable[dict]) -> set[Key]:
    return {row_key(r) for r in rows}


def answer_row(qa: str, item: QAItem, mode: str, preset: str, retriever: str | None, k: int | None, a: Any,
               gold: bool | None, order: int | None) -> dict:
    """One tidy row of an answer (an `Answer`)."""
    golds = item.answers
    return {
        "qa": qa, "question_id": question_id(item), "mode": mode, "preset": preset, "retriever": retriever, "k": k,
        "em": exact_match(a.text, golds), "f1": f1_score(a.text, golds), "contains": contains_answer(a.text, golds),
        "gold_in_top_k": gold, "logprob": a.sequence_logprob, "n_tokens": len(a.token_ids),
        "seconds": a.timings.get("total"), "answer": a.text, "decoding": a.decoding, "stopped": a.stopped,
        "order": order, "confidence": a.confidence, "signals": a.signals, "cues": [c["kind"] for c in a.cues],
    }


def retrieval_row(qa: str, item: QAItem, retriever: str, k: int, rank: int | None, preset: str | None = None) -> dict:
    """Whether the top k hold a gold answer; `preset` names a trained question tower's rows (None:
    the base tower, whatever the preset)."""
    return {"qa": qa, "question_id": question_id(item), "mode": "retrieval", "preset": preset, "retriever": retriever,
            "k": k, "em": None, "f1": None, "contains": None, "gold_in_top_k": rank is not None and rank <= k,
            "logprob": None, "n_tokens": None, "seconds": None, "answer": None, "decoding": None, "stopped": None,
            "order": None, "confidence": None, "signals": None, "cues": []}


def to_do(items: list[QAItem], grid: Grid, done: set[Key]) -> int:
    """How many answers the grid still needs for these questions (the progress bar's total)."""
    rag = [m for m in grid.modes if m != "closed-book"]
    n = 0
    for item in items:
        qid = question_id(item)
        for p in grid.presets:
            n += "closed-book" in grid.modes and (qid, "closed-book", p, None, None) not in done
            n += sum((qid, m, p, r, k) not in done for m in rag for r in grid.retrievers for k in grid.ks)
    return n


def sweep(pipe: Any, items: list[QAItem], grid: Grid, done: set[Key] | None = None, qa: str = "qa",
          run: Any = None, on_answer: Callable[[int], None] | None = None) -> Iterator[dict]:
    """Run the grid over `items` and yield each row not in `done`, as it is made: a question's
    retrieval rows, then per preset its closed-book answer and, per retriever and K (the default K
    first), its RAG answers (the RAG modes of one K in one call: they share the retrieval and the
    prefill). `run` (pipeline.Run): when to stop and how to share the CPU, as for a question;
    once it is cancelled no more rows come. `on_answer(n)` is told each time n answers are done."""
    done = set(done or ())
    rag_modes = [m for m in grid.modes if m != "closed-book"]
    enc_mode = rag_modes[0] if rag_modes else "token"
    depth = min(max(grid.ks), len(pipe.index))
    if max(grid.ks) > len(pipe.index):
        raise ValueError(f"K={max(grid.ks)} is more than the {len(pipe.index)} passages of {pipe.index.corpus.name!r}: "
                         f"use K up to {len(pipe.index)}.")
    # the question towers the grid reads: the base one, and the trained one where a preset's weights are
    towers = {p: grid.settings(p).decoding.weights for p in grid.presets}

    def cancelled() -> bool:
        return run is not None and run.cancelled is not None and run.cancelled()

    for item in items:
        if cancelled():
            return
        qid, q = question_id(item), item.question
        retrieved: dict[tuple[str, int, str], Any] = {}  # (retriever, group, weights) -> Retrieval to depth

        def ranked(r: str, g: int = 0, weights: str = "base"):
            if (r, g, weights) not in retrieved:
                groups = pipe.modes_by_encoder(rag_modes, weights)
                retrieved[(r, g, weights)] = pipe.retrieve(q, groups[g][0] if groups else enc_mode, depth, r,
                                                           weights=weights)
            return retrieved[(r, g, weights)]

        # recall: the base tower's rows (preset null), and a trained tower's under its preset's name
        # (BM25 reads no tower, so it has no trained rows)
        recall = [(r, None, "base") for r in grid.recall_retrievers]
        recall += [(r, p, w) for p, w in towers.items() if w != "base" for r in grid.recall_retrievers if r != "bm25"]
        for r, p, w in recall:
            keys = [(qid, "retrieval", p, r, k) for k in grid.ks]
            if all(key in done for key in keys):
                continue
            rank = first_hit([passage_text(x) for x in ranked(r, 0, w).passages], item.answers)
            for key, k in zip(keys, grid.ks):
                if key not in done:
                    done.add(key)
                    yield retrieval_row(qa, item, r, k, rank, p)
        for preset in grid.presets:
            s = grid.settings(preset)
            weights = s.decoding.weights
            groups = pipe.modes_by_encoder(rag_modes, weights)
            if "closed-book" in grid.modes and (qid, "closed-book", preset, None, None) not in done:
                # closed-book reads no passages; K only has to be one the corpus can give
                a = pipe.answers(q, ["closed-book"], s.merged(k=min(s.decoding.k, len(pipe.index))), run)["closed-book"]
                if cancelled():
                    return
                done.add((qid, "closed-book", preset, None, None))
                yield answer_row(qa, item, "closed-book", preset, None, None, a, None, None)
                if on_answer:
                    on_answer(1)
            for r in grid.retrievers:
                order = 0
                for k in grid.ordered_ks(s.decoding.k):
                    ran = False
                    for g, group in enumerate(groups):
                        modes = [m for m in group if (qid, m, preset, r, k) not in done]
                        if not modes:
                            continue
                        got = ranked(r, g, weights)
                        gold = first_hit([passage_text(p) for p in got.passages[:k]], item.answers) is not None
                        answers = pipe.answer_from_modes(q, modes, got.passages[:k], got.scores[:k], s.merged(k=k),
                                                         dict(got.timings), run)
                        if cancelled():
                            return
                        for m in modes:
                            answers[m].retriever = got.retriever
                            done.add((qid, m, preset, r, k))
                            yield answer_row(qa, item, m, preset, r, k, answers[m], gold, order)
                        if on_answer:
                            on_answer(len(modes))
                        ran = True
                    order += ran


def write_meta(path: Path, grid: Grid, pipe: Any, qa_path: str, n_questions: int, command: str) -> dict:
    """RUN.meta.json: this invocation (command, date, CPU, grid) added to the runs before it; the
    top-level fields name the latest, which the figures print under each chart."""
    meta_path = meta_path_of(path)
    old = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    m = machine_info()
    now = {"command": command, "date": datetime.date.today().isoformat(),
           "cpu": m.get("processor"), "threads": m.get("threads"), "torch": m.get("torch"),
           "qa": qa_path, "questions": n_questions, "grid": {k: list(v) if isinstance(v, tuple) else v
                                                              for k, v in asdict(grid).items()},
           "stack": pipe.stack.describe(), "corpus": f"{pipe.index.corpus.name} ({len(pipe.index):,} passages)"}
    meta = {**old, **now, "runs": [*old.get("runs", []), now]}
    meta_path.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return meta


def meta_path_of(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.stem + ".meta.json")


def run_to_file(pipe: Any, items: list[QAItem], grid: Grid, out: str | Path, qa_path: str, command: str,
                progress: bool = True) -> tuple[int, int]:
    """The CLI's sweep: rows appended to `out` as they come (each line flushed to disk), finished
    rows skipped, a progress bar with its ETA on stderr; -> (rows written now, rows already there)."""
    from tqdm import tqdm

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = read_rows(out, repair=True)
    if out.is_file() and out.stat().st_size and not out.read_bytes().endswith(b"\n"):
        with out.open("a", encoding="utf-8") as f:  # a whole last row whose newline was never written
            f.write("\n")
    done = done_keys(old)
    write_meta(out, grid, pipe, qa_path, len(items), command)
    total = to_do(items, grid, done)
    bar = tqdm(total=total, desc="sweep", unit="answer", file=sys.stderr, disable=not progress, smoothing=0.05)
    written = 0
    with out.open("a", encoding="utf-8") as f:
        for row in sweep(pipe, items, grid, done, Path(qa_path).stem, on_answer=bar.update):
            f.write(json.dumps(compact(row), ensure_ascii=False, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
            written += 1
    bar.close()
    return written, len(old)
