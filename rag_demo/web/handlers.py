"""The page's event handlers: every button and API endpoint of the app calls one `Handlers` method.

Owns what a click does (answers streamed as they are decoded, uploads, edits, a passage taken
away) and the named API endpoints (`/ask`, `/ask_stream`). The handlers call the library and
render its dicts (render.py); they recompute no math and import no torch.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import gradio as gr

from rag_demo.config import (
    KNOBS,
    MODE_TITLES,
    MODES,
    PRESET_OF_STACK,
    STACKS,
    RagSettings,
    check_question,
)
from rag_demo.runs import Run
from rag_demo.serving.admission import Serving
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import (
    Session,
    active_index,
    embed_corpus,
    session_pipeline,
)
from rag_demo.web.answering import (
    TYPICAL_QUESTION,
    answer_again,
    answer_all,
    answer_without,
    answering,
    ask_outputs,
    empty_outputs,
    examples_html,
    fit_k,
    partial_outputs,
    settings_of,
    stop_button,
)
from rag_demo.web.api import api_endpoint, api_signature, base_url, page_event
from rag_demo.web.cost_view import render_cost
from rag_demo.web.passages_view import anchors, render_passages
from rag_demo.web.render import esc, json_safe, plural, render_answer
from rag_demo.web.reproduce import caveat, cli_command, client_code
from rag_demo.web.session_view import corpus_choices, render_status, stack_choices
from rag_demo.web.validation import (
    check_last_answers,
    check_passage_chosen,
    check_upload,
    checked_settings,
    logs_refusals,
    refusal,
    remove_uploaded,
    settings_from_inputs,
    user_errors,
    validate_ask,
    validate_edit,
    wrong,
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

    def forget(self, request: gr.Request = None) -> None:
        """A visitor's tab has closed (demo.unload): their run numbers go, so the maps hold only
        the visitors still here."""
        key = getattr(request, "session_hash", None)
        with self._runs_lock:
            self._runs.pop(key, None)
            self._stopped.pop(key, None)

    def stop_run(self, request: gr.Request = None):
        """Stop this visitor's running question: its decoding ends at the next step and its cards
        show what was answered so far, marked stopped, each with a button to finish it."""
        key = getattr(request, "session_hash", None)
        with self._runs_lock:
            if key is not None:
                self._stopped[key] = self._runs.get(key, 0)
        return '<div class="rag-status-note">Stopped: the answers end where they were.</div>', stop_button(False)

    def fresh(self, s: Session | None) -> Session:
        return s if isinstance(s, Session) else Session(stack=self.default_stack)

    def refuse(self, question: str, settings: RagSettings, s: Session) -> str | None:
        """The budget's refusal of this question (None: allowed, or the models are not loaded
        yet: the handler checks again once they are). Never raises: it runs in a validator."""
        pipe = self.pool.loaded(self.fresh(s).stack)
        if self.serving is None or pipe is None:
            return None
        try:
            settings, _ = fit_k(pipe, active_index(self.fresh(s), pipe), settings)
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
            settings, _ = fit_k(pipe, active_index(s, pipe), settings)
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

    @logs_refusals
    def settle(self, s=None, **settings):
        """(the cost line, then each REACHED slider's reach) for these settings: one response, so
        the page settles in one update and a slider is re-rendered at most once per change (a
        re-render puts back the slider's value over what is being typed into its box)."""
        return (self.estimate(s, **settings), *self.reach(s, **settings))

    REACHED = ("k", "num_beams", "max_new_tokens")  # the knobs the server's budget bounds hardest

    def reach(self, s=None, **settings):
        """The K, beams and max-new-tokens sliders say how far this server admits them now with the
        other settings as they are (the budget at the machine's current speed); their ranges stay
        the knobs' own. Nothing changes while the models load, without a budget, or when the
        settings are invalid (the cost line says why)."""
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
            note = "" if top == int(KNOBS[name].hi) else (
                f" This server admits up to {top} with your other settings: more is refused, saying what to lower.")
            # the range itself never moves: a slider whose maximum fell under the value it held
            # made gradio refuse every later Ask until the page was reloaded
            out.append(gr.Slider(info=spec.help + note))
        return tuple(out)

    @page_event
    @logs_refusals
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
            examples_html(active_index(s, pipe)),
            gr.Dropdown(choices=corpus_choices(self.pool, s), value=s.corpus),
            gr.Dropdown(choices=stack_choices(self.pool), value=s.stack),
            s,
        )

    @logs_refusals
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
        yield partial_outputs({})  # the cards wait for their turn; the old answers are gone
        for kind, value in answering(pipe, question, settings, s=s, serving=self.serving, request=request,
                                      cancelled=turn.cancelled):
            if turn.superseded():  # a newer question or a corpus switch took over: write nothing more
                return
            if kind == "partial":
                yield partial_outputs(value)
            else:
                result, s = value
                yield (render_status(self.pool, s, pipe), *ask_outputs(result, s))

    @api_endpoint(dict)
    @logs_refusals
    def ask(self, *args, **kwargs) -> dict:
        """Answer one question with RAG-Sequence, RAG-Token and closed-book over a built-in corpus
        (no per-visitor state). Every knob is optional (None: the preset's value). Returns a dict:
        {"question", "stack", "corpus", "settings", "answers": {"sequence", "token", "closed-book"}},
        each answer an Answer.to_dict() (its "settings" say which preset ran and which aids were on,
        "stopped" why it ended, "confidence" how likely it is right). A question over the server's
        budget gets an error naming its cost and what to change, and nothing runs."""
        call = api_signature(dict).bind(self, *args, **kwargs)
        call.apply_defaults()
        pipe, settings = self._api_request(call.arguments)
        return answer_all(pipe, call.arguments["question"], settings, serving=self.serving,
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

    @api_endpoint(dict)
    @logs_refusals
    def ask_stream(self, *args, **kwargs) -> dict:  # each value it yields (gr.api counts the outputs from this hint)
        """/ask, streamed: yields {"question", "stack", "corpus", "answers": {mode: dict}, "done":
        false} while the answers are decoded (each answer so far: RagPipeline.partial_answer's dict,
        with "partial": true; an answer already finished: its Answer.to_dict() with "final": true),
        then /ask's final dict with "done": true. Same arguments and budget as /ask."""
        call = api_signature(dict).bind(self, *args, **kwargs)
        call.apply_defaults()
        question, request = call.arguments["question"], call.arguments["request"]
        pipe, settings = self._api_request(call.arguments)

        for kind, value in answering(pipe, question, settings, serving=self.serving, request=request):
            if kind == "partial":
                yield {"question": question, "stack": pipe.stack.name, "corpus": pipe.index.corpus.name,
                       "answers": json_safe(value), "done": False}
            else:
                yield {**value[0], "done": True}

    @logs_refusals
    def show_code(self, raw, s, request: gr.Request = None):
        """"Show the code" of the answers on screen: (the CLI command, the gradio_client call, what
        they cannot reproduce of what this visitor changed: an upload, an edit). Empty before the
        first answer."""
        s = self.fresh(s)
        if not isinstance(raw, dict) or not raw.get("question") or not raw.get("answers"):
            return "", "", ""
        corpus = s.corpus if s.corpus in ("builtin", *self.pool.corpora()) else "builtin"
        flags = (["--corpus", corpus] if corpus != "builtin" else
                 ["--corpus-file", "YOUR_FILES"] if s.corpus == "upload" else list(self.pool.cli_flags))
        return (cli_command(raw, flags), client_code(raw, base_url(request), corpus),
                esc(caveat(s.corpus, bool(s.edits), raw)))

    @page_event
    @logs_refusals
    def upload(self, files, s, progress=gr.Progress(), request: gr.Request = None):
        """Split the uploaded files into passages, embed them (progress bar) and answer from them."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = self.fresh(s)
        n_files = len(files) if isinstance(files, list) else 1
        progress(0.0, desc="Reading and splitting the files")
        with user_errors():
            try:
                corpus = check_upload(files)
            finally:  # read into the corpus (or refused): the files on disk are not needed again
                remove_uploaded(files)
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
            examples_html(index),
            *empty_outputs(s),
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
            examples_html(active_index(s, pipe)),
            *empty_outputs(s),
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
                    gr.skip(), *[gr.skip()] * (len(empty_outputs(s)) - 2), stop_button(False), s)

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
            examples_html(active_index(new, pipe)),
            *empty_outputs(new),
        )

    @logs_refusals
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
        result, s = answer_all(pipe, question, settings, progress, s=s, serving=self.serving, request=request,
                                cancelled=turn.cancelled)
        if turn.superseded():  # a newer question or a corpus switch took over: write nothing
            return tuple(gr.skip() for _ in range(1 + len(MODES) + 7))
        gr.Info(f"Passage {pid!r} edited in your copy of the index (the shared index and the models are unchanged).")
        return (render_status(self.pool, s, pipe), *ask_outputs(result, s))

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
            # the visitor's index (uploads and edits too), priced and admitted as a question is
            result = answer_without(pipe, raw, pid, serving=self.serving, request=request)
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
            settings = settings_of(raw)
            progress(0.1, desc=f"{MODE_TITLES[mode]}: answering again with a fresh time budget")
            a = answer_again(pipe, raw, mode, settings, Run(cancelled=turn.cancelled), self.serving, request,
                             turn.cancelled)
        if turn.superseded():
            return tuple(gr.skip() for _ in range(len(MODES) + 4))
        answers = {**raw["answers"], mode: json_safe(a.to_dict())}
        raw = {**raw, "answers": answers}
        anc = anchors(answers)
        cards = [render_answer(answers[m], anc.get(m, "rag-p-all-")) if m == mode else gr.skip() for m in MODES]
        return (*cards, render_passages(answers, s.edits), raw, stop_button(False), s)

    @page_event
    @logs_refusals
    def reset_edits(self, s, request: gr.Request = None):
        """Drop this visitor's passage edits (back to the unedited corpus)."""
        self.begin_run(request)  # a question still running is from before the switch: stop it
        s = dataclasses.replace(self.fresh(s), edited=None, edits=())
        return (render_status(self.pool, s), *empty_outputs(s))


