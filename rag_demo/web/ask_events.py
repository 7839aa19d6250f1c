"""A visitor's questions: answers streamed into the cards, a passage edited and asked again, a
passage taken away, a cut card finished, and "show the code" of the answers on screen.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import gradio as gr

from rag_demo.config import MODE_TITLES, MODES, check_question
from rag_demo.runs import Run
from rag_demo.serving.session import Edits, session_pipeline
from rag_demo.web.answering import (
    answer_again, answer_all, answer_without, answering, ask_outputs, partial_outputs, settings_of, stop_button,
)
from rag_demo.web.api import base_url, page_event
from rag_demo.web.passages_view import anchors, render_passages
from rag_demo.web.render import esc, json_safe, render_answer
from rag_demo.web.reproduce import caveat, cli_command, client_code
from rag_demo.web.session_view import render_status
from rag_demo.web.validation import (
    check_last_answers, check_passage_chosen, checked_settings, logs_refusals, user_errors, wrong,
)
from rag_demo.web.turns import Part


class AskEvents(Part):
    """The events that answer a visitor's questions."""

    @page_event
    @logs_refusals
    def ask_session(self, question, s, progress=gr.Progress(), request: gr.Request = None, **settings):
        """Answer in all three modes from this visitor's corpus (upload and edits included),
        streamed: the cards grow token by token, each final as soon as its mode is done, then the
        final outputs. A visitor has one question at a time: asking again stops the one running,
        which writes nothing more to the page. `settings`: the controls' values by knob name."""
        turn = self.turns.begin_run(request)
        s = self.fresh(s)
        settings = checked_settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress, self.serving)
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
        turn = self.turns.begin_run(request)
        s = self.fresh(s)
        with user_errors():
            check_passage_chosen(pid, s)
        settings = checked_settings(**settings)
        with user_errors():
            check_question(question)
            pipe, s = session_pipeline(self.pool, s, progress, self.serving)
            progress(0.0, desc="Re-embedding the edited passage")
            recipe = s.edited if s.edited is not None else Edits(pipe.index)
            with self.serving.embed_turn() if self.serving is not None else contextlib.nullcontext() as run:
                edit = functools.partial(recipe.then, pid, new_text, new_title or None, pipe.stack.ctx_encoder)
                recipe = edit() if run is None else run(edit)  # the server's model thread embeds it
        s = dataclasses.replace(s, edited=recipe, edits=recipe.passage_ids)
        pipe = pipe.with_index(recipe.index(pipe.stack.ctx_encoder))
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
        turn = self.turns.begin_run(request)  # Stop ends it, as it ends a question
        s = self.fresh(s)
        with user_errors():
            pipe, s = session_pipeline(self.pool, s, progress, self.serving)
            raw = check_last_answers(raw)  # a client may send anything where the page sends its JSON
            progress(0.1, desc="Answering again without the passage")
            # the visitor's index (uploads and edits too), priced and admitted as a question is; the
            # numbers shown are the ones this server computed for the last answers (the session's)
            result = answer_without(pipe, raw, pid, serving=self.serving, request=request, cancelled=turn.cancelled,
                                    numbers=s.last_numbers)
        return json_safe(result), s

    @page_event
    @logs_refusals
    def continue_mode(self, mode, raw, s, progress=gr.Progress(), request: gr.Request = None):
        """Finish a card that was cut (time limit, or stopped): answer its mode again over the same
        passages with the same settings, with the whole time limit for that one mode. -> its card,
        the passages, the raw answers updated, the Stop button hidden."""
        turn = self.turns.begin_run(request)
        s = self.fresh(s)
        with user_errors():
            raw = check_last_answers(raw)  # a client may send anything where the page sends its JSON
            if mode not in MODES or mode not in raw["answers"]:
                have = [m for m in MODES if m in raw["answers"]]
                raise wrong("mode", mode, f"the mode of one of the last answers: {', '.join(have)}" if have else
                            "a mode, once there is an answer: ask a question first")
            pipe, s = session_pipeline(self.pool, s, progress, self.serving)
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
