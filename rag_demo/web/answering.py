"""Answering for the page: a question's answers streamed as the pipeline decodes them (progress
from what is done), a passage taken away, one mode answered again in full, and the outputs each
of those fills on the page. Handlers (handlers.py) call these; they import no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from rag_demo.config import MODE_TITLES, MODES, RagSettings, check_question
from rag_demo.serving.admission import Serving, throttled, within_defaults
from rag_demo.serving.session import Session
from rag_demo.runs import Run
from rag_demo.web.passages_view import anchors, render_passages
from rag_demo.web.render import json_safe, plural, render_answer, render_partial
from rag_demo.web.session_view import passage_choices, render_lessons
from rag_demo.web.validation import (
    check_last_answers, settings_of, user_errors,
)

TYPICAL_QUESTION = "Who painted The Starry Night?"

def fit_k(pipe: Any, index: Any, settings: RagSettings) -> tuple[RagSettings, int | None]:
    """(settings with K at most the corpus size, the K asked for when it was reduced)."""
    n = len(index)
    return (settings.merged(k=n), settings.decoding.k) if settings.decoding.k > n else (settings, None)


def answering(pipe: Any, question: str, settings: RagSettings, progress=None, *, s: Session | None = None,
               serving: Serving | None = None, request: Any = None, partials: bool = True,
               cancelled: Callable[[], bool] | None = None) -> Iterator[tuple[str, Any]]:
    """The three answers, from one `answer_modes` call: yields ("partial", {mode: its answer so far,
    or its final Answer.to_dict() with "final": True}) at most ~10 times a second while they grow
    (with `partials`; a card is final as soon as its mode is done), then ("done", (result, session)):
    result the JSON-able {"question", "stack", "corpus", "settings", "answers": {mode: Answer.to_dict()}},
    the visitor's state remembering the warnings it has seen.

    Refused before anything runs when over the budget (the estimate is the one the validator
    priced); otherwise each mode runs within its share of the time limit, at the priority its cost
    gives it, its model steps through the shared gate. An expensive request is refused while
    `serving.max_heavy` others run. Closing this iterator, or `cancelled()` turning True, stops the
    decoding at its next step."""
    with user_errors():
        q = check_question(question)
    settings, asked_k = fit_k(pipe, pipe.index, settings)
    if asked_k is not None:
        n, key = settings.decoding.k, f"k-reduced:{pipe.stack.name}:{pipe.index.corpus.name}:{settings.decoding.k}"
        if s is None or key not in s.warned:
            gr.Warning(f"This corpus has only {plural(n, 'passage')}: using K = {n} instead of {asked_k}.")
            if s is not None:
                s = dataclasses.replace(s, warned=s.warned | {key})
    with user_errors():
        cost = serving.check(pipe, q, settings) if serving else None
    if serving:
        run = serving.run(cost, request, cancelled)
    else:
        run = Run(cancelled=cancelled)
    answers: dict[str, dict] = {}

    def step() -> None:  # what is done, not which mode runs next: the pipeline orders the modes
        if progress and len(answers) < len(MODES):
            done = "".join(f", {MODE_TITLES[m]} done" for m in MODES if m in answers)
            progress(len(answers) / len(MODES), desc=f"Answering in {len(MODES)} modes{done}")

    with user_errors(), (serving.heavy_slot(cost) if serving else contextlib.nullcontext()):
        # one call for the three modes: RAG-Sequence and RAG-Token share the retrieval, the prefill
        # of the K prompts and each passage's drafts (docs/DESIGN.md §5)
        step()
        events = pipe.answer_modes(q, list(MODES), settings, run, partials=partials)
        for latest in throttled(events):
            for mode, a in latest.items():
                if not isinstance(a, dict) and mode not in answers:  # this mode's final Answer
                    answers[mode] = json_safe(a.to_dict())
                    step()
            if partials:
                yield "partial", {m: {**answers[m], "final": True} if m in answers else a for m, a in latest.items()}
    yield "done", ({"question": q, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                    "weights": weights_of(pipe), "settings": settings.to_dict(),
                    "answers": {m: answers[m] for m in MODES if m in answers}}, s)


def weights_of(pipe: Any) -> dict | None:
    """Which weights answered (models/weights.Weights as a dict: the GGUF file and fingerprint or the
    Hub id, the trained delta's hash, whether they are the measured ones); None where unknown."""
    w = getattr(pipe.stack, "weights", None)
    return w.to_dict() if w is not None else None


def answer_all(pipe: Any, question: str, settings: RagSettings, progress=None, **kw) -> tuple[dict, Session | None]:
    """`answering` without the partial answers: (result, session) once every answer is done."""
    return next(v for kind, v in answering(pipe, question, settings, progress, partials=False, **kw) if kind == "done")


def without_plan(pipe: Any, raw: dict | None, pid: Any) -> list[tuple[list[str], list, list[float], list[dict], int]]:
    """What taking passage `pid` away runs: per group of RAG modes that read the same passages,
    (modes, the passages left, their scores, the passages they read, pid's position among them).
    ValueError (shown on the page) when there is nothing to compare or the passages are gone."""
    if not raw or not raw.get("answers"):
        raise ValueError("there is no answer yet: ask a question, then take one of its passages away.")
    raw = check_last_answers(raw)
    weights = settings_of(raw).decoding.weights
    by_ids: dict[tuple[str, ...], list[str]] = {}
    for m, a in raw["answers"].items():
        if m != "closed-book" and any(d["id"] == pid for d in a["docs"]):
            by_ids.setdefault(tuple(d["id"] for d in a["docs"]), []).append(m)
    if not by_ids:
        raise ValueError(f"passage {pid!r} is not among the last answer's passages: ask again, then choose one of them.")
    corpus, plan = pipe.index.corpus, []
    for ids, modes in by_ids.items():
        docs = raw["answers"][modes[0]]["docs"]
        if len(docs) < 2:
            raise ValueError("the last answer read only one passage: with it taken away nothing is left (raise K).")
        keep = [d for d in docs if d["id"] != pid]
        try:
            passages = [corpus.passages[corpus.position(d["id"])] for d in keep]
        except (KeyError, ValueError):
            raise ValueError("the corpus changed since this answer: ask again, then take a passage away.") from None
        # the retriever's own scores of the passages left (what the client sent is never read)
        scores = [float(x) for x in pipe.passage_scores(raw["question"], modes[0], passages, weights)]
        plan.append((modes, passages, scores, docs, next(i for i, d in enumerate(docs) if d["id"] == pid)))
    return plan


def server_numbers(answers: dict[str, dict]) -> tuple:
    """Session.last_numbers of answers this server just computed: per RAG mode its passages' ids,
    each passage's drop and the posterior p(z|x,y) (None where the mode has none)."""
    out = []
    for m, a in answers.items():
        if m == "closed-book" or not a.get("docs"):
            continue
        post = a.get("doc_posterior")
        out.append((m, tuple(d["id"] for d in a["docs"]), tuple(a.get("passage_drop") or [None] * len(a["docs"])),
                    None if post is None else tuple(post)))
    return tuple(out)


def price_groups(serving: Serving, pipe: Any, question: str, settings: RagSettings, plan: list) -> Any:
    """One Cost for every passage group of a plan: each group priced over its own passages and
    admitted as a question is, then their seconds added up and checked against the budget as one
    request (ValueError naming the total and what to lower)."""
    costs = [serving.check(pipe, question, settings, modes, passages) for modes, passages, *_ in plan]
    if any(c is None for c in costs):
        return None
    total = type(costs[0])(seconds=sum(c.seconds for c in costs), peak_bytes=max(c.peak_bytes for c in costs),
                           per_mode={m: s for c in costs for m, s in c.per_mode.items()},
                           heavy=any(c.heavy for c in costs))
    limit = getattr(serving.budget, "max_seconds", None)
    if limit is not None and len(costs) > 1 and total.seconds > limit and not all(
            within_defaults(pipe, question, settings, c) for c in costs):
        raise ValueError(f"answering again without the passage would take {total.describe()} over its "
                         f"{len(costs)} passage groups, over this server's {limit:.0f} s: lower K, beams or max new "
                         "tokens and ask again.")
    return total


def answer_without(pipe: Any, raw: dict | None, pid: Any, run: Any = None, serving: Serving | None = None,
                   request: Any = None, cancelled: Callable[[], bool] | None = None,
                   numbers: tuple = ()) -> dict:
    """Answer the last question again in each RAG mode that read passage `pid`, without it, with
    the same settings (`raw` is the last answer's JSON, as the page holds it: its question,
    settings, passage ids and texts are read, never its numbers); -> the dict `render_without`
    shows. Priced over every passage group's passages left and admitted by `serving` as a question
    is (refused over the budget; an expensive one takes the heavy slot); `cancelled()` (Stop) ends
    it at its next step. `numbers`: Session.last_numbers, what this server computed for the last
    answers; a mode whose passages are not those gets no drop and no attribution note.
    ValueError (shown on the page) when there is no answer to compare."""
    plan = without_plan(pipe, raw, pid)
    settings = settings_of(raw)
    cost = None
    if serving is not None:
        cost = price_groups(serving, pipe, raw["question"], settings, plan)
        run = serving.run(cost, request, cancelled)
    elif run is None and cancelled is not None:
        run = Run(cancelled=cancelled)
    ours = {m: (ids, drops, post) for m, ids, drops, post in numbers}
    out, dropped, k = {}, None, 0
    with serving.heavy_slot(cost) if serving is not None else contextlib.nullcontext():
        for modes, passages, scores, docs, z in plan:
            new = pipe.answer_from_modes(raw["question"], modes, passages, scores, settings, run=run)
            dropped, k = docs[z], len(docs)
            for m in modes:
                ids, drops, post = ours.get(m, ((), (), None))
                mine = ids == tuple(d["id"] for d in docs)
                x = {"before": raw["answers"][m]["text"], "after": new[m].text, "drop": None, "top": None,
                     "most": None, "stopped": new[m].stopped, "answer": new[m].to_dict()}
                if mine:
                    top = max(range(len(docs)), key=(post or [d["prior"] for d in docs]).__getitem__)
                    most = max(range(len(docs)), key=lambda i: -math.inf if drops[i] is None else drops[i])
                    x.update(drop=drops[z], top={"rank": docs[top]["rank"], "title": docs[top]["title"]},
                             most={"rank": docs[most]["rank"], "title": docs[most]["title"], "drop": drops[most] or 0.0})
                out[m] = x
    return {"question": raw["question"], "dropped": dropped, "k": k,
            "modes": {m: out[m] for m in ("sequence", "token") if m in out}}


def stop_button(running: bool) -> Any:
    """The Stop button: shown while this visitor's question runs."""
    return gr.Button(visible=running)


def again_passages(pipe: Any, raw: dict, mode: str) -> tuple[list, list[float]] | None:
    """The passages `mode`'s card read and the retriever's scores of them (None for closed-book),
    for answering it again."""
    if mode == "closed-book":
        return None
    raw = check_last_answers(raw)
    corpus, docs = pipe.index.corpus, raw["answers"][mode]["docs"]
    try:
        passages = [corpus.passages[corpus.position(d["id"])] for d in docs]
    except (KeyError, ValueError):
        raise ValueError("the corpus changed since this answer: ask again.") from None
    weights = settings_of(raw).decoding.weights  # the retriever's own scores, never the client's
    return passages, [float(x) for x in pipe.passage_scores(raw["question"], mode, passages, weights)]


def answer_again(pipe: Any, raw: dict, mode: str, settings: RagSettings, run: Any, serving: Serving | None = None,
                 request: Any = None, cancelled: Callable[[], bool] | None = None) -> Any:
    """`mode`'s answer to the last question again: over the same passages and scores for a RAG
    mode (the card's own), with no passage for closed-book; priced and admitted by `serving` as
    a question is, with the whole time limit for this one mode."""
    given = again_passages(pipe, raw, mode)
    if serving is not None:
        cost = serving.check(pipe, raw["question"], settings, [mode], None if given is None else given[0])
        run = serving.run(cost, request, cancelled)
        with serving.heavy_slot(cost):
            return answer_again(pipe, raw, mode, settings, run)
    if given is None:
        return pipe.answer(raw["question"], mode, settings, run)
    return pipe.answer_from(raw["question"], mode, given[0], given[1], settings, run=run)


def ask_outputs(result: dict, s: Session) -> tuple:
    """(3 answer cards, passages, raw JSON, edit-passage choices, edit text, edit title, the Stop
    button hidden, session)."""
    answers = result["answers"]
    anc = anchors(answers)
    docs = next((a["docs"] for a in answers.values() if a["docs"]), [])
    s = dataclasses.replace(s, last_docs=tuple((d["id"], d["title"], d["text"]) for d in docs),
                            last_numbers=server_numbers(answers))
    choices = passage_choices(s)
    return (
        *(render_answer(answers[m], anc.get(m, "rag-p-all-")) for m in MODES),
        render_passages(answers, s.edits),
        result,
        gr.Dropdown(choices=choices, value=choices[0][1] if choices else None),
        docs[0]["text"] if docs else "",
        docs[0]["title"] if docs else "",
        stop_button(False),
        s,
    )


def partial_outputs(latest: dict[str, dict]) -> tuple:
    """The ask outputs while answers grow: the three cards and the Stop button, the rest as it is. A
    finished card has no "answer in full" button yet: it comes with the run's final outputs."""
    skip = gr.skip()
    cards = (render_answer(a, continuable=False) if a and a.get("final") else render_partial(a, m) for m, a in
             ((m, latest.get(m)) for m in MODES))
    return (skip, *cards, skip, skip, skip, skip, skip, stop_button(True), skip)


def empty_outputs(s: Session) -> tuple:
    """The same outputs, cleared (after the corpus or the stack changed)."""
    return (
        *(render_answer(None, mode=m) for m in MODES),
        render_passages({}),
        None,
        gr.Dropdown(choices=[], value=None),
        "",
        "",
        stop_button(False),
        dataclasses.replace(s, last_docs=(), last_numbers=()),
    )


def examples_html(index: Any) -> str:
    """The Ask tab's lessons for the index's corpus."""
    return render_lessons(index.corpus)
