"""The Gradio page: the layout of the Ask and How it works tabs, the wiring of every event to a
`Handlers` method (handlers.py), and `launch` (theme, CSS, page script, MCP).

Imports no torch. Layout follows gradio's demos: the `with gr.Blocks()` layout, then the event
wiring. assets/ holds the page's text (intro.html, how_it_works.md) and style.css.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import gradio as gr

from rag_demo.config import MAX_QUESTION_CHARS, MODES, RagSettings
from rag_demo.knowledge.uploads import MAX_UPLOAD_BYTES, TRANSFER_LIMIT_BYTES, supported_extensions
from rag_demo.serving.admission import Serving
from rag_demo.serving.budget import MODEL_CONCURRENCY
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import Session
from rag_demo.web import inputs
from rag_demo.web.api import describe_api, json_tool
from rag_demo.web.controls import preset_switch, preset_values, settings_controls
from rag_demo.web.handlers import Handlers
from rag_demo.web.passages_view import render_passages, render_without
from rag_demo.web.render import render_answer
from rag_demo.web.results import ResultsHandlers, results_tab
from rag_demo.web.results import wire as wire_results
from rag_demo.web.session_view import corpus_choices, render_status, stack_choices
from rag_demo.web.validation import validate_upload

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CSS_PATH = ASSETS / "style.css"
DIAGRAM_PATH = ASSETS / "rag_diagram.svg"

UPLOAD_CACHE_S = 3600  # gradio's cache of uploaded files is swept this often, of files this old
QUEUE_CONCURRENCY = 1  # events outside the model group (none of them run a model)
QUEUE_MAX_SIZE = 32  # a burst of ~30 waiting requests; more get "queue full" instead of waiting minutes
STATE_TTL_S = 3600  # a session's uploads and edits are dropped an hour after their last change
# Sessions whose state the server holds, the least recently used dropped first: gradio keeps for each
# a copy of the page's whole configuration (~0.5 MB here) and by default 10,000 of them, so API
# clients, which never close a tab, grew the app ~8 MB a minute under load (docs/results.md §3.6)
STATE_SESSIONS = 100




INTRO = (ASSETS / "intro.html").read_text(encoding="utf-8")  # the page's header

HOW_IT_WORKS = (ASSETS / "how_it_works.md").read_text(encoding="utf-8")  # the "How it works" tab


def _diagram() -> str:
    try:
        svg = DIAGRAM_PATH.read_text(encoding="utf-8")
    except OSError:
        return ""
    return f'<div class="rag-diagram">{svg}</div>'


# Screens narrower than this (CSS pixels) are phones: the answer cards sit below the question, the
# corpus and the settings, so asking scrolls their top to the top of the screen; a wider screen
# scrolls only as far as brings them into view (PAGE_JS).
PHONE_MAX_PX = 700

# Runs once when the page loads (launch(js=...)): a click on an answer token opens that token's
# inspector panel in its card (render_inspector) instead of jumping to its passage; a second
# click, or "close", hides it. Ask (or Enter in the question box) brings the cards into view.
PAGE_JS = """() => {
    // Below the lessons, an open accordion or on a phone, the cards are off the screen when Ask is
    // pressed: bring them into view, where they show at once that the answers are coming. Not for
    // an empty or over-long question, whose message shows on the question box.
    const toCards = () => {
        const q = document.querySelector('#rag-question textarea, #rag-question input');
        const n = [...((q && q.value) || '').trim()].length;
        const cards = document.querySelector('#rag-cards');
        if (n === 0 || n > %(max_chars)d || !cards) return;
        const box = cards.getBoundingClientRect();
        const phone = window.innerWidth < %(phone)d;
        if (!phone && box.top >= 0 && box.top + Math.min(box.height, 240) <= window.innerHeight) return;  // in view
        cards.scrollIntoView({block: phone ? 'start' : 'nearest', behavior: 'smooth'});
    };
    document.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' && !ev.shiftKey && ev.target.closest && ev.target.closest('#rag-question')) toCards();
    }, true);
    document.addEventListener('click', (ev) => {
        if (ev.target.closest('#rag-ask')) { toCards(); return; }
        const drop = ev.target.closest('button.rag-without-btn');
        if (drop) {  // "answer without it": hand the passage id to the hidden textbox, then press its button
            const box = document.querySelector('#rag-without-id textarea, #rag-without-id input');
            box.value = drop.dataset.id;
            box.dispatchEvent(new Event('input', {bubbles: true}));
            setTimeout(() => document.querySelector('#rag-without-go').click(), 100);
            return;
        }
        const lesson = ev.target.closest('button.rag-lesson-q');
        if (lesson) {  // a lesson's question: into the question box, then Ask
            const box = document.querySelector('#rag-question textarea, #rag-question input');
            box.value = lesson.textContent;
            box.dispatchEvent(new Event('input', {bubbles: true}));
            setTimeout(() => document.querySelector('#rag-ask').click(), 100);
            return;
        }
        const more = ev.target.closest('button.rag-continue-btn');
        if (more) {  // "continue": hand the card's mode to the hidden textbox, then press its button
            const box = document.querySelector('#rag-continue-mode textarea, #rag-continue-mode input');
            box.value = more.dataset.mode;
            box.dispatchEvent(new Event('input', {bubbles: true}));
            setTimeout(() => document.querySelector('#rag-continue-go').click(), 100);
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
    // A setting's number box: the slider clamps a typed value into its range when the box loses
    // focus or Enter is pressed; say so beside it, so that no value is changed silently.
    const typed = (ev) => {
        const box = ev.target;
        const knob = box instanceof HTMLInputElement && box.type === 'number' && box.closest('[id^=rag-knob-]');
        if (!knob || (ev.type === 'keydown' && ev.key !== 'Enter')) return;
        const range = knob.querySelector('input[type=range]');
        if (!range) return;
        const v = Number(box.value), lo = Number(range.min), hi = Number(range.max);
        let note = knob.querySelector('.rag-range-msg');
        // the value the note set is in range too: only another value the visitor enters clears it
        if (box.value === '' || (v >= lo && v <= hi)) { if (note && note.dataset.set !== box.value) note.remove(); return; }
        if (!note) {
            note = document.createElement('div');
            note.className = 'rag-range-msg';
            note.setAttribute('role', 'alert');
            knob.appendChild(note);
        }
        const name = (knob.querySelector('[data-testid=block-info]') || {}).textContent || 'This setting';
        note.dataset.set = String(v < lo ? lo : hi);
        note.textContent = `${box.value} is out of range: ${name.trim()} goes from ${lo} to ${hi} here, so it is set to ${
            note.dataset.set}.`;
    };
    document.addEventListener('keydown', typed, true);
    document.addEventListener('blur', typed, true);
}""" % {"phone": PHONE_MAX_PX, "max_chars": MAX_QUESTION_CHARS}
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
    a factory). `budget`: the server's limits (a `rag_demo.serving.budget.Budget`; None: the library's
    defaults). `model_concurrency`: model events that may run at once (their steps still take
    turns at the shared StepScheduler, decoding steps batched). Queue configured; launch with `launch(demo, ...)` (theme and
    CSS are launch() arguments in gradio 6)."""
    from rag_demo.serving.budget import Budget
    from rag_demo.serving.scheduler import StepScheduler

    if not isinstance(pool, PipelinePool):
        raise ValueError(f"build_app takes a PipelinePool, not {type(pool).__name__}: "
                         "wrap it with PipelinePool.of(...).")
    if default_stack is None:
        default_stack = next(iter(pool.loaded_stacks()), "offline")
    app: dict[str, gr.Blocks] = {}
    # the server's limits and the handlers that apply them
    serving = Serving(budget=budget if budget is not None else Budget(), gate=StepScheduler(model_thread=pool.model_thread),
                      queue=lambda: getattr(app.get("demo"), "_queue", None), max_heavy=1)
    h = Handlers(pool, default_stack, serving)
    # what the page shows before a visitor does anything: a new session's settings, status and choices
    settings0 = RagSettings.for_stack(default_stack)
    session0 = Session(stack=default_stack)
    status0, corpora0, stacks0 = render_status(pool, session0), corpus_choices(pool, session0), stack_choices(pool)
    upload_label = f"{', '.join(supported_extensions())}; up to {MAX_UPLOAD_BYTES / 2**20:.0f} MB in all"

    # an uploaded file is read into the visitor's corpus and deleted at once (CorpusEvents.upload); what a
    # failed or abandoned upload leaves in gradio's cache goes within UPLOAD_CACHE_S
    with gr.Blocks(title="RAG demo: retrieve, then generate", delete_cache=(UPLOAD_CACHE_S, UPLOAD_CACHE_S)) as demo:
        app["demo"] = demo
        session = gr.State(None, time_to_live=STATE_TTL_S)
        demo.unload(h.turns.forget)  # the visitor's run numbers go with their tab
        gr.HTML(INTRO)
        status = gr.HTML(status0, elem_id="rag-status")
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
                        with gr.Row(equal_height=True, elem_id="rag-ask-row"):
                            ask_btn = gr.Button("Ask", variant="primary", elem_id="rag-ask", scale=1)
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="rag-stop", scale=0, min_width=80,
                                                 visible=False)
                            preset = preset_switch(settings0.preset)
                        examples = gr.HTML('<div class="rag-lessons rag-placeholder">Lessons appear here once the '
                                           'models are ready.</div>', elem_id="rag-examples")
                    with gr.Column(scale=2):
                        # handed on: a value that is no choice reaches the handler, which names it
                        corpus_dd = inputs.handed_on(gr.Dropdown(
                            choices=corpora0, value="builtin",
                            label="Corpus (the non-parametric memory)", elem_id="rag-corpus",
                        ))
                        stack_dd = inputs.handed_on(gr.Dropdown(
                            choices=stacks0, value=default_stack, label="Model stack",
                            elem_id="rag-stack",
                        ))
                        with gr.Accordion("Upload your own documents", open=False, elem_id="rag-upload-acc"):
                            # no file_types: gradio would refuse another type while preprocessing the
                            # validator's input, a bare HTTP 400; check_upload names the types instead
                            # inputs.files: what is not a list of files reaches check_upload, which names it
                            files = inputs.files(label=upload_label, elem_id="rag-files")
                            upload_btn = gr.Button("Split, embed and use these documents", elem_id="rag-upload")
                        with gr.Accordion("Settings", open=False, elem_id="rag-settings"):
                            knobs = settings_controls(settings0)
                            cost_box = gr.HTML(h.pricing.estimate(None), elem_id="rag-cost")
                with gr.Row(equal_height=True, elem_id="rag-cards"):
                    cards = [gr.HTML(render_answer(None, mode=m), elem_id=f"rag-answer-{m}") for m in MODES]
                with gr.Accordion("Show the code: rerun these answers yourself", open=False, elem_id="rag-code"):
                    gr.Markdown("The command line and the API call that give the answers above: the question, "
                                "the corpus, the preset and every setting you changed from it.")
                    code_cli = gr.Code(language="shell", label="Command line (in the checkout, after scripts/setup.sh)",
                                       interactive=False, elem_id="rag-code-cli")
                    code_py = gr.Code(language="python", label="Python, through this app's /ask endpoint",
                                      interactive=False, elem_id="rag-code-py")
                    code_note = gr.HTML("", elem_id="rag-code-note")
                passages = gr.HTML(render_passages({}), elem_id="rag-passages")
                without = gr.HTML(render_without(None), elem_id="rag-without")
                without_data = gr.JSON(visible=False)  # /without_passage's data, drawn into `without`
                # the passage rows' "answer without it" buttons fill this box and click this button
                # (PAGE_JS); hidden by CSS, not visible=False, so that they are on the page
                without_id = gr.Textbox(elem_id="rag-without-id", elem_classes=["rag-hidden"], show_label=False,
                                        container=False)
                without_btn = gr.Button("answer without", elem_id="rag-without-go", elem_classes=["rag-hidden"])
                # a cut card's "continue" button fills this box with its mode and clicks this button (PAGE_JS)
                continue_mode = gr.Textbox(elem_id="rag-continue-mode", elem_classes=["rag-hidden"], show_label=False,
                                           container=False)
                continue_btn = gr.Button("continue", elem_id="rag-continue-go", elem_classes=["rag-hidden"])
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
            with gr.Tab("Results", id="results"):
                results = results_tab(ResultsHandlers(pool, serving, default_stack))
            with gr.Tab("How it works", id="how"):
                gr.HTML(_diagram())
                gr.Markdown(
                    HOW_IT_WORKS,
                    latex_delimiters=[{"left": "$$", "right": "$$", "display": True},
                                      {"left": "$", "right": "$", "display": False}],
                )

        # ------------------------------------------------------------ events
        # every knob's control by name, and the preset, passed to the handlers by name (gradio's
        # inputs_kwargs); generated from the knobs' declarations (rag_demo/config.py)
        # (the positional order of the events' API: earlier clients passed K, beams, max new tokens and
        # RAG-Sequence decoding first, and /edit_passage the new title after those four)
        settings_in = {**knobs, "preset": preset}
        first = dict(list(settings_in.items())[:4])
        edit_in = {**first, "new_title": edit_title, **settings_in}
        answer_out = [*cards, passages, raw, edit_pick, edit_text, edit_title, stop_btn, session]
        model = {"concurrency_id": "model", "concurrency_limit": model_concurrency}
        # what a change of settings updates, in one response: the cost line, and the sliders the
        # budget bounds reaching only as far as the server admits now
        settled = [cost_box, *(knobs[n] for n in h.pricing.REACHED)]
        demo.load(
            h.corpus.on_load, inputs=[session], outputs=[status, examples, corpus_dd, stack_dd, session],
            api_name="status", concurrency_limit=None, show_progress="hidden",
        ).then(h.pricing.settle, inputs=[session], inputs_kwargs=settings_in, outputs=settled, queue=False,
               show_progress="hidden", api_visibility="private")
        # while the dense index is built in the background the status line shows how far (CorpusEvents.index_progress)
        timer = gr.Timer(2.0)
        timer.tick(h.corpus.index_progress, inputs=[session], outputs=[status, timer], queue=False, show_progress="hidden",
                   api_visibility="private")
        # cheap, not queued: the cost model only, no model runs
        # the preset switch sets every knob to the preset's value (then each change re-estimates the cost)
        preset.input(lambda p: preset_values(p), inputs=[preset], outputs=list(knobs.values()), queue=False,
                     show_progress="hidden", api_visibility="private")
        gr.on([c.change for c in settings_in.values()], h.pricing.settle, inputs=[session], inputs_kwargs=settings_in,
              outputs=settled, queue=False, show_progress="hidden", api_visibility="private")
        question.change(None, inputs=[question], outputs=[counter], js=COUNTER_JS, queue=False,
                        show_progress="hidden", api_visibility="private")  # in the browser only
        # asking again while a question runs starts the new one ("multiple"): the handler stops the old
        # one, which writes nothing more to the page (Turns.begin_run)
        gr.on(
            [ask_btn.click, question.submit], h.answers.ask_session, inputs=[question, session], inputs_kwargs=settings_in,
            outputs=[status, *answer_out], api_name="ask_session", validator=h.pricing.validate_ask, trigger_mode="multiple",
            **model,
        )
        stop_btn.click(h.turns.stop_run, outputs=[status, stop_btn], queue=False,
                       api_visibility="private")
        upload_btn.click(
            h.corpus.upload, inputs=[files, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="upload", show_progress_on=status, validator=lambda f, s: validate_upload(f, s, serving), **model,
        )
        corpus_dd.input(
            h.corpus.choose_corpus, inputs=[corpus_dd, session], outputs=[status, corpus_dd, examples, *answer_out],
            api_name="choose_corpus", show_progress_on=status, **model,
        )
        stack_dd.input(  # not in the model group: a first load takes minutes and must not block questions
            h.corpus.choose_stack, inputs=[stack_dd, session], outputs=[status, stack_dd, examples, *answer_out],
            api_name="choose_stack", show_progress_on=status, concurrency_limit=None,
        )
        edit_pick.input(h.answers.pick_passage, inputs=[edit_pick, session], outputs=[edit_text, edit_title],
                        api_visibility="private", queue=False)
        edit_btn.click(
            h.answers.edit_passage, inputs=[edit_pick, edit_text, question, session], inputs_kwargs=edit_in,
            outputs=[status, *answer_out], api_name="edit_passage", validator=h.pricing.validate_edit, **model,
        )
        gr.on([ask_btn.click, question.submit], lambda: render_without(None), outputs=[without], queue=False,
              show_progress="hidden", api_visibility="private")  # a new question: the comparison is stale
        # its output is hidden data: the progress shows on the comparison it is drawn into, so the
        # visitor sees the second run going rather than a page that seems to ignore the click
        without_btn.click(lambda: gr.Button(visible=True), outputs=[stop_btn], queue=False, show_progress="hidden",
                          api_visibility="private")  # Stop ends it, as it ends a question
        without_btn.click(h.answers.without_passage, inputs=[without_id, raw, session], outputs=[without_data, session],
                          api_name="without_passage", show_progress_on=[without], **model
                          ).then(render_without, inputs=[without_data], outputs=[without], queue=False,
                                 show_progress="hidden", api_visibility="private"
                                 ).then(lambda: gr.Button(visible=False), outputs=[stop_btn], queue=False,
                                        show_progress="hidden", api_visibility="private")
        continue_btn.click(h.answers.continue_mode, inputs=[continue_mode, raw, session],
                           outputs=[*cards, passages, raw, stop_btn, session], api_name="continue_mode", **model)
        reset_btn.click(h.corpus.reset_edits, inputs=[session], outputs=[status, *answer_out], api_name="reset_edits",
                        show_progress_on=status)
        wire_results(results, session, model)
        # "show the code" follows the answers on screen, whichever event put them there
        raw.change(h.answers.show_code, inputs=[raw, session], outputs=[code_cli, code_py, code_note], queue=False,
                   show_progress="hidden", api_visibility="private")
        # MCP tools first (gradio names a tool after its function and keeps the first of a name):
        # `ask` and `ask_stream` answer an agent in JSON text; /ask and /ask_stream answer the API in dicts
        for fn, name in ((h.api.ask, "ask"), (h.api.ask_stream, "ask_stream")):
            describe_api(gr.api(json_tool(fn, name), api_name=f"{name}_json", **model), demo)
        for fn, name in ((h.api.ask, "ask"), (h.api.ask_stream, "ask_stream")):
            describe_api(gr.api(fn, api_name=name, **model), demo)

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
    # an exception no check foresaw shows a short message with an id (validation.unexpected), never its text
    kwargs.setdefault("show_error", False)
    # gradio refuses a far larger file while it streams in, before it is written to disk (with its own
    # toast and a bare "Error" on the box); one a little over the limit gets check_upload's message
    kwargs.setdefault("max_file_size", TRANSFER_LIMIT_BYTES)
    # a class's tabs and its API clients, not every session since the start (STATE_SESSIONS)
    kwargs.setdefault("state_session_capacity", STATE_SESSIONS)
    # the named API endpoints are MCP tools too (gradio[mcp]; streamable HTTP at /gradio_api/mcp/):
    # an agent calls `ask` with the question and gets /ask's dict
    kwargs.setdefault("mcp_server", True)
    # gradio warns of a gr.State input on every named endpoint, also the page's that its MCP server
    # does not list (api.page_event); the tools it lists take none (tests/test_ui.py checks it)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="This MCP server includes a tool that has a gr.State input")
        return demo.launch(**kwargs)
