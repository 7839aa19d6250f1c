"""The Results tab: RAG's lessons as figures over many questions, and a learner's own small sweep.

The figures are drawn (measure/figures.py) from the sweep runs that ship in assets/results/, each
made by the command printed under it; opening the tab runs no model. "Run it yourself" runs a
small grid on the dev questions through the same engine, budget and queue as a question (its
answers at low priority, one sweep at a time per visitor and per server), and draws its points
over the shipped ones as they come in. Imports no torch: it calls the library.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from rag_demo.config import KNOBS, MODE_TITLES, MODES, PRESETS
from rag_demo.measure import figures as fig
from rag_demo.measure.curve import load_curve, training_curve
from rag_demo.questions import read_qa, sample_items
from rag_demo.measure.run_rows import REQUIRED, tidy, with_answerable
from rag_demo.serving import memory
from rag_demo.serving.session import Session, session_pipeline
from rag_demo.web.answering import TYPICAL_QUESTION
from rag_demo.web.api import page_event
from rag_demo.web.render import esc, fmt_seconds

ASSETS = Path(__file__).resolve().parents[2] / "assets"
RESULTS_DIR = ASSETS / "results"
DEV_QA = ASSETS / "qa_dev.jsonl"
# The shipped runs, by question set (the file's stem): what the tab's set picker offers
SETS = {"qa_open_vital": "External questions written by others and labelled by hand (NQ-open, EfficientQA, "
                         "WebQuestions, CuratedTREC): the report split's answerable questions, never trained or fitted on",
        "qa_dev": "Dev set: 80 questions written for this demo, where the aids were chosen (in-sample)",
        "qa_train_vital": "External questions written by others (WebQuestions, CuratedTREC), string-matched: the "
                          "report split, none of it answerable from one summary"}
# a set with splits is drawn on the one nothing was fitted on, and where labelled on its answerable questions
SPLIT_OF_SET = {"qa_open_vital": "report", "qa_train_vital": "report"}
ANSWERABLE_ONLY = {"qa_open_vital"}
GIVEN_SET = "qa_open_vital"  # where retrieval both finds and misses the answer: the given-retrieval figure's set
CURVE = ASSETS / "trained" / "curve.jsonl"  # python -m rag_demo train's loss curve
HELDOUT = RESULTS_DIR / "confidence_heldout.jsonl"  # the confidence on the report split (eval --fit-confidence)
SWEEP_KS = (1, 2, 3, 5, 10, 20)
SWEEP_MAX_QUESTIONS = 20
LESSONS = {
    "accuracy_vs_k": "Figure 3 (left) of the paper: more passages help, then the gain flattens. Closed-book does "
                     "not read passages, so it is flat.",
    "recall_vs_k": "Figure 3 (centre): how often a passage holding the answer is among the K retrieved. The generator "
                   "can copy an answer only when retrieval found it.",
    "accuracy_given_retrieval": "What retrieval bounds: each mode's accuracy when a gold passage was among the K and "
                                "when none was.",
    "plain_vs_aided": "What the reader aids buy and what they cost: the same formulas, with aids that help a small "
                      "model read, against seconds per answer.",
    "reliability": "Does an answer card's confidence mean what it says? Each point: answers binned by confidence, "
                   "against how often they were right, on questions the model was not fitted on.",
    "training_curve": "The paper trains its question encoder and generator end to end (§2.4), with RAG's own loss: "
                      "−log p(y|x) marginalised over the retrieved passages. Here the generator trains on "
                      "labelled questions; a trained question map did not find more answers and does not ship.",
}


@lru_cache(maxsize=8)
def shipped(name: str) -> tuple[pd.DataFrame, dict] | None:
    """A shipped run's rows and meta (None when the file is not there)."""
    path = RESULTS_DIR / f"{name}.jsonl"
    if not path.is_file():
        return None
    return fig.load_rows(path), fig.load_meta(path)


def _rows(name: str, given_set: str | None = None) -> tuple[pd.DataFrame, dict]:
    """A shipped set's rows (only its SPLIT_OF_SET split, and only its answerable questions where it is
    labelled, except as `given_set`) and meta, the split named in the meta."""
    got = shipped(name)
    if got is None:
        return tidy(pd.DataFrame(columns=list(REQUIRED))), {}
    rows, meta = got
    split = SPLIT_OF_SET.get(name)
    if not split:
        return rows, meta
    rows = fig.in_split(rows, split)
    if name in ANSWERABLE_ONLY and name != given_set:
        rows = with_answerable(rows)
        rows = rows[rows["answerable"]].drop(columns="answerable")
        split = f"{split} (its answerable questions only)"
    return rows, {**meta, "split": split}


def _caption(meta: dict, rows: pd.DataFrame | None = None, retrieval: bool = False) -> str:
    n = fig.questions_drawn(rows, retrieval) if rows is not None and len(rows) else None
    return f'<div class="rag-fig-caption">{esc(fig.caption(meta, n, meta.get("split")))}</div>'


def _mine(rows: list[dict] | None) -> pd.DataFrame | None:
    return fig.tidy(pd.DataFrame(rows)) if rows else None


def draw(name: str, metric: str, mine: list[dict] | None = None) -> tuple:
    """The tab's figures for question set `name` (the learner's rows on top), each with its caption:
    (accuracy, caption, recall, caption, given retrieval, caption, aids, caption, reliability,
    caption, the cue's precision and recall)."""
    rows, meta = _rows(name)
    extra = _mine(mine) if name == "qa_dev" else None
    ks = sorted({int(x) for x in rows["k"].dropna()}) or [5]
    k = 5 if 5 in ks else ks[0]
    held = fig.load_rows(HELDOUT) if HELDOUT.is_file() else None
    held_meta = fig.load_meta(HELDOUT) if HELDOUT.is_file() else {}
    reliability = fig.reliability(held) if held is not None else fig.reliability(rows.iloc[0:0])
    cues = (fig.cue_quality(held) if held is not None
            else pd.DataFrame(columns=["preset", "mode", "answers", "flagged", "wrong", "precision", "recall"]))
    given, given_meta = _rows(GIVEN_SET, GIVEN_SET)  # all its report questions: retrieval finds and misses
    curve = load_curve(CURVE)
    return (fig.accuracy_vs_k(rows, metric, extra=extra), _caption(meta, rows),
            fig.recall_vs_k(rows, extra=extra), _caption(meta, rows, retrieval=True),
            fig.accuracy_given_retrieval(given, k=k), _caption(given_meta, given),
            fig.plain_vs_aided(rows, k=k), _caption(meta, rows),
            reliability, _caption(held_meta), training_curve(curve), _curve_caption(),
            cues)


def _curve_caption() -> str:
    """Under the training curve: what trained, on what, where and how (assets/trained/meta.json)."""
    meta_path = CURVE.with_name("meta.json")
    if not meta_path.is_file():
        return '<div class="rag-fig-caption">No trained weights ship with this copy: python -m rag_demo train.</div>'
    import json

    stages = json.loads(meta_path.read_text(encoding="utf-8")).get("stages", {})
    parts = []
    for s in stages.values():
        kinds = s["data"]["examples"]
        real = kinds.get("external", 0)
        made = f" and {sum(kinds.values()) - real} made from the corpus" if len(kinds) > 1 else ""
        rerun = " then ".join(c for c in ((s.get("prepared_by") or {}).get("command"), s["command"]) if c)
        parts.append(f"{s['stage']}: {s['data']['trained_on']} examples ({real} labelled questions of the external "
                     f"files' train split{made}), {s['precision']}, "
                     f"{s['seconds_training_all_processes'] / 60:.0f} min on {s['device']}, {s['finished']}. "
                     f"Rerun: {rerun}")
    return f'<div class="rag-fig-caption">{esc(" ".join(parts))}</div>'


class ResultsHandlers:
    """The Results tab's events: draw the shipped figures, run and stop a learner's sweep."""

    def __init__(self, pool: Any, serving: Any, default_stack: str = "offline") -> None:
        self.pool, self.serving, self.default_stack = pool, serving, default_stack
        self._running: dict[str, threading.Event] = {}  # a visitor's sweep -> its stop flag
        self._lock = threading.Lock()

    def draw(self, name: str, metric: str, mine: list[dict] | None):
        return draw(name if name in SETS else "qa_open_vital", metric if metric in fig.METRICS else "em", mine)

    def plan(self, pipe: Any, n: Any, ks: Any, modes: Any, preset: Any, retriever: Any) -> tuple[Any, list, float]:
        """(the grid, its questions, its estimated seconds), or a ValueError saying what to change."""
        from rag_demo.measure.sweep import (
            Grid,  # the sweep reads indexes: torch, loaded once the models are
        )

        try:
            n = int(n)
        except (TypeError, ValueError):
            raise ValueError(f"questions={n!r} is not a number: choose 1 to {SWEEP_MAX_QUESTIONS}.") from None
        if not 1 <= n <= SWEEP_MAX_QUESTIONS:
            raise ValueError(f"questions={n} is out of range: choose 1 to {SWEEP_MAX_QUESTIONS}.")
        if not isinstance(ks, (list, tuple)) or not ks:
            raise ValueError("no K chosen: tick at least one number of passages.")
        if not isinstance(modes, (list, tuple)) or not modes:
            raise ValueError("no mode chosen: tick at least one of RAG-Sequence, RAG-Token and closed-book.")
        ks = tuple(sorted(int(k) for k in ks))
        if max(ks) > len(pipe.index):
            raise ValueError(f"K={max(ks)} is more than the {len(pipe.index)} passages of this corpus: choose smaller K.")
        grid = Grid(ks=ks, modes=tuple(m for m in MODES if m in modes), presets=(str(preset),),
                    retrievers=(str(retriever),), recall_retrievers=(str(retriever),))
        items = sample_items(read_qa(DEV_QA).items, n)
        per_k = self.per_question(pipe, grid)
        seconds = n * sum(per_k.values())
        limit = getattr(getattr(self.serving, "budget", None), "max_sweep_seconds", None)
        if limit is not None and seconds > limit:
            answers = n * grid.answers_per_question()
            raise ValueError(f"This sweep ({n} questions x {len(ks)} values of K x {len(grid.modes)} mode(s): "
                             f"{answers} answers) would take about {duration(seconds)} on this server now, over its "
                             f"{duration(limit)} for a sweep. {fits(per_k, n, limit)}")
        return grid, items, seconds

    @staticmethod
    def per_question(pipe: Any, grid: Any) -> dict[Any, float]:
        """Seconds one question of the grid is expected to take, by K (closed-book under None), as
        answers usually run on this machine now (`RagPipeline.expect`: the shipped cost fit, scaled by
        the speed of its recent answers), not the worst case a single request is admitted by."""
        s = grid.settings(grid.presets[0])
        rag = [m for m in grid.modes if m != "closed-book"]
        out: dict[Any, float] = {k: sum(pipe.expect(TYPICAL_QUESTION, rag, s.merged(k=k)).values()) for k in grid.ks} \
            if rag else {}
        if "closed-book" in grid.modes:
            out[None] = sum(pipe.expect(TYPICAL_QUESTION, ["closed-book"], s.merged(k=min(grid.ks))).values())
        return out

    def stop(self, request: gr.Request = None):
        """Stop this visitor's sweep after the answer being computed; with none running, say so at once."""
        flag = self._running.get(getattr(request, "session_hash", None) or "")
        if flag is None:
            return '<div class="rag-sweep-status" data-state="idle">No sweep of yours is running.</div>'
        flag.set()
        return '<div class="rag-sweep-status" data-state="stopping">Stopping after the answer being computed ...</div>'

    @page_event
    def run(self, n, ks, modes, preset, retriever, metric, mine, s, request: gr.Request = None,
            progress=gr.Progress()) -> Iterator[tuple]:
        """A learner's sweep: (status, accuracy figure, recall figure, the learner's rows, set picker)
        after each answer; refused at once, saying what to lower, when over the budget."""
        key = getattr(request, "session_hash", None) or ""
        s = s if isinstance(s, Session) else Session(stack=self.default_stack)
        try:
            pipe, _ = session_pipeline(self.pool, Session(stack=s.stack))
            grid, items, seconds = self.plan(pipe, n, ks, modes, preset, retriever)
        except ValueError as e:  # refused: said in the sweep's own status, nothing runs
            yield (f'<div class="rag-sweep-status" data-state="refused">Not run: {esc(e)}</div>', gr.skip(), gr.skip(),
                   gr.skip(), gr.skip())
            return
        stop = threading.Event()
        with self._lock:
            if key in self._running:
                raise gr.Error("Your sweep is still running: stop it first.", print_exception=False)
            self._running[key] = stop
        from rag_demo.measure.sweep import sweep

        rows: list[dict] = []
        try:
            with self.serving.sweep_slot() if self.serving is not None else _nothing():
                run = (self.serving.background_run(request, stop.is_set) if self.serving is not None else None)
                total = len(items) * grid.answers_per_question()
                done, t0 = 0, time.monotonic()
                yield self._update(rows, done, total, t0, seconds, metric)
                for row in sweep(pipe, items, grid, qa="qa_dev", run=run):
                    rows.append(row)
                    if row["mode"] == "retrieval":
                        continue
                    done += 1
                    progress((done, total), desc="Your sweep", unit="answers")
                    yield self._update(rows, done, total, t0, seconds, metric)
        except ValueError as e:
            raise gr.Error(str(e), print_exception=False) from None
        finally:
            with self._lock:
                self._running.pop(key, None)
            memory.trim()  # the sweep's freed buffers back to the OS, as after every request
        yield self._update(rows, done, total, t0, seconds, metric, finished=not stop.is_set(), stopped=stop.is_set())

    def _update(self, rows, done, total, t0, estimate, metric, finished=False, stopped=False) -> tuple:
        elapsed = time.monotonic() - t0
        eta = elapsed / done * (total - done) if done else estimate
        state = ("stopped" if stopped else "done" if finished else "running")
        what = (f"Stopped after {done} of {total} answers." if stopped else
                f"Done: {total} answers in {fmt_seconds(elapsed)}." if finished else
                f"{done} of {total} answers, about {fmt_seconds(eta)} left.")
        status = (f'<div class="rag-sweep-status" data-state="{state}" data-done="{done}" data-total="{total}">'
                  f'<progress value="{done}" max="{max(total, 1)}"></progress> {esc(what)} Your points are the '
                  "hollow diamonds on the first two figures.</div>")
        extra = _mine(rows)
        rows_all, _ = _rows("qa_dev")
        return (status, fig.accuracy_vs_k(rows_all, metric if metric in fig.METRICS else "em", extra=extra),
                fig.recall_vs_k(rows_all, extra=extra), rows, "qa_dev")


def duration(s: float) -> str:
    """Seconds as a learner reads a sweep's length: "40 s", "12 min"."""
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


def fits(per_k: dict[Any, float], n: int, limit: float) -> str:
    """Settings of the same sweep that would fit in `limit` seconds: fewer questions, else fewer values of K."""
    per_q = sum(per_k.values())
    most = int(limit // per_q) if per_q > 0 else n
    if most >= 1:
        return f"It fits with {most} question{'s' if most > 1 else ''} or fewer (about {duration(most * per_q)})."
    ks = sorted((k for k in per_k if k is not None), key=lambda k: per_k[k])
    cheapest = next((k for k in ks if per_k[k] + per_k.get(None, 0.0) <= limit), None)
    return (f"Even one question is over it: choose K = {cheapest} alone, or one mode." if cheapest is not None else
            "Even one question is over it: choose one small K and one mode.")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def results_tab(rh: ResultsHandlers) -> dict[str, Any]:
    """The tab's layout (inside a `gr.Tab`); -> its components by name and its handlers ("handlers"),
    for the wiring."""
    first = draw("qa_open_vital", "em")
    c: dict[str, Any] = {"handlers": rh}
    gr.Markdown(
        "The paper teaches with numbers over many questions. These figures come from sweeps that ship with the demo "
        "(one row per question and setting); under each figure: the questions, the CPU, the date and the command "
        "that reproduces it. Hover a point for its numbers. Below, run a small sweep yourself.",
        elem_id="rag-results-intro")
    with gr.Row():
        c["set"] = gr.Dropdown(choices=[(v, k) for k, v in SETS.items()], value="qa_open_vital", label="Question set",
                               elem_id="rag-results-set", scale=3)
        c["metric"] = gr.Radio(choices=[(v, k) for k, v in fig.METRICS.items()], value="em", label="Accuracy as",
                               elem_id="rag-results-metric", scale=2)
    names = ("accuracy_vs_k", "recall_vs_k", "accuracy_given_retrieval", "plain_vs_aided", "reliability",
             "training_curve")
    plots, caps = [], []
    for i, name in enumerate(names):
        with gr.Column(elem_classes=["rag-fig"], elem_id=f"rag-fig-{name}"):
            gr.Markdown(LESSONS[name], elem_classes=["rag-fig-lesson"])
            plots.append(gr.Plot(first[2 * i], show_label=False, elem_id=f"rag-plot-{name}"))
            caps.append(gr.HTML(first[2 * i + 1], elem_classes=["rag-fig-cap"]))
    c["cues"] = gr.Dataframe(first[-1], label="The 'probably wrong' cue on the report split (questions it was never "
                             "fitted on): how many answers it flags, its precision (flagged answers that were wrong) "
                             "and recall (wrong answers it flagged)", interactive=False, elem_id="rag-results-cues")
    c["plots"], c["captions"] = plots, caps
    with gr.Accordion("Run it yourself: a small sweep on the dev questions", open=True, elem_id="rag-sweep"):
        gr.Markdown("Pick a few questions and values of K and run them through the same engine: your points appear "
                    "on the first two figures as they come in. Your answers run at low priority, so other visitors' "
                    "questions go first at every step; one sweep runs at a time on this server.")
        with gr.Row():
            c["n"] = gr.Slider(1, SWEEP_MAX_QUESTIONS, value=10, step=1, label="Questions (a fixed sample of the dev set)",
                               elem_id="rag-sweep-n")
            c["ks"] = gr.CheckboxGroup([str(k) for k in SWEEP_KS], value=["1", "5"], label="Passages K",
                                       elem_id="rag-sweep-ks")
        with gr.Row():
            c["modes"] = gr.CheckboxGroup([(MODE_TITLES[m], m) for m in MODES], value=["token"], label="Modes",
                                          elem_id="rag-sweep-modes")
            c["preset"] = gr.Radio([(t, p) for p, t in PRESETS.items()], value="aided", label="Preset",
                                   elem_id="rag-sweep-preset")
            c["retriever"] = gr.Radio(list(KNOBS["retriever"].choices), value="dense", label=KNOBS["retriever"].label,
                                      elem_id="rag-sweep-retriever")
        with gr.Row():
            c["run"] = gr.Button("Run my sweep", variant="primary", elem_id="rag-sweep-run")
            c["stop"] = gr.Button("Stop", variant="stop", elem_id="rag-sweep-stop")
        c["status"] = gr.HTML('<div class="rag-sweep-status" data-state="idle"></div>', elem_id="rag-sweep-status")
    c["mine"] = gr.State([])
    return c


def wire(c: dict[str, Any], session: Any, model: dict) -> None:
    """The tab's events (`c`: what results_tab returned): redraw on a change of question set or
    metric; run and stop a sweep."""
    rh = c["handlers"]
    outs = [x for pair in zip(c["plots"], c["captions"]) for x in pair] + [c["cues"]]
    gr.on([c["set"].input, c["metric"].input], rh.draw, inputs=[c["set"], c["metric"], c["mine"]], outputs=outs,
          queue=False, show_progress="hidden", api_visibility="private")
    c["run"].click(rh.run, inputs=[c["n"], c["ks"], c["modes"], c["preset"], c["retriever"], c["metric"], c["mine"],
                                   session],
                   outputs=[c["status"], c["plots"][0], c["plots"][1], c["mine"], c["set"]], api_name="sweep",
                   show_progress="minimal", **model)
    c["stop"].click(rh.stop, outputs=[c["status"]], queue=False, api_visibility="private")
