"""The web app: a Gradio Blocks teaching demo of RAG (Lewis et al. 2020) over `RagPipeline`.

Owns the page: the handlers behind every button (`Handlers`: answers streamed as they are
decoded, uploads, edits, taking a passage away), the layout and the named API endpoints. Its
neighbours, each owning one job: session.py the per-session state (`Session` in a `gr.State`),
validation.py the checks run before the queue, serving.py the budget each request must fit and
the streaming worker, render.py the HTML drawn from the library's dicts (pure), pool.py one
pipeline per stack; assets/ holds the page's text (intro.html, how_it_works.md) and style.css.
Nothing here recomputes the math.

Imports no torch: handlers call the library (loaded lazily, inside functions). Layout follows
gradio's demos: functions first, then `with gr.Blocks()` layout, then event wiring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr

from .config import (
    ANSWER_STYLES,
    MODE_TITLES,
    MODES,
    MAX_BEAMS,
    MAX_K,
    MAX_NEW_TOKENS,
    MAX_QUESTION_CHARS,
    MAX_ECHO_RETRIES,
    MAX_WORKED_EXAMPLES,
    SEQUENCE_DECODINGS,
    STACKS,
    RagSettings,
    check_question,
)
from .corpus import MAX_UPLOAD_BYTES, supported_extensions
from .pool import PipelinePool, Progress, default_unavailable, stack_factory  # noqa: F401 - re-exported
from .render import (  # noqa: F401 - re-exported: the renderers are the page's
    PALETTE,
    _finite,
    anchors,
    badge,
    esc,
    fmt_seconds,
    plural,
    render_answer,
    render_heatmap,
    render_inspector,
    render_partial,
    render_passages,
    render_tokens,
    render_without,
    show_token,
)
from .serving import Serving, client_gone, stream, within_defaults  # noqa: F401 - re-exported
from .session import (  # noqa: F401 - re-exported
    FACTBOOK_EXAMPLES,
    HOT_SWAP_EXAMPLES,
    STACK_BLURB,
    VITAL_EXAMPLES,
    Session,
    _embed,
    active_index,
    corpus_choices,
    example_questions,
    passage_choices,
    render_status,
    session_pipeline,
    stack_choices,
)
from .validation import (  # noqa: F401 - re-exported
    MAX_UPLOAD_FILES,
    Refuse,
    _settings,
    check_passage_chosen,
    check_upload,
    settings_from_inputs,
    user_errors,
    validate_ask,
    validate_edit,
    validate_upload,
)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "style.css"
DIAGRAM_PATH = ASSETS / "rag_diagram.svg"

# /ask's and /ask_stream's settings arguments (RagSettings fields), in their positional order after
# (question, ...) with `stack` between the first four and the reader settings
API_SETTINGS = ("k", "num_beams", "max_new_tokens", "sequence_decoding", "answer_style", "prior_temperature",
                "passage_sentences", "question_position", "extractive", "question_weight", "worked_examples",
                "echo_retries")
QUEUE_CONCURRENCY = 1  # events outside the model group (none of them run a model)
# Model events run two at a time: a cheap question can start while an expensive one runs. They
# do not compute at the same time: the shared StepGate lets one model step run at a time and at
# each step gives it to the waiting request with the lowest priority (cheap before expensive).
MODEL_CONCURRENCY = 2
QUEUE_MAX_SIZE = 32  # a burst of ~30 waiting requests; more get "queue full" instead of waiting minutes
# The question the settings' cost estimate is computed for (a typical one-sentence question).
TYPICAL_QUESTION = "Who painted The Starry Night?"
STATE_TTL_S = 3600  # a session's uploads and edits are dropped an hour after their last change



# ---------------------------------------------------------------- handlers

def _fit_k(pipe: Any, index: Any, settings: RagSettings) -> tuple[RagSettings, int | None]:
    """(settings with K at most the corpus size, the K asked for when it was reduced)."""
    n = len(index)
    return (settings.merged(k=n), settings.k) if settings.k > n else (settings, None)


def _answer_all(pool: PipelinePool, pipe: Any, question: str, settings: RagSettings, progress=None, *,
                s: Session | None = None, serving: Serving | None = None, request: Any = None,
                on_partial: Callable[[dict], None] | None = None, stopped: Callable[[], bool] | None = None,
                ) -> tuple[dict, Session | None]:
    """The three answers, from one `answer_modes` call (each handed over as its mode is done, so the
    progress bar can say which runs and each card shows when final: `_run_modes`), as the JSON-able
    {"question", "stack", "corpus", "settings", "answers": {mode: Answer.to_dict()}}, and the
    session (which remembers the warnings it has seen).

    Refused before anything runs when over the budget; otherwise runs under one RunControl (one
    deadline for the three answers, priority from the cost, the shared gate). No lock is held:
    the gate interleaves this request's model steps with other requests' ones. An expensive
    request is refused while `serving.max_heavy` others run. on_partial: streaming, each answer's
    dict as it grows (RunControl.on_partial); stopped: True once the listener has gone (decoding
    then stops as if cancelled)."""
    with user_errors():
        q = check_question(question)
    settings, asked_k = _fit_k(pipe, pipe.index, settings)
    if asked_k is not None:
        n, key = settings.k, f"k-reduced:{pipe.stack.name}:{pipe.index.corpus.name}:{settings.k}"
        if s is None or key not in s.warned:
            gr.Warning(f"This corpus has only {plural(n, 'passage')}: using K = {n} instead of {asked_k}.")
            if s is not None:
                s = dataclasses.replace(s, warned=s.warned | {key})
    with user_errors():
        cost = serving.check(pipe, q, settings) if serving else None
    control = serving.control(cost, request) if serving else None
    if on_partial is not None or stopped is not None:
        from .budget import RunControl

        gone = control.cancelled if control is not None else None
        cancelled = (lambda: stopped() or bool(gone and gone())) if stopped is not None else gone  # noqa: E731
        control = dataclasses.replace(control or RunControl(), on_partial=on_partial, cancelled=cancelled)
    answers = {}
    with user_errors(), (serving.heavy_slot(cost) if serving else contextlib.nullcontext()):
        _run_modes(pipe, q, settings, control, answers, progress)
    return {
        "question": q, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
        "settings": dataclasses.asdict(settings), "answers": answers,
    }, s


def _run_modes(pipe: Any, q: str, settings: RagSettings, control: Any, answers: dict, progress=None) -> None:
    from . import memory
    from .budget import RunControl

    def step(i: int) -> None:
        if progress and i < len(MODES):
            progress(i / len(MODES), desc=f"{MODE_TITLES[MODES[i]]}: retrieve, generate, attribute")

    def done(mode: str, a: Any) -> None:
        answers[mode] = _finite(a.to_dict())
        if control is not None and control.on_partial is not None:  # streaming: this card is final
            control.on_partial({**answers[mode], "final": True})
        step(len(answers))

    try:
        # one call for the three modes: RAG-Sequence and RAG-Token share the retrieval, the prefill
        # of the K prompts and each passage's drafts (answered one mode at a time, RAG-Token redid
        # them: 11.2 s -> 7.4 s median a question, docs/DESIGN.md §5); each card is shown as it is done
        step(0)
        with user_errors():
            pipe.answer_modes(q, list(MODES), settings,
                              control=dataclasses.replace(control or RunControl(), on_answer=done))
    finally:
        memory.trim()  # give the request's freed buffers back to the OS (rag_demo/memory.py)


def _answer_without(pipe: Any, raw: dict | None, pid: Any, control: Any = None) -> dict:
    """Answer the last question again in each RAG mode that read passage `pid`, without it, with
    the same settings (`raw` is the last answer's JSON, as the page holds it); -> the dict
    `render_without` shows. ValueError (shown on the page) when there is no answer to compare."""
    if not raw or not raw.get("answers"):
        raise ValueError("there is no answer yet: ask a question, then take one of its passages away.")
    settings = RagSettings(**{f: v for f, v in raw["settings"].items() if f in RagSettings.__dataclass_fields__})
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
                                     control=control)
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


def _ask_outputs(result: dict, s: Session) -> tuple:
    """(3 answer cards, passages, raw JSON, edit-passage choices, edit text, edit title, session)."""
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
        s,
    )


def _partial_outputs(latest: dict[str, dict]) -> tuple:
    """The ask outputs while answers grow: the three cards, everything else left as it is."""
    skip = gr.skip()
    cards = (render_answer(a) if a and a.get("final") else render_partial(a, m) for m, a in
             ((m, latest.get(m)) for m in MODES))
    return (skip, *cards, skip, skip, skip, skip, skip, skip)


def _empty_outputs(s: Session) -> tuple:
    """The same outputs, cleared (after the corpus or the stack changed)."""
    return (
        *(render_answer(None, mode=m) for m in MODES),
        render_passages({}),
        None,
        gr.Dropdown(choices=[], value=None),
        "",
        "",
        dataclasses.replace(s, last_docs=()),
    )


def _examples(index: Any) -> gr.Dataset:
    return gr.Dataset(samples=[[q] for q in example_questions(index.corpus)])


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


def render_cost(cost: Any, refusal: str | None, budget: Any = None) -> str:
    """The estimated cost of one question with the current settings (all three answers)."""
    per = " · ".join(f"{MODE_TITLES.get(m, m)} {fmt_seconds(t)}" for m, t in (cost.per_mode or {}).items())
    verdict = (f'<div class="rag-over">Over this server\'s limit, a question would be refused: {esc(refusal)}</div>'
               if refusal else '<div class="rag-note">Expensive: runs at low priority.</div>' if cost.heavy else "")
    return (
        f'<div class="rag-cost" data-seconds="{cost.seconds:.3f}" data-heavy="{int(bool(cost.heavy))}" '
        f'data-refused="{int(bool(refusal))}">Estimated cost of one question with these settings (three answers): '
        f"<b>{esc(cost.describe())}</b>" + (f'<div class="rag-note">{esc(per)}</div>' if per else "")
        + verdict + render_budget(budget) + "</div>"
    )


def _arguments_of(api: Callable) -> Callable[[Callable], Callable]:
    """Declare that a method takes `api`'s arguments: gr.api reads an endpoint's parameters, their
    defaults and types from its signature and type hints, so /ask_stream carries /ask's (one list
    of 15 arguments, not two to keep in step). The method itself, a generator gradio must see as
    one, is returned as it is: it binds its *args / **kwargs with `inspect.signature(api)`."""
    def declare(fn: Callable) -> Callable:
        fn.__signature__ = inspect.signature(api)
        fn.__annotations__ = dict(api.__annotations__)
        return fn
    return declare


class Handlers:
    """The event handlers behind every button and endpoint; the wiring in `build_app` names
    them (`h.ask_session`, ...). They hold the stack pool and the serving limits; tests call
    them directly."""

    def __init__(self, pool: PipelinePool, default_stack: str = "offline", serving: Serving | None = None) -> None:
        self.pool, self.default_stack, self.serving = pool, default_stack, serving

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
        except ValueError as e:
            return f'<div class="rag-cost rag-over">{esc(e)}</div>'
        refusal = None
        if self.serving is not None and self.serving.budget is not None:
            try:
                cost = self.serving.check(pipe, TYPICAL_QUESTION, settings) or cost  # sets cost.heavy
            except ValueError as e:
                refusal = str(e)
        return render_cost(cost, refusal, self.serving.budget if self.serving else None)

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

    def ask_session(self, question, s, progress=gr.Progress(), request: gr.Request = None, **settings):
        """Answer in all three modes from this session's corpus (upload and edits included),
        streamed: the cards grow token by token, then the final outputs replace them.
        `settings`: the settings widgets' values by RagSettings field name (gradio's inputs_kwargs)."""
        s = self.fresh(s)
        settings = _settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress)
        yield _partial_outputs({})  # the cards wait for their turn; the old answers are gone

        def run(on_partial, stopped):
            return _answer_all(self.pool, pipe, question, settings, s=s, serving=self.serving, request=request,
                               on_partial=on_partial, stopped=stopped)

        for kind, value in stream(run):
            if kind == "partial":
                yield _partial_outputs(value)
            else:
                result, s = value
                yield (render_status(self.pool, s, pipe), *_ask_outputs(result, s))

    defaults = RagSettings()  # the API's defaults are the library's

    def ask(
        self,
        question: str,
        k: int = defaults.k,
        num_beams: int = defaults.num_beams,
        max_new_tokens: int = defaults.max_new_tokens,
        sequence_decoding: str = defaults.sequence_decoding,
        stack: str = "offline",
        answer_style: str = defaults.answer_style,
        prior_temperature: float = defaults.prior_temperature,
        passage_sentences: int = defaults.passage_sentences,
        question_position: str = defaults.question_position,
        extractive: bool = defaults.extractive,
        question_weight: float = defaults.question_weight,
        worked_examples: int = defaults.worked_examples,
        echo_retries: int = defaults.echo_retries,
        request: gr.Request = None,
    ) -> dict:
        """Answer one question with RAG-Sequence, RAG-Token and closed-book over the stack's
        built-in corpus (no session state). Returns {"question", "stack", "corpus", "settings",
        "answers": {"sequence", "token", "closed-book"}}, each answer an Answer.to_dict() (its
        "stopped" says why it ended; with passage_sentences > 0 each doc's "read_sentences" says
        which sentences the generator read). The reader settings come after `stack`, so callers
        from before they existed keep working. A question over the server's budget gets an error
        naming its cost and what to change, and nothing runs."""
        pipe, settings = self._api_request(locals())
        return _answer_all(self.pool, pipe, question, settings, serving=self.serving, request=request)[0]

    def _api_request(self, args: dict) -> tuple[Any, RagSettings]:
        """/ask's and /ask_stream's arguments -> (the stack's pipeline, the validated settings)."""
        settings = _settings(**{f: args[f] for f in API_SETTINGS})
        if args["stack"] not in STACKS:
            raise gr.Error(f"stack={args['stack']!r} is unknown: use one of {', '.join(STACKS)}.")
        with user_errors():
            return self.pool.get(args["stack"]), settings

    @_arguments_of(ask)
    def ask_stream(self, *args, **kwargs) -> dict:  # each value it yields (gr.api counts the outputs from this hint)
        """/ask, streamed: yields {"question", "stack", "corpus", "answers": {mode: dict}, "done": false}
        while the answers are decoded (each answer so far: RagPipeline.partial_answer's dict, with
        "partial": true; an answer already finished: its Answer.to_dict() with "final": true), then
        /ask's final dict with "done": true. Same arguments and budget as /ask."""
        call = inspect.signature(Handlers.ask).bind(self, *args, **kwargs)
        call.apply_defaults()
        question, request = call.arguments["question"], call.arguments["request"]
        pipe, settings = self._api_request(call.arguments)

        def run(on_partial, stopped):
            return _answer_all(self.pool, pipe, question, settings, serving=self.serving, request=request,
                               on_partial=on_partial, stopped=stopped)[0]

        for kind, value in stream(run):
            if kind == "partial":
                yield {"question": question, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                       "answers": value, "done": False}
            else:
                yield {**value, "done": True}

    def upload(self, files, s, progress=gr.Progress()):
        """Split the uploaded files into passages, embed them (progress bar) and answer from them."""
        s = self.fresh(s)
        n_files = len(files) if isinstance(files, list) else 1
        progress(0.0, desc="Reading and splitting the files")
        with user_errors():
            corpus = check_upload(files)
            base = self.pool.get(s.stack, lambda f, m: progress(f, desc=m))
        t0 = time.perf_counter()
        index = _embed(self.pool, base, corpus, progress)
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

    def choose_corpus(self, choice, s, progress=gr.Progress()):
        """Switch this session between the stack's built-in corpus, the other built-in corpora (the
        CIA World Factbook: its index is built, with a progress bar, by the first session that
        chooses it, then loaded from the disk cache and shared) and its uploaded documents."""
        s = self.fresh(s)
        note = ""
        if choice == "upload" and s.upload is None:
            note = "No uploaded documents in this session yet: upload files first."
            choice = "builtin"
        if choice not in ("builtin", "upload", *self.pool.corpora()):
            known = ", ".join(["builtin", *self.pool.corpora(), "upload"])
            raise gr.Error(f"corpus {choice!r} is unknown: choose one of {known}.")
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

    def choose_stack(self, stack, s, progress=gr.Progress()):
        """Switch this session's stack, loading it once (lazily, with progress). An unavailable
        stack is refused at once with the reason, said once, in the status line (not a pop-up:
        a pop-up per event showed the same warning twice), and the session stays where it was."""
        s = self.fresh(s)
        if stack not in STACKS:
            raise gr.Error(f"stack={stack!r} is unknown: use one of {', '.join(STACKS)}.")

        def stay(note: str = ""):
            return (render_status(self.pool, s, note=note), gr.Dropdown(choices=stack_choices(self.pool), value=s.stack),
                    gr.skip(), *[gr.skip()] * (len(_empty_outputs(s)) - 1), s)

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

    def edit_passage(self, pid, new_text, question, s, progress=gr.Progress(), request: gr.Request = None, *,
                     new_title=None, **settings):
        """Replace one passage's text (and title, if given) in this session's copy of the index
        (re-embedded), then ask again: the answer follows the document, the models are unchanged."""
        s = self.fresh(s)
        with user_errors():
            check_passage_chosen(pid, s)
        settings = _settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress)
            progress(0.0, desc="Re-embedding the edited passage")
            with self.pool.lock:
                edited = pipe.index.with_edited_passage(pid, new_text, pipe.stack.ctx_encoder, new_title or None)
        s = dataclasses.replace(s, edited=edited, edits=tuple(dict.fromkeys((*s.edits, pid))))
        pipe = pipe.with_index(edited)
        result, s = _answer_all(self.pool, pipe, question, settings, progress, s=s, serving=self.serving, request=request)
        gr.Info(f"Passage {pid!r} edited in your copy of the index (the shared index and the models are unchanged).")
        return (render_status(self.pool, s, pipe), *_ask_outputs(result, s))

    def without_passage(self, pid, raw, s, progress=gr.Progress(), request: gr.Request = None):
        """Answer the last question again (RAG-Sequence and RAG-Token, same settings) with passage
        `pid` taken away, and show how the original answer's log-probability changed."""
        s = self.fresh(s)
        with user_errors():
            pipe, s = session_pipeline(self.pool, s, progress)
            progress(0.1, desc="Answering again without the passage")
            control = self.serving.control(None, request) if self.serving else None
            result = _answer_without(pipe, raw, pid, control)  # the session's index: uploads and edits too
        return render_without(result), s

    def reset_edits(self, s):
        """Drop this session's passage edits (back to the unedited corpus)."""
        s = dataclasses.replace(self.fresh(s), edited=None, edits=())
        return (render_status(self.pool, s), *_empty_outputs(s))


# ---------------------------------------------------------------- the page

INTRO = (ASSETS / "intro.html").read_text(encoding="utf-8")  # the page's header

HOW_IT_WORKS = (ASSETS / "how_it_works.md").read_text(encoding="utf-8")  # the "How it works" tab


def _diagram() -> str:
    try:
        svg = DIAGRAM_PATH.read_text(encoding="utf-8")
    except OSError:
        return ""
    return f'<div class="rag-diagram">{svg}</div>'


# Runs once when the page loads (launch(js=...)): a click on an answer token opens that token's
# inspector panel in its card (render_inspector) instead of jumping to its passage; a second
# click, or "close", hides it.
PAGE_JS = """() => {
    document.addEventListener('click', (ev) => {
        const drop = ev.target.closest('button.rag-without-btn');
        if (drop) {  // "answer without it": hand the passage id to the hidden textbox, then press its button
            const box = document.querySelector('#rag-without-id textarea, #rag-without-id input');
            box.value = drop.dataset.id;
            box.dispatchEvent(new Event('input', {bubbles: true}));
            setTimeout(() => document.querySelector('#rag-without-go').click(), 100);
            return;
        }
        const close = ev.target.closest('.rag-insp-close');
        const tok = ev.target.closest('a.rag-tok[data-i]');
        const card = (close || tok) && (close || tok).closest('.rag-card');
        if (!card) return;
        ev.preventDefault();
        const panels = card.querySelectorAll('.rag-insp');
        const want = tok ? card.querySelector(`.rag-insp[data-i="${tok.dataset.i}"]`) : null;
        const open = want && want.hidden;
        panels.forEach((p) => { p.hidden = true; });
        card.querySelectorAll('a.rag-tok.rag-active').forEach((t) => t.classList.remove('rag-active'));
        if (open) { want.hidden = false; tok.classList.add('rag-active'); }
    });
}"""
COUNTER_JS = """(q) => {
  const n = [...(q || "").trim()].length, limit = %d, over = n > limit;
  return `<div class="rag-qcount${over ? " rag-over" : ""}" data-n="${n}">${n.toLocaleString("en")} / ${
    limit.toLocaleString("en")} characters${over ? ": over the limit, shorten the question" : ""}</div>`;
}""" % MAX_QUESTION_CHARS


def render_counter(question: str = "") -> str:
    """The question box's character counter (the browser updates it with COUNTER_JS as you type;
    this is the same HTML, for the first render). It counts what check_question counts."""
    n = len((question or "").strip())
    over = n > MAX_QUESTION_CHARS
    return (f'<div class="rag-qcount{" rag-over" if over else ""}" data-n="{n}">{n:,} / {MAX_QUESTION_CHARS:,} '
            f'characters{": over the limit, shorten the question" if over else ""}</div>')


def build_app(pool: PipelinePool, *, default_stack: str | None = None, budget: Any = None,
              model_concurrency: int = MODEL_CONCURRENCY) -> gr.Blocks:
    """The Blocks app over a stack pool (`PipelinePool.of(...)` makes one from a RagPipeline or
    a factory). `budget`: the server's limits (a `rag_demo.budget.Budget`; None: the library's
    defaults). `model_concurrency`: model events that may run at once (their steps still take
    turns at the shared StepGate). Queue configured; launch with `launch(demo, ...)` (theme and
    CSS are launch() arguments in gradio 6)."""
    from .budget import Budget, StepGate

    if not isinstance(pool, PipelinePool):
        raise ValueError(f"build_app takes a PipelinePool, not {type(pool).__name__}: "
                         "wrap it with PipelinePool.of(...).")
    if default_stack is None:
        default_stack = next(iter(pool.loaded_stacks()), "offline")
    app: dict[str, gr.Blocks] = {}
    serving = Serving(budget=budget if budget is not None else Budget(), gate=StepGate(),
                      queue=lambda: getattr(app.get("demo"), "_queue", None), max_heavy=max(1, model_concurrency - 1))
    h = Handlers(pool, default_stack, serving)
    settings0 = RagSettings()

    with gr.Blocks(title="RAG demo: retrieve, then generate") as demo:
        app["demo"] = demo
        session = gr.State(None, time_to_live=STATE_TTL_S)
        gr.HTML(INTRO)
        status = gr.HTML(render_status(pool, Session(stack=default_stack)), elem_id="rag-status")
        with gr.Tabs():
            with gr.Tab("Ask", id="ask"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        question = gr.Textbox(
                            label="Question", placeholder="Who painted The Starry Night?", lines=1,
                            elem_id="rag-question",  # no max_length: a paste is never cut silently
                            info=f"One or two sentences, up to {MAX_QUESTION_CHARS:,} characters.",
                        )
                        counter = gr.HTML(render_counter(""), elem_id="rag-qcount")
                        ask_btn = gr.Button("Ask", variant="primary", elem_id="rag-ask")
                        examples = gr.Dataset(
                            components=[question], samples=[], label="Example questions (click one to ask it)",
                            elem_id="rag-examples", samples_per_page=12,
                        )
                    with gr.Column(scale=2):
                        corpus_dd = gr.Dropdown(
                            choices=corpus_choices(pool, Session(stack=default_stack)), value="builtin",
                            label="Corpus (the non-parametric memory)", elem_id="rag-corpus",
                        )
                        stack_dd = gr.Dropdown(
                            choices=stack_choices(pool), value=default_stack, label="Model stack",
                            elem_id="rag-stack",
                        )
                        with gr.Accordion("Upload your own documents", open=False, elem_id="rag-upload-acc"):
                            # no file_types: gradio would refuse another type while preprocessing the
                            # validator's input, a bare HTTP 400; check_upload names the types instead
                            files = gr.File(
                                file_count="multiple",
                                label=f"{', '.join(supported_extensions())}; up to {MAX_UPLOAD_BYTES / 2**20:.0f} MB "
                                "in all", elem_id="rag-files",
                            )
                            upload_btn = gr.Button("Split, embed and use these documents", elem_id="rag-upload")
                        with gr.Accordion("Settings", open=False, elem_id="rag-settings"):
                            k = gr.Slider(1, MAX_K, value=settings0.k, step=1, label="Passages K", elem_id="rag-k")
                            beams = gr.Slider(1, MAX_BEAMS, value=settings0.num_beams, step=1,
                                              label="Beam size (1 = greedy)", elem_id="rag-beams")
                            max_new = gr.Slider(1, MAX_NEW_TOKENS, value=settings0.max_new_tokens, step=1,
                                                label="Max new tokens", elem_id="rag-max-new")
                            decoding = gr.Radio(list(SEQUENCE_DECODINGS), value=settings0.sequence_decoding,
                                                label="RAG-Sequence decoding",
                                                info="thorough: rescore every candidate under every passage; "
                                                "fast: skip those passes (paper §2.5)", elem_id="rag-decoding")
                            # the reader: how the generator is asked and what it reads (RagSettings)
                            style = gr.Radio(list(ANSWER_STYLES), value=settings0.answer_style, label="Answer style",
                                             info="short: a phrase of a few words; sentence: a full sentence (the "
                                             "paper stack's BART ignores it)", elem_id="rag-style")
                            temperature = gr.Slider(0.25, 4, value=settings0.prior_temperature, step=0.25,
                                                    label="Retrieval temperature", elem_id="rag-temperature",
                                                    info="p(z|x) = softmax((score + w · vote) / T): higher spreads the answer "
                                                    "over more passages, lower leans on the top one")
                            examples_n = gr.Slider(0, MAX_WORKED_EXAMPLES, value=settings0.worked_examples, step=1,
                                                   label="Worked examples", elem_id="rag-worked-examples",
                                                   info="invented passages answered in the answer style, shown to "
                                                   "the generator before the question (computed once for all K "
                                                   "passages; BART ignores them)")
                            question_weight = gr.Slider(0, 2, value=settings0.question_weight, step=0.25,
                                                        label="Generator's vote on the passages",
                                                        elem_id="rag-question-weight",
                                                        info="p(z|x) = softmax((score + w · log p(question | "
                                                        "passage)) / T: w > 0 lets the generator reweigh the retrieved "
                                                        "passages by how well each explains the question (free: "
                                                        "read from the prompt it already runs; BART ignores it)")
                            sentences = gr.Slider(0, 6, value=settings0.passage_sentences, step=1,
                                                  label="Sentences per passage", elem_id="rag-sentences",
                                                  info="0 = the whole passage; n = the n sentences the retriever "
                                                  "finds closest to the question (marked in the passages)")
                            question_both = gr.Checkbox(value=settings0.question_position == "both",
                                                        label="Question before the passage too",
                                                        info="the generator then reads the passage knowing the "
                                                        "question (the paper stack's BART ignores it)",
                                                        elem_id="rag-question-both")
                            extractive = gr.Checkbox(value=settings0.extractive, label="Copy the answer from a passage",
                                                     info="decoding may only continue a span of the passages (each "
                                                     "passage its own, in RAG-Sequence); scores stay the model's",
                                                     elem_id="rag-extractive")
                            echo_n = gr.Slider(0, MAX_ECHO_RETRIES, value=settings0.echo_retries, step=1,
                                               label="Retry answers that only repeat the question",
                                               elem_id="rag-echo",
                                               info="'Who wrote Hamlet?' answered 'Hamlet', or 'What did Alfred "
                                               "Nobel invent?' answered 'Alfred Nobel', is decoded again with "
                                               "its first word banned, up to n times (0: keep it); scores stay "
                                               "the model's")
                            cost_box = gr.HTML(h.estimate(None), elem_id="rag-cost")
                with gr.Row(equal_height=True, elem_id="rag-cards"):
                    cards = [gr.HTML(render_answer(None, mode=m), elem_id=f"rag-answer-{m}") for m in MODES]
                passages = gr.HTML(render_passages({}), elem_id="rag-passages")
                without = gr.HTML(render_without(None), elem_id="rag-without")
                # the passage rows' "answer without it" buttons fill this box and click this button
                # (PAGE_JS); hidden by CSS, not visible=False, so that they are on the page
                without_id = gr.Textbox(elem_id="rag-without-id", elem_classes=["rag-hidden"], show_label=False,
                                        container=False)
                without_btn = gr.Button("answer without", elem_id="rag-without-go", elem_classes=["rag-hidden"])
                with gr.Accordion("Edit a retrieved passage, then ask again", open=False, elem_id="rag-edit-acc"):
                    gr.Markdown(
                        "Change what a passage says (e.g. swap the painter's name) and ask the same question: "
                        "the answer follows the document, the models are unchanged. The edit lives in your "
                        "session's copy of the index only."
                    )
                    # allow_custom_value: an id that is not a choice reaches the validator, which says
                    # why, instead of gradio's bare "not in the list of choices" HTTP error
                    edit_pick = gr.Dropdown(choices=[], label="Passage", elem_id="rag-edit-pick",
                                            allow_custom_value=True)
                    edit_title = gr.Textbox(lines=1, label="Passage title (read by the retriever and the "
                                            "generator with the text)", elem_id="rag-edit-title")
                    edit_text = gr.Textbox(lines=4, label="Passage text", elem_id="rag-edit-text")
                    with gr.Row():
                        edit_btn = gr.Button("Save edit and ask again", variant="primary", elem_id="rag-edit")
                        reset_btn = gr.Button("Undo my edits", elem_id="rag-reset")
                with gr.Accordion("Raw answers (JSON, as the /ask API returns them)", open=False):
                    raw = gr.JSON(elem_id="rag-json")
            with gr.Tab("How it works", id="how"):
                gr.HTML(_diagram())
                gr.Markdown(
                    HOW_IT_WORKS,
                    latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                      {"left": "$", "right": "$", "display": False}],
                )

        # ------------------------------------------------------------ events
        # every settings widget by its RagSettings field, passed to the handlers by name (gradio's
        # inputs_kwargs): a new setting is one line here, not a new positional parameter everywhere.
        # The API keeps its order: (question, the settings in this order) for /ask_session.
        settings_in = {"k": k, "num_beams": beams, "max_new_tokens": max_new, "sequence_decoding": decoding,
                       "answer_style": style, "prior_temperature": temperature, "passage_sentences": sentences,
                       "question_position": question_both, "extractive": extractive,
                       "question_weight": question_weight, "worked_examples": examples_n,
                       "echo_retries": echo_n}
        # /edit_passage's positional API was (pid, text, question, the first four settings, title):
        # the reader settings come after the title, so positional callers keep working
        edit_in = {**dict(list(settings_in.items())[:4]), "new_title": edit_title, **settings_in}
        answer_out = [*cards, passages, raw, edit_pick, edit_text, edit_title, session]
        model = {"concurrency_id": "model", "concurrency_limit": model_concurrency}
        demo.load(
            h.on_load, inputs=[session], outputs=[status, examples, corpus_dd, stack_dd, session],
            api_name="status", concurrency_limit=None, show_progress="hidden",
        ).then(h.estimate, inputs=[session], inputs_kwargs=settings_in, outputs=[cost_box], queue=False,
               show_progress="hidden", api_visibility="private")
        # cheap, not queued: the cost model only, no model runs
        gr.on([c.change for c in settings_in.values()], h.estimate, inputs=[session], inputs_kwargs=settings_in,
              outputs=[cost_box], queue=False, show_progress="hidden", api_visibility="private")
        question.change(None, inputs=[question], outputs=[counter], js=COUNTER_JS, queue=False,
                        show_progress="hidden", api_visibility="private")  # in the browser only
        gr.on(
            [ask_btn.click, question.submit], h.ask_session, inputs=[question, session], inputs_kwargs=settings_in,
            outputs=[status, *answer_out], api_name="ask_session", validator=h.validate_ask, **model,
        )
        examples.click(lambda x: x[0], inputs=[examples], outputs=[question], api_visibility="private",
                       queue=False).then(
            h.ask_session, inputs=[question, session], inputs_kwargs=settings_in, outputs=[status, *answer_out],
            api_visibility="private", validator=h.validate_ask, **model,
        )
        upload_btn.click(
            h.upload, inputs=[files, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="upload", show_progress_on=status, validator=validate_upload, **model,
        )
        corpus_dd.input(
            h.choose_corpus, inputs=[corpus_dd, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="choose_corpus", show_progress_on=status, **model,
        )
        stack_dd.input(  # not in the model group: a first load takes minutes and must not block questions
            h.choose_stack, inputs=[stack_dd, session], outputs=[status, stack_dd, examples, *answer_out],
            api_name="choose_stack", show_progress_on=status, concurrency_limit=None,
        )
        edit_pick.input(h.pick_passage, inputs=[edit_pick, session], outputs=[edit_text, edit_title],
                        api_visibility="private", queue=False)
        edit_btn.click(
            h.edit_passage, inputs=[edit_pick, edit_text, question, session], inputs_kwargs=edit_in,
            outputs=[status, *answer_out], api_name="edit_passage", validator=h.validate_edit, **model,
        )
        gr.on([ask_btn.click, question.submit], lambda: render_without(None), outputs=[without], queue=False,
              show_progress="hidden", api_visibility="private")  # a new question: the comparison is stale
        without_btn.click(h.without_passage, inputs=[without_id, raw, session], outputs=[without, session],
                          api_name="without_passage", **model)
        reset_btn.click(h.reset_edits, inputs=[session], outputs=[status, *answer_out], api_name="reset_edits",
                        show_progress_on=status)
        gr.api(h.ask, api_name="ask", **model)
        gr.api(h.ask_stream, api_name="ask_stream", **model)

    demo.queue(default_concurrency_limit=QUEUE_CONCURRENCY, max_size=QUEUE_MAX_SIZE)
    demo.rag_pool = pool  # for app.py (start loading) and tests
    demo.rag_serving = serving
    return demo


def theme() -> gr.themes.Base:
    """gradio's default theme in indigo, with the system's sans-serif font (gradio's bundled
    web fonts are subsets: bold text falls back glyph by glyph and looks broken)."""
    return gr.themes.Default(
        primary_hue="indigo",
        font=["Segoe UI", "Roboto", "Helvetica Neue", "Arial", "Liberation Sans", "DejaVu Sans", "sans-serif"],
    )


def launch(demo: gr.Blocks, **kwargs) -> Any:
    """demo.launch with the app's CSS, page script and theme (launch() arguments in gradio 6), and
    the MCP server on."""
    kwargs.setdefault("css_paths", [CSS_PATH])
    kwargs.setdefault("js", PAGE_JS)
    kwargs.setdefault("theme", theme())
    kwargs.setdefault("show_error", True)
    # the named API endpoints are MCP tools too (gradio[mcp]; streamable HTTP at /gradio_api/mcp/):
    # an agent calls `ask` with the question and gets /ask's dict
    kwargs.setdefault("mcp_server", True)
    return demo.launch(**kwargs)
