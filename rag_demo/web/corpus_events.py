"""What a visitor answers from: the page's first load (the stack's loading streamed), the status line
while a dense index is built, an upload, the corpus and stack switches, and edits undone.
"""
from __future__ import annotations

import dataclasses
import time

import gradio as gr

from rag_demo.config import STACKS
from rag_demo.serving.session import Session, active_index, embed_corpus, session_pipeline, upload_lane
from rag_demo.web.answering import empty_outputs, examples_html, stop_button
from rag_demo.web.api import page_event
from rag_demo.web.render import plural
from rag_demo.web.session_view import corpus_choices, render_status, stack_choices
from rag_demo.web.validation import check_upload, logs_refusals, refusal, remove_uploaded, user_errors, wrong
from rag_demo.web.turns import Part


class CorpusEvents(Part):
    """The events that choose what a visitor's questions are answered from."""

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
    def upload(self, files, s, progress=gr.Progress(), request: gr.Request = None):
        """Split the uploaded files into passages, embed them (progress bar) and answer from them."""
        self.turns.begin_run(request)  # a question still running is from before the switch: stop it
        s = self.fresh(s)
        n_files = len(files) if isinstance(files, list) else 1
        progress(0.0, desc="Reading and splitting the files")
        with user_errors():
            try:
                base = self.pool.get(s.stack, lambda f, m: progress(f, desc=m))
                with upload_lane(self.serving, progress):  # read and embedded in the server's one upload lane
                    t0 = time.perf_counter()
                    corpus = check_upload(files)
                    index = embed_corpus(base, corpus, progress, self.serving)
            finally:  # read into the corpus (or refused): the files on disk are not needed again
                remove_uploaded(files)
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
        self.turns.begin_run(request)  # a question still running is from before the switch: stop it
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
            pipe, s = session_pipeline(self.pool, s, progress, self.serving)
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
        self.turns.begin_run(request)  # a question still running is from before the switch: stop it
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
            pipe, new = session_pipeline(self.pool, dataclasses.replace(s, stack=stack, edited=None, edits=()), progress,
                                         self.serving)
        except ValueError as e:
            return stay(f"{e} Staying on the {s.stack} stack.")
        return (
            render_status(self.pool, new, pipe, note=note),
            gr.Dropdown(choices=stack_choices(self.pool), value=stack),
            examples_html(active_index(new, pipe)),
            *empty_outputs(new),
        )

    @page_event
    @logs_refusals
    def reset_edits(self, s, request: gr.Request = None):
        """Drop this visitor's passage edits (back to the unedited corpus)."""
        self.turns.begin_run(request)  # a question still running is from before the switch: stop it
        s = dataclasses.replace(self.fresh(s), edited=None, edits=())
        return (render_status(self.pool, s), *empty_outputs(s))
