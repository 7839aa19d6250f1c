"""The web app (rag_demo/ui.py): pure rendering, the pipeline pool, and the launched app driven
through gradio_client (named endpoints, bad input, per-session corpora, edits, a burst).

The app-level tests run the real offline models over a 3-document corpus (models load once per
session, ~20 s; an answer with max_new_tokens <= 8 takes about a second).
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rag_demo import ui
from rag_demo.corpus import MAX_UPLOAD_BYTES, VITAL_ARTICLES_NAME, Corpus, Passage

ROOT = Path(__file__).resolve().parent.parent
DOCS = [
    ("Georges Seurat", "Georges Seurat was a French post-Impressionist artist. He devised the painting technique "
     "known as pointillism.", None),
    ("The Starry Night", "The Starry Night is an oil-on-canvas painting by Vincent van Gogh, painted in June 1889.",
     "https://en.wikipedia.org/wiki/The_Starry_Night"),
    ("Mars", "Mars is the fourth planet from the Sun.", None),
]
SMALL = {"k": 2, "num_beams": 1, "max_new_tokens": 8, "sequence_decoding": "thorough"}
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
    code = "import sys, rag_demo.ui; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_validators_put_the_library_message_on_the_bad_input_only():
    def bad(results):
        return {i: r["message"] for i, r in enumerate(results) if not r["is_valid"]}

    ok = ui.validate_ask("Who painted The Starry Night?", 5, 1, 32, "thorough", None)
    assert len(ok) == 6 and bad(ok) == {}
    assert list(bad(ui.validate_ask("  ", 5, 1, 32, "thorough", None))) == [0]
    assert "question is empty" in bad(ui.validate_ask("  ", 5, 1, 32, "thorough", None))[0]
    assert "over the limit of 1000" in bad(ui.validate_ask("x" * 1001, 5, 1, 32, "thorough", None))[0]
    settings = bad(ui.validate_ask("What is Mars?", 0, 1, 32, "thorough", None))
    assert list(settings) == [1, 2, 3, 4] and "k=0 is out of range" in settings[1]

    ok = ui.validate_edit("Mars#0", "Mars is red.", "What is Mars?", 5, 1, 32, "fast", None)
    assert len(ok) == 8 and bad(ok) == {}
    assert "No passage chosen" in bad(ui.validate_edit(None, "x", "What is Mars?", 5, 1, 32, "fast", None))[0]
    assert list(bad(ui.validate_edit("Mars#0", " \n ", "What is Mars?", 5, 1, 32, "fast", None))) == [1]
    assert list(bad(ui.validate_edit("Mars#0", "x", "", 5, 1, 32, "fast", None))) == [2]


def test_tokens_are_coloured_by_their_top_passage():
    html = ui.render_tokens(answer_dict())
    assert html.count('<a class="rag-tok') == 3
    # token 1 -> passage 1, token 2 -> passage 2, token 3 -> passage 1 (colours by rank)
    spans = html.split("<a ")[1:]
    assert ui.PALETTE[0] in spans[0] and 'data-rank="1"' in spans[0]
    assert ui.PALETTE[1] in spans[1] and 'data-rank="2"' in spans[1]
    assert 'data-rank="1"' in spans[2]
    assert "The Starry Night" in spans[0] and "p = 0.90" in spans[0]  # hover title names passage + posterior
    assert spans[0].count("<sup>") == 1 and spans[1].count("<sup>") == 1 and spans[2].count("<sup>") == 1
    assert 'href="#rag-p-1"' in spans[0]
    legend = html.split('class="rag-legend"')[1]
    assert legend.count("rag-legend-item") == 2 and "Mars &lt;b&gt;planet&lt;/b&gt;" in legend  # escaped


def test_heatmap_has_a_row_per_token_and_a_column_per_passage():
    html = ui.render_heatmap(answer_dict())
    assert 'data-tokens="3" data-docs="2"' in html
    body = html.split("<tbody>")[1]
    assert body.count("<tr>") == 3
    assert body.count('<td class="rag-heat-tok">') == 3
    assert body.count("<td class=") == 3 + 3 * 2
    assert "0.90" in body and "0.80" in body
    assert body.count("rag-max") == 3  # one strongest passage per token row
    assert "Fig. 2" in html  # RAG-Token caption


def test_answer_card_shows_score_timings_and_escapes_text():
    card = ui.render_answer(answer_dict(text="<img src=x onerror=alert(1)>", tokens=("<img", " src", "=x")))
    assert "<img src=x" not in card and "&lt;img src=x onerror=alert(1)&gt;" in card
    assert "log p(y|x) = -1.250" in card
    for stage in ("encode 10 ms", "retrieve 2 ms", "generate 1.50 s", "attribute 100 ms", "total 1.61 s"):
        assert stage in card
    assert "RAG-Token" in card and "rag-heat" in card and "rag-tokens" in card


def test_closed_book_card_has_no_passages_and_says_why():
    card = ui.render_answer(answer_dict(mode="closed-book", docs=[], rows=[]))
    assert "Closed-book" in card and "No passages" in card
    assert "rag-heat" not in card and "rag-tok" not in card


def test_empty_answer_and_infinite_score_render():
    card = ui.render_answer(answer_dict(text="", tokens=(), rows=[], sequence_logprob=None))
    assert "(empty answer)" in card and "-inf" in card
    assert ui.render_answer(None, mode="sequence").count("Ask a question") == 1


def test_passages_table_one_table_when_modes_share_docs():
    answers = {"sequence": answer_dict("sequence"), "token": answer_dict("token"),
               "closed-book": answer_dict("closed-book", docs=[], rows=[])}
    html = ui.render_passages(answers, edits=("b#0",))
    assert html.count("<table") == 1
    assert html.count("<tr id=") == 2 and 'id="rag-p-all-1"' in html
    assert "RAG-Sequence<br>p(z|x,y)" in html and "RAG-Token<br>mean p(z|x,y_i)" in html
    assert 'href="https://en.wikipedia.org/wiki/The_Starry_Night"' in html  # linked title
    assert "0.800" in html and "0.700" in html  # retrieval score, prior
    assert html.count("edited by you") == 1
    assert ui.anchors(answers) == {"sequence": "rag-p-all-", "token": "rag-p-all-"}


def test_passages_table_splits_when_modes_retrieved_differently():
    other = [dict(d, id=d["id"] + "x") for d in answer_dict()["docs"]]
    answers = {"sequence": answer_dict("sequence"), "token": answer_dict("token", docs=other)}
    html = ui.render_passages(answers)
    assert html.count("<table") == 2 and "for RAG-Sequence" in html and "for RAG-Token" in html
    assert ui.anchors(answers) == {"sequence": "rag-p-sequence-", "token": "rag-p-token-"}


def test_heatmap_labels_make_whitespace_visible():
    assert [ui.show_token(t) for t in ("\n", " ", "", " Gogh", "\t")] == ["↵", "␣", "∅", " Gogh", "⇥"]
    assert ui.plural(1, "passage") == "1 passage" and ui.plural(11485, "passage") == "11,485 passages"


def test_example_questions():
    vital = Corpus(VITAL_ARTICLES_NAME, [Passage("x#0", "x", "y")])
    assert ui.example_questions(vital) == list(ui.VITAL_EXAMPLES)
    assert "Who painted The Starry Night?" in ui.VITAL_EXAMPLES
    up = Corpus("Your documents", [Passage("Mars#0", "Mars", "t"), Passage("Mars#1", "Mars", "u"),
                                   Passage("notes row 3#0", "notes row 3", "v"), Passage("Venus#0", "Venus", "w")])
    assert ui.example_questions(up) == ["What is Mars?", "What do the documents say about Venus?"]


def test_vital_examples_name_articles_in_the_corpus():
    import json

    from rag_demo.corpus import vital_articles_path

    titles = {a["title"] for a in json.loads(vital_articles_path().read_text(encoding="utf-8")).values()}
    for q, title in zip(ui.VITAL_EXAMPLES, ("The Starry Night", "Australia", "Hamlet", "Penicillin",
                                            "World Wide Web", "Mona Lisa", "War and Peace", "Taj Mahal"), strict=True):
        assert title in titles, (q, title)


# ---------------------------------------------------------------- pure: the pipeline pool


class FakePipe:
    def __init__(self, name):
        self.stack = type("S", (), {"name": name, "describe": lambda self: f"{name}: fake"})()
        self.index = type("I", (), {"corpus": Corpus("Fake corpus", [Passage("Mars#0", "Mars", "red")])})()

    def answer_modes(self, *a, **k):  # marks it as a pipeline for PipelinePool.of
        raise NotImplementedError


def test_pool_loads_each_stack_once_lazily_and_relays_progress():
    calls = []

    def factory(stack, progress):
        calls.append(stack)
        progress(0.5, "half way")
        time.sleep(0.3)
        return FakePipe(stack)

    pool = ui.PipelinePool(factory, unavailable=fake_unavailable)
    assert pool.loaded("offline") is None and calls == []
    seen, results = [], []
    threads = [threading.Thread(target=lambda: results.append(pool.get("offline", lambda f, m: seen.append(m))))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert calls == ["offline"] and len(results) == 4 and len({id(r) for r in results}) == 1
    assert any("half way" in m or "ready" in m or "Starting" in m for m in seen)


def test_pool_refuses_an_unavailable_stack_at_once():
    pool = ui.PipelinePool(lambda s, p: FakePipe(s), unavailable=fake_unavailable)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="paper stack is unavailable here: HF_HUB_OFFLINE is set"):
        pool.get("paper")
    assert time.perf_counter() - t0 < 1
    labels = dict((v, k) for k, v in ui.stack_choices(pool))
    assert "unavailable: HF_HUB_OFFLINE is set" in labels["paper"] and "unavailable" not in labels["offline"]


def test_pool_reports_a_failed_load_and_can_retry():
    attempts = []

    def factory(stack, progress):
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("disk on fire")
        return FakePipe(stack)

    pool = ui.PipelinePool(factory, unavailable=fake_unavailable)
    with pytest.raises(ValueError, match="could not be loaded: OSError: disk on fire"):
        pool.get("offline")
    assert "disk on fire" in ui.render_status(pool, ui.Session())
    assert pool.get("offline").stack.name == "offline"


def test_page_load_streams_loading_progress_then_says_what_is_live():
    def factory(stack, progress):
        for i in range(3):
            progress(i / 3, f"step {i}")
            time.sleep(0.4)
        return FakePipe(stack)

    pool = ui.PipelinePool(factory, unavailable=fake_unavailable)
    steps = list(ui.make_handlers(pool)["on_load"](None))
    statuses = [step[0] for step in steps]
    assert len(statuses) >= 3
    assert all("Loading the <b>offline</b> stack" in st and "rag-bar" in st for st in statuses[:-1])
    assert any("step 1" in st or "step 2" in st for st in statuses)
    assert 'data-stack="offline"' in statuses[-1] and "Fake corpus" in statuses[-1] and "1 passage)" in statuses[-1]
    assert steps[-1][1].raw_samples == [["What is Mars?"]]  # examples from the live corpus
    assert isinstance(steps[-1][-1], ui.Session)


def test_default_unavailable_names_the_reason_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert ui.default_unavailable("offline") is None
    # the clock is for the probe, not for the first import of torch and transformers it triggers
    # (13 s measured on a loaded 2-core machine)
    import huggingface_hub  # noqa: F401
    import rag_demo.stacks  # noqa: F401

    t0 = time.perf_counter()
    reason = ui.default_unavailable("paper")
    assert time.perf_counter() - t0 < 5
    # None only if the three paper checkpoints are in the local HF cache
    assert reason is None or "HF_HUB_OFFLINE" in reason


# ---------------------------------------------------------------- the real app (offline models, 3 documents)


@pytest.fixture(scope="session")
def small_pipe():
    from rag_demo.config import RagSettings, StackSpec
    from rag_demo.corpus import corpus_from_documents
    from rag_demo.index import build_index
    from rag_demo.pipeline import RagPipeline
    from rag_demo.stacks import load_stack

    stack = load_stack(StackSpec())
    index = build_index(corpus_from_documents("Test corpus", DOCS), stack.ctx_encoder)
    return RagPipeline(stack, index, RagSettings(**SMALL))


@pytest.fixture(scope="module")
def app(small_pipe, free_port):
    demo = ui.build_app(small_pipe, unavailable=fake_unavailable)
    port = free_port()
    ui.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    yield demo, f"http://127.0.0.1:{port}/"
    demo.close()


def client(url):
    from gradio_client import Client

    return Client(url, verbose=False)


def ask_session(c, question, **settings):
    s = {**SMALL, **settings}
    return c.predict(question, s["k"], s["num_beams"], s["max_new_tokens"], s["sequence_decoding"],
                     api_name="/ask_session")


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
    names = set(client(app[1]).view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/ask", "/ask_session", "/upload", "/choose_corpus", "/choose_stack", "/edit_passage",
            "/reset_edits", "/status"} <= names


@pytest.mark.slow
def test_ask_endpoint_returns_three_answers(app, small_pipe):
    r = client(app[1]).predict("Who painted The Starry Night?", 2, 1, 8, "thorough", "offline", api_name="/ask")
    assert set(r) == {"question", "stack", "corpus", "settings", "answers"}
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
    assert small_pipe.settings.k == 2  # the API left the shared pipeline's settings alone


@pytest.mark.slow
def test_ask_session_renders_answers_passages_tokens_heatmap(app):
    out = ask_session(client(app[1]), "Who painted The Starry Night?")
    status, seq, tok, cb, passages, raw, pick, text = out
    assert "Test corpus" in status and "offline" in status
    for card, mode in ((seq, "sequence"), (tok, "token")):
        assert f'data-mode="{mode}"' in card and "rag-answer" in card
        n = len(raw["answers"][mode]["tokens"])
        assert card.count('<a class="rag-tok') == n and f'data-tokens="{n}" data-docs="2"' in card
    assert 'data-mode="closed-book"' in cb and "rag-heat" not in cb
    assert passages.count("<tr id=") == 2 and "The Starry Night" in passages
    assert val(pick) == "The Starry Night#0" and "Vincent van Gogh" in text


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
def test_k_over_the_corpus_size_is_clamped(app):
    r = client(app[1]).predict("What is Mars?", 20, 1, 2, "fast", "offline", api_name="/ask")
    assert len(r["answers"]["token"]["docs"]) == 3


@pytest.mark.slow
@pytest.mark.parametrize("name, data, message", [
    ("big.txt", b"word " * (MAX_UPLOAD_BYTES // 5 + 1), "over the limit of 5 MB"),
    ("binary.txt", bytes(range(256)) * 8, "looks binary"),
    ("noise.md", b"\x01\x02\x03\x04\x05\x06 hello \x07\x08" * 50, "looks binary or is in an unknown text encoding"),
    ("empty.txt", b"", "is empty"),
    ("table.csv", b"name,year\nMona Lisa,1503\n", "has no text column"),
    ("broken.jsonl", b'{"text": "ok"}\nnot json\n', "line 2 is not valid JSON"),
    ("scan.pdf", b"%PDF-1.4 garbage", "not a readable PDF|has no text"),
    ("program.exe", b"MZ\x90\x00", "Invalid file type"),
])
def test_bad_uploads_get_a_message_and_the_app_keeps_serving(app, tmp_path, name, data, message):
    from gradio_client.exceptions import AppError

    c = client(app[1])
    with pytest.raises(AppError, match=message):
        upload(c, write(tmp_path, name, data))
    out = ask_session(c, "What is Mars?", k=1, max_new_tokens=2)
    assert "Test corpus" in out[0]  # still on the built-in corpus, still answering


@pytest.mark.slow
def test_upload_with_no_file_gets_a_message(app):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="No file uploaded"):
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
        assert other not in out[4].lower() and mine in out[4]
    assert {d["title"] for d in rf[5]["answers"]["token"]["docs"]} <= {d[0] for d in DOCS}
    assert "zorblax" not in rf[4].lower() and "glimmerfin" not in rf[4].lower()
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
    assert "Monet" in raw["answers"]["token"]["text"] or "Monet" in raw["answers"]["sequence"]["text"]
    # the shared base index and the other sessions are untouched
    assert "Vincent van Gogh" in small_pipe.index.corpus.passages[small_pipe.index.corpus.position(pid)].text
    assert (small_pipe.index.embeddings == before).all()  # stored vectors, untouched: compared bitwise
    other = ask_session(client(app[1]), "Who painted The Starry Night?", k=1, max_new_tokens=2)
    assert "Vincent van Gogh" in other[4] and "edited by you" not in other[4]
    # undo
    reset = c.predict(api_name="/reset_edits")
    assert "edited" not in reset[0]
    again = ask_session(c, "Who painted The Starry Night?", k=1, max_new_tokens=2)
    assert "Vincent van Gogh" in again[4]


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
def test_queue_is_one_model_call_at_a_time(app):
    demo = app[0]
    assert demo._queue.default_concurrency_limit == 1 and demo._queue.max_size == ui.QUEUE_MAX_SIZE
    model_fns = [f for f in demo.fns.values() if f.name in ("ask_session", "upload", "edit_passage", "ask",
                                                            "choose_corpus")]
    assert len(model_fns) >= 5
    assert {f.concurrency_id for f in model_fns} == {"model"}
    assert {f.concurrency_limit for f in model_fns} <= {1, "default"}
    # switching stacks may wait minutes for a first load: outside the group, serialised by the pool's lock
    assert [f.concurrency_limit for f in demo.fns.values() if f.name == "choose_stack"] == [None]


@pytest.mark.slow
def test_burst_of_ten_concurrent_questions_all_get_answers(app):
    sys.path.insert(0, str(ROOT / "scripts"))
    import burst

    results = burst.run(app[1], n=10, k=2, max_new_tokens=4)
    assert len(results) == 10 and all(r["ok"] for r in results), results
    assert all(r["answer"] for r in results)


def noprogress(*args, **kwargs):
    return None


@pytest.mark.slow
def test_switching_stack_loads_it_once_and_reembeds_the_upload(small_pipe, tmp_path):
    import dataclasses

    from rag_demo.config import StackSpec
    from rag_demo.pipeline import RagPipeline

    calls = []

    def factory(stack, progress):  # a second "stack": the same models under another name
        calls.append(stack)
        progress(0.5, f"loading {stack}")
        return RagPipeline(dataclasses.replace(small_pipe.stack, spec=StackSpec(name=stack)), small_pipe.index,
                           small_pipe.settings)

    pool = ui.PipelinePool(factory, preloaded={"offline": small_pipe}, unavailable=lambda s: None)
    h = ui.make_handlers(pool)
    doc = write(tmp_path, "zorblax.txt", "The Zorblax Festival is held every spring in the town of Quillmere.")
    s = h["upload"]([doc], None, progress=noprogress)[-1]
    assert s.corpus == "upload" and s.upload_stack == "offline" and calls == []
    out = h["choose_stack"]("paper", s, progress=noprogress)
    s2 = out[-1]
    assert calls == ["paper"] and s2.stack == "paper" and s2.upload_stack == "paper"
    assert s2.upload_index is not s.upload_index  # re-embedded with the new stack's passage encoder
    assert 'data-stack="paper"' in out[0] and "zorblax.txt" in out[0]
    r = h["ask_session"]("Where is the Zorblax Festival held?", 1, 1, 2, "fast", s2, progress=noprogress)
    assert r[5]["stack"] == "paper" and r[5]["answers"]["token"]["docs"][0]["title"] == "zorblax"
    back = h["choose_stack"]("offline", r[-1], progress=noprogress)
    assert calls == ["paper"] and back[-1].stack == "offline"  # loaded once, kept
    assert set(pool.loaded_stacks()) == {"offline", "paper"}
