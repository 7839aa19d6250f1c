"""Smoke test of the benchmark's reference comparison: on tiny random checkpoints our engine
and transformers' RAG-Token / RAG-Sequence generate give the same tokens. Not a timing test."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo import bench  # noqa: E402
from rag_demo.corpus import Passage  # noqa: E402
from rag_demo.random_models import fixture_passages  # noqa: E402


def test_reference_comparison_gives_same_outputs_on_tiny_models(tiny_ckpts):
    paths = tiny_ckpts  # conftest: n_docs=3
    docs = [Passage(f"{t}#0", t, text) for t, text in fixture_passages()]
    cases = [("Who painted The Starry Night?", docs), ("What is the capital of France?", docs[::-1])]
    res = bench.compare_with_transformers(paths, cases, max_new_tokens=8)
    assert set(res) == {"token", "sequence"}
    for mode, x in res.items():
        assert x["n_docs"] == 3 and x["n"] == 2
        assert x["same"], (mode, [(r["ours"], r["transformers"]) for r in x["rows"]])
        assert all(len(r["ours"]) == 8 for r in x["rows"])  # EOS suppressed: every answer runs to the limit
        assert x["ratio"] > 0


def test_percentile():
    assert bench.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert bench.percentile([5.0], 95) == 5.0
    assert bench.percentile([0.0, 10.0], 95) == 9.5
