"""The web app (rag_demo/ui.py): pure rendering, the pipeline pool, and the launched app driven
through gradio_client (named endpoints, bad input, per-session corpora, edits, a burst).

The app-level tests run the real offline models over a 3-document corpus (models load once per
session, ~20 s; an answer with max_new_tokens <= 8 takes about a second).
"""
from __future__ import annotations

import inspect
import json
import logging
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_demo.serving import admission
import gradio as gr
from rag_demo.web import api as web_api
from rag_demo.web import handlers
from rag_demo.web import page
from rag_demo.serving.pool import PipelinePool, default_unavailable
from rag_demo.web import passages_view, render
from rag_demo.serving.session import Session
from rag_demo.web import session_view
from rag_demo.web import validation
from rag_demo.config import KNOBS, MODES, PRESETS, RagSettings
from rag_demo.knowledge.uploads import MAX_UPLOAD_BYTES
from rag_demo.knowledge.corpus import VITAL_ARTICLES_NAME, Corpus, Passage

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ("Georges Seurat", "Georges Seurat was a French post-Impressionist artist. He devised the painting technique "
     "known as pointillism.", None),
    ("The Starry Night", "The Starry Night is an oil-on-canvas painting by Vincent van Gogh, painted in June 1889.",
     "https://en.wikipedia.org/wiki/The_Starry_Night"),
    ("Mars", "Mars is the fourth planet from the Sun.", None),
]
SMALL = {"k": 2, "num_beams": 1, "max_new_tokens": 8, "sequence_decoding": "thorough"}
DEFAULTS = RagSettings(preset="aided")  # the offline stack's preset, what the page starts with
# every control as the page sends it: the preset switch, then each knob in its declaration order
ALL = {**DEFAULTS.knobs(), "preset": DEFAULTS.preset}
EDIT = {**dict(list(ALL.items())[:4]), "new_title": "Mars", **ALL}  # /edit_passage: the title after the first four


def _other(spec):
    """(a value of this knob that is not the aided default, as its control sends it; the value it
    must give): a slider sends a float, a checkbox a bool, a radio its choice."""
    if spec.kind == "bool":
        return not spec.aided, not spec.aided
    if spec.kind == "choice":
        v = next(c for c in spec.choices if c != spec.aided)
        return v, v
    v = spec.lo if spec.aided != spec.lo else spec.hi
    return float(v), (int(v) if spec.kind == "int" else float(v))


# every knob, generated from the declarations: a new knob is tested through the page, the API,
# the validators and the cost line without a line added here
READER = {name: _other(spec) for name, spec in KNOBS.items()}
OLD_CALL = {"k": 1, "num_beams": 1, "max_new_tokens": 8, "sequence_decoding": "fast"}  # /ask's first four, positional
UNAVAILABLE = "HF_HUB_OFFLINE is set"


def fake_unavailable(stack: str) -> str | None:
    return UNAVAILABLE if stack == "paper" else None


# ---------------------------------------------------------------- pure: rendering


def answer_dict(mode="token", tokens=("Vincent", " van", " Gogh"), rows=None, docs=None, text=None, **kw):
    docs = docs if docs is not None else [
        {"rank": 1, "id": "a#0", "title": "The Starry Night", "text": "painted by Vincent van Gogh",
         "url": "https://en.wikipedia.org/wiki/The_Starry_Night", "score": 0.8, "prior": 0.7},
        {"rank": 2, "id": "b#0", "title": "Mars <b>planet</b>", "text": "Mars & moons", "url": None,
         "score": 0.1, "prior": 0.3},
    ]
    rows = rows if rows is not None else ([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]] if docs else [])
    d = {
        "question": "Who painted it?", "mode": mode, "text": text if text is not None else "".join(tokens),
        "tokens": list(tokens), "token_ids": list(range(len(tokens))), "docs": docs,
        "token_doc_posteriors": rows, "top_docs": [row.index(max(row)) for row in rows],
        "doc_posterior": [0.65, 0.35] if docs else None,
        "sequence_logprob": -1.25, "decoding": "greedy",
        "timings": {"encode": 0.01, "retrieve": 0.002, "generate": 1.5, "attribute": 0.1, "total": 1.612},
        "stack": "offline", "corpus": "Test corpus", "candidates": [],
    }
    d.update(kw)
    return d


def test_ui_imports_without_torch():
    code = "import sys, rag_demo.web.page; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_renderers_pool_session_and_serving_import_neither_gradio_nor_torch():
    code = ("import sys, rag_demo.web.render, rag_demo.serving.pool, rag_demo.serving.session, rag_demo.serving.admission; bad = [m for m in ('torch', 'gradio') if m in sys.modules]; "
            "assert not bad, bad; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_validators_put_the_library_message_on_the_bad_input_only():
    def bad(results):
        return {i: r["message"] for i, r in enumerate(results) if not r["is_valid"]}

    ok = validation.validate_ask("Who painted The Starry Night?", None, **ALL)
    assert len(ok) == 2 + len(ALL) and bad(ok) == {}  # question, session, the settings
    assert list(bad(validation.validate_ask("  ", None, **ALL))) == [0]
    assert "question is empty" in bad(validation.validate_ask("  ", None, **ALL))[0]
    assert "over the limit of 1000" in bad(validation.validate_ask("x" * 1001, None, **ALL))[0]
    settings = bad(validation.validate_ask("What is Mars?", None, **{**ALL, "k": 0}))
    assert list(settings) == [2] and "k=0 is out of range" in settings[2]  # on K only

    mars = Session(last_docs=(("Mars#0", "Mars", "Mars is red."),))
    ok = validation.validate_edit("Mars#0", "Mars is red.", "What is Mars?", mars, **EDIT)
    assert len(ok) == 4 + len(EDIT) and bad(ok) == {}  # pid, text, question, session, settings and title
    assert "No passage chosen" in bad(validation.validate_edit(None, "x", "What is Mars?", None, **EDIT))[0]
    assert list(bad(validation.validate_edit("Mars#0", " \n ", "What is Mars?", mars, **EDIT))) == [1]
    assert list(bad(validation.validate_edit("Mars#0", "x", "", mars, **EDIT))) == [2]
    # the results follow the event's inputs: the title (never invalid) sits where the event put it
    wrong = bad(validation.validate_edit("Mars#0", "x", "What is Mars?", mars, **{**EDIT, "passage_sentences": 99}))
    assert list(wrong) == [4 + list(EDIT).index("passage_sentences")]


def test_edit_validator_names_a_passage_that_is_not_in_the_last_answer():
    s = Session(last_docs=(("Mars#0", "Mars", "Mars is red."),))
    ok = validation.validate_edit("Mars#0", "Mars is blue.", "What is Mars?", s, **EDIT)
    assert all(r["is_valid"] for r in ok) and len(ok) == 4 + len(EDIT)
    bad = validation.validate_edit("Nope#3", "text", "What is Mars?", s, **EDIT)
    assert [i for i, r in enumerate(bad) if not r["is_valid"]] == [0]
    assert "'Nope#3' is not one of the passages retrieved for your last question" in bad[0]["message"]
    fresh = validation.validate_edit("Mars#0", "text", "What is Mars?", None, **EDIT)  # nothing asked yet
    assert not fresh[0]["is_valid"] and "ask a question" in fresh[0]["message"]


def test_question_counter_shows_the_one_limit():
    assert 'data-n="0"' in page.render_counter("") and "0 / 1,000 characters" in page.render_counter("")
    over = page.render_counter("x" * 5000)
    assert "5,000 / 1,000 characters" in over and "rag-over" in over and "shorten" in over
    assert page.render_counter("  " + "x" * 1000 + "  ").count("rag-over") == 0  # counts what check_question counts
    assert "limit = 1000" in page.COUNTER_JS and ".trim()" in page.COUNTER_JS


def test_upload_validator_reads_the_files_before_the_queue(tmp_path):
    good = tmp_path / "mars.txt"
    good.write_text("Mars is the fourth planet from the Sun.")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(256)) * 8)
    assert all(r["is_valid"] for r in validation.validate_upload([str(good)], None))
    bad = validation.validate_upload([str(binary)], None)
    assert not bad[0]["is_valid"] and "looks binary" in bad[0]["message"] and bad[1]["is_valid"]
    assert "No file uploaded" in validation.validate_upload([], None)[0]["message"]
    assert "over the limit of 20" in validation.validate_upload([str(good)] * 21, None)[0]["message"]


def test_a_stopped_card_offers_to_answer_in_full_only_once_its_run_has_written_the_last_answers():
    """The button reads the last answers, written with the run's final outputs: a card final while
    the run still streams has no button yet (a click then would find no answer to continue)."""
    from rag_demo.web.answering import partial_outputs

    stopped = answer_dict(stopped="cancelled", final=True)
    streaming = partial_outputs({"token": stopped})
    token_card = streaming[1 + list(MODES).index("token")]
    assert "cut: stopped" in token_card and "rag-continue-btn" not in token_card
    assert "rag-continue-btn" in render.render_answer(stopped)


def test_answer_card_names_its_question_and_marks_a_cut_answer():
    card = render.render_answer(answer_dict(question="Where is the <Taj> Mahal?", stopped="eos"))
    assert "Q: Where is the &lt;Taj&gt; Mahal?" in card and "rag-cut" not in card
    cut = render.render_answer(answer_dict(stopped="max_new_tokens"))
    assert 'class="rag-cut"' in cut and "…" in cut and "cut: max new tokens reached" in cut
    late = render.render_answer(answer_dict(stopped="time_limit"))
    assert "cut: time limit reached" in late and "…" in late
    assert "rag-cut" not in render.render_answer(answer_dict())  # answers from before Answer.stopped
    read = render.render_answer(answer_dict(question="who painted <b>", read_question="Who painted <b>?"))
    assert "Q: who painted &lt;b&gt; <span" in read and "(read as: Who painted &lt;b&gt;?)" in read
    assert "read as" not in render.render_answer(answer_dict(question="Who painted it?", read_question=""))
    cands = [{"text": "Vincent van Gogh.", "logprob": -1.25}, {"text": "Gauguin.", "logprob": -3.0, "lower_bound": True}]
    fast = render.render_answer(answer_dict(mode="sequence", candidates=cands, decoding="fast, 2 beams"))
    assert "Candidates, each scored by the passages that wrote it (≥: at least this; the chosen one's score is the card's) " \
        "(2, fast, 2 beams)" in fast
    assert "<code>-1.250</code> Vincent" in fast and "<code>≥ -3.000</code> Gauguin" in fast
    thorough = render.render_answer(answer_dict(mode="sequence", candidates=cands, decoding="thorough, 2 beams"))
    assert "Candidates rescored under every passage (2, thorough, 2 beams)" in thorough and "each scored by" not in thorough


def test_tokens_are_coloured_by_their_top_passage():
    html = render.render_tokens(answer_dict())
    assert html.count('<a class="rag-tok') == 3
    # token 1 -> passage 1, token 2 -> passage 2, token 3 -> passage 1 (colours by rank)
    spans = html.split("<a ")[1:]
    assert render.PALETTE[0] in spans[0] and 'data-rank="1"' in spans[0]
    assert render.PALETTE[1] in spans[1] and 'data-rank="2"' in spans[1]
    assert 'data-rank="1"' in spans[2]
    assert "The Starry Night" in spans[0] and "p = 0.90" in spans[0]  # hover title names passage + posterior
    assert spans[0].count("<sup>") == 1 and spans[1].count("<sup>") == 1 and spans[2].count("<sup>") == 1
    assert 'href="#rag-p-1"' in spans[0]
    legend = html.split('class="rag-legend"')[1]
    assert legend.count("rag-legend-item") == 2 and "Mars &lt;b&gt;planet&lt;/b&gt;" in legend  # escaped


def test_inspector_has_a_panel_per_token_with_a_row_per_passage():
    ins = [{"p_token": [0.5, 0.05], "top": [[["Vin", 0.5], ["Van", 0.2], ["<b>", 0.1]], [["Mars", 0.6], ["a", 0.1],
                                                                                       ["the", 0.05]]],
            "mix": [["Vin", 0.37], ["Mars", 0.18], ["Van", 0.14]]}] * 3
    html = render.render_answer(answer_dict(inspector=ins))
    assert html.count('class="rag-insp"') == 3 and html.count(" hidden>") == 3  # shown by the page's script
    assert [int(x) for x in re.findall(r'<a class="rag-tok[^>]* data-i="(\d+)"', html)] == [0, 1, 2]
    panel = html.split('class="rag-insp" data-i="1"')[1].split('class="rag-insp" data-i="2"')[0]
    assert panel.count("<tr") == 3  # head + a row per passage
    assert ">0.200</td>" in panel and ">0.800</td>" in panel  # the heatmap row of token 2, as the heatmap has it
    assert "&lt;b&gt;" in panel and "<b>" not in panel.replace("<b>planet</b>", "")  # token text escaped
    assert "The mixture" in panel and "0.37" in panel
    seq = render.render_answer(answer_dict(mode="sequence", inspector=[{**i, "mix": None} for i in ins]))
    assert seq.count('class="rag-insp"') == 3 and "The mixture" not in seq and "p(z | x, y_≤i)" in seq
    assert 'class="rag-insp"' not in render.render_answer(answer_dict())  # no inspector data: no panels


def test_heatmap_has_a_row_per_token_and_a_column_per_passage():
    html = render.render_heatmap(answer_dict())
    assert 'data-tokens="3" data-docs="2"' in html
    body = html.split("<tbody>")[1]
    assert body.count("<tr>") == 3
    assert body.count('<td class="rag-heat-tok">') == 3
    assert body.count("<td class=") == 3 + 3 * 2
    assert "0.90" in body and "0.80" in body
    assert body.count("rag-max") == 3  # one strongest passage per token row
    assert "Fig. 2" in html  # RAG-Token caption


def test_answer_card_shows_score_timings_and_escapes_text():
    card = render.render_answer(answer_dict(text="<img src=x onerror=alert(1)>", tokens=("<img", " src", "=x")))
    assert "<img src=x" not in card and "&lt;img src=x onerror=alert(1)&gt;" in card
    assert "log p(y|x) = -1.250" in card
    for stage in ("encode 10 ms", "retrieve 2 ms", "generate 1.50 s", "attribute 100 ms", "total 1.61 s"):
        assert stage in card
    assert "RAG-Token" in card and "rag-heat" in card and "rag-tokens" in card


def test_closed_book_card_has_no_passages_and_says_why():
    card = render.render_answer(answer_dict(mode="closed-book", docs=[], rows=[]))
    assert "Closed-book" in card and "No passages" in card
    assert "rag-heat" not in card and "rag-tok" not in card


def test_empty_answer_and_infinite_score_render():
    card = render.render_answer(answer_dict(text="", tokens=(), rows=[], sequence_logprob=None))
    assert "(empty answer)" in card and "-inf" in card
    cut = render.render_answer(answer_dict(text="", tokens=(), rows=[], sequence_logprob=None, stopped="time_limit"))
    assert "(no answer: time limit reached)" in cut and "(empty answer)" not in cut
    assert render.render_answer(None, mode="sequence").count("Ask a question") == 1


def test_passages_table_one_table_when_modes_share_docs():
    answers = {"sequence": answer_dict("sequence"), "token": answer_dict("token"),
               "closed-book": answer_dict("closed-book", docs=[], rows=[])}
    html = passages_view.render_passages(answers, edits=("b#0",))
    assert html.count("<table") == 1
    assert html.count("<tr id=") == 2 and 'id="rag-p-all-1"' in html
    assert "RAG-Sequence<br>p(z|x,y)" in html and "RAG-Token<br>mean p(z|x,y_i)" in html
    assert 'href="https://en.wikipedia.org/wiki/The_Starry_Night"' in html  # linked title
    assert "0.800" in html and "0.700" in html  # retrieval score, prior
    assert html.count("edited by you") == 1
    assert passages_view.anchors(answers) == {"sequence": "rag-p-all-", "token": "rag-p-all-"}


def test_passages_table_splits_when_modes_retrieved_differently():
    other = [dict(d, id=d["id"] + "x") for d in answer_dict()["docs"]]
    answers = {"sequence": answer_dict("sequence"), "token": answer_dict("token", docs=other)}
    html = passages_view.render_passages(answers)
    assert html.count("<table") == 2 and "for RAG-Sequence" in html and "for RAG-Token" in html
    assert passages_view.anchors(answers) == {"sequence": "rag-p-sequence-", "token": "rag-p-token-"}


def test_heatmap_labels_make_whitespace_visible():
    assert [render.show_token(t) for t in ("\n", " ", "", " Gogh", "\t")] == ["↵", "␣", "∅", " Gogh", "⇥"]
    assert render.plural(1, "passage") == "1 passage" and render.plural(11485, "passage") == "11,485 passages"


def test_example_questions():
    vital = Corpus(VITAL_ARTICLES_NAME, [Passage("x#0", "x", "y")])
    assert session_view.example_questions(vital) == list(session_view.VITAL_EXAMPLES)
    assert "Who painted The Starry Night?" in session_view.VITAL_EXAMPLES
    up = Corpus("Your documents", [Passage("Mars#0", "Mars", "t"), Passage("Mars#1", "Mars", "u"),
                                   Passage("notes row 3#0", "notes row 3", "v"), Passage("Venus#0", "Venus", "w")])
    assert session_view.example_questions(up) == ["What is Mars?", "What do the documents say about Venus?"]


# ---------------------------------------------------------------- pure: the pipeline pool


class FakePipe:
    def __init__(self, name):
        self.stack = type("S", (), {"name": name, "describe": lambda self: f"{name}: fake"})()
        self.index = type("I", (), {"corpus": Corpus("Fake corpus", [Passage("Mars#0", "Mars", "red")])})()

    def answer_modes(self, *a, **k):  # marks it as a pipeline for PipelinePool.of
        raise NotImplementedError


def test_pool_loads_each_stack_once_lazily_and_relays_progress():
    calls, loading, go = [], threading.Event(), threading.Event()

    def factory(stack, progress):
        calls.append(stack)
        progress(0.5, "half way")
        loading.set()
        assert go.wait(10)  # still loading while the other visitors ask
        return FakePipe(stack)

    pool = PipelinePool(factory, unavailable=fake_unavailable)
    assert pool.loaded("offline") is None and calls == []
    seen, results = [], []
    threads = [threading.Thread(target=lambda: results.append(pool.get("offline", lambda f, m: seen.append(m))))
               for _ in range(4)]
    threads[0].start()
    assert loading.wait(10)
    for t in threads[1:]:
        t.start()
    go.set()
    for t in threads:
        t.join(10)
    assert calls == ["offline"] and len(results) == 4 and len({id(r) for r in results}) == 1
    assert any("half way" in m or "ready" in m or "Starting" in m for m in seen)


def test_pool_refuses_an_unavailable_stack_at_once():
    pool = PipelinePool(lambda s, p: FakePipe(s), unavailable=fake_unavailable)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="paper stack is unavailable here: HF_HUB_OFFLINE is set"):
        pool.get("paper")
    assert time.perf_counter() - t0 < 1
    labels = dict((v, k) for k, v in session_view.stack_choices(pool))
    assert "unavailable: HF_HUB_OFFLINE is set" in labels["paper"] and "unavailable" not in labels["offline"]


def test_pool_reports_a_failed_load_and_can_retry():
    attempts = []

    def factory(stack, progress):
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("disk on fire")
        return FakePipe(stack)

    pool = PipelinePool(factory, unavailable=fake_unavailable)
    with pytest.raises(ValueError, match=r"could not be loaded: an unexpected error on the server \(error [0-9a-f]{8}"):
        pool.get("offline")
    shown = session_view.render_status(pool, Session())
    assert "Could not load" in shown and "disk on fire" not in shown  # never the exception's own text
    assert pool.get("offline").stack.name == "offline"


def test_page_load_streams_loading_progress_then_says_what_is_live():
    shown = [threading.Event() for _ in range(3)]

    def factory(stack, progress):
        for i in range(3):
            progress(i / 3, f"step {i}")
            assert shown[i].wait(10)  # the next step only once the page has shown this one
        return FakePipe(stack)

    pool = PipelinePool(factory, unavailable=fake_unavailable)
    steps = []
    for step in handlers.Handlers(pool).corpus.on_load(None):
        steps.append(step)
        for i, said in enumerate(shown):
            if f"step {i}" in step[0]:
                said.set()
    statuses = [step[0] for step in steps]
    assert len(statuses) >= 3
    assert all("Loading the <b>offline</b> stack" in st and "rag-bar" in st for st in statuses[:-1])
    assert any("step 1" in st or "step 2" in st for st in statuses)
    assert 'data-stack="offline"' in statuses[-1] and "Fake corpus" in statuses[-1] and "1 passage)" in statuses[-1]
    assert "What is Mars?" in steps[-1][1]  # lessons from the live corpus
    assert isinstance(steps[-1][-1], Session)


class Ans:
    def __init__(self, mode, q):
        self.d = answer_dict(mode, question=q) if mode != "closed-book" else answer_dict(
            mode, docs=[], rows=[], question=q)

    def to_dict(self):
        return self.d


class AnsweringPipe(FakePipe):
    """A fake pipeline over a one-passage corpus that answers instantly."""

    def __init__(self, name="offline"):
        super().__init__(name)
        self.index.__class__.__len__ = lambda self: 1
        self.calls = []
        self.settings_seen = []
        self.modes_calls = []

    def answer(self, q, mode, settings, **kw):
        self.calls.append((mode, settings.decoding.k, kw))
        self.settings_seen.append(settings)
        a = Ans(mode, q)
        run = kw.get("run")
        if run is not None and run.stop_for(mode)():  # stops as the engine would, at its first step
            a.d["stopped"] = run.stop_for(mode)()
        return a

    def answer_modes(self, q, modes, settings, run=None, partials=False):
        """As RagPipeline.answer_modes: an event with each mode's final answer when it is done."""
        from rag_demo.answer import AnswerEvent

        self.modes_calls.append(list(modes))
        for mode in modes:
            yield AnswerEvent(mode, True, self.answer(q, mode, settings, run=run))

    def with_index(self, index):
        return self


def ask_all(h, *args, **kwargs):
    """ask_session streams: the outputs it yields last are the final ones."""
    out = None
    for out in h.answers.ask_session(*args, **kwargs):
        pass
    return out


def test_k_reduced_warning_is_shown_once_per_session_and_corpus(monkeypatch):
    warnings = []
    monkeypatch.setattr(gr, "Warning", lambda msg, *a, **k: warnings.append(msg))
    pipe = AnsweringPipe()
    pool = PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable)
    h = handlers.Handlers(pool)
    s = None
    for _ in range(3):
        out = ask_all(h, "What is Mars?", s, progress=noprogress, k=5, max_new_tokens=8)
        s = out[-1]
    assert warnings == ["This corpus has only 1 passage: using K = 1 instead of 5."]
    assert {k for _, k, _ in pipe.calls} == {1}
    ask_all(h, "What is Mars?", None, progress=noprogress, k=5)  # a new session is told too
    assert len(warnings) == 2


def test_the_three_cards_come_from_one_call_each_shown_when_done():
    """One answer_modes call a question (RAG-Token reuses RAG-Sequence's prefill and drafts), and
    the streamed output carries each card final before the next mode is asked."""
    pipe = AnsweringPipe()
    pool = PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable)
    finals = []
    for out in handlers.Handlers(pool).answers.ask_session("What is Mars?", None, progress=noprogress, k=1):
        cards = out[1:1 + len(MODES)]
        done = [m for m, c in zip(MODES, cards) if isinstance(c, str) and "rag-total" in c]
        if done and (not finals or finals[-1][0] != done):
            finals.append((done, len(pipe.calls)))
    assert pipe.modes_calls == [list(MODES)]
    assert finals == [(list(MODES[: i + 1]), i + 1) for i in range(len(MODES))]  # card i final before mode i+1 ran


def test_unavailable_stack_is_said_once_in_the_status_line(monkeypatch):
    popups = []
    for kind in ("Warning", "Info"):
        monkeypatch.setattr(gr, kind, lambda msg, *a, **k: popups.append(msg))
    pipe = AnsweringPipe()
    pool = PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable)
    out = handlers.Handlers(pool).corpus.choose_stack("paper", None, progress=noprogress)
    assert popups == []
    assert out[0].count("unavailable here: HF_HUB_OFFLINE is set") == 1 and 'data-stack="offline"' in out[0]


def test_ready_only_after_warm_up():
    warmed, release, said = threading.Event(), threading.Event(), threading.Event()

    class WarmPipe(FakePipe):
        def warm_up(self, progress=None):
            progress("answering one question in every mode")
            said.set()
            release.wait(10)
            warmed.set()
            return 0.5

    pool = PipelinePool(lambda s, p: WarmPipe(s), unavailable=fake_unavailable)
    pool.start("offline")
    assert said.wait(10) and "every mode" in pool.progress("offline")[1]
    assert pool.loaded("offline") is None and pool.loading("offline")  # loaded, not yet warm: not ready
    status = session_view.render_status(pool, Session())
    assert "rag-loading" in status and "data-stack" not in status and "every mode" in status
    release.set()
    pipe = pool.get("offline", timeout=10)
    assert warmed.is_set() and pool.loaded("offline") is pipe
    assert 'data-stack="offline"' in session_view.render_status(pool, Session())


def test_one_expensive_request_at_a_time_so_cheap_ones_always_find_a_slot():
    class Cost:
        def __init__(self, heavy):
            self.heavy, self.seconds = heavy, 40.0 if heavy else 3.0

        def describe(self):
            return f"about {self.seconds:.0f} s and 0.4 GB"

    budget = type("B", (), {"heavy_seconds": 20.0, "time_limit_s": 60.0})()
    serving = admission.Serving(budget=budget, max_heavy=1)
    with serving.heavy_slot(Cost(True)):
        assert "1 expensive question already running" in serving.heavy_busy()
        with pytest.raises(ValueError, match=r"expensive \(about 40 s and 0.4 GB\).*under about 20 s, or no more than 1.5x the default settings"):
            with serving.heavy_slot(Cost(True)):
                pass
        with serving.heavy_slot(Cost(False)), serving.heavy_slot(None):  # cheap ones are never held back
            pass
    assert serving.heavy_busy() is None
    with serving.heavy_slot(Cost(True)):  # the slot was given back
        pass


def test_questions_no_costlier_than_the_defaults_are_never_expensive():
    from rag_demo.models.cost import Cost
    from rag_demo.serving.budget import Budget

    class Pipe:
        def check_budget(self, q, modes, settings, budget, passages=None):
            secs = 8.0 * settings.decoding.k / 5 * settings.decoding.max_new_tokens / 32
            return Cost(secs, 1, {}, heavy=secs > budget.heavy_seconds)

        def estimate(self, q, modes, settings, passages=None):
            return Cost(8.0 * settings.decoding.k / 5 * settings.decoding.max_new_tokens / 32, 1, {})

    serving = admission.Serving(budget=Budget(heavy_seconds=6.0))
    assert serving.check(Pipe(), "q", RagSettings(preset="aided")).heavy is False  # 8 s > 6 s, but it is the default
    assert serving.check(Pipe(), "q", RagSettings(preset="aided", k=5, max_new_tokens=40)).heavy is False  # within 1.5x
    assert serving.check(Pipe(), "q", RagSettings(preset="aided", k=20, max_new_tokens=128)).heavy is True


def test_the_page_defaults_are_admitted_even_when_the_estimate_is_over_the_budget():
    from rag_demo.models.cost import Cost
    from rag_demo.serving.budget import Budget

    class SlowCpu:  # a warm-up calibrated on a busy CPU: even the defaults look too slow
        def check_budget(self, q, modes, settings, budget, passages=None):
            raise ValueError("This request (K=...) would need about 57 s of generation (limit 45 s)")

        def estimate(self, q, modes, settings, passages=None):  # priced by K alone here; the defaults' K prices 57 s
            return Cost(57.0 * settings.decoding.k / RagSettings(preset="aided").decoding.k, 1, {})

    serving = admission.Serving(budget=Budget())
    cost = serving.check(SlowCpu(), "q", RagSettings(preset="aided"))
    assert cost.seconds == 57.0 and cost.heavy is False
    assert serving.check(SlowCpu(), "q", RagSettings(preset="aided", k=2, max_new_tokens=8)).heavy is False
    with pytest.raises(ValueError, match="would need about 57 s"):
        serving.check(SlowCpu(), "q", RagSettings(preset="aided", k=6))


def test_client_gone_reads_the_queue_jobs_of_the_session():
    class Ev:
        def __init__(self, sh, alive=True):
            self.session_hash, self.alive = sh, alive

    class Q:
        active_jobs = [None, [Ev("other")]]

    q = Q()
    req = type("R", (), {"session_hash": "mine"})()
    gone = admission.client_gone(lambda: q, req)
    assert gone() is False  # not running (yet): never cancel what we cannot see
    mine = Ev("mine")
    q.active_jobs = [[mine], [Ev("other", alive=False)]]
    assert gone() is False
    mine.alive = False  # what gradio's queue does when the session's event stream closes
    assert gone() is True
    assert admission.client_gone(lambda: q, None) is None
    assert admission.client_gone(lambda: 1 / 0, req)() is False  # gradio internals changed: never cancels


def test_gradio_queue_still_marks_dead_jobs_the_way_client_gone_reads_them():
    """client_gone relies on gradio internals: Queue.active_jobs holding Events with
    session_hash and alive, and clean_events setting alive = False. Checked here so a gradio
    upgrade that changes them fails a test instead of silently never cancelling."""
    import inspect

    from gradio import queueing

    src = inspect.getsource(queueing.Queue.clean_events)
    assert "active_jobs" in src and "job.alive = False" in src and "session_hash" in src
    ev_init = inspect.getsource(queueing.Event.__init__)
    assert "self.alive = True" in ev_init and "self.session_hash" in ev_init


def test_default_unavailable_names_the_reason_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert default_unavailable("offline") is None
    # the clock is for the probe, not for the first import of torch and transformers it triggers
    # (13 s measured on a loaded 2-core machine)
    import huggingface_hub  # noqa: F401
    import rag_demo.models.stacks  # noqa: F401

    t0 = time.perf_counter()
    reason = default_unavailable("paper")
    assert time.perf_counter() - t0 < 5
    # None only if the three paper checkpoints are in the local HF cache
    assert reason is None or "HF_HUB_OFFLINE" in reason


# ---------------------------------------------------------------- the reader settings


def reader_pool(pipe=None):
    pipe = pipe or AnsweringPipe()
    return pipe, PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable)


@pytest.mark.parametrize("name", list(READER))
def test_each_reader_control_changes_the_settings_built(name, monkeypatch):
    """From the widgets' values to RagSettings: settings_from_inputs, the validator's budget check
    (refuse), the page's ask, the edit, the /ask API function and the cost estimate all get it."""
    monkeypatch.setattr(gr, "Warning", lambda *a, **k: None)
    monkeypatch.setattr(gr, "Info", lambda *a, **k: None)
    sent, expected = READER[name]
    page = {**ALL, name: sent}
    assert validation.settings_from_inputs(**ALL) == DEFAULTS
    built = validation.settings_from_inputs(**page)
    assert built.knobs()[name] == expected and built.changed() == {name: expected}

    refused = []
    ok = validation.validate_ask("What is Mars?", None, lambda q, st, s: refused.append(st), **page)
    assert all(r["is_valid"] for r in ok) and refused[0].knobs()[name] == expected

    pipe, pool = reader_pool(EditablePipe())
    h = handlers.Handlers(pool)
    out = ask_all(h, "What is Mars?", None, progress=noprogress, **page)
    assert out[5]["settings"][name] == expected  # the raw answers say what they ran with
    h.answers.edit_passage("a#0", "Mars is blue.", "What is Mars?", out[-1], progress=noprogress, new_title="Mars", **page)
    assert pipe.edited == [("a#0", "Mars is blue.", "Mars")]
    h.api.ask("What is Mars?", **{name: expected})  # the API takes RagSettings' own values
    h.api.ask("What is Mars?", 1, 1, 8, "fast", "offline")  # a caller from before the reader settings
    runs = [pipe.settings_seen[i:i + 3] for i in range(0, len(pipe.settings_seen), 3)]  # three modes a question
    old = OLD_CALL.get(name, DEFAULTS.knobs()[name])  # the old caller set the first four
    assert [[st.knobs()[name] for st in run] for run in runs] == [[expected] * 3] * 3 + [[old] * 3]

    from rag_demo.serving.budget import Budget

    cost_pipe, pool = reader_pool(CostPipe())
    html = handlers.Handlers(pool).pricing.estimate(None, **page)  # the cost model alone
    assert 'class="rag-cost"' in html and "rag-over" not in html
    assert [st.knobs()[name] for st in cost_pipe.estimated] == [expected] and cost_pipe.budgeted == []
    html = handlers.Handlers(pool, serving=admission.Serving(budget=Budget())).pricing.estimate(None, **page)  # and the budget
    assert 'class="rag-cost"' in html and [st.knobs()[name] for st in cost_pipe.budgeted] == [expected]


@pytest.mark.parametrize("name, value, message", [
    ("answer_style", "long", "answer_style='long' is unknown"),
    ("prior_temperature", 30, "prior_temperature=30 is out of range"),
    ("prior_temperature", "hot", "prior_temperature='hot' is not a number"),
    ("passage_sentences", 2.5, "passage_sentences=2.5 is not a whole number"),
    ("passage_sentences", 21, "passage_sentences=21 is out of range"),
    ("question_position", "before", "question_position='before' is unknown"),
])
def test_bad_reader_settings_get_the_library_message(name, value, message):
    import html
    import re

    out = validation.validate_ask("What is Mars?", None, **{**ALL, name: value})
    bad = {i: r["message"] for i, r in enumerate(out) if not r["is_valid"]}
    assert list(bad) == [2 + list(ALL).index(name)] and message in bad[2 + list(ALL).index(name)]  # on it only
    pipe, pool = reader_pool(CostPipe())
    h = handlers.Handlers(pool)
    with pytest.raises(gr.Error, match=re.escape(message)):
        ask_all(h, "What is Mars?", None, progress=noprogress, **{**ALL, name: value})
    with pytest.raises(gr.Error, match=re.escape(message)):
        h.api.ask("What is Mars?", **{name: value})
    assert pipe.calls == []  # nothing ran
    est = h.pricing.estimate(None, **{name: value})
    assert "rag-over" in est and message in html.unescape(est) and pipe.estimated == []


class EditablePipe(AnsweringPipe):
    """An AnsweringPipe whose index takes edits (recorded; the edited index is the same index, as
    PassageIndex.with_edited_passage returns an index)."""

    def __init__(self, name="offline"):
        super().__init__(name)
        self.edited = []
        self.stack.ctx_encoder = None

        def edit(pid, text, enc, title=None):
            self.edited.append((pid, text, title))
            return self.index
        self.index.with_edited_passage = edit


class CostPipe(AnsweringPipe):
    """An AnsweringPipe with a cost model that records the settings it prices."""

    def __init__(self, name="offline"):
        super().__init__(name)
        self.estimated, self.budgeted = [], []

    @staticmethod
    def cost(modes):
        from rag_demo.models.cost import Cost

        return Cost(1.0, 2**20, {m: 1.0 / len(modes) for m in modes})

    def estimate(self, q, modes, settings, passages=None):
        self.estimated.append(settings)
        return self.cost(modes)

    def check_budget(self, q, modes, settings, budget, passages=None):
        self.budgeted.append(settings)
        return self.cost(modes)


def test_the_page_controls_and_the_api_come_from_the_knob_declarations():
    """One control per declared knob (its range, its label, the aided default), the preset switch
    next to Ask, every event that builds settings fed all of them, and /ask taking every knob as
    an optional parameter: nothing of a knob is written twice."""
    from rag_demo.web import controls

    demo = page.build_app(reader_pool()[1])
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    for name, spec in KNOBS.items():
        c = by_id[controls.elem_id(name)]
        assert c.value == DEFAULTS.knobs()[name] and c.label == spec.label, name
        if spec.kind in ("int", "float"):
            assert (c.minimum, c.maximum) == (spec.lo, spec.hi), name
        if spec.kind == "choice":
            assert [v for _, v in c.choices] == list(spec.choices), name
    assert [v for _, v in by_id["rag-preset"].choices] == list(PRESETS) and by_id["rag-preset"].value == "aided"
    inputs = {by_id[controls.elem_id(n)]._id for n in KNOBS} | {by_id["rag-preset"]._id}
    for fn_name in ("ask_session", "edit_passage", "settle"):
        fns = [f for f in demo.fns.values() if f.name == fn_name]
        assert fns and all(inputs <= {c._id for c in f.inputs} for f in fns), fn_name
    # the preset switch sets every knob to the preset's own value
    switch = next(f for f in demo.fns.values() if [c._id for c in f.inputs] == [by_id["rag-preset"]._id])
    assert [c.elem_id for c in switch.outputs] == [controls.elem_id(n) for n in KNOBS]
    assert switch.fn("paper") == list(RagSettings(preset="paper").knobs().values())
    params = {p["parameter_name"]: p for p in demo.get_api_info()["named_endpoints"]["/ask"]["parameters"]}
    for name in [*KNOBS, "preset"]:
        assert params[name]["parameter_has_default"] and params[name]["parameter_default"] is None, name


def test_the_api_endpoints_take_the_reader_settings_and_old_callers_keep_working(free_port):
    """Through gradio and gradio_client: the events pass the settings by name (inputs_kwargs),
    old positional calls still line up, and new parameters are optional (RagSettings' defaults)."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError, ValidationError

    pipe, pool = reader_pool(EditablePipe())
    demo = page.build_app(pool)
    port = free_port()
    page.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False)
        reader = {n: OLD_CALL.get(n, DEFAULTS.knobs()[n]) for n in READER}
        old = c.predict("What is Mars?", 1, 1, 8, "fast", "offline", api_name="/ask")["settings"]
        assert old["sequence_decoding"] == "fast" and {n: old[n] for n in READER} == reader
        new = c.predict("What is Mars?", api_name="/ask", **{n: v for n, (_, v) in READER.items()})["settings"]
        assert {n: new[n] for n in READER} == {n: v for n, (_, v) in READER.items()}
        assert c.predict("What is Mars?", api_name="/ask", preset="paper")["settings"]["aids_on"] == []
        with pytest.raises(AppError, match="prior_temperature=30.0 is out of range"):
            c.predict("What is Mars?", api_name="/ask", prior_temperature=30.0)

        old = c.predict("What is Mars?", 1, 1, 8, "fast", api_name="/ask_session")[5]["settings"]
        assert old["max_new_tokens"] == 8 and {n: old[n] for n in READER} == reader
        new = c.predict("What is Mars?", api_name="/ask_session", **{n: s for n, (s, _) in READER.items()})
        assert {n: new[5]["settings"][n] for n in READER} == {n: v for n, (_, v) in READER.items()}
        with pytest.raises(ValidationError, match="passage_sentences=2.5 is not a whole number"):
            c.predict("What is Mars?", api_name="/ask_session", passage_sentences=2.5)

        out = c.predict("a#0", "Mars is blue.", "What is Mars?", 1, 1, 8, "fast", "Blue Mars",
                        api_name="/edit_passage")  # the positional order from before the reader settings
        assert pipe.edited[-1] == ("a#0", "Mars is blue.", "Blue Mars") and out[5]["settings"]["max_new_tokens"] == 8
        out = c.predict("a#0", "Mars is green.", "What is Mars?", api_name="/edit_passage",
                        **{n: s for n, (s, _) in READER.items()})
        assert {n: out[5]["settings"][n] for n in READER} == {n: v for n, (_, v) in READER.items()}
    finally:
        demo.close()


def test_passage_card_dims_the_sentences_the_generator_did_not_read():
    text = "Alexander Fleming was a <Scottish> physician. He discovered penicillin in 1928. He shared a Nobel Prize."
    docs = answer_dict()["docs"]
    focused = [{**docs[0], "text": text, "read_sentences": [1]}, {**docs[1], "read_sentences": [0]}]
    html = passages_view.render_passages({"token": answer_dict("token", docs=focused)})
    first = html.split("<tr id=")[1]
    assert first.count('class="rag-unread"') == 2 and first.count('class="rag-read"') == 1
    assert first.split('class="rag-read">')[1].split("</span>")[0] == "He discovered penicillin in 1928."
    assert "a &lt;Scottish&gt; physician." in first  # escaped, dimmed
    assert 'data-read="1"' in first and "the generator read the 1 highlighted sentence" in first
    second = html.split("<tr id=")[2]  # one sentence, read: nothing dimmed
    assert "rag-unread" not in second and "the generator read the whole passage (1 sentence)" in second
    css = page.CSS_PATH.read_text()
    assert ".rag-unread" in css and "opacity" in css.split(".rag-unread")[1].split("}")[0]

    for whole in ([{**focused[0], "read_sentences": None}], [{**docs[0], "text": text}]):
        plain = passages_view.render_passages({"token": answer_dict("token", docs=whole, rows=[[1.0]] * 3)})
        assert "rag-read" not in plain and "rag-unread" not in plain and "highlighted" not in plain
        assert '<div class="rag-ptext">Alexander Fleming was a &lt;Scottish&gt; physician. He discovered' in plain


def test_modes_that_read_different_sentences_get_their_own_passage_tables():
    docs = answer_dict()["docs"]
    seq = answer_dict("sequence", docs=[{**d, "read_sentences": [0]} for d in docs])
    tok = answer_dict("token", docs=[{**d, "read_sentences": []} for d in docs])
    assert passages_view.render_passages({"sequence": seq, "token": tok}).count("<table") == 2
    assert passages_view.render_passages({"sequence": seq, "token": answer_dict("token", docs=seq["docs"])}).count("<table") == 1




# ---------------------------------------------------------------- the real app (offline models, 3 documents)


@pytest.fixture(scope="session")
def small_pipe():
    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.knowledge.corpus import corpus_from_documents
    from rag_demo.knowledge.index import build_index
    from rag_demo.pipeline import RagPipeline
    from rag_demo.models.stacks import load_stack

    stack = load_stack(StackSpec())
    index = build_index(corpus_from_documents("Test corpus", DOCS), stack.ctx_encoder)
    return RagPipeline(stack, index, RagSettings(preset="aided", **SMALL))


def test_the_defaults_exemption_is_decided_by_cost_so_every_knob_counts(small_pipe):
    """A server with a tiny budget (max_seconds 0.5) still answers each preset's defaults (they are
    always admitted), and anything no costlier by the budget's own estimate; it refuses the aided
    defaults with thorough RAG-Sequence, 5 echo retries and context contrast 4, naming its cost and
    the knobs to lower (a list of fields compared K, beams and lengths only, and admitted it)."""
    from rag_demo.serving.budget import Budget

    serving, q = admission.Serving(budget=Budget(max_seconds=0.5)), "Who painted The Starry Night?"
    for preset in ("paper", "aided"):
        defaults = RagSettings(preset=preset)
        assert small_pipe.estimate(q, list(MODES), defaults).seconds > 0.5  # over the budget: the exemption decides
        assert serving.check(small_pipe, q, defaults).heavy is False
        cheaper = defaults.merged(question_position="after", k=2)
        assert serving.check(small_pipe, q, cheaper) is not None
    costly = RagSettings(preset="aided", sequence_decoding="thorough", echo_retries=5, context_contrast=4)
    with pytest.raises(ValueError) as e:
        serving.check(small_pipe, q, costly)
    said = str(e.value)
    assert "s of generation (limit 0 s)" in said or "s of generation (limit 1 s)" in said, said
    assert "echo retries (5)" in said and "context-aware decoding off" in said and "fast RAG-Sequence decoding" in said
    # each of the three knobs alone is priced above the defaults
    for knob in ({"sequence_decoding": "thorough"}, {"echo_retries": 5}, {"context_contrast": 4.0}):
        assert small_pipe.estimate(q, list(MODES), RagSettings(preset="aided", **knob)).seconds > \
            small_pipe.estimate(q, list(MODES), RagSettings(preset="aided")).seconds, knob


@pytest.fixture(scope="module")
def app(small_pipe, free_port):
    demo = page.build_app(PipelinePool.of(small_pipe, fake_unavailable))
    port = free_port()
    page.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield demo, f"http://127.0.0.1:{port}/"
    demo.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def ask_session(c, question, **settings):
    s = {**SMALL, **settings}
    return c.predict(question, s["k"], s["num_beams"], s["max_new_tokens"], s["sequence_decoding"],
                     api_name="/ask_session")


def _text(html: str) -> str:
    """A rendered fragment's text (an answer's copied words are marked inside their passage)."""
    return re.sub(r"<[^>]+>", "", html)


def val(x):
    """The value of a component update as gradio_client returns it."""
    return x["value"] if isinstance(x, dict) and x.get("__type__") == "update" else x


def write(tmp_path, name, data: bytes | str) -> str:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


def upload(c, *paths):
    from gradio_client import handle_file

    return c.predict([handle_file(p) for p in paths], api_name="/upload")


@pytest.mark.slow
def test_named_endpoints_are_listed(app):
    api = client(app[1]).view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert {"/ask", "/ask_stream", "/ask_session", "/upload", "/choose_corpus", "/choose_stack", "/edit_passage",
            "/reset_edits", "/status", "/sweep"} <= set(api)
    # every /ask argument says what it is (its knob's help), and /ask returns a dict, as README says
    for name in ("/ask", "/ask_stream"):
        params = api[name]["parameters"]
        assert [p["parameter_name"] for p in params] == ["question", *web_api.API_ARGUMENTS]
        empty = [p["parameter_name"] for p in params if not p["python_type"]["description"]]
        assert empty == [], empty
        assert api[name]["returns"][0]["python_type"]["type"].startswith("dict")
    k = next(p for p in api["/ask"]["parameters"] if p["parameter_name"] == "k")["python_type"]["description"]
    assert KNOBS["k"].help in k and "1 to 20" in k


@pytest.mark.slow
def test_ask_endpoint_returns_three_answers(app, small_pipe):
    r = client(app[1]).predict("Who painted The Starry Night?", 2, 1, 8, "thorough", "offline", api_name="/ask")
    assert set(r) == {"question", "stack", "corpus", "weights", "settings", "answers"}
    from rag_demo.models.weights import MEASURED_GGUF

    assert r["weights"]["generator"] == "gguf" and r["weights"]["fingerprint"] == MEASURED_GGUF  # which weights answered
    assert r["weights"]["measured"] is True and r["weights"]["trained_sha256"]
    assert r["question"] == "Who painted The Starry Night?" and r["stack"] == "offline" and r["corpus"] == "Test corpus"
    assert r["settings"]["k"] == 2 and r["settings"]["max_new_tokens"] == 8
    assert set(r["answers"]) == {"sequence", "token", "closed-book"}
    titles = {d[0] for d in DOCS}
    for mode in ("sequence", "token"):
        a = r["answers"][mode]
        assert a["mode"] == mode and a["text"].strip() and 1 <= len(a["tokens"]) <= 8
        assert [d["rank"] for d in a["docs"]] == [1, 2] and a["docs"][0]["title"] == "The Starry Night"
        assert {d["title"] for d in a["docs"]} <= titles
        # float32 softmaxes over K = 2 docs sum to 1 within a few ulps: 4e-8 (priors) and 7e-8
        # (posterior rows) measured with float32 and bfloat16 weights alike (the softmax is float32)
        assert sum(d["prior"] for d in a["docs"]) == pytest.approx(1.0, abs=1e-6)
        assert len(a["token_doc_posteriors"]) == len(a["tokens"])
        assert all(len(row) == 2 and sum(row) == pytest.approx(1.0, abs=1e-6) for row in a["token_doc_posteriors"])
        assert set(a["timings"]) >= {"encode", "retrieve", "generate", "attribute", "total"}
        assert isinstance(a["sequence_logprob"], float) and a["sequence_logprob"] <= 0
    cb = r["answers"]["closed-book"]
    assert cb["docs"] == [] and cb["text"].strip()
    assert small_pipe.settings.decoding.k == 2  # the API left the shared pipeline's settings alone


@pytest.mark.slow
def test_ask_session_renders_answers_passages_tokens_heatmap(app):
    out = ask_session(client(app[1]), "Who painted The Starry Night?")
    status, seq, tok, cb, passages, raw, pick, text, title = out
    assert val(title) == "The Starry Night"
    assert "Test corpus" in status and "offline" in status
    for card, mode in ((seq, "sequence"), (tok, "token")):
        assert f'data-mode="{mode}"' in card and "rag-answer" in card
        n = len(raw["answers"][mode]["tokens"])
        assert card.count('<a class="rag-tok') == n and f'data-tokens="{n}" data-docs="2"' in card
    assert 'data-mode="closed-book"' in cb and "rag-heat" not in cb
    assert passages.count("<tr id=") == 2 and "The Starry Night" in passages
    assert val(pick) == "The Starry Night#0" and "Vincent van Gogh" in text


@pytest.mark.slow
def test_ask_stream_yields_growing_answers_then_the_final_dict_of_ask(app):
    """/ask_stream: partial answers while decoding (done false), RAG-Token's a prefix of its
    final answer, then /ask's own dict (done true); /ask itself is unchanged (one final dict).
    RAG-Token may read every step from what RAG-Sequence's searches just kept (DESIGN.md §5) and
    finish before a partial could be shown: then RAG-Sequence's drafts are the partials seen."""
    c = client(app[1])
    settings = {"k": 2, "num_beams": 1, "max_new_tokens": 12, "sequence_decoding": "thorough",
                "answer_style": "sentence", "worked_examples": 0}
    job = c.submit("Who painted The Starry Night?", api_name="/ask_stream", **settings)
    job.result(timeout=300)
    outs = list(job.outputs())  # a dict each
    final = outs[-1]
    assert final["done"] is True and not any(o["done"] for o in outs[:-1])
    once = c.predict("Who painted The Starry Night?", api_name="/ask", **settings)
    assert "done" not in once and set(once["answers"]) == set(final["answers"])
    for m in ("sequence", "token", "closed-book"):
        assert final["answers"][m]["text"] == once["answers"][m]["text"]
    tok_final = final["answers"]["token"]["token_ids"]
    growing = [o["answers"][m] for o in outs[:-1] for m in ("sequence", "token") if m in o["answers"]
               and o["answers"][m].get("partial") and o["answers"][m]["token_ids"]]
    assert growing, "no partial answer of a RAG mode was streamed"
    for p in growing:
        if p["mode"] == "token":
            assert tok_final[: len(p["token_ids"])] == p["token_ids"]
    assert any(len(p["token_ids"]) < len(tok_final) for p in growing)
    drafts = [o["answers"]["sequence"]["drafts"] for o in outs[:-1] if o["answers"].get("sequence", {}).get("drafts")]
    assert drafts and all(len(d) == 2 for d in drafts)


@pytest.mark.slow
def test_ask_is_an_mcp_tool_an_agent_can_list_and_call(app):
    """launch() serves `ask` and `ask_stream` as MCP tools, and only them: the `mcp` client lists `ask`
    with its docstring and its settings as parameters, and a call answers in the three modes as
    JSON text that json.loads reads."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def run():
        async with streamablehttp_client(app[1] + "gradio_api/mcp/") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                got = await session.call_tool("ask", {"question": "Who painted The Starry Night?", "k": 2,
                                                      "max_new_tokens": 8, "sequence_decoding": "fast"})
                return tools, got

    tools, got = asyncio.run(run())
    assert set(tools) == {"ask", "ask_stream"}, set(tools)  # the page's own events are not tools
    # the tools take no gr.State (whose value an agent could never update): launch() hides gradio's
    # warning, which it gives for the page's own endpoints too
    import gradio as gr

    listed = [f for f in app[0].fns.values() if getattr(f.fn, "_mcp_type", None) == "tool"]
    assert len(listed) >= 2, [f.api_name for f in listed]  # the two tools' endpoints
    assert not [f.api_name for f in listed if any(isinstance(i, gr.State) for i in f.inputs)]
    assert "ask" in tools and "Answer one question with RAG-Sequence, RAG-Token and closed-book" in tools["ask"].description
    params = tools["ask"].inputSchema["properties"]
    assert {"question", "k", "num_beams", "answer_style", "question_weight"} <= set(params)
    assert not got.isError, got
    text = "".join(c.text for c in got.content if getattr(c, "type", "") == "text")
    # /ask's dict as JSON text: what a client's json.loads reads (gradio would send a Python literal)
    answers = json.loads(text)["answers"]
    assert answers is not None and set(answers) == {"sequence", "token", "closed-book"}, text[:500]
    assert all(len(a["docs"]) == 2 for m, a in answers.items() if m != "closed-book")


@pytest.mark.slow
@pytest.mark.parametrize("question, message", [
    ("", "question is empty"),
    ("   ", "question is empty"),
    ("x" * 1001, "over the limit of 1000"),
])
def test_bad_questions_get_a_message_and_the_app_keeps_serving(app, question, message):
    from gradio_client.exceptions import AppError, ValidationError

    c = client(app[1])
    with pytest.raises(ValidationError, match=message):  # the UI's validator, before the queue
        ask_session(c, question)
    with pytest.raises(AppError, match=message):
        c.predict(question, 2, 1, 4, "thorough", "offline", api_name="/ask")
    assert c.predict("What is Mars?", 1, 1, 2, "fast", "offline", api_name="/ask")["answers"]["token"]["text"]


@pytest.mark.slow
def test_bad_settings_get_a_message(app):
    from gradio_client.exceptions import AppError

    c = client(app[1])
    with pytest.raises(AppError, match="k=0 is out of range"):
        c.predict("What is Mars?", 0, 1, 4, "thorough", "offline", api_name="/ask")
    with pytest.raises(AppError, match="sequence_decoding='slow' is unknown"):
        c.predict("What is Mars?", 2, 1, 4, "slow", "offline", api_name="/ask")
    with pytest.raises(AppError, match="paper stack is unavailable here: HF_HUB_OFFLINE is set"):
        c.predict("What is Mars?", 2, 1, 4, "thorough", "paper", api_name="/ask")


@pytest.mark.slow
@pytest.mark.parametrize("k, message", [(2.5, "k=2.5 is not a whole number"), ("abc", "k='abc' is not a number")])
def test_non_integer_settings_get_the_library_message(app, k, message):
    from gradio_client.exceptions import AppError

    c = client(app[1])
    with pytest.raises(AppError, match=message) as e:
        c.predict("What is Mars?", k, 1, 4, "thorough", "offline", api_name="/ask")
    assert "invalid literal" not in str(e.value)


@pytest.mark.slow
def test_unknown_passage_id_gets_a_message_not_a_bare_400(app):
    from gradio_client.exceptions import ValidationError

    c = client(app[1])
    ask_session(c, "What is Mars?", k=1, max_new_tokens=2)
    with pytest.raises(ValidationError, match="'Nope#7' is not one of the passages retrieved for your last question"):
        c.predict("Nope#7", "text", "What is Mars?", 1, 1, 2, "fast", api_name="/edit_passage")


@pytest.fixture(scope="module")
def last_raw(app):
    """The last answers' JSON as the page holds it (/ask_session's raw output), for the endpoints
    that take it back."""
    return ask_session(client(app[1]), "What is Mars?", k=1, max_new_tokens=2)[5]


NOT_AN_ANSWER = {"question": "What is Mars?", "settings": {}, "answers": {"token": "Mars"}}
# Each named endpoint sent an argument of the wrong type (a number as a string, a list or a string
# where a dict goes, None): (endpoint, its arguments, what the message says: the argument, what it
# got, what to send). /reset_edits and /status take no argument a client sends.
WRONG_TYPES = [
    ("/ask", ("What is Mars?", [2], 1, 2, "fast"), r"k=\[2\] is not a number: give e.g. 5"),
    ("/ask", (5, 1, 1, 2, "fast"), "question must be text, got int: pass a string"),
    ("/ask", ("What is Mars?", 1, 1, 2, "fast", ["offline"]), r"stack=\['offline'\] is unknown: use one of offline"),
    ("/ask_stream", ("What is Mars?", "two"), "k='two' is not a number: give e.g. 5"),
    ("/ask_session", ("What is Mars?", "abc", 1, 2, "fast"), "k='abc' is not a number: give e.g. 5"),
    ("/ask_session", ("What is Mars?", 1, 1, 2, ["fast"]), r"sequence_decoding=\['fast'\] is unknown"),
    ("/upload", ("notes.txt",), "files got str 'notes.txt': send one or more files, each as gradio_client's handle_file"),
    ("/upload", (["/etc/hostname"],), r"files got list \['/etc/hostname'\]: send one or more files"),
    ("/choose_corpus", (5,), "choice got int 5: send the corpus to answer from: one of builtin"),
    ("/choose_stack", (None,), r"stack got nothing \(None\): send the stack to answer with: one of offline, paper"),
    ("/edit_passage", ([1], "text", "What is Mars?", 1, 1, 2, "fast"), r"pid got list \[1\]: send the id of one"),
    ("/without_passage", ("Mars#0", "the last answer"), "raw got str 'the last answer': send a dict, as in the last "
     "answers' JSON"),
    ("/without_passage", ("Mars#0", [1, 2]), r"raw got list \[1, 2\]: send a dict"),
    ("/without_passage", ("Mars#0", NOT_AN_ANSWER), r"raw\[\"answers\"\]\['token'\] got str 'Mars': send an answer"),
    ("/continue_mode", ("token", None), r"raw got nothing \(None\): there is no answer yet"),
    ("/continue_mode", ("token", {**NOT_AN_ANSWER, "settings": "aided"}), r"raw\[\"settings\"\] got str 'aided'"),
    ("/continue_mode", (3, "LAST"), "mode got str '3': send the mode of one of the last answers: sequence, token, "
     "closed-book"),
]


@pytest.mark.slow
@pytest.mark.parametrize("endpoint, args, message", WRONG_TYPES, ids=[f"{e}-{i}" for i, (e, *_) in enumerate(WRONG_TYPES)])
def test_every_endpoint_answers_an_argument_of_the_wrong_type_with_what_to_send(app, last_raw, endpoint, args, message):
    """A clear message (gr.Error, or the validator's before the queue), not a traceback's last line
    (/without_passage sent a string where the last answers' dict goes said "AttributeError: 'str'
    object has no attribute 'get'"); the app keeps serving."""
    from gradio_client.exceptions import AppError, ValidationError

    c = client(app[1])
    args = tuple(last_raw if a == "LAST" else a for a in args)
    with pytest.raises((AppError, ValidationError), match=message) as e:
        c.predict(*args, api_name=endpoint)
    assert "attribute" not in str(e.value) and "Error:" not in str(e.value), e.value
    assert c.predict("What is Mars?", 1, 1, 2, "fast", api_name="/ask")["answers"]["token"]["text"]  # still serving


@pytest.mark.slow
@pytest.mark.parametrize("endpoint", ["/ask", "/ask_stream"])
def test_a_refused_question_is_one_line_in_the_servers_log_not_a_traceback(app, endpoint, capfd, caplog):
    """The server says why it refused, once, naming the endpoint; a refusal is the app's answer,
    not its failure, so no traceback (gradio printed one for every refused question)."""
    from gradio_client.exceptions import AppError

    capfd.readouterr()  # what came before this call
    with caplog.at_level(logging.WARNING, logger="rag_demo.web.validation"):
        with pytest.raises(AppError, match="k=0 is out of range"):
            client(app[1]).predict("What is Mars?", 0, 1, 2, "fast", api_name=endpoint)
    lines = [r.getMessage() for r in caplog.records if r.name == "rag_demo.web.validation"]
    assert lines == [f"{endpoint} refused: k=0 is out of range: use 1 to 20."], lines
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("streams", [False, True])
def test_an_unforeseen_exception_shows_an_id_the_log_has_the_traceback_under(streams, caplog):
    """A handler's bug is shown as a short message with an error id, never the exception's own text
    (show_error is off: gradio would send it), and the log holds the traceback under that id."""
    import gradio as gr

    from rag_demo.web.validation import logs_refusals

    def broken(question):
        raise KeyError("/srv/secret/path")

    def broken_stream(question):
        yield "partial"
        raise KeyError("/srv/secret/path")

    fn = logs_refusals(broken_stream if streams else broken)
    with caplog.at_level(logging.ERROR, logger="rag_demo.web.validation"):
        with pytest.raises(gr.Error) as e:
            list(fn("q")) if streams else fn("q")
    ident = re.search(r"error ([0-9a-f]{8})", e.value.message)[1]
    assert "secret" not in e.value.message and "KeyError" not in e.value.message
    record = next(r for r in caplog.records if ident in r.getMessage())
    assert record.exc_info and "secret" in str(record.exc_info[1])


@pytest.mark.slow
def test_question_box_does_not_cut_a_long_paste(app):
    box = next(b for b in app[0].blocks.values() if getattr(b, "elem_id", None) == "rag-question")
    assert box.max_length is None  # the library's limit is the only one, with its message
    from gradio_client.exceptions import ValidationError

    with pytest.raises(ValidationError, match="question is 5000 characters, over the limit of 1000"):
        ask_session(client(app[1]), "x" * 5000)


@pytest.mark.slow
def test_answers_name_their_question_and_say_why_they_stopped(app):
    out = ask_session(client(app[1]), "Who painted The Starry Night?", max_new_tokens=2)
    raw = out[5]
    for card, mode in zip(out[1:4], ("sequence", "token", "closed-book"), strict=True):
        assert "Q: Who painted The Starry Night?" in card
        stopped = raw["answers"][mode]["stopped"]
        assert stopped in ("eos", "max_new_tokens")
        assert ("cut: max new tokens reached" in card) == (stopped == "max_new_tokens")


@pytest.mark.slow
def test_k_over_the_corpus_size_is_clamped(app):
    r = client(app[1]).predict("What is Mars?", 20, 1, 2, "fast", "offline", api_name="/ask")
    assert len(r["answers"]["token"]["docs"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name, data, message", [
    # over the limit: the app's own message (gradio takes in up to TRANSFER_LIMIT_BYTES)
    ("big.txt", b"word " * (MAX_UPLOAD_BYTES // 5 + 1), "over the limit of 5 MB in all: upload smaller"),
    ("binary.txt", bytes(range(256)) * 8, "looks binary"),
    ("noise.md", b"\x01\x02\x03\x04\x05\x06 hello \x07\x08" * 50, "looks binary or is in an unknown text encoding"),
    ("empty.txt", b"", "is empty"),
    ("table.csv", b"name,year\nMona Lisa,1503\n", "has no text column"),
    ("broken.jsonl", b'{"text": "ok"}\nnot json\n', "line 2 is not valid JSON"),
    ("scan.pdf", b"%PDF-1.4 garbage", "not a readable PDF|has no text"),
    ("program.exe", b"MZ\x90\x00", "unsupported type .exe: upload one of .txt, .md"),
])
def test_bad_uploads_get_a_message_and_the_app_keeps_serving(app, tmp_path, name, data, message):
    from gradio_client.exceptions import AppError, ValidationError

    c = client(app[1])
    with pytest.raises((ValidationError, AppError, ValueError), match=message):  # the validator, before the queue
        upload(c, write(tmp_path, name, data))
    out = ask_session(c, "What is Mars?", k=1, max_new_tokens=2)
    assert "Test corpus" in out[0]  # still on the built-in corpus, still answering


@pytest.mark.slow
def test_upload_with_no_file_gets_a_message(app):
    from gradio_client.exceptions import AppError, ValidationError

    with pytest.raises((ValidationError, AppError), match="No file uploaded"):
        client(app[1]).predict(None, api_name="/upload")


@pytest.mark.slow
def test_two_sessions_with_different_uploads_do_not_see_each_other(app, tmp_path):
    a, b, fresh = client(app[1]), client(app[1]), client(app[1])
    pa = write(tmp_path, "zorblax.txt", "The Zorblax Festival is held every spring in the mountain town of Quillmere.")
    pb = write(tmp_path, "glimmerfin.txt", "The glimmerfin is a small silver fish that lives only in Lake Oxbarrow.")
    up_a, up_b = upload(a, pa), upload(b, pb)
    assert "zorblax.txt" in up_a[0] and "glimmerfin.txt" in up_b[0]
    assert val(up_a[1]) == "upload"  # the corpus dropdown switched to the upload
    ra = ask_session(a, "Where is the Zorblax Festival held?")
    rb = ask_session(b, "Where does the glimmerfin live?")
    rf = ask_session(fresh, "Where is the Zorblax Festival held?")
    for out, mine, other in ((ra, "zorblax", "glimmerfin"), (rb, "glimmerfin", "zorblax")):
        docs = out[5]["answers"]["token"]["docs"]
        assert [d["title"] for d in docs] == [mine]  # K clamped to the one passage there is
        assert out[5]["answers"]["token"]["corpus"] == f"Your documents: {mine}.txt"
        table = out[4][out[4].index("<table"):]  # the passages shown (the sentence above them quotes answers)
        assert other not in table.lower() and mine in table
    assert {d["title"] for d in rf[5]["answers"]["token"]["docs"]} <= {d[0] for d in DOCS}
    table = rf[4][rf[4].index("<table"):]
    assert "zorblax" not in table.lower() and "glimmerfin" not in table.lower()
    # the stateless API still answers from the built-in corpus
    assert client(app[1]).predict("Where is the Zorblax Festival held?", 2, 1, 2, "fast", "offline",
                                  api_name="/ask")["corpus"] == "Test corpus"
    # switching back to the built-in corpus
    back = a.predict("builtin", api_name="/choose_corpus")
    assert "Test corpus" in back[0] and val(back[1]) == "builtin"
    again = ask_session(a, "Where is the Zorblax Festival held?", k=1, max_new_tokens=2)
    assert again[5]["answers"]["token"]["docs"][0]["title"] in {d[0] for d in DOCS}


@pytest.mark.slow
def test_upload_formats_pdf_csv_jsonl_md(app):
    fixtures = ROOT / "tests" / "fixtures"
    c = client(app[1])
    out = upload(c, *(str(fixtures / n) for n in ("paintings.csv", "planets.jsonl", "rag_notes.md", "pointillism.pdf")))
    assert "4 more" not in out[0] and "Your documents: paintings.csv, planets.jsonl, rag_notes.md +1" in out[0]
    r = ask_session(c, "What does pointillism paint with?", k=1, max_new_tokens=4)
    assert r[5]["answers"]["token"]["docs"][0]["title"] == "pointillism"


@pytest.mark.slow
def test_edit_a_passage_the_answer_follows_and_the_shared_index_is_unchanged(app, small_pipe):
    c = client(app[1])
    first = ask_session(c, "Who painted The Starry Night?", k=1, max_new_tokens=12)
    pid = val(first[6])
    assert pid == "The Starry Night#0" and "Gogh" in first[5]["answers"]["token"]["text"]
    before = small_pipe.index.embeddings.copy()
    new_text = "The Starry Night is an oil-on-canvas painting by Claude Monet, painted in June 1889."
    out = c.predict(pid, new_text, "Who painted The Starry Night?", 1, 1, 12, "thorough", api_name="/edit_passage")
    status, seq, tok, cb, passages, raw, *_ = out
    assert "1 passage edited in your copy" in status and "edited by you" in passages and "Claude Monet" in passages
    assert raw["answers"]["token"]["docs"][0]["text"] == new_text
    assert raw["answers"]["token"]["docs"][0]["title"] == "The Starry Night"  # no new title: kept
    assert "Monet" in raw["answers"]["token"]["text"] or "Monet" in raw["answers"]["sequence"]["text"]
    # the shared base index and the other sessions are untouched
    assert "Vincent van Gogh" in small_pipe.index.corpus.passages[small_pipe.index.corpus.position(pid)].text
    assert (small_pipe.index.embeddings == before).all()  # stored vectors, untouched: compared bitwise
    other = ask_session(client(app[1]), "Who painted The Starry Night?", k=1, max_new_tokens=2)
    assert "Vincent van Gogh" in _text(other[4]) and "edited by you" not in other[4]
    # undo
    reset = c.predict(api_name="/reset_edits")
    assert "edited" not in reset[0]
    again = ask_session(c, "Who painted The Starry Night?", k=1, max_new_tokens=2)
    assert "Vincent van Gogh" in _text(again[4])


@pytest.mark.slow
def test_edited_title_reaches_the_model(app):
    c = client(app[1])
    first = ask_session(c, "Who painted The Starry Night?", k=1, max_new_tokens=4)
    pid = val(first[6])
    assert val(first[8]) == "The Starry Night"  # the title box is filled with the passage's title
    text = "This oil-on-canvas painting was made in June 1889."
    out = c.predict(pid, text, "Who painted The Starry Night?", 1, 1, 4, "fast", "Claude Monet's Starry Night",
                    api_name="/edit_passage")
    doc = out[5]["answers"]["token"]["docs"][0]
    assert doc["title"] == "Claude Monet's Starry Night" and doc["text"] == text  # what the generator read
    assert "Claude Monet&#x27;s Starry Night" in out[4] and "edited by you" in out[4]


@pytest.mark.slow
def test_edit_without_a_passage_or_with_empty_text_gets_a_message(app):
    from gradio_client.exceptions import ValidationError

    c = client(app[1])
    with pytest.raises(ValidationError, match="No passage chosen"):
        c.predict(None, "text", "Who painted The Starry Night?", 1, 1, 2, "fast", api_name="/edit_passage")
    ask_session(c, "What is Mars?", k=1, max_new_tokens=2)
    with pytest.raises(ValidationError, match="is empty"):
        c.predict("Mars#0", "   ", "What is Mars?", 1, 1, 2, "fast", api_name="/edit_passage")


@pytest.mark.slow
def test_unavailable_stack_is_refused_without_hanging(app):
    c = client(app[1])
    t0 = time.perf_counter()
    out = c.predict("paper", api_name="/choose_stack")
    assert time.perf_counter() - t0 < 10
    assert val(out[1]) == "offline" and "offline" in out[0]
    status = c.predict(api_name="/status")
    assert "offline" in status[0] and "Test corpus" in status[0]


@pytest.mark.slow
def test_model_group_runs_a_class_at_a_time_with_one_shared_scheduler(app):
    demo = app[0]
    assert demo._queue.max_size == page.QUEUE_MAX_SIZE
    model_fns = [f for f in demo.fns.values() if f.name in ("ask_session", "upload", "edit_passage", "ask",
                                                            "choose_corpus")]
    assert len(model_fns) >= 5
    assert {f.concurrency_id for f in model_fns} == {"model"}
    # a class's questions in flight at once, their decoding steps batched (serving/scheduler.py)
    assert {f.concurrency_limit for f in model_fns} == {page.MODEL_CONCURRENCY} and page.MODEL_CONCURRENCY == 20
    serving = demo.rag_serving
    assert serving.gate is not None and serving.budget is not None and serving.max_heavy == 1
    assert serving.queue() is demo._queue  # for "client gone"
    # the cost estimate events are not queued (no model runs)
    assert all(f.queue is False for f in demo.fns.values() if f.name == "estimate")
    # switching stacks may wait minutes for a first load: outside the group, serialised by the pool's lock
    assert [f.concurrency_limit for f in demo.fns.values() if f.name == "choose_stack"] == [None]


@pytest.mark.slow
def test_burst_of_ten_concurrent_questions_all_get_answers(app):
    sys.path.insert(0, str(ROOT / "scripts"))
    import load  # scripts/load.py --burst N

    results = load.run_burst(app[1], n=10, k=2, max_new_tokens=4)
    assert len(results) == 10 and all(r["ok"] for r in results), results
    assert all(r["answer"] for r in results)
    assert load.report_burst(results, 1.0) == 0  # --burst's exit status: every request answered


@pytest.mark.slow
def test_a_load_burst_mixes_in_an_edit_and_an_upload_and_each_is_done(app):
    """scripts/load.py's mixed burst with a visitor who edits a passage and asks again and one who
    uploads a document and asks it, beside a cheap question: every one answered."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import load

    results = load.burst(app[1], 1, 0, 300, n_edits=1, n_uploads=1)
    assert sorted(r["kind"] for r in results) == ["cheap", "edit", "upload"]
    assert all(r["ok"] for r in results), results
    assert load.budget_promise(10**9) > 10**9 + 2 * 3 * 2**30  # the app, its caches' bounds, two requests


def noprogress(*args, **kwargs):
    return None


@pytest.mark.slow
def test_switching_stack_loads_it_once_and_reembeds_the_upload(small_pipe, tmp_path):
    import dataclasses

    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.pipeline import RagPipeline

    calls = []

    def factory(stack, progress):  # a second "stack": the same models under another name
        calls.append(stack)
        progress(0.5, f"loading {stack}")
        return RagPipeline(dataclasses.replace(small_pipe.stack, spec=StackSpec(name=stack)), small_pipe.index,
                           small_pipe.settings)

    pool = PipelinePool(factory, preloaded={"offline": small_pipe}, unavailable=lambda s: None)
    h = handlers.Handlers(pool)
    doc = write(tmp_path, "zorblax.txt", "The Zorblax Festival is held every spring in the town of Quillmere.")
    s = h.corpus.upload([doc], None, progress=noprogress)[-1]
    assert s.corpus == "upload" and s.upload_stack == "offline" and calls == []
    out = h.corpus.choose_stack("paper", s, progress=noprogress)
    s2 = out[-1]
    assert calls == ["paper"] and s2.stack == "paper" and s2.upload_stack == "paper"
    assert s2.upload_index is not s.upload_index  # re-embedded with the new stack's passage encoder
    assert 'data-stack="paper"' in out[0] and "zorblax.txt" in out[0]
    r = ask_all(h, "Where is the Zorblax Festival held?", s2, progress=noprogress, k=1, max_new_tokens=2,
                         sequence_decoding="fast")
    assert r[5]["stack"] == "paper" and r[5]["answers"]["token"]["docs"][0]["title"] == "zorblax"
    back = h.corpus.choose_stack("offline", r[-1], progress=noprogress)
    assert calls == ["paper"] and back[-1].stack == "offline"  # loaded once, kept
    assert set(pool.loaded_stacks()) == {"offline", "paper"}


@pytest.mark.slow
def test_choosing_the_factbook_builds_its_index_once_answers_from_it_and_switches_back(small_pipe, tmp_path):
    """The corpus dropdown's second built-in corpus: the first session to choose it builds its
    index (the progress bar moves), every later one shares it; answers come from its passages;
    "builtin" goes back; an unknown corpus is a message naming the choices."""
    import dataclasses

    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.knowledge.factbook import FACTBOOK_NAME, load_factbook

    loads, bar = [], []

    def small_factbook():  # Algeria, Angola, Botswana: ~30 passages, embedded in seconds
        loads.append(1)
        return load_factbook(limit=15)

    stack = dataclasses.replace(small_pipe.stack, spec=StackSpec(cache_dir=tmp_path))  # no cache: built
    pipe = type(small_pipe)(stack, small_pipe.index, small_pipe.settings)
    pool = PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable,
                           corpora={"factbook": (FACTBOOK_NAME, small_factbook)})
    h = handlers.Handlers(pool)
    assert session_view.corpus_choices(pool, Session()) == [("Test corpus (built in)", "builtin"),
                                                     (f"{FACTBOOK_NAME} (built in)", "factbook")]
    out = h.corpus.choose_corpus("factbook", None, progress=lambda frac, desc=None, **k: bar.append((frac, desc)))
    s = out[-1]
    assert f'data-corpus="{FACTBOOK_NAME}"' in out[0] and out[1].value == "factbook"
    assert all(q in out[2] for q in session_view.FACTBOOK_EXAMPLES)
    assert loads == [1] and (1.0, f"Embedding passages of {FACTBOOK_NAME}: 31/31") in bar  # built, with a bar
    assert s.corpus == "factbook" and s.named_index is pool.corpus_index("offline", "factbook")
    other = h.corpus.choose_corpus("factbook", None, progress=noprogress)[-1]
    assert other.named_index is s.named_index and loads == [1]  # shared, built once
    r = ask_all(h, "What is the capital of Algeria?", s, progress=noprogress, k=2, max_new_tokens=4,
                sequence_decoding="fast")
    docs = r[5]["answers"]["token"]["docs"]
    assert r[5]["corpus"] == FACTBOOK_NAME and "Algeria: Government" in [d["title"] for d in docs]
    assert all(d["url"].startswith("https://www.cia.gov/the-world-factbook/countries/") for d in docs)
    assert "Capital: Algiers" in _text(r[4])  # the passages shown are the Factbook's
    back = h.corpus.choose_corpus("builtin", r[-1], progress=noprogress)
    assert 'data-corpus="Test corpus"' in back[0] and back[-1].corpus == "builtin"
    again = ask_all(h, "Who painted The Starry Night?", back[-1], progress=noprogress, k=1, max_new_tokens=2,
                    sequence_decoding="fast")
    assert again[5]["answers"]["token"]["docs"][0]["title"] in {d[0] for d in DOCS}
    with pytest.raises(gr.Error, match="corpus 'nope' is unknown: choose one of builtin, factbook, upload"):
        h.corpus.choose_corpus("nope", s, progress=noprogress)


def test_build_app_takes_a_pool_and_the_wiring_names_handler_methods():
    with pytest.raises(ValueError, match="build_app takes a PipelinePool, not AnsweringPipe"):
        page.build_app(AnsweringPipe())
    demo = page.build_app(reader_pool()[1])
    wired = {getattr(fn.fn, "__func__", None) for fn in demo.fns.values()}  # bound methods of one Handlers' parts
    from rag_demo.web.api_events import ApiEvents
    from rag_demo.web.ask_events import AskEvents

    assert AskEvents.ask_session in wired and ApiEvents.ask in wired and AskEvents.without_passage in wired


def test_answer_without_it_shows_its_progress_on_the_comparison_it_is_drawn_into():
    """Its output is hidden data (drawn into the comparison afterwards): without show_progress_on
    the second run showed nothing while it ran."""
    cfg = page.build_app(reader_pool()[1]).get_config_file()
    elem = {c["id"]: c.get("props", {}).get("elem_id") for c in cfg["components"]}
    dep = next(d for d in cfg["dependencies"] if d.get("api_name") == "without_passage")
    assert [elem[i] for i in dep.get("show_progress_on") or []] == ["rag-without"]
    assert dep["show_progress"] == "full"


def test_ask_stream_declares_the_arguments_of_ask():
    """/ask_stream takes /ask's arguments, declared once: gr.api sees the same parameters,
    defaults and types in both, and a streamed call binds them by position or by name."""
    from gradio.utils import get_function_params

    h = handlers.Handlers(reader_pool()[1])
    params = get_function_params(h.api.ask_stream)
    assert params == get_function_params(h.api.ask) and [p[0] for p in params][:3] == ["question", "k", "num_beams"]
    assert inspect.isgeneratorfunction(h.api.ask_stream)  # gradio streams only a generator function
    with pytest.raises(gr.Error, match="stack='nope' is unknown"):
        next(h.api.ask_stream("Who painted it?", 2, 1, 8, "thorough", "nope"))
    with pytest.raises(gr.Error, match="stack='nope' is unknown"):
        next(h.api.ask_stream("Who painted it?", stack="nope"))
    with pytest.raises(gr.Error, match="unexpected keyword argument 'colour': /ask takes question, k, num_beams"):
        next(h.api.ask_stream("Who painted it?", colour="red"))  # a refusal naming it, not "something went wrong"


def test_a_second_question_from_the_same_visitor_stops_the_first_which_writes_nothing_more():
    """One question at a time per visitor: starting another (or switching corpus) supersedes the
    running one; it stops at its next step and yields no more outputs, so a stale answer can
    never reach the page. Another visitor's question is not touched."""
    from types import SimpleNamespace

    pipe = AnsweringPipe()
    pool = PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=fake_unavailable)
    h = handlers.Handlers(pool)
    me, other = SimpleNamespace(session_hash="me"), SimpleNamespace(session_hash="other")
    first = h.answers.ask_session("What is Mars?", None, progress=noprogress, request=me, k=1)
    theirs = h.answers.ask_session("What is Mars?", None, progress=noprogress, request=other, k=1)
    next(first), next(theirs)  # both started: their cards cleared
    second = list(h.answers.ask_session("What is Venus?", None, progress=noprogress, request=me, k=1))
    assert "Q: What is Venus?" in second[-1][1]  # the new question's answers
    assert list(first) == []  # the old one writes nothing more
    assert "Q: What is Mars?" in list(theirs)[-1][1]  # the other visitor's question still answers
    third = h.answers.ask_session("What is Mars?", None, progress=noprogress, request=me, k=1)
    next(third)
    h.corpus.choose_corpus("builtin", None, progress=noprogress, request=me)  # a switch stops it too
    assert list(third) == []
    fourth = h.answers.ask_session("What is Mars?", None, progress=noprogress, request=me, k=1)
    next(fourth)
    status, stop = h.turns.stop_run(me)  # Stop: the run ends at once but still shows what it has
    assert "Stopped" in status and stop.visible is False
    cards = list(fourth)[-1][1:4]
    assert all("cut: stopped" in c and "rag-continue-btn" in c for c in cards)
    again = ask_all(h, "What is Venus?", None, progress=noprogress, request=me, k=1)
    assert "Q: What is Venus?" in again[1] and "cut:" not in again[1]  # the next question is not stopped


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["paper", "aided"])
def test_show_the_code_run_as_printed_gives_the_same_answers(app, tmp_path, preset, cache_sharing_smollm):
    """"Show the code" of an answer: the gradio_client snippet, run as printed, and the command
    line, run as printed (a fresh process, the same documents), give the answers on screen."""
    import io
    import shlex
    from contextlib import redirect_stdout
    from types import SimpleNamespace

    demo, url = app
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"title": t, "text": x, "url": u}) + "\n" for t, x, u in DOCS), encoding="utf-8")
    pool = demo.rag_pool
    pool.cli_flags = ["--corpus-file", str(docs)]  # what app.py sets from --corpus-file
    try:
        result = client(url).predict("Who painted The Starry Night?", preset=preset, k=2, max_new_tokens=8,
                                     sequence_decoding="fast", api_name="/ask")
        cli, code, note = handlers.Handlers(pool, "offline").answers.show_code(
            result, Session(), SimpleNamespace(headers={"host": url.split("//")[1].rstrip("/")}))
    finally:
        pool.cli_flags = []
    assert note == "" and f"preset={preset!r}" in code and f"--preset {preset}" in cli
    shown = {m: a["text"].strip() for m, a in result["answers"].items()}
    out = io.StringIO()
    with redirect_stdout(out):
        exec(code, {})  # noqa: S102 - the snippet the page prints, as a learner would paste it
    printed = (line.split(" ", 1) for line in out.getvalue().splitlines() if line.split(" ", 1)[0] in MODES)
    assert {m: t.strip() for m, t in printed} == shown  # (gradio_client also prints "Loaded as API: ...")
    args = shlex.split(cli)
    assert args[:4] == [".venv/bin/python", "-m", "rag_demo", "ask"]  # the checkout's interpreter: it has torch
    run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "RAG_DEMO_CACHE": str(cache_sharing_smollm(tmp_path / "cache"))})
    assert run.returncode == 0, run.stderr[-2000:]
    said = [t.strip() for t in re.findall(r"^Answer: (.*)$", run.stdout, re.M)]
    assert said == [shown["sequence"], shown["token"], shown["closed-book"]], (said, shown)


def test_every_card_shows_its_confidence_or_why_it_has_none():
    """A card in every mode says how likely its answer is right (its own number, rounded), marked
    low when the probably-wrong cue fired; without a fitted model it says so rather than hide it."""
    cue = {"kind": "probably_wrong", "text": "Probably wrong: ..."}
    for mode in MODES:
        a = answer_dict(mode) if mode != "closed-book" else answer_dict(mode, docs=[], rows=[])
        sure = render.render_answer({**a, "confidence": 0.912, "cues": []})
        assert 'data-confidence="0.912"' in sure and "<b>91%</b>" in sure and "rag-conf-high" in sure
        low = render.render_answer({**a, "confidence": 0.08, "cues": [cue]})
        assert "rag-conf-low" in low and "<b>8%</b>" in low and 'data-cue="probably_wrong"' in low
        none = render.render_answer({**a, "confidence": None, "cues": []})
        assert 'data-confidence=""' in none and "not calibrated" in none
