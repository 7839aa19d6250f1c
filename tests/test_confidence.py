"""An answer's confidence: its signals read off a hand-made answer, the logistic model's formula,
the "probably wrong" cue below the threshold, and the model file's round trip."""
from __future__ import annotations

import json
import math

import pytest

from rag_demo import confidence as cf


def answer(mode="token", **kw):
    a = {"mode": mode, "stack": "offline", "settings": {"preset": "aided"}, "question": "Who painted The Starry Night?",
         "text": "Vincent van Gogh.", "token_ids": [1, 2, 3, 4], "sequence_logprob": -2.0, "stopped": "eos",
         "candidates": [{"text": "Vincent van Gogh.", "logprob": -2.0}, {"text": "Paris.", "logprob": -3.5}],
         "doc_posterior": [0.9, 0.1],
         "docs": [{"prior": 0.8, "score": 0.61, "title": "The Starry Night", "text": "painted by Vincent van Gogh"},
                  {"prior": 0.2, "score": 0.40, "title": "Paris", "text": "the capital of France"}],
         "inspector": [{"p_token": [0.5, 0.1]}, {"p_token": [0.9, 0.2]}]}
    a.update(kw)
    return a


def test_signals_of_a_rag_answer_by_hand():
    s = cf.signals(answer())
    assert s["logprob"] == -2.0 and s["mean_logprob"] == -0.5 and s["n_tokens"] == pytest.approx(math.log(5))
    assert s["ended"] == 1.0 and s["empty"] == 0.0 and s["echo"] == 0.0
    assert s["margin"] == pytest.approx(1.5) and s["single"] == 0.0
    assert s["best_prior"] == 0.8 and s["top_score"] == 0.61 and s["max_posterior"] == 0.9
    assert s["in_passage"] == 1.0
    # token 1: 0.8·0.5 + 0.2·0.1 = 0.42; token 2: 0.8·0.9 + 0.2·0.2 = 0.76: the weakest is 0.42
    assert s["min_token_logprob"] == pytest.approx(math.log(0.42))
    # vincent, van, gogh: none asked, all in the top passage (prior 0.8)
    assert s["new_words"] == pytest.approx(math.log(4)) and s["new_in_top"] == 1.0 and s["new_in_passages"] == 1.0
    assert set(s) == set(cf.FEATURES["token"]) | set(cf.GROUNDING)


def test_grounding_counts_what_the_answer_adds_to_its_question_where_the_passages_hold_it():
    passages = [("Paris", "Paris is the capital of France."), ("Lyon", "Lyon lies on the Rhone, in France.")]
    # "capital of France" is asked; "lyon" and "rhone" are new: in the second passage only
    g = cf.grounding("What is the capital of France?", "Lyon, on the Rhone", passages, top=0)
    assert g == {"new_words": pytest.approx(math.log(3)), "new_in_top": 0.0, "new_in_passages": 1.0}
    assert cf.grounding("What is the capital of France?", "Lyon, on the Rhone", passages, top=1)["new_in_top"] == 1.0
    # half the new words nowhere; an echo of the question (and stop words) adds nothing
    assert cf.grounding("Who?", "Paris Berlin", passages)["new_in_passages"] == 0.5
    assert cf.grounding("What is the capital of France?", "It is the capital", passages) == \
        {"new_words": 0.0, "new_in_top": 0.0, "new_in_passages": 0.0}
    # the top passage is the one the retriever trusts most, wherever it stands in the list
    docs = [{"prior": 0.1, "score": 0.2, "title": "Paris", "text": "the capital"},
            {"prior": 0.9, "score": 0.5, "title": "The Starry Night", "text": "painted by Vincent van Gogh"}]
    assert cf.signals(answer(docs=docs))["new_in_top"] == 1.0


def test_signals_of_wrong_looking_answers():
    s = cf.signals(answer(text="The Starry Night.", candidates=[{"text": "x", "logprob": -1.0}], stopped="time_limit",
                          docs=[{"prior": 1.0, "score": 0.3, "title": "Mars", "text": "the red planet"}],
                          sequence_logprob=float("-inf")))
    assert s["echo"] == 1.0 and s["single"] == 1.0 and s["margin"] == cf.NO_RIVAL and s["ended"] == 0.0
    assert s["in_passage"] == 0.0 and s["logprob"] == cf.FLOOR
    closed = cf.signals(answer(mode="closed-book", docs=[], candidates=[], inspector=[]))
    assert set(closed) == set(cf.FEATURES["closed-book"])


def test_the_model_is_a_logistic_regression_and_its_cue_fires_below_the_threshold(tmp_path):
    m = cf.Logistic(("logprob",), (-2.0,), (2.0,), (1.5,), 0.25, 0.4)
    # z = 0.25 + 1.5·(−6 + 2)/2 = −2.75
    assert m.predict({"logprob": -6.0}) == pytest.approx(1 / (1 + math.exp(2.75)))
    model = cf.ConfidenceModel({cf.ConfidenceModel.key("offline", "aided", "token"): m}, {"fitted_on": "test"})
    _, p, cue = cf.judge(answer(sequence_logprob=-6.0), model)
    assert p == pytest.approx(1 / (1 + math.exp(2.75))) and cue["kind"] == "probably_wrong" and "6%" in cue["text"]
    _, p, cue = cf.judge(answer(sequence_logprob=-0.5), model)
    assert p > 0.4 and cue is None
    # no model for this preset, mode or stack: no number, no cue
    assert cf.judge(answer(mode="sequence"), model)[1:] == (None, None)
    assert cf.judge(answer(), None)[1:] == (None, None)
    path = model.save(tmp_path / "c.json")
    cf.load_model.cache_clear()
    again = cf.load_model(path)
    assert again.model_for("offline", "aided", "token") == m and again.about == {"fitted_on": "test"}
    assert cf.load_model(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text(json.dumps({"version": 2}))
    with pytest.raises(ValueError, match="not a confidence model file"):
        cf.load_model(tmp_path / "bad.json")



def test_each_card_quotes_what_its_own_model_was_fitted_on():
    """The trained preset's models were fitted on fewer calibrate questions than the aided ones: each
    card's tooltip quotes its own preset and mode's count and the settings the fit covers."""
    from rag_demo.web.render import render_confidence

    model = cf.load_model()
    about = {(r["preset"], r["mode"]): r["questions"] for r in model.about["fitted"]}
    for preset in ("aided", "trained"):
        q = model.quoted("offline", preset, "token")
        assert q["fitted_questions"] == about[(preset, "token")]
        shown = render_confidence({"stopped": "eos", "confidence": 0.5, "cues": [], "confidence_model": q})
        assert f"fitted on {about[(preset, 'token')]} questions of this preset and mode" in shown
        assert "at K 5" in shown
    assert about[("trained", "token")] != about[("aided", "token")]


def test_a_request_outside_the_fit_is_named_and_one_inside_is_not():
    about = {"k": 5, "corpus": "Wikipedia Vital Articles (en) (11,485 passages)"}
    vital = "Wikipedia Vital Articles (en) (11,485 passages)"
    assert cf.outside_fit(about, 5, "dense", vital, True) == []
    said = cf.outside_fit(about, 3, "bm25 (dense index building: 40%)", "Your documents: notes.txt (12 passages)", False)
    assert said == ["K 3 (fitted at K 5)", "the bm25 retriever (fitted on dense)",
                    "Your documents: notes.txt (12 passages) (fitted on Wikipedia Vital Articles (en) (11,485 passages))",
                    "other generator weights than those measured"]


def test_the_card_says_when_its_confidence_was_fitted_elsewhere():
    from rag_demo.web.render import render_confidence

    base = {"confidence": 0.46, "stopped": "eos", "cues": [],
            "confidence_model": {"fitted_questions": 306, "questions": 452, "precision": 0.9, "recall": 0.5,
                                 "auroc": 0.8, "features": ["logprob"], "outside": []}}
    inside = render_confidence(base)
    assert 'data-outside="0"' in inside and "fitted elsewhere" not in inside
    out = render_confidence({**base, "confidence_model": {**base["confidence_model"], "outside": ["K 3 (fitted at K 5)"]}})
    assert 'data-outside="1"' in out and "this answer used K 3 (fitted at K 5), so this number and its cue may not hold" in out
