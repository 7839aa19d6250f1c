"""The benchmark's reference comparison (rag_demo/reference.py) on tiny random checkpoints: our
engine and transformers' RAG-Token / RAG-Sequence generate give the same tokens, and the timing
summary is computed from the per-question timings it reports. Not a timing test."""
from __future__ import annotations

import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

import pytest  # noqa: E402

from rag_demo.measure import bench_report, cold_start, latency  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.models.random_models import fixture_passages  # noqa: E402
from rag_demo.measure.reference import compare_with_transformers, paired_times  # noqa: E402


def test_reference_comparison_gives_same_outputs_on_tiny_models(tiny_ckpts):
    paths = tiny_ckpts  # conftest: n_docs=3
    docs = [Passage(f"{t}#0", t, text) for t, text in fixture_passages()]
    cases = [("Who painted The Starry Night?", docs), ("What is the capital of France?", docs[::-1])]
    res = compare_with_transformers(paths, cases, max_new_tokens=8)
    assert set(res) == {"token", "sequence"}
    for mode, x in res.items():
        assert x["n_docs"] == 3 and x["n"] == 2
        assert x["same"], (mode, [(r["ours"], r["transformers"]) for r in x["rows"]])
        assert all(len(r["ours"]) == 8 for r in x["rows"])  # EOS suppressed: every answer runs to the limit
        rows = x["rows"]
        assert all(r["ours_s"] > 0 and r["transformers_s"] > 0 for r in rows)
        # the summary is the median of the per-question paired ratios, not a ratio of sums
        assert x["ratio"] == pytest.approx(statistics.median(r["ours_s"] / r["transformers_s"] for r in rows))
        assert x["ours_s_p50"] == pytest.approx(statistics.median(r["ours_s"] for r in rows))
        assert 0 < x["ratio_generate_only"] <= x["ratio"] * (1 + 1e-9)  # generate is part of the whole call


def test_case_with_wrong_number_of_passages_is_refused(tiny_ckpts):
    docs = [Passage(f"{t}#0", t, text) for t, text in fixture_passages()]
    with pytest.raises(ValueError, match="n_docs is 3"):
        compare_with_transformers(tiny_ckpts, [("Q?", docs[:2])], max_new_tokens=2)


def test_paired_times_alternates_and_returns_medians():
    order: list[str] = []
    ticks = iter(range(100))

    def a():
        order.append("a")
        return next(ticks)

    def b():
        order.append("b")
        return "b"

    t_a, r_a, t_b, r_b = paired_times(a, b, reps=4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]  # who runs first alternates
    assert r_b == "b" and r_a == 3 and t_a >= 0 and t_b >= 0  # the last result of each side


def test_percentile():
    assert latency.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert latency.percentile([5.0], 95) == 5.0
    assert latency.percentile([0.0, 10.0], 95) == 9.5


def test_the_latency_table_names_the_beam_count_it_ran_with():
    def heading(beams):
        return bench_report.latency_heading({"n": 2, "stack": "offline",
                                      "settings": {"k": 5, "max_new_tokens": 32, "num_beams": beams}})

    assert "K=5, 2 beams, max 32 new tokens" in heading(2)
    assert "K=5, greedy, max 32 new tokens" in heading(1)


def test_targets_are_the_issues_bars_in_both_directions():
    """bench's targets table: time limits pass at or below, index throughput at or above; each
    generator precision has its own latency bars; an unmeasured target says so rather than passing."""
    lat = {"token": {"total": [1.4, 1.6, 1.2], "retrieve": [0.001] * 3, "ttft": [0.5, 0.9, 0.7],
                     "generate": [1.0, 1.0, 1.0], "generate_streamed": [1.01, 1.2, 1.03]},
           "sequence": {"total": [2.6, 2.7, 2.4], "retrieve": [0.001] * 3}}
    f32 = {"token": {"total": [2.4, 2.6, 2.0], "retrieve": [0.001] * 3, "ttft": [0.9, 1.1, 1.0],
                     "generate": [1.0] * 3, "generate_streamed": [1.0] * 3},
           "sequence": {"total": [2.6, 2.4, 2.4], "retrieve": [0.001] * 3}}
    r = {"latency": {"bfloat16": lat, "float32": f32}, "memory": {"rss_warm": 1.5e9},
         "throughput": {"passages_per_s": 149.0}, "cold": {"cold_uncached": {"seconds": 95.0}}}
    t = bench_report.targets(r)
    assert t["RAG-Token p50 (bfloat16 generator)"]["value"] == 1.4
    assert t["RAG-Token p50 (bfloat16 generator)"]["result"] == "PASS"
    assert t["RAG-Sequence p50 (bfloat16 generator)"]["result"] == "FAIL"  # 2.6 > 2.5
    assert t["RAG-Token time to first token p50 (bfloat16 generator)"]["value"] == 0.7
    assert t["RAG-Token p50 (float32 generator)"]["result"] == "PASS"  # 2.4 <= 2.5: float32's own bar
    assert t["RAG-Sequence p50 (float32 generator)"]["result"] == "PASS"
    assert t["RAG-Token time to first token p50 (float32 generator)"]["value"] == 1.0
    assert t["RAG-Token time to first token p50 (float32 generator)"]["result"] == "PASS"
    assert t["RAG-Token streamed / quiet generate p50"]["value"] == pytest.approx(1.03)  # the first precision's
    assert t["index build throughput"]["bound"] == ">=" and t["index build throughput"]["result"] == "FAIL"  # 149 < 150
    assert t["cold start without a cache"]["result"] == "PASS"
    assert t["engine / transformers RAG (base)"]["measured"] == "not run"
    r["throughput"]["passages_per_s"] = 150.0
    assert bench_report.targets(r)["index build throughput"]["result"] == "PASS"
    del r["latency"]["bfloat16"]  # a CPU without native bfloat16: its bars say so
    assert bench_report.targets(r)["RAG-Token p50 (bfloat16 generator)"]["measured"] == "not run"


def test_generator_dtypes_measured():
    """bench times float32 and, where the CPU has native bfloat16, bfloat16 too, the app's own first;
    --generator-dtype alone keeps meaning one precision."""
    assert latency.generator_dtypes(None, None, "offline", native=True) == ["bfloat16", "float32"]
    assert latency.generator_dtypes(None, None, "offline", native=False) == ["float32"]
    assert latency.generator_dtypes(None, "float32", "offline", native=True) == ["float32"]
    assert latency.generator_dtypes("float32,auto", None, "offline", native=True) == ["float32", "bfloat16"]
    assert latency.generator_dtypes("bfloat16", None, "offline", native=False) == ["bfloat16"]
    assert latency.generator_dtypes(None, None, "paper", native=True) == ["float32"]
    with pytest.raises(ValueError, match="float16"):
        latency.generator_dtypes("float32,float16", None, "offline", native=True)


def test_the_apps_cold_start_is_reported_and_checked_against_its_bars():
    """bench --cold-only: launch to the first answer (with the retriever it names) and to the
    dense index complete, per generator precision; the float32 run has both bars, bfloat16 the
    dense index's, and a precision that did not run (no native bfloat16) says so."""
    cold = {"cold_uncached": {"seconds": 150.0},
            "app_float32": {"first_answer_s": 48.2, "ready_s": 41.0, "first_retriever": "bm25 (dense index building: 31%)",
                            "dense_complete_s": 131.5, "second_retriever": "dense", "first_answer": "Seurat"}}
    r = {"cold": cold, "machine": {"processor": "x", "cpus": 2, "torch": "2", "threads": 2},
         "load_avg": {"start": [0.1], "end": [0.2]}}
    t = bench_report.targets(r)
    assert t["app cold start: first answer (float32 generator)"]["result"] == "PASS"  # 48.2 <= 60
    assert t["app cold start: dense index complete (float32 generator)"]["result"] == "FAIL"  # 131.5 > 120
    assert t["app cold start: dense index complete (bfloat16 generator)"]["measured"] == "not run"
    assert t["cold start without a cache"]["result"] == "FAIL" and "RAG-Token p50 (float32 generator)" in t  # not run, listed
    r["targets"] = t
    text = bench_report.format_cold_only(r)
    assert "| float32 | 41.0 s | 48.2 s | bm25 (dense index building: 31%) | 131.5 s | dense |" in text
    assert "RAG-Token p50" not in text  # only the cold starts' targets
    assert cold_start.format_cold_starts({"cold_uncached": {"seconds": 1.0}}) == []
