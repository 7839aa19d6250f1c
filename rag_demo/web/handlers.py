"""The page's event handlers: every button and API endpoint of the app calls one `Handlers` method.

Owns what a click does (answers streamed as they are decoded, uploads, edits, a passage taken
away) and the named API endpoints (`/ask`, `/ask_stream`). The handlers call the library and
render its dicts (render.py); they recompute no math and import no torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from rag_demo.config import KNOBS, MODE_TITLES, MODES, PRESET_OF_STACK, STACKS, RagSettings, check_question
from rag_demo.serving import memory
from rag_demo.serving.admission import Serving, throttled
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import Session, embed_corpus, active_index, session_pipeline
from rag_demo.web.render import (
    json_safe,
    anchors,
    esc,
    fmt_seconds,
    plural,
    render_answer,
    render_partial,
    render_passages,
)
from rag_demo.web.reproduce import caveat, cli_command, client_code
from rag_demo.web.session_view import corpus_choices, passage_choices, render_lessons, render_status, stack_choices
from rag_demo.web.validation import (
    checked_settings,
    check_last_answers,
    check_passage_chosen,
    check_upload,
    logs_refusals,
    refusal,
    settings_from_inputs,
    user_errors,
    validate_ask,
    validate_edit,
    wrong,
)

# /ask's arguments after the question, in their positional order: the order earlier clients call
# with, then the preset, then every other knob in its declaration order (rag_demo/config.py), and
# last the arguments added since (so that no earlier positional call changes meaning)
_FIRST = ("k", "num_beams", "max_new_tokens", "sequence_decoding", "stack", "answer_style", "prior_temperature",
          "passage_sentences", "question_position", "extractive", "question_weight", "worked_examples", "echo_retries")
_LAST = ("retriever", "corpus")
API_ARGUMENTS = (*_FIRST, "preset", *(n for n in KNOBS if n not in _FIRST and n not in _LAST), *_LAST)
_TYPES = {"int": int, "float": float, "bool": bool, "choice": str}


def api_help(name: str) -> str:
    """One /ask argument's description in the API page and the MCP tool: a knob's own help, range
    and both presets' values (rag_demo/config.py); the others' here."""
    if name == "question":
        return "The question, in English, one or two sentences (up to 1,000 characters)."
    if name == "stack":
        return f"Which models answer: {' or '.join(STACKS)} (default offline: MiniLM and SmolLM2-135M, no download)."
    if name == "preset":
        return ("paper (the paper's algorithm, every reader aid off) or aided (the reader aids for a small model); "
                "default: the stack's (offline aided, paper paper). Every knob left out takes the preset's value.")
    if name == "corpus":
        return ("Which built-in corpus the passages come from: builtin (the stack's own: Wikipedia Vital Articles "
                "unless the server was started with other documents) or factbook (the CIA World Factbook).")
    spec = KNOBS[name]
    values = (", ".join(spec.choices) if spec.kind == "choice" else "true or false" if spec.kind == "bool"
              else f"{spec.lo:g} to {spec.hi:g}")
    default = f"{spec.aided}" if spec.aided == spec.paper else f"aided {spec.aided}, paper {spec.paper}"
    return f"{spec.label}: {spec.help} {values} (default {default})."


def _api_signature(returns: Any) -> inspect.Signature:
    """/ask's signature, generated from the knobs: (self, question, ...API_ARGUMENTS, request); a knob
    left out (None) takes the preset's value, the preset the stack's (offline: aided, paper: paper)."""
    P = inspect.Parameter
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("question", P.POSITIONAL_OR_KEYWORD, annotation=str)]
    for name in API_ARGUMENTS:
        if name == "stack":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default="offline", annotation=str))
        elif name == "corpus":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default="builtin", annotation=str))
        elif name == "preset":
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=None, annotation=str | None))
        else:
            params.append(P(name, P.POSITIONAL_OR_KEYWORD, default=None, annotation=_TYPES[KNOBS[name].kind] | None))
    params.append(P("request", P.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request))
    return inspect.Signature(params, return_annotation=returns)


def describe_api(dependency: Any, blocks: Any) -> None:
    """Give each argument of an endpoint made by `gr.api` over an `_api` method its help text in the
    API page (gradio reads a parameter's description from its Api component's schema, key
    "additional_description"; checked by tests/test_ui.py). The MCP tool reads the docstring's
    "Args:" section, which `_api` writes."""
    fn = blocks.fns[dependency["id"]]
    names = ["question", *API_ARGUMENTS]
    for comp, name in zip(fn.inputs, names):
        comp._api_info = {**comp.api_info(), "additional_description": api_help(name)}


def _base_url(request: Any) -> str:
    """The address this visitor reached the app at (a proxy's scheme and host when there is one)."""
    headers = getattr(request, "headers", None) or {}
    host = headers.get("x-forwarded-host") or headers.get("host") or "127.0.0.1:7860"
    scheme = headers.get("x-forwarded-proto") or "http"
    return f"{scheme}://{host}/"


def page_event(fn: Callable) -> Callable:
    """Mark a handler as the page's own event: callable through the API like any endpoint, but not
    an MCP tool. gradio's MCP server lists only the endpoints whose function has no `_mcp_type` or
    has "tool" (gradio.mcp; checked by tests/test_ui.py): agents get /ask and /ask_stream."""
    fn._mcp_type = "page"
    return fn


def _api(returns: Any) -> Callable[[Callable], Callable]:
    """Give an endpoint method /ask's generated parameters (gr.api reads an endpoint's parameters,
    defaults and types from its signature and type hints) and an "Args:" section describing each
    (what gradio's MCP server reads); the method binds its *args / **kwargs with that signature itself."""
    def declare(fn: Callable) -> Callable:
        fn.__signature__ = _api_signature(returns)
        fn.__annotations__ = {p.name: p.annotation for p in fn.__signature__.parameters.values()
                              if p.annotation is not inspect.Parameter.empty} | {"return": returns}
        fn.__doc__ = (inspect.cleandoc(fn.__doc__ or "") + "\n\nArgs:\n"
                      + "\n".join(f"    {n}: {api_help(n)}" for n in ("question", *API_ARGUMENTS)))
        return fn
    return declare

# The question the settings' cost estimate is computed for (a typical one-sentence question).
TYPICAL_QUESTION = "Who painted The Starry Night?"

def _fit_k(pipe: Any, index: Any, settings: RagSettings) -> tuple[RagSettings, int | None]:
    """(settings with K at most the corpus size, the K asked for when it was reduced)."""
    n = len(index)
    return (settings.merged(k=n), settings.decoding.k) if settings.decoding.k > n else (settings, None)


def _answering(pipe: Any, question: str, settings: RagSettings, progress=None, *, s: Session | None = None,
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
    settings, asked_k = _fit_k(pipe, pipe.index, settings)
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
        from rag_demo.pipeline import Run

        run = Run(cancelled=cancelled)
    answers: dict[str, dict] = {}

    def step() -> None:  # what is done, not which mode runs next: the pipeline orders the modes
        if progress and len(answers) < len(MODES):
            done = "".join(f", {MODE_TITLES[m]} done" for m in MODES if m in answers)
            progress(len(answers) / len(MODES), desc=f"Answering in {len(MODES)} modes{done}")

    with user_errors(), (serving.heavy_slot(cost) if serving else contextlib.nullcontext()):
        try:
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
        finally:
            memory.trim()  # give the request's freed buffers back to the OS (rag_demo/serving/memory.py)
    yield "done", ({"question": q, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                    "settings": settings.to_dict(), "answers": {m: answers[m] for m in MODES if m in answers}}, s)


def _answer_all(pipe: Any, question: str, settings: RagSettings, progress=None, **kw) -> tuple[dict, Session | None]:
    """`_answering` without the partial answers: (result, session) once every answer is done."""
    return next(v for kind, v in _answering(pipe, question, settings, progress, partials=False, **kw) if kind == "done")


def _answer_without(pipe: Any, raw: dict | None, pid: Any, run: Any = None) -> dict:
    """Answer the last question again in each RAG mode that read passage `pid`, without it, with
    the same settings (`raw` is the last answer's JSON, as the page holds it); -> the dict
    `render_without` shows. ValueError (shown on the page) when there is no answer to compare."""
    if not raw or not raw.get("answers"):
        raise ValueError("there is no answer yet: ask a question, then take one of its passages away.")
    settings = RagSettings(preset=raw["settings"].get("preset", "aided"),
                           **{n: v for n, v in raw["settings"].items() if n in KNOBS})
    by_ids: dict[tuple[str, ...], list[str]] = {}
    for m, a in raw["answers"].items():
        if m != "closed-book" and any(d["id"] == pid for d in a["docs"]):
            by_ids.setdefault(tuple(d["id"] for d in a["docs"]), []).append(m)
    if not by_ids:
        raise ValueError(f"passage {pid!r} is not among the last answer's passages: ask again, then choose one of them.")
    corpus, out, dropped, k = pipe.index.corpus, {}, None, 0
    for ids, modes in by_ids.items():
        docs = raw["answers"][modes[0]]["docs"]
        if len(docs) < 2:
            raise ValueError("the last answer read only one passage: with it taken away nothing is left (raise K).")
        keep = [d for d in docs if d["id"] != pid]
        try:
            passages = [corpus.passages[corpus.position(d["id"])] for d in keep]
        except (KeyError, ValueError):
            raise ValueError("the corpus changed since this answer: ask again, then take a passage away.") from None
        new = pipe.answer_from_modes(raw["question"], modes, passages, [d["score"] for d in keep], settings,
                                     run=run)
        z = next(i for i, d in enumerate(docs) if d["id"] == pid)
        dropped, k = docs[z], len(docs)
        for m in modes:
            a = raw["answers"][m]
            drops = a.get("passage_drop") or [None] * len(docs)
            post = a.get("doc_posterior") or [d["prior"] for d in docs]
            top = max(range(len(docs)), key=post.__getitem__)
            most = max(range(len(docs)), key=lambda i: -math.inf if drops[i] is None else drops[i])
            out[m] = {"before": a["text"], "after": new[m].text, "drop": drops[z],
                      "top": {"rank": docs[top]["rank"], "title": docs[top]["title"]},
                      "most": {"rank": docs[most]["rank"], "title": docs[most]["title"], "drop": drops[most] or 0.0},
                      "answer": new[m].to_dict()}
    return {"question": raw["question"], "dropped": dropped, "k": k,
            "modes": {m: out[m] for m in ("sequence", "token") if m in out}}


def _stop(running: bool) -> Any:
    """The Stop button: shown while this visitor's question runs."""
    return gr.Button(visible=running)


def _answer_again(pipe: Any, raw: dict, mode: str, settings: RagSettings, run: Any) -> Any:
    """`mode`'s answer to the last question again: over the same passages and scores for a RAG
    mode (the card's own), with no passage for closed-book."""
    if mode == "closed-book":
        return pipe.answer(raw["question"], mode, settings, run)
    corpus, docs = pipe.index.corpus, raw["answers"][mode]["docs"]
    try:
        passages = [corpus.passages[corpus.position(d["id"])] for d in docs]
    except (KeyError, ValueError):
        raise ValueError("the corpus changed since this answer: ask again.") from None
    return pipe.answer_from(raw["question"], mode, passages, [d["score"] for d in docs], settings, run=run)


def _ask_outputs(result: dict, s: Session) -> tuple:
    """(3 answer cards, passages, raw JSON, edit-passage choices, edit text, edit title, the Stop
    button hidden, session)."""
    answers = result["answers"]
    anc = anchors(answers)
    docs = next((a["docs"] for a in answers.values() if a["docs"]), [])
    s = dataclasses.replace(s, last_docs=tuple((d["id"], d["title"], d["text"]) for d in docs))
    choices = passage_choices(s)
    return (
        *(render_answer(answers[m], anc.get(m, "rag-p-all-")) for m in MODES),
        render_passages(answers, s.edits),
        result,
        gr.Dropdown(choices=choices, value=choices[0][1] if choices else None),
        docs[0]["text"] if docs else "",
        docs[0]["title"] if docs else "",
        _stop(False),
        s,
    )


def _partial_outputs(latest: dict[str, dict]) -> tuple:
    """The ask outputs while answers grow: the three cards and the Stop button, the rest as it is."""
    skip = gr.skip()
    cards = (render_answer(a) if a and a.get("final") else render_partial(a, m) for m, a in
             ((m, latest.get(m)) for m in MODES))
    return (skip, *cards, skip, skip, skip, skip, skip, _stop(True), skip)


def _empty_outputs(s: Session) -> tuple:
    """The same outputs, cleared (after the corpus or the stack changed)."""
    return (
        *(render_answer(None, mode=m) for m in MODES),
        render_passages({}),
        None,
        gr.Dropdown(choices=[], value=None),
        "",
        "",
        _stop(False),
        dataclasses.replace(s, last_docs=()),
    )


def _examples(index: Any) -> str:
    """The Ask tab's lessons for the index's corpus."""
    return render_lessons(index.corpus)


def render_budget(budget: Any) -> str:
    """What the server allows, in a sentence (under the cost estimate)."""
    if budget is None:
        return ""
    return (
        f'<div class="rag-note">This server refuses a question estimated above {budget.max_seconds:.0f} s or '
        f"{budget.max_request_bytes / 2**30:.1f} GB, stops any answer after {budget.time_limit_s:.0f} s, and runs "
        f"questions estimated above {budget.heavy_seconds:.0f} s at low priority (cheaper questions go first at "
        "every model step).</div>"
    )


def render_cost(cost: Any, refusal: str | None, budget: Any = None, expected: dict[str, float] | None = None) -> str:
    """The cost of one question with the current settings (all three answers): what it is expected
    to take (a typical answer, what is kept counted; each card shows it again beside the time its
    answer took) and the worst case the server's budget counts (every answer to max new tokens)."""
    per = " · ".join(f"{MODE_TITLES.get(m, m)} {fmt_seconds(t)}" for m, t in (cost.per_mode or {}).items())
    verdict = (f'<div class="rag-over">Over this server\'s limit, a question would be refused: {esc(refusal)}</div>'
               if refusal else '<div class="rag-note">Expensive: runs at low priority.</div>' if cost.heavy else "")
    typical = ""
    if expected:
        each = " · ".join(f"{MODE_TITLES.get(m, m)} {fmt_seconds(t)}" for m, t in expected.items())
        typical = (f'Expected for a typical question with these settings: <b data-expected="{sum(expected.values()):.3f}">'
                   f"{fmt_seconds(sum(expected.values()))}</b> ({esc(each)}). ")
    return (
        f'<div class="rag-cost" data-seconds="{cost.seconds:.3f}" data-heavy="{int(bool(cost.heavy))}" '
        f'data-refused="{int(bool(refusal))}">{typical}Worst case (every answer to max new tokens), what this '
        f"server's budget counts: <b>{esc(cost.describe())}</b>" + (f'<div class="rag-note">{esc(per)}</div>' if per else "")
        + verdict + render_budget(budget) + "</div>"
    )


@dataclasses.dataclass(frozen=True)
class Turn:
    """One visitor's run. superseded(): a newer question, Stop or a switch took over and this run
    must write nothing more; cancelled(): decoding should stop (superseded, or Stop pressed: then
    the run still shows what it answered, marked stopped)."""

    superseded: Callable[[], bool]
    cancelled: Callable[[], bool]


class Handlers:
    """The event handlers behind every button and endpoint; the wiring in `build_app` names
    them (`h.ask_session`, ...). They hold the stack pool and the serving limits; tests call
    them directly."""

    def __init__(self, pool: PipelinePool, default_stack: str = "offline", serving: Serving | None = None) -> None:
        self.pool, self.default_stack, self.serving = pool, default_stack, serving
        self._runs: dict[str, int] = {}  # each visitor's (session hash's) current run number
        self._stopped: dict[str, int] = {}  # the run number each visitor last pressed Stop on
        self._runs_lock = threading.Lock()

    def begin_run(self, request: Any) -> Turn:
        """A new run for this visitor (browser tab): any run of theirs still going is superseded
        (it stops decoding at its next step and writes nothing more to the page). -> the new run's
        `Turn`."""
        key = getattr(request, "session_hash", None)
        if key is None:
            return Turn(lambda: False, lambda: False)
        with self._runs_lock:
            n = self._runs.get(key, 0) + 1
            self._runs[key] = n
        superseded = lambda: self._runs.get(key) != n  # noqa: E731
        return Turn(superseded, lambda: superseded() or self._stopped.get(key) == n)

    def stop_run(self, request: gr.Request = None):
        """Stop this visitor's running question: its decoding ends at the next step and its cards
        show what was answered so far, marked stopped, each with a button to finish it."""
        key = getattr(request, "session_hash", None)
        with self._runs_lock:
            if key is not None:
                self._stopped[key] = self._runs.get(key, 0)
        return '<div class="rag-status-note">Stopped: the answers end where they were.</div>', _stop(False)

    def fresh(self, s: Session | None) -> Session:
        return s if isinstance(s, Session) else Session(stack=self.default_stack)

    def refuse(self, question: str, settings: RagSettings, s: Session) -> str | None:
        """The budget's refusal of this question (None: allowed, or the models are not loaded
        yet: the handler checks again once they are). Never raises: it runs in a validator."""
        pipe = self.pool.loaded(self.fresh(s).stack)
        if self.serving is None or pipe is None:
            return None
        try:
            settings, _ = _fit_k(pipe, active_index(self.fresh(s), pipe), settings)
            cost = self.serving.check(pipe, check_question(question), settings)
            busy = self.serving.heavy_busy() if cost is not None and cost.heavy else None
            if busy:
                return f"This question is expensive ({cost.describe()}): {busy}"
        except ValueError as e:
            return str(e)
        except Exception:  # noqa: BLE001 - the handler checks again and reports
            return None
        return None

    def validate_ask(self, question, s, **settings):
        return validate_ask(question, s, self.refuse, **settings)

    def validate_edit(self, pid, new_text, question, s, **fields):
        return validate_edit(pid, new_text, question, s, self.refuse, **fields)

    def estimate(self, s=None, **settings):
        """The settings accordion's cost line: the estimated time and memory of one question (a
        typical one) with these settings (by RagSettings field name; left out: the default), and
        whether the server would refuse it. Cheap: the library's cost model, no model runs."""
        s = self.fresh(s)
        pipe = self.pool.loaded(s.stack)
        if pipe is None or not hasattr(pipe, "estimate"):
            return ('<div class="rag-cost rag-placeholder">The estimated cost of these settings shows here once '
                    "the models are ready.</div>")
        try:
            settings = settings_from_inputs(**settings)
            settings, _ = _fit_k(pipe, active_index(s, pipe), settings)
            cost = pipe.estimate(TYPICAL_QUESTION, list(MODES), settings)
            expected = pipe.expect(TYPICAL_QUESTION, list(MODES), settings) if hasattr(pipe, "expect") else {}
        except ValueError as e:
            return f'<div class="rag-cost rag-over">{esc(e)}</div>'
        refusal = None
        if self.serving is not None and self.serving.budget is not None:
            try:
                cost = self.serving.check(pipe, TYPICAL_QUESTION, settings) or cost  # sets cost.heavy
            except ValueError as e:
                refusal = str(e)
        return render_cost(cost, refusal, self.serving.budget if self.serving else None, expected)

    def settle(self, s=None, **settings):
        """(the cost line, then each REACHED slider's reach) for these settings: one response, so
        the page settles in one update and a slider is re-rendered at most once per change (a
        re-render puts back the slider's value over what is being typed into its box)."""
        return (self.estimate(s, **settings), *self.reach(s, **settings))

    REACHED = ("k", "num_beams", "max_new_tokens")  # the knobs the server's budget bounds hardest

    def reach(self, s=None, **settings):
        """The K, beams and max-new-tokens sliders reach only as far as this server admits now
        with the other settings as they are (the budget at the machine's current speed), and say
        so; nothing changes while the models load, without a budget, or when the settings are
        invalid (the cost line says why)."""
        s = self.fresh(s)
        pipe = self.pool.loaded(s.stack)
        skip = tuple(gr.skip() for _ in self.REACHED)
        if pipe is None or not hasattr(pipe, "estimate") or self.serving is None or self.serving.budget is None:
            return skip
        try:
            settings = settings_from_inputs(**settings)
        except ValueError:
            return skip
        out = []
        for name in self.REACHED:
            spec, lo, hi = KNOBS[name], int(KNOBS[name].lo), int(KNOBS[name].hi)
            if name == "k":
                hi = min(hi, len(active_index(s, pipe)))

            def admitted(v: int) -> bool:
                try:
                    self.serving.check(pipe, TYPICAL_QUESTION, settings.merged(**{name: v}))
                    return True
                except ValueError:
                    return False

            top = lo
            if admitted(hi):
                top = hi
            else:  # the largest admitted value, by bisection (the cost grows with each of these knobs)
                a, b = lo, hi
                while a < b:
                    mid = (a + b + 1) // 2
                    a, b = (mid, b) if admitted(mid) else (a, mid - 1)
                top = a
            note = "" if top == int(KNOBS[name].hi) else f" This server admits up to {top} with your other settings."
            out.append(gr.Slider(maximum=max(top, lo), info=spec.help + note))
        return tuple(out)

    @page_event
    def on_load(self, s: Session | None):
        """Stream the default stack's loading progress into the status line, then say what is
        live and fill the example questions."""
        s = self.fresh(s)
        if self.pool.loaded(s.stack) is None and not self.pool.unavailable(s.stack):
            self.pool.start(s.stack)
            last = None
            while self.pool.loading(s.stack):
                now = render_status(self.pool, s)
                if now != last:
                    yield now, gr.skip(), gr.skip(), gr.skip(), s
                    last = now
                time.sleep(0.3)
        try:
            pipe, s = session_pipeline(self.pool, s)
        except ValueError as e:
            yield render_status(self.pool, s, note=str(e)), gr.skip(), gr.skip(), gr.skip(), s
            return
        yield (
            render_status(self.pool, s, pipe),
            _examples(active_index(s, pipe)),
            gr.Dropdown(choices=corpus_choices(self.pool, s), value=s.corpus),
            gr.Dropdown(choices=stack_choices(self.pool), value=s.stack),
            s,
        )

    def index_progress(self, s: Session | None):
        """The status line every few seconds while the visitor's stack answers with BM25 because its
        dense index is built in the background; -> (status, timer): the timer stops once the dense
        index serves, or when the stack is neither loaded nor loading (on_load reports that)."""
        s = self.fresh(s)
        pipe = self.pool.loaded(s.stack)
        if pipe is None:  # on_load streams the loading progress
            return gr.skip(), gr.skip() if self.pool.loading(s.stack) else gr.Timer(active=False)
        building = getattr(pipe, "index_building", None)
        return render_status(self.pool, s, pipe), gr.skip() if callable(building) and building() else gr.Timer(active=False)

    @page_event
    @logs_refusals
    def ask_session(self, question, s, progress=gr.Progress(), request: gr.Request = None, **settings):
        """Answer in all three modes from this visitor's corpus (upload and edits included),
        streamed: the cards grow token by token, each final as soon as its mode is done, then the
        final outputs. A visitor has one question at a time: asking again stops the one running,
        which writes nothing more to the page. `settings`: the controls' values by knob name."""
        turn = self.begin_run(request)
        s = self.fresh(s)
        settings = checked_settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress)
        yield _partial_outputs({})  # the cards wait for their turn; the old answers are gone
        for kind, value in _answering(pipe, question, settings, s=s, serving=self.serving, request=request,
                                      cancelled=turn.cancelled):
            if turn.superseded():  # a newer question or a corpus switch took over: write nothing more
                return
            if kind == "partial":
                yield _partial_outputs(value)
            else:
                result, s = value
                yield (render_status(self.pool, s, pipe), *_ask_outputs(result, s))

    @_api(dict)
    @logs_refusals
    def ask(self, *args, **kwargs) -> dict:
        """Answer one question with RAG-Sequence, RAG-Token and closed-book over a built-in corpus
        (no per-visitor state). Every knob is optional (None: the preset's value). Returns a dict:
        {"question", "stack", "corpus", "settings", "answers": {"sequence", "token", "closed-book"}},
        each answer an Answer.to_dict() (its "settings" say which preset ran and which aids were on,
        "stopped" why it ended, "confidence" how likely it is right). A question over the server's
        budget gets an error naming its cost and what to change, and nothing runs."""
        call = _api_signature(dict).bind(self, *args, **kwargs)
        call.apply_defaults()
        pipe, settings = self._api_request(call.arguments)
        return _answer_all(pipe, call.arguments["question"], settings, serving=self.serving,
                           request=call.arguments["request"])[0]

    def _api_request(self, args: dict) -> tuple[Any, RagSettings]:
        """/ask's and /ask_stream's arguments -> (the pipeline of the stack and corpus asked for, the
        validated settings)."""
        if args["stack"] not in STACKS:
            raise refusal(f"stack={args['stack']!r} is unknown: use one of {', '.join(STACKS)}.")
        corpus = args.get("corpus") or "builtin"
        if corpus not in ("builtin", *self.pool.corpora()):
            raise refusal(f"corpus={corpus!r} is unknown: use one of {', '.join(['builtin', *self.pool.corpora()])}.")
        settings = checked_settings(preset=args["preset"] or PRESET_OF_STACK[args["stack"]],
                             **{n: args[n] for n in KNOBS})
        with user_errors():
            pipe, _ = session_pipeline(self.pool, Session(stack=args["stack"], corpus=corpus))
            return pipe, settings

    @_api(dict)
    @logs_refusals
    def ask_stream(self, *args, **kwargs) -> dict:  # each value it yields (gr.api counts the outputs from this hint)
        """/ask, streamed: yields {"question", "stack", "corpus", "answers": {mode: dict}, "done":
        false} while the answers are decoded (each answer so far: RagPipeline.partial_answer's dict,
        with "partial": true; an answer already finished: its Answer.to_dict() with "final": true),
        then /ask's final dict with "done": true. Same arguments and budget as /ask."""
        call = _api_signature(dict).bind(self, *args, **kwargs)
        call.apply_defaults()
        question, request = call.arguments["question"], call.arguments["request"]
        pipe, settings = self._api_request(call.arguments)

        for kind, value in _answering(pipe, question, settings, serving=self.serving, request=request):
            if kind == "partial":
                yield {"question": question, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                       "answers": json_safe(value), "done": False}
            else:
                yield {**value[0], "done": True}

    def show_code(self, raw, s, request: gr.Request = None):
        """"Show the code" of the answers on screen: (the CLI command, the gradio_client call, what
        they cannot reproduce of this session). Empty before the first answer."""
        s = self.fresh(s)
        if not isinstance(raw, dict) or not raw.get("question") or not raw.get("answers"):
            return "", "", ""
        corpus = s.corpus if s.corpus in ("builtin", *self.pool.corpora()) else "builtin"
        flags = (["--corpus", corpus] if corpus != "builtin" else
                 ["--corpus-file", "YOUR_FILES"] if s.corpus == "upload" else list(self.pool.cli_flags))
        return (cli_command(raw, flags), client_code(raw, _base_url(request), corpus),
                esc(caveat(s.corpus, bool(s.edits))))

    @page_event
    @logs_refusals
    def upload(self, files, s, progress=gr.Progress(), request: gr.Request = None):
        """Split the uploaded files into passages, embed them (progress bar) and answer from them."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = self.fresh(s)
        n_files = len(files) if isinstance(files, list) else 1
        progress(0.0, desc="Reading and splitting the files")
        with user_errors():
            corpus = check_upload(files)
            base = self.pool.get(s.stack, lambda f, m: progress(f, desc=m))
        t0 = time.perf_counter()
        index = embed_corpus(self.pool, base, corpus, progress)
        s = dataclasses.replace(
            s, corpus="upload", upload=corpus, upload_index=index, upload_stack=s.stack, edited=None, edits=()
        )
        gr.Info(f"Indexed {plural(len(corpus), 'passage')} from {plural(n_files, 'file')} in "
                f"{time.perf_counter() - t0:.1f} s: questions are now answered from your documents.")
        return (
            render_status(self.pool, s, base),
            gr.Dropdown(choices=corpus_choices(self.pool, s), value="upload"),
            _examples(index),
            *_empty_outputs(s),
        )

    @page_event
    @logs_refusals
    def choose_corpus(self, choice, s, progress=gr.Progress(), request: gr.Request = None):
        """Switch this visitor between the stack's built-in corpus, the other built-in corpora (the
        CIA World Factbook: its index is built, with a progress bar, by the first visitor that
        chooses it, then loaded from the disk cache and shared) and their uploaded documents."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = self.fresh(s)
        note = ""
        if not isinstance(choice, str):
            known = ", ".join(["builtin", *self.pool.corpora(), "upload"])
            raise refusal(str(wrong("choice", choice, f"the corpus to answer from: one of {known}")))
        if choice == "upload" and s.upload is None:
            note = "You have not uploaded any documents yet: upload files first."
            choice = "builtin"
        if choice not in ("builtin", "upload", *self.pool.corpora()):
            known = ", ".join(["builtin", *self.pool.corpora(), "upload"])
            raise refusal(f"corpus {choice!r} is unknown: choose one of {known}.")
        if s.edits and choice != s.corpus:
            note = "Your passage edits were dropped with the corpus switch."
        s = dataclasses.replace(s, corpus=choice, edited=None, edits=())
        with user_errors():
            pipe, s = session_pipeline(self.pool, s, progress)
        return (
            render_status(self.pool, s, pipe, note=note),
            gr.Dropdown(choices=corpus_choices(self.pool, s), value=choice),
            _examples(active_index(s, pipe)),
            *_empty_outputs(s),
        )

    @page_event
    @logs_refusals
    def choose_stack(self, stack, s, progress=gr.Progress(), request: gr.Request = None):
        """Switch this visitor's stack, loading it once (lazily, with progress). An unavailable
        stack is refused at once with the reason, said once, in the status line (not a pop-up:
        a pop-up per event showed the same warning twice), and the visitor stays where they were."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = self.fresh(s)
        if not isinstance(stack, str):
            raise refusal(str(wrong("stack", stack, f"the stack to answer with: one of {', '.join(STACKS)}")))
        if stack not in STACKS:
            raise refusal(f"stack={stack!r} is unknown: use one of {', '.join(STACKS)}.")

        def stay(note: str = ""):
            return (render_status(self.pool, s, note=note), gr.Dropdown(choices=stack_choices(self.pool), value=s.stack),
                    gr.skip(), *[gr.skip()] * (len(_empty_outputs(s)) - 2), _stop(False), s)

        reason = self.pool.unavailable(stack)
        if reason:
            return stay(f"The {stack} stack is unavailable here: {reason}. Staying on the {s.stack} stack.")
        if stack == s.stack:
            return stay()
        note = "Your passage edits were dropped with the stack switch (the new retriever re-embeds passages)." \
            if s.edits else ""
        try:
            pipe, new = session_pipeline(self.pool, dataclasses.replace(s, stack=stack, edited=None, edits=()), progress)
        except ValueError as e:
            return stay(f"{e} Staying on the {s.stack} stack.")
        return (
            render_status(self.pool, new, pipe, note=note),
            gr.Dropdown(choices=stack_choices(self.pool), value=stack),
            _examples(active_index(new, pipe)),
            *_empty_outputs(new),
        )

    def pick_passage(self, pid, s):
        """Put the chosen passage's text and title into the edit boxes."""
        return next(((text, title) for i, title, text in self.fresh(s).last_docs if i == pid), ("", ""))

    @page_event
    @logs_refusals
    def edit_passage(self, pid, new_text, question, s, progress=gr.Progress(), request: gr.Request = None, *,
                     new_title=None, **settings):
        """Replace one passage's text (and title, if given) in this visitor's copy of the index
        (re-embedded), then ask again: the answer follows the document, the models are unchanged."""
        turn = self.begin_run(request)
        s = self.fresh(s)
        with user_errors():
            check_passage_chosen(pid, s)
        settings = checked_settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress)
            progress(0.0, desc="Re-embedding the edited passage")
            with self.pool.lock:
                edited = pipe.index.with_edited_passage(pid, new_text, pipe.stack.ctx_encoder, new_title or None)
        s = dataclasses.replace(s, edited=edited, edits=tuple(dict.fromkeys((*s.edits, pid))))
        pipe = pipe.with_index(edited)
        result, s = _answer_all(pipe, question, settings, progress, s=s, serving=self.serving, request=request,
                                cancelled=turn.cancelled)
        if turn.superseded():  # a newer question or a corpus switch took over: write nothing
            return tuple(gr.skip() for _ in range(1 + len(MODES) + 7))
        gr.Info(f"Passage {pid!r} edited in your copy of the index (the shared index and the models are unchanged).")
        return (render_status(self.pool, s, pipe), *_ask_outputs(result, s))

    @page_event
    @logs_refusals
    def without_passage(self, pid, raw, s, progress=gr.Progress(), request: gr.Request = None):
        """Answer the last question again (RAG-Sequence and RAG-Token, same settings) with passage
        `pid` taken away; -> the comparison as data (`render_without` draws it on the page): per mode
        the answer before and after, how much the original answer's log-probability dropped."""
        s = self.fresh(s)
        with user_errors():
            pipe, s = session_pipeline(self.pool, s, progress)
            raw = check_last_answers(raw)  # a client may send anything where the page sends its JSON
            progress(0.1, desc="Answering again without the passage")
            run = self.serving.run(None, request) if self.serving else None
            result = _answer_without(pipe, raw, pid, run)  # the visitor's index: uploads and edits too
        return json_safe(result), s

    @page_event
    @logs_refusals
    def continue_mode(self, mode, raw, s, progress=gr.Progress(), request: gr.Request = None):
        """Finish a card that was cut (time limit, or stopped): answer its mode again over the same
        passages with the same settings, with the whole time limit for that one mode. -> its card,
        the passages, the raw answers updated, the Stop button hidden."""
        turn = self.begin_run(request)
        s = self.fresh(s)
        with user_errors():
            raw = check_last_answers(raw)  # a client may send anything where the page sends its JSON
            if mode not in MODES or mode not in raw["answers"]:
                have = [m for m in MODES if m in raw["answers"]]
                raise wrong("mode", mode, f"the mode of one of the last answers: {', '.join(have)}" if have else
                            "a mode, once there is an answer: ask a question first")
            pipe, s = session_pipeline(self.pool, s, progress)
            settings = RagSettings(preset=raw["settings"].get("preset", "aided"),
                                   **{n: v for n, v in raw["settings"].items() if n in KNOBS})
            if self.serving:
                run = self.serving.run(None, request, turn.cancelled)
            else:
                from rag_demo.pipeline import Run

                run = Run(cancelled=turn.cancelled)
            progress(0.1, desc=f"{MODE_TITLES[mode]}: answering again with a fresh time budget")
            a = _answer_again(pipe, raw, mode, settings, run)
        if turn.superseded():
            return tuple(gr.skip() for _ in range(len(MODES) + 4))
        answers = {**raw["answers"], mode: json_safe(a.to_dict())}
        raw = {**raw, "answers": answers}
        anc = anchors(answers)
        cards = [render_answer(answers[m], anc.get(m, "rag-p-all-")) if m == mode else gr.skip() for m in MODES]
        return (*cards, render_passages(answers, s.edits), raw, _stop(False), s)

    @page_event
    @logs_refusals
    def reset_edits(self, s, request: gr.Request = None):
        """Drop this visitor's passage edits (back to the unedited corpus)."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = dataclasses.replace(self.fresh(s), edited=None, edits=())
        return (render_status(self.pool, s), *_empty_outputs(s))


