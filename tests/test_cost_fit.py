"""What a card expects an answer to take (models/cost.CostModel.expected, measure/cost_fit.py):
the typical length and fitted factor by hand, a re-ask priced from what is kept, and the fit's
file and held-out report."""
from __future__ import annotations

import json

import pytest

from rag_demo.measure import cost_fit
from rag_demo.models.cost import CostFit, CostModel, ModelDims

DIMS = ModelDims(layers=2, kv_width=8, vocab=100, dtype_bytes=4)


def test_expected_prices_the_typical_length_times_the_fitted_factor():
    model = CostModel()
    fit = CostFit({"aided|token": 5}, {"aided|token": 2.0}, {"aided|token": 0.1})
    worst, _ = model.request(DIMS, "token", 5, 2, 32, 300, drafts="own")
    typical, _ = model.request(DIMS, "token", 5, 2, 5, 300, drafts="own")
    assert model.expected(DIMS, "token", 5, 2, 32, 300, fit, "aided", drafts="own") == pytest.approx(2.0 * typical)
    assert 2.0 * typical < worst
    # a re-ask: every prompt's state kept, no prefill priced, the re-ask factor
    kept, _ = model.request(DIMS, "token", 5, 2, 5, 300, drafts="own", cached_tokens=5 * 300)
    assert model.expected(DIMS, "token", 5, 2, 32, 300, fit, "aided", drafts="own", prompts_kept=True) == \
        pytest.approx(0.1 * kept)
    # max new tokens below the typical length bounds it; nothing fitted: factor 1, DEFAULT_TOKENS
    short, _ = model.request(DIMS, "token", 5, 2, 3, 300)
    assert model.expected(DIMS, "token", 5, 2, 3, 300, fit, "aided") == pytest.approx(2.0 * short)
    none, _ = model.request(DIMS, "closed-book", 1, 1, int(CostFit.DEFAULT_TOKENS), 50)
    assert model.expected(DIMS, "closed-book", 1, 1, 32, 50, CostFit(), "paper") == pytest.approx(none)


def test_the_fit_file_round_trips_and_a_wrong_one_is_refused(tmp_path):
    fit = CostFit({"paper|token": 4.0}, {"paper|token": 1.5}, {"paper|token": 0.2}, {"command": "x"})
    path = tmp_path / "cost_fit.json"
    path.write_text(json.dumps(fit.to_dict()))
    assert CostFit.load(path) == fit
    assert CostFit.load(tmp_path / "missing.json") == CostFit()
    path.write_text(json.dumps({"version": 7}))
    with pytest.raises(ValueError, match="not a cost fit"):
        CostFit.load(path)


def test_typical_tokens_and_errors_by_hand(tmp_path):
    run = tmp_path / "r.jsonl"
    rows = [{"qa": "d", "question_id": str(i), "mode": "token", "preset": "aided", "retriever": "dense", "k": k,
             "n_tokens": n} for i, (k, n) in enumerate([(5, 3), (5, 5), (5, 9), (1, 40)])]
    rows.append({"qa": "d", "question_id": "c", "mode": "closed-book", "preset": "aided", "retriever": None, "k": None,
                 "n_tokens": 7})
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cost_fit.typical_tokens(run) == {"aided|token": 5.0, "aided|closed-book": 7.0}  # K = 1 left out
    errs = cost_fit._errors([{"preset": "p", "mode": "m", "seconds": 2.0, "x": 3.0},
                             {"preset": "p", "mode": "m", "seconds": 4.0, "x": 2.0},
                             {"preset": "p", "mode": "m", "seconds": 1.0, "x": 1.0}], "x")
    assert errs == {"p|m": 0.0}  # errors +0.5, -0.5, 0: the median
