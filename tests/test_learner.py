"""What a learner sees beside the answers: honest cues, why the two modes agree or differ, the
retriever's own prior beside the reweighted one, readable tokens, a cut answer that can be
finished; and what keeps one visitor's page consistent: one question at a time, time shares,
an estimate that follows the machine's speed. Pure functions and fake pipelines: no model."""
from __future__ import annotations

import time
from html import escape as html_escape
from types import SimpleNamespace

import pytest

from rag_demo.models.cost import CostModel, Speed, Timed
from rag_demo.answer import cues, unread
from rag_demo.reader.language import language_of
from rag_demo.serving.admission import time_shares
from rag_demo.web.passages_view import explain_modes, render_passages
from rag_demo.web.render import render_answer, render_tokens


@pytest.mark.parametrize("question, language", [
    ("Qui a peint la Joconde ?", "French"), ("Wer hat die Mona Lisa gemalt?", "German"),
    ("¿Quién pintó la Mona Lisa?", "Spanish"), ("Chi ha dipinto la Gioconda?", "Italian"),
    ("Quem pintou a Mona Lisa?", "Portuguese"), ("Was ist die Hauptstadt von Deutschland?", "German"),
    ("Who wrote La Traviata?", "English"), ("Mona Lisa painter", "English"), ("capital of australia", "English"),
    ("Who painted Las Meninas?", "English"), ("who sang la vie en rose", "English"),
    ("Wie heeft De Sterrennacht geschilderd?", "Dutch"), ("Кто написал «Анну Каренину»?", "Cyrillic script"),
    ("谁发明了纸？", "Chinese or Japanese script"), ("من كتب ألف ليلة وليلة؟", "Arabic script"),
    ("Who wrote 源氏物語?", "English"), ("Who founded Москва?", "English"),
])
def test_the_language_of_a_question(question, language):
    assert language_of(question) == language


def test_cues_say_when_the_passages_may_not_hold_the_answer_and_when_the_question_is_not_english():
    mm = SimpleNamespace(doubt_below=0.5)
    assert cues("Who painted The Starry Night?", mm, [0.71, 0.4]) == []
    low = cues("Who won the 2022 FIFA World Cup?", mm, [0.44, 0.41])
    assert [c["kind"] for c in low] == ["may_lack_answer"] and "0.44" in low[0]["text"]
    french = cues("Qui a peint la Joconde ?", mm, [0.7])
    assert [c["kind"] for c in french] == ["not_english"] and "French" in french[0]["text"]
    assert cues("Who won the 2022 FIFA World Cup?", SimpleNamespace(doubt_below=None), [0.1]) == []  # not calibrated
    assert [c["kind"] for c in cues("Qui a peint la Joconde ?")] == ["not_english"]  # closed-book too


def test_an_answer_no_passage_contains_is_said_to_come_from_the_weights():
    docs = [SimpleNamespace(title="Penicillin", text="Alexander Fleming discovered penicillin in 1928.")]
    assert unread("Alexander Fleming.", docs) == [] and unread("1928", docs) == []
    said = unread("Howard Florey.", docs)
    assert [c["kind"] for c in said] == ["not_in_passages"] and "own weights" in said[0]["text"]
    assert unread("Fleming discovered", docs) == [] and unread("Flem", docs) != []  # whole words only
    assert unread("Howard", docs, stopped="time_limit") == [] and unread("Howard", []) == []  # cut; closed-book
    # copied words are found whatever their case, punctuation or Unicode forms; an article is a word too
    quoted = [SimpleNamespace(title="Reef", text="Australia’s “Great Barrier Reef” lies off Queensland.")]
    assert unread("The…", [SimpleNamespace(title="T", text="It is the largest.")]) == []
    assert unread("australia's great barrier reef", quoted) == [] and unread("Great Barrier-Reef!", quoted) == []
    assert unread("ＧＲＥＡＴ Barrier Reef", quoted) == []  # full-width letters: the same word once normalised


def _answer(mode, text, priors, post=None, **kw):
    docs = [{"rank": i + 1, "id": f"d{i}", "title": t, "text": t, "url": None, "score": 0.5, "prior": p,
             "retriever_prior": p} for i, (t, p) in enumerate(priors)]
    return {"question": "What is the capital of Brazil?", "mode": mode, "text": text, "tokens": [text],
            "token_ids": [1], "docs": docs, "token_doc_posteriors": [[p for _, p in priors]], "top_docs": [0],
            "doc_posterior": post, "sequence_logprob": -1.0, "decoding": "greedy", "timings": {"total": 1.0},
            "stack": "offline", "corpus": "C", "candidates": [], **kw}


def test_the_sentence_under_the_cards_says_why_the_modes_agree_or_differ_from_this_questions_numbers():
    peaked = [("Brasília", 0.97), ("Brazil", 0.03)]
    agree = explain_modes({"sequence": _answer("sequence", "Brasília.", peaked, [0.99, 0.01]),
                           "token": _answer("token", "Brasília.", peaked),
                           "closed-book": _answer("closed-book", "Rio de Janeiro.", [])})
    assert "agree" in agree and "0.97" in agree and "almost alone" in agree and "Rio de Janeiro" in agree
    spread = [("Brasília", 0.43), ("Brazil", 0.28), ("Rio de Janeiro", 0.19)]
    differ = explain_modes({"sequence": _answer("sequence", "Brasília.", spread, [0.82, 0.17, 0.01]),
                            "token": _answer("token", "Rio de Janeiro.", spread)})
    # the reason is in the two modes' scores (on their cards), not blamed on the prior
    assert "differ" in differ and "spread" not in differ and "0.43" in differ and "0.82" in differ
    assert "scored log p(y|x) = -1.000" in differ and "search (greedy or its beams) never reached" in differ
    assert "Rio de Janeiro" in differ and "Brasília" in differ
    assert explain_modes({"closed-book": _answer("closed-book", "x", [])}) == ""
    stopped = explain_modes({"sequence": _answer("sequence", "Brasília.", spread, [0.82, 0.17, 0.01]),
                             "token": _answer("token", "Rio", spread, stopped="cancelled")})
    assert "RAG-Token stopped early" in stopped and "differ" not in stopped  # no lesson from a cut answer
    ranked_fast = explain_modes({"sequence": _answer("sequence", "Brasília.", spread, fell_back="fast_ranking"),
                                 "token": _answer("token", "Rio de Janeiro.", spread)})
    assert "RAG-Sequence stopped early" in ranked_fast and "differ" not in ranked_fast  # nor from another algorithm


def test_the_explanation_names_the_passage_the_answer_came_from_when_retrieval_trusted_another():
    """Retrieval put 1.00 on the first passage, but both answers copied the second's words and
    RAG-Sequence's posterior moved there: the sentence says so, never "read that passage almost alone"."""
    priors = [("Victoria Falls", 0.998), ("Niagara Falls is a group of waterfalls", 0.002)]
    why = explain_modes({"sequence": _answer("sequence", "Niagara Falls.", priors, [0.054, 0.946]),
                         "token": _answer("token", "Niagara Falls.", priors)})
    assert "almost alone" not in why and "agree" in why
    assert "yet the answer comes from [2] Niagara Falls is a group of waterfalls whose text holds" in why
    assert "posterior p(z|x,y) puts 0.95 on it" in why and "1.00 on [1] Victoria Falls" in why


def test_the_passage_table_shows_the_retrievers_own_prior_beside_the_reweighted_one():
    plain = _answer("token", "x", [("A", 0.6), ("B", 0.4)])
    assert "retriever<br>p(z|x)" not in render_passages({"token": plain})  # the paper's prior: one column
    voted = _answer("token", "x", [("A", 0.2), ("B", 0.8)])
    for d, own, lp in zip(voted["docs"], (0.7, 0.3), (-30.0, -12.0)):
        d["retriever_prior"], d["question_logprob"] = own, lp
    html = render_passages({"token": voted})
    assert "retriever<br>p(z|x)" in html and "with<br>the vote" in html
    assert html.index("0.700") < html.index("0.200")  # the retriever's own first, then the one the formulas used


def test_a_bare_space_token_is_shown_with_the_token_after_it():
    a = _answer("token", " Vincent van", [("A", 1.0)])
    a.update(tokens=[" ", "Vincent", " van"], token_ids=[1, 2, 3], token_doc_posteriors=[[1.0]] * 3, top_docs=[0] * 3)
    html = render_tokens(a)
    assert html.count('<a class="rag-tok') == 2 and ">  Vincent<" not in html and "> Vincent</a>" in html
    assert 'data-i="1"' in html and 'data-i="0"' not in html  # the merged token opens token 1's inspector


def test_a_cut_answer_offers_continue_and_a_finished_one_does_not():
    cut = _answer("token", "Cle", [("A", 1.0)], stopped="time_limit")
    assert 'class="rag-continue-btn"' in render_answer(cut) and 'data-mode="token"' in render_answer(cut)
    assert "rag-continue-btn" not in render_answer(_answer("token", "Cleopatra.", [("A", 1.0)], stopped="eos"))


@pytest.mark.parametrize("mode, fell_back, says", [
    ("sequence", "fast_ranking", "Stopped early: ranked the fast way, not as the paper does"),
    ("token", "no_drafts", "Stopped early: the passages' drafts were not weighed"),
])
def test_a_card_whose_mode_a_stop_made_run_something_else_says_so_in_its_head_and_can_be_answered_in_full(
        mode, fell_back, says):
    """An answer that ended at its own end (stopped "eos") but by another algorithm than its settings
    name (Answer.fell_back): the card's head says so, and it offers to answer the mode in full."""
    html = render_answer(_answer(mode, "Cleopatra.", [("A", 1.0)], stopped="eos", fell_back=fell_back))
    head = html[html.index('class="rag-card-head"'):html.index('class="rag-answer"')]  # before the answer
    assert f'data-fell-back="{fell_back}"' in head and html_escape(says) in head
    assert f'class="rag-continue-btn" type="button" data-mode="{mode}"' in html
    as_asked = render_answer(_answer(mode, "Cleopatra.", [("A", 1.0)], stopped="eos", fell_back=""))
    assert "rag-fell-back" not in as_asked and "rag-continue-btn" not in as_asked


def test_each_mode_gets_its_own_share_of_the_time_limit():
    cost = SimpleNamespace(per_mode={"sequence": 6.0, "token": 3.0, "closed-book": 1.0})
    shares = time_shares(cost, 60.0)
    assert shares["sequence"] == pytest.approx(36.0) and shares["token"] == 20.0 and shares["closed-book"] == 20.0
    assert time_shares(None, 60.0) == {"sequence": 60.0, "token": 60.0, "closed-book": 60.0}  # not priced


def test_the_estimate_follows_the_speed_measured_since_warm_up():
    speed = Speed()
    for _ in range(50):
        speed.observe(1.0, 0.3)  # quiet: the model prices worst cases, real calls are cheaper
    speed.settle()
    assert speed.factor == pytest.approx(1.0)
    for _ in range(100):
        speed.observe(1.0, 0.6)  # another job shares the CPU: twice as slow
    assert speed.factor == pytest.approx(2.0, rel=0.02)
    for _ in range(200):
        speed.observe(1.0, 2.4)  # two processes each wanting every core: eight times as slow, priced so
    assert speed.factor == pytest.approx(8.0, rel=0.02)
    for _ in range(200):
        speed.observe(1.0, 100.0)
    assert speed.factor == Speed.RANGE[1]  # bounded


def test_timed_calls_feed_the_speed():
    class Slow:
        def prefill(self, prompts, keep_prompt_logprobs=0):
            time.sleep(0.02)
            return "lp", "state"

    speed = Speed()
    gen = Timed(Slow(), CostModel(prefill_s_per_token=0.001), speed)
    assert gen.prefill([[1] * 10, [2] * 10]) == ("lp", "state")
    # 20 tokens priced at 20 ms, at least 20 ms taken (a busy machine only makes it longer)
    assert speed.ratio is not None and 0.95 <= speed.ratio < 20
