"""The token inspector's numbers, on tiny random BART with EOS suppressed (8-token answers).

Answer.inspector carries, per shown token, each doc's p(y_i | x, z, y_<i) and top next tokens
(and RAG-Token's mixture's): they must agree with the attribution rows the heatmap shows, the
greedy choice must be the mixture's top token, and the tables greedy records while decoding
must equal a separate teacher-forced pass over the finished answer."""
from __future__ import annotations

import copy
import math

import pytest
import torch

from rag_demo.config import RagSettings
from rag_demo.rag.engine import INSPECT_TOP, inspect_answer
from rag_demo.rag.marginalize import doc_log_prior

Q = "who painted the starry night"


@pytest.fixture(scope="module")
def pipe(long_answer_pipe):
    return long_answer_pipe


def _normalised(xs: list[float]) -> list[float]:
    total = sum(xs)
    return [x / total for x in xs]


@pytest.mark.parametrize("beams", [1, 2])
def test_rag_token_inspector_agrees_with_the_heatmap_and_the_choice(pipe, beams):
    a = pipe.answer(Q, "token", num_beams=beams)
    prior = [d.prior for d in a.docs]
    assert len(a.inspector) == len(a.tokens) == len(a.token_doc_posteriors) == 8
    for i, row in enumerate(a.inspector):
        assert len(row["p_token"]) == len(row["top"]) == 3 and all(len(t) == INSPECT_TOP for t in row["top"])
        # the heatmap row of RAG-Token: p(z | x, y_i, y_<i) ∝ p(z|x) p(y_i | x, z, y_<i)
        assert _normalised([p * q for p, q in zip(prior, row["p_token"])]) == pytest.approx(
            a.token_doc_posteriors[i], abs=1e-5)
        for top in (*row["top"], row["mix"]):
            probs = [p for _, p in top]
            assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
        # each doc's own probability of the chosen token is at most its top token's
        assert all(p <= top[0][1] + 1e-6 for p, top in zip(row["p_token"], row["top"]))
        # the mixture's probability of the chosen token: sum_z p(z|x) p(y_i | x, z, y_<i)
        mix_p = sum(p * q for p, q in zip(prior, row["p_token"]))
        if beams == 1:  # greedy takes the mixture's most likely token
            assert row["mix"][0][0] == a.tokens[i] and row["mix"][0][1] == pytest.approx(mix_p, rel=1e-4)
        else:
            assert mix_p <= row["mix"][0][1] + 1e-6


def test_greedy_records_what_a_teacher_forced_pass_computes(pipe):
    """The tables greedy records while decoding equal inspect_answer's teacher-forced pass over
    the finished answer from a fresh prefill (float32, same numbers in another order: 1e-4)."""
    from rag_demo.rag.engine import rag_token

    s = RagSettings(preset="paper", k=3, max_new_tokens=8).decoding
    gen = pipe.stack.modes["token"].generator
    r = pipe.retrieve(Q, "token", 3)
    prompts = [gen.prompt(Q, p, s.max_doc_tokens) for p in r.passages]
    scores = r.scores * pipe.stack.modes["token"].score_scale
    g = rag_token(gen, prompts, scores, s)
    first, state = gen.prefill(prompts)  # (3, V)
    forced = inspect_answer(gen, state, first, g.tokens, doc_log_prior(scores))
    rec = g.inspection
    torch.testing.assert_close(rec.doc_top_lp, forced.doc_top_lp, atol=1e-4, rtol=0)
    torch.testing.assert_close(rec.mix_top_lp, forced.mix_top_lp, atol=1e-4, rtol=0)
    same = (rec.doc_top_ids == forced.doc_top_ids) | (rec.doc_top_lp - forced.doc_top_lp).abs().lt(1e-4)
    assert bool(same.all())  # the same tokens, up to ties
    assert rec.mix_top_ids[:, 0].tolist() == g.tokens  # greedy: the mixture's top token is the answer
    # and the pass leaves the prefill state usable: a second pass gives the same numbers
    again = inspect_answer(gen, state, first, g.tokens, doc_log_prior(scores))
    torch.testing.assert_close(again.doc_top_lp, forced.doc_top_lp)


def test_rag_sequence_inspector_explains_its_running_posterior(pipe):
    a = pipe.answer(Q, "sequence")
    prior = [d.prior for d in a.docs]
    assert len(a.inspector) == len(a.tokens) and all(row["mix"] is None for row in a.inspector)
    running = [math.log(p) for p in prior]
    for i, row in enumerate(a.inspector):
        # the heatmap row of RAG-Sequence: p(z | x, y_<=i) ∝ p(z|x) prod_{j<=i} p(y_j | x, z, y_<j)
        running = [lp + math.log(p) for lp, p in zip(running, row["p_token"])]
        top = max(running)
        assert _normalised([math.exp(lp - top) for lp in running]) == pytest.approx(a.token_doc_posteriors[i], abs=1e-5)


def test_closed_book_has_no_inspector(pipe):
    assert pipe.answer(Q, "closed-book").inspector == []


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_passage_drop_is_the_answers_log_prob_lost_without_each_passage(pipe, mode):
    """Answer.passage_drop[z] = log p(y|x) - log p(y|x) with z taken away and p(z|x) renormalised
    over the rest, recomputed here by hand from the inspector's per-doc token probabilities."""
    a = pipe.answer(Q, mode)
    prior, rows = [d.prior for d in a.docs], [r["p_token"] for r in a.inspector]
    assert len(rows) == 8  # every generated token is shown (EOS suppressed): the whole answer

    def logp(keep: list[int]) -> float:
        w = [prior[z] / sum(prior[z] for z in keep) for z in keep]
        if mode == "token":
            return sum(math.log(sum(wi * r[z] for wi, z in zip(w, keep))) for r in rows)
        return math.log(sum(wi * math.prod(r[z] for r in rows) for wi, z in zip(w, keep)))

    full = logp([0, 1, 2])
    assert full == pytest.approx(a.sequence_logprob, abs=1e-3)
    for z in range(3):
        assert a.passage_drop[z] == pytest.approx(full - logp([x for x in range(3) if x != z]), abs=1e-3)
    assert pipe.answer(Q, mode, k=1).passage_drop == [None]  # nothing left to answer from


def test_answer_without_a_passage_reruns_the_rag_modes_and_reports_the_drop(pipe):
    """The page's "answer without it" (AskEvents.without_passage, as the page and /without_passage
    call it): the new answers are those of the remaining passages, the change is
    Answer.passage_drop's; a bad request gets the page's error naming what is wrong."""
    import gradio as gr

    from rag_demo.serving.pool import PipelinePool
    from rag_demo.serving.session import Session
    from rag_demo.web import handlers, passages_view
    from rag_demo.web.answering import server_numbers

    h = handlers.Handlers(PipelinePool(lambda s, p: pipe, preloaded={"offline": pipe}, unavailable=lambda s: None))

    out = pipe.answers(Q, ["sequence", "token", "closed-book"])
    raw = {"question": Q, "settings": pipe.settings.to_dict(),
           "answers": {m: a.to_dict() for m, a in out.items()}}
    ours = server_numbers(copy.deepcopy(raw["answers"]))  # what the session keeps of the answers it computed

    def without(raw, pid):
        return h.answers.without_passage(pid, raw, Session(stack="offline", last_numbers=ours),
                                         progress=lambda *a, **k: None)[0]

    docs = raw["answers"]["token"]["docs"]
    res = without(raw, docs[0]["id"])
    assert list(res["modes"]) == ["sequence", "token"] and res["dropped"]["rank"] == 1 and res["k"] == 3
    for m in ("sequence", "token"):  # the paper stack: each mode has its own question encoder and ranking
        mine = raw["answers"][m]["docs"]
        z = [d["id"] for d in mine].index(docs[0]["id"])
        keep = [d for d in mine if d["id"] != docs[0]["id"]]
        rest = [pipe.index.corpus.passages[pipe.index.corpus.position(d["id"])] for d in keep]
        again = pipe.answer_from(Q, m, rest, [d["score"] for d in keep])
        x = res["modes"][m]
        assert x["after"] == again.text and x["before"] == out[m].text
        assert x["drop"] == pytest.approx(out[m].passage_drop[z])
        assert [d["id"] for d in x["answer"]["docs"]] == [d["id"] for d in keep]
    html = passages_view.render_without(res)
    assert html.count("<tr data-mode=") == 2 and "How faithful" in html and "renormalised over the other 2" in html
    for bad, msg in ((None, "no answer yet"), ({**raw, "answers": {"closed-book": raw["answers"]["closed-book"]}},
                                                "not among")):
        with pytest.raises(gr.Error, match=msg):
            without(bad, docs[0]["id"])
    with pytest.raises(gr.Error, match="not among"):
        without(raw, "no-such#0")
    one = {**raw, "answers": {"token": pipe.answer(Q, "token", k=1).to_dict()}}
    with pytest.raises(gr.Error, match="only one passage"):
        without(one, one["answers"]["token"]["docs"][0]["id"])
    # a client's own scores, priors and posteriors, and 1,000-item token lists, change nothing: the
    # passages come from the corpus and their scores from the server's retriever
    forged = copy.deepcopy(raw)
    for a in forged["answers"].values():
        a["docs"] = [{**d, "score": 99.0, "prior": 1.0} for d in a["docs"]]
        a["doc_posterior"] = [1.0] + [0.0] * (len(a["docs"]) - 1) if a["docs"] else a.get("doc_posterior")
        a["token_ids"], a["tokens"] = list(range(1000)), ["x"] * 1000
    same = without(forged, docs[0]["id"])
    for m in ("sequence", "token"):
        assert same["modes"][m]["after"] == res["modes"][m]["after"]
        assert same["modes"][m]["top"] == res["modes"][m]["top"] and same["modes"][m]["drop"] == res["modes"][m]["drop"]
        assert [d["score"] for d in same["modes"][m]["answer"]["docs"]] == [
            d["score"] for d in res["modes"][m]["answer"]["docs"]] != [99.0] * (len(docs) - 1)


@pytest.mark.parametrize("mode,beams,decoding", [("sequence", 1, "fast"), ("sequence", 2, "fast"), ("token", 2, "fast")])
def test_one_pass_scores_and_inspects_the_winner_as_two_did(pipe, monkeypatch, mode, beams, decoding):
    """The winner's log-probs under every doc come from the inspector's own teacher-forced pass
    (inspect_and_score): the same answer, log-probs and tables as a separate scoring pass and
    inspector pass (float32: the same model calls, log_softmax gathered against gather - logsumexp)."""
    from rag_demo.rag import engine
    from rag_demo.rag.decoding import score_candidates

    one = pipe.answer(Q, mode, num_beams=beams, sequence_decoding=decoding)
    inspect = engine.inspect_and_score

    def two_passes(gen, state, first_lp, tokens, prior, n=INSPECT_TOP):  # the code before: a pass each
        lp = score_candidates(gen, state, first_lp, [tokens], gen.pad_token_id)[0][:, 0]  # (K, T)
        return inspect(gen, state, first_lp, tokens, prior, n)[0], lp

    monkeypatch.setattr(engine, "inspect_and_score", two_passes)
    two = pipe.answer(Q, mode, num_beams=beams, sequence_decoding=decoding)
    assert one.tokens == two.tokens and one.text == two.text
    assert one.sequence_logprob == pytest.approx(two.sequence_logprob, abs=1e-5)
    for a, b in zip(one.inspector, two.inspector):
        assert a["p_token"] == pytest.approx(b["p_token"], abs=1e-5)
        assert [t for t, _ in a["top"][0]] == [t for t, _ in b["top"][0]]
    assert [p for row in one.token_doc_posteriors for p in row] == pytest.approx(
        [p for row in two.token_doc_posteriors for p in row], abs=1e-5)
