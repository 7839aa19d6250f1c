"""What a client can send the app, and what it gets back (issue: nothing ends in a bare error):
a lengthened passage list is refused with a message, links are http(s) only, an oversized upload
is refused before it is written, uploaded files and a visitor's run numbers go with the visitor, a
refused sweep says why with settings that fit and Stop answers at once, a slider's bounds never
meet, a cut answer is not rated, and an answer's score is the same number on its card, in its
candidates and in the text beside them."""
from __future__ import annotations

import copy
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import pytest
from test_ui import CostPipe, answer_dict, reader_pool

from rag_demo.web import handlers, page, passages_view, render, validation
from rag_demo.web.results import ResultsHandlers, fits

RAW = {"question": "Who painted it?", "settings": {"preset": "aided", "k": 2},
       "answers": {"token": answer_dict(passage_drop=[0.5, 0.1])}}


def test_a_lengthened_passage_list_is_refused_with_a_message():
    validation.check_last_answers(copy.deepcopy(RAW))  # as the page holds it: fine
    long = copy.deepcopy(RAW)
    long["answers"]["token"]["docs"] = long["answers"]["token"]["docs"] * 20  # 40 passages
    with pytest.raises(ValueError, match=r'\["docs"\] holds 40 passages, more than K can be \(20\)'):
        validation.check_last_answers(long)
    odd = copy.deepcopy(RAW)
    odd["answers"]["token"]["docs"].append(dict(odd["answers"]["token"]["docs"][0], id="c#0", rank=3))
    with pytest.raises(ValueError, match=r'\["passage_drop"\] has 2 numbers but .*\["docs"\] has 3 passages'):
        validation.check_last_answers(odd)


def test_without_passage_and_continue_mode_are_priced_and_admitted_as_a_question_is():
    """The passages left are priced with their own prompts, by the same Serving.check as /ask: a
    request over the budget is refused with the budget's message before anything runs."""
    from rag_demo.serving.admission import Serving
    from rag_demo.serving.budget import Budget
    from rag_demo.web.answering import answer_again

    pipe = CostPipe()
    seen = []
    pipe.check_budget = lambda q, modes, s, budget, passages=None: (seen.append((modes, passages)),
                                                                    (_ for _ in ()).throw(ValueError("over budget")))[1]
    from rag_demo.models.cost import Cost

    # over the budget, and over the preset's defaults (which are always admitted)
    pipe.estimate = lambda q, modes, s, passages=None: Cost(100.0 if passages else 1.0, 2**20, {})
    pipe.index.corpus.position = lambda pid: 0
    pipe.index.corpus.passages = ["the one passage"]
    # the passages' scores come from the server's retriever, never from the client's answer
    pipe.passage_scores = lambda q, mode, passages, weights: [0.0] * len(passages)
    serving = Serving(budget=Budget())
    with pytest.raises(ValueError, match="over budget"):
        answer_again(pipe, copy.deepcopy(RAW), "token", validation.settings_from_inputs(preset="aided"), None,
                     serving)
    assert seen == [(["token"], ["the one passage", "the one passage"])]


def _two_groups():
    """Last answers whose two RAG modes read different passages (two passage groups to rerun)."""
    raw = copy.deepcopy(RAW)
    seq = copy.deepcopy(raw["answers"]["token"])
    seq["docs"] = [dict(d, id=d["id"] + "-s") for d in seq["docs"]]
    raw["answers"]["sequence"] = seq
    return raw


def test_without_passage_is_priced_over_every_passage_group():
    """Each group of modes that read the same passages is priced over its own passages left; their
    seconds add up to one request's, which the budget refuses whole."""
    from rag_demo.models.cost import Cost
    from rag_demo.serving.admission import Serving
    from rag_demo.serving.budget import Budget
    from rag_demo.web.answering import answer_without

    pipe = CostPipe()
    seen = []
    pipe.check_budget = lambda q, modes, s, budget, passages=None: (seen.append((tuple(modes), len(passages))),
                                                                    Cost(30.0, 2**20, {m: 30.0 for m in modes}))[1]
    pipe.estimate = lambda q, modes, s, passages=None: Cost(1.0 if passages is None else 30.0, 2**20, {})
    pipe.index.corpus.position = lambda pid: 0
    pipe.index.corpus.passages = ["the one passage"]
    pipe.passage_scores = lambda q, mode, passages, weights: [0.0] * len(passages)
    raw = _two_groups()
    pid = raw["answers"]["token"]["docs"][0]["id"]
    raw["answers"]["sequence"]["docs"][0]["id"] = pid  # both groups read the passage taken away
    with pytest.raises(ValueError, match="about 60 s and 0.0 GB over its 2 passage groups, over this server's 45 s"):
        answer_without(pipe, raw, pid, serving=Serving(budget=Budget()))
    assert sorted(seen) == [(("sequence",), 1), (("token",), 1)]  # both groups priced, nothing ran


def test_without_passage_shows_only_the_servers_numbers_and_stops_with_stop():
    """The drop and the attribution note come from the session's numbers (what this server
    computed), not from the client's JSON; Stop (cancelled) ends the reruns at their next step."""
    from rag_demo.web.answering import answer_without, server_numbers

    pipe = CostPipe()
    pipe.index.corpus.position = lambda pid: 0
    pipe.index.corpus.passages = ["the one passage"]
    pipe.passage_scores = lambda q, mode, passages, weights: [0.0] * len(passages)
    asked = []
    pipe.answer_from_modes = lambda q, modes, passages, scores, s, run=None: (
        asked.append(run), {m: SimpleNamespace(text="Paris.", stopped="cancelled" if run and run.cancelled() else "eos",
                                               to_dict=lambda: {"docs": []}) for m in modes})[1]
    raw = copy.deepcopy(RAW)
    pid = raw["answers"]["token"]["docs"][0]["id"]
    ours = server_numbers(copy.deepcopy(raw["answers"]))
    forged = copy.deepcopy(raw)
    forged["answers"]["token"]["passage_drop"] = [99.0, 0.0]  # a client's own numbers
    out = answer_without(pipe, forged, pid, numbers=ours, cancelled=lambda: True)["modes"]["token"]
    assert out["drop"] == 0.5 and out["most"]["drop"] == 0.5 and out["stopped"] == "cancelled"
    assert asked[0].cancelled()
    bare = answer_without(pipe, forged, pid)["modes"]["token"]  # no numbers of this server's: none shown
    assert bare["drop"] is None and bare["top"] is None
    assert "no numbers" in passages_view.render_without({"dropped": raw["answers"]["token"]["docs"][0], "k": 2,
                                                         "modes": {"token": bare}})


def test_only_http_links_become_links():
    from rag_demo.knowledge.uploads import web_url

    assert render.link_target("https://en.wikipedia.org/wiki/Mars") and render.link_target("http://x.org")
    assert not any(render.link_target(u) for u in ("javascript:alert(1)", " JavaScript:x", "data:text/html,x", None))
    assert web_url("javascript:alert(1)") is None and web_url(" https://x.org ") == "https://x.org"
    bad = answer_dict(docs=[dict(answer_dict()["docs"][0], url="javascript:alert(document.cookie)")],
                      rows=[[1.0]] * 3, doc_posterior=[1.0])
    html = passages_view.render_passages({"token": bad})
    assert "javascript:" not in html and "The Starry Night" in html


@pytest.mark.slow
def test_an_oversized_upload_is_refused_before_it_is_written(free_port, tmp_path):
    """launch() caps what an upload may send: gradio refuses a far larger file while it streams in,
    so nothing of it is left in the upload cache."""
    import httpx

    from rag_demo.knowledge.uploads import TRANSFER_LIMIT_BYTES

    os.environ["GRADIO_TEMP_DIR"] = str(tmp_path)
    _, pool = reader_pool()
    demo = page.build_app(pool)
    port = free_port()
    page.launch(demo, server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        big = b"word " * (TRANSFER_LIMIT_BYTES // 5 + 1000)
        r = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload", files={"files": ("big.txt", big)}, timeout=60)
        assert r.status_code == 413, (r.status_code, r.text[:200])
        assert "exceeded maximum allowed size" in r.text
        assert not [p for p in tmp_path.rglob("big.txt")]
        small = httpx.post(f"http://127.0.0.1:{port}/gradio_api/upload", files={"files": ("a.txt", b"Mars is red.")},
                           timeout=60)
        assert small.status_code == 200
        # the server holds the state of at most STATE_SESSIONS sessions, the least recently used dropped
        holder = demo.state_holder
        for i in range(page.STATE_SESSIONS + 5):
            holder[f"visitor-{i}"]
            holder.update(f"visitor-{i}")
        assert len(holder.session_data) == page.STATE_SESSIONS
        assert "visitor-0" not in holder and f"visitor-{page.STATE_SESSIONS + 4}" in holder
    finally:
        demo.close()
        os.environ.pop("GRADIO_TEMP_DIR", None)


def test_uploaded_files_and_a_visitors_run_numbers_go_with_the_visitor(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("Mars is the fourth planet.")
    validation.remove_uploaded([str(f)])
    assert not f.exists()
    validation.remove_uploaded(None)  # nothing uploaded: nothing to do

    class Req:
        session_hash = "tab-1"

    _, pool = reader_pool()
    h = handlers.Handlers(pool)
    h.turns.begin_run(Req())
    h.turns.stop_run(Req())
    assert "tab-1" in h.turns._runs and "tab-1" in h.turns._stopped
    h.turns.forget(Req())
    assert "tab-1" not in h.turns._runs and "tab-1" not in h.turns._stopped


def test_a_refused_sweep_says_why_with_settings_that_fit_and_stop_answers_at_once(monkeypatch):
    from rag_demo.serving.admission import Serving
    from rag_demo.serving.budget import Budget

    class Pipe:
        index = [0] * 100

        def expect(self, q, modes, s):
            return {m: 30.0 * s.decoding.k for m in modes}  # 30 s a passage: 150 s a question at K = 5

    rh = ResultsHandlers(None, Serving(budget=Budget(max_sweep_seconds=600)))
    rh.pool = type("P", (), {"loaded": lambda self, s: Pipe()})()
    from rag_demo.web import results

    monkeypatch.setattr(results, "session_pipeline", lambda pool, s: (Pipe(), s))
    out = list(rh.run(10, ["5"], ["token"], "aided", "dense", "em", [], None))
    assert len(out) == 1 and 'data-state="refused"' in out[0][0]
    assert "about 25 min on this server now, over its 10 min for a sweep" in out[0][0]
    assert "It fits with 4 questions or fewer (about 10 min)" in out[0][0]
    assert 'data-state="idle"' in rh.stop()  # nothing running: said at once, never "Stopping..." for ever
    assert fits({1: 900.0, None: 5.0}, 3, 600) == ("Even one question is over it: choose one small K and one mode.")


def test_a_sliders_range_never_moves_when_the_server_admits_less():
    """Only the minimum admitted: each slider says so in its help and keeps its knob's own range, so
    no value it holds can fall outside it (a maximum moved under a held value jammed the page)."""
    from rag_demo.serving.admission import Serving
    from rag_demo.serving.budget import Budget

    pipe, pool = reader_pool(CostPipe())
    serving = Serving(budget=Budget())
    serving.check = lambda p, q, s, *a: (_ for _ in ()).throw(ValueError("no")) if (
        s.decoding.k > 1 or s.decoding.num_beams > 1 or s.decoding.max_new_tokens > 1) else None
    h = handlers.Handlers(pool, serving=serving)
    sliders = h.pricing.reach(None)
    # the update names its help alone (gradio sends only a returned component's own arguments)
    assert all(set(s._constructor_args[0]) == {"info"} for s in sliders)
    assert all("admits up to 1 with your other settings: more is refused" in s.info for s in sliders)


def test_a_cut_answer_is_not_rated():
    from rag_demo.confidence import ConfidenceModel, Logistic, judge

    m = ConfidenceModel({"offline|aided|token": Logistic(("logprob",), (0.0,), (1.0,), (1.0,), 0.0, 0.5)}, {})
    a = {"mode": "token", "stack": "offline", "settings": {"preset": "aided"}, "text": "Paris", "token_ids": [1],
         "sequence_logprob": -0.1, "docs": [], "candidates": []}
    assert judge({**a, "stopped": "eos"}, m)[1] is not None
    for why, by in (("cancelled", "Stop"), ("time_limit", "the time limit"), ("max_new_tokens", "max new tokens")):
        sig, p, cue = judge({**a, "stopped": why}, m)
        assert p is None and cue is None
        shown = render.render_confidence({**a, "stopped": why, "confidence": 0.46})
        assert f"cut by {by}, not rated" in shown and "46%" not in shown


def test_a_card_cut_by_the_time_limit_names_its_own_share_of_it():
    """The modes share the server's time limit (admission.time_shares): a card cut at 24 s on a server
    of 60 s says it reached its share, 24 s, not "the time limit"."""
    a = {"mode": "token", "question": "q", "text": "Paris", "tokens": ["Paris"], "token_ids": [1], "docs": [],
         "token_doc_posteriors": [], "top_docs": [], "doc_posterior": None, "sequence_logprob": -1.0,
         "decoding": "greedy", "timings": {"total": 24.1}, "stack": "offline", "corpus": "c", "candidates": [],
         "stopped": "time_limit", "time_share_s": 23.9, "settings": {"preset": "aided", "preset_title": "x"}}
    card = render.render_answer(a)
    assert "this mode&#x27;s share of the time limit (24 s) reached" in card and "time limit reached" not in card


def test_an_answers_score_is_one_number_on_its_card_in_its_candidates_and_in_the_text():
    """Fast RAG-Sequence ranks by a lower bound; the chosen answer's entry is its full log p(y|x), the
    others are marked as lower bounds, and the sentence beside the cards reads the same numbers."""
    from rag_demo.answer import ranked_candidates
    from rag_demo.rag.engine import Generation

    class Gen:
        def decode(self, ids):
            return {(1,): " Paris.", (2,): " Lyon."}[tuple(ids)]

    g = Generation(tokens=[1], logprob=-7.487, candidates=[([1], -7.806), ([2], -9.1)], decoding="fast, beam=2")
    cands = ranked_candidates(Gen(), g)
    assert cands[0] == {"text": " Paris.", "logprob": -7.487, "chosen": True}
    assert cands[1]["lower_bound"] and cands[1]["logprob"] == -9.1
    seq = answer_dict(mode="sequence", text=" Paris.", sequence_logprob=-7.487, candidates=cands, decoding="fast, beam=2")
    tok = answer_dict(mode="token", text=" Lyon.", sequence_logprob=-8.0,
                      candidates=[{"text": " Lyon.", "logprob": -8.0, "chosen": True}])
    card = render.render_answer(seq)
    assert card.count(render.fmt_lp(-7.487)) >= 2 and render.fmt_lp(-7.806) not in card  # head and candidates
    why = passages_view._why_differ(seq, tok)
    assert f"scored {render.fmt_lp(-7.487)} against at least {render.fmt_lp(-9.1)} for “Lyon”" in why


def test_show_the_code_names_the_retriever_that_answered_and_says_when_an_answer_was_cut():
    from rag_demo.web.reproduce import caveat, cli_command

    result = {"question": "Who painted it?", "settings": {"preset": "aided", "changed": {}, "retriever": "dense"},
              "answers": {"token": {"retriever": "bm25 (dense index building: 40%)", "stopped": "cancelled"},
                          "sequence": {"retriever": "bm25 (dense index building: 40%)", "stopped": "eos"},
                          "closed-book": {"retriever": "", "stopped": "eos"}}}
    assert cli_command(result).endswith("--preset aided --retriever bm25")
    note = caveat("builtin", False, result)
    assert "came from BM25" in note and "cut RAG-Token (stopped) short" in note and "RAG-Sequence" not in note
    dense = {**result, "answers": {m: {**a, "retriever": "dense", "stopped": "eos"} for m, a in result["answers"].items()}}
    assert "--retriever" not in cli_command(dense) and caveat("builtin", False, dense) == ""


def test_an_unexpected_exception_never_shows_its_text(monkeypatch, tmp_path):
    """A check no one foresaw failing (a PDF library's error inside the upload's validator), or a
    stack whose load raises, shows a plain message with an error id, never the exception's text;
    the log holds it."""
    from rag_demo.serving.pool import PipelinePool

    def broken(files):
        raise RuntimeError("secret /srv/cache/path in pypdf")

    monkeypatch.setattr(validation, "check_upload", broken)
    shown = validation.validate_upload([str(tmp_path / "x.pdf")], None)[0]
    assert shown["is_valid"] is False and "secret" not in shown["message"] and "error " in shown["message"]

    def factory(stack, progress):
        raise OSError("secret /srv/cache/path")

    pool = PipelinePool(factory, unavailable=lambda s: None)
    with pytest.raises(ValueError) as e:
        pool.get("offline", timeout=30)
    said = pool.error("offline")
    assert "secret" not in said and "secret" not in str(e.value) and "error " in said


def test_an_edited_title_is_bounded():
    from rag_demo.knowledge.corpus import MAX_TITLE_CHARS, check_passage_title, corpus_from_documents

    assert check_passage_title("p#0", "  The   Starry Night ") == "The Starry Night" and check_passage_title("p", None) == ""
    with pytest.raises(ValueError, match=f"over {MAX_TITLE_CHARS} characters"):
        check_passage_title("p#0", "x" * (MAX_TITLE_CHARS + 1))
    corpus = corpus_from_documents("c", [("Title", "Some text about a painting.", None)])
    with pytest.raises(ValueError, match="new title"):
        corpus.with_passage_text(corpus.passages[0].id, "New text.", "y" * 10_000)
    out = validation.validate_edit(corpus.passages[0].id, "New text.", "Who?", None, new_title="z" * 500)
    assert any(not r["is_valid"] and "new title" in r["message"] for r in out)
