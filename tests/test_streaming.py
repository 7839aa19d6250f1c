"""Streaming: answers handed out as they are decoded, on tiny random models.

What must hold: listening changes nothing (same tokens, same log p(y|x)); every partial answer
is a prefix of the final one; RAG-Token's partial attribution rows are exactly the final
answer's first rows (greedy records each doc's log-prob as it goes); RAG-Sequence hands one
draft per passage, then says it is rescoring; beam search hands its current best."""
from __future__ import annotations

import pytest
import torch

from rag_demo.config import RagSettings
from rag_demo.rag.decoding import Rows, Step, search

QUESTION = "who painted the starry night"


@pytest.fixture(scope="module")
def pipe(long_answer_pipe):
    return long_answer_pipe


def _listen(pipe, modes, **overrides):
    """Answer with the partial answers streamed; greedy unless `overrides` say otherwise (the
    traces below are greedy's). -> (the final answers, the partial answer dicts in order)."""
    seen: list[dict] = []
    out = {}
    for e in pipe.answer_modes(QUESTION, modes, partials=True, **{"num_beams": 1, **overrides}):
        if e.final:
            out[e.mode] = e.answer
        else:
            seen.append(e.answer)
    return out, seen


@pytest.mark.parametrize("beams", [1, 3])
def test_listening_changes_nothing(pipe, beams):
    modes = ["sequence", "token", "closed-book"]
    quiet = pipe.answers(QUESTION, modes, num_beams=beams)
    loud, seen = _listen(pipe, modes, num_beams=beams)
    assert {p["mode"] for p in seen} == set(modes)
    for m in modes:
        assert loud[m].token_ids == quiet[m].token_ids
        assert loud[m].sequence_logprob == pytest.approx(quiet[m].sequence_logprob, abs=1e-5)


def test_each_answer_is_handed_over_as_soon_as_its_mode_is_done(pipe):
    """answer_modes' events (the app's one call for three cards): each mode's final Answer comes
    before the next mode streams anything, closed-book (the cheapest) first, then the RAG modes in
    the order asked; each is the answer `answers` gives, and the answer each mode gives alone."""
    events: list[tuple[str, str]] = []
    modes = ["sequence", "token", "closed-book"]
    out = {}
    for e in pipe.answer_modes(QUESTION, modes, partials=True, num_beams=1):
        events.append(("answer" if e.final else "partial", e.mode))
        if e.final:
            out[e.mode] = e.answer
    order = ["closed-book", "sequence", "token"]
    assert [m for kind, m in events if kind == "answer"] == order
    for i, mode in enumerate(order):
        done = events.index(("answer", mode))
        assert ("partial", mode) in events[:done]  # it streamed first
        assert all(m != mode for kind, m in events[done + 1:])  # nothing of it after its answer
        assert all(m not in order[i + 1:] for _, m in events[:done])  # the later modes wait
    together = pipe.answers(QUESTION, modes, num_beams=1)
    assert all(out[m].token_ids == together[m].token_ids for m in modes)
    for m in modes:  # running first or last changes no mode's answer
        assert pipe.answers(QUESTION, [m], num_beams=1)[m].token_ids == out[m].token_ids, m


def test_rag_token_partials_are_prefixes_with_the_final_attribution_rows(pipe):
    out, seen = _listen(pipe, ["token"])
    final, parts = out["token"], [p for p in seen if p["mode"] == "token"]
    assert parts[0]["phase"] == "reading" and parts[0]["k"] == 3 and parts[0]["token_ids"] == []  # before the prefill
    parts = parts[1:]
    assert len(parts) >= 2 and all(p["partial"] and p["phase"] == "decoding" for p in parts)
    lengths = [len(p["token_ids"]) for p in parts]
    assert lengths == sorted(lengths) and lengths[0] < len(final.token_ids)  # it grows, from short
    for p in parts:
        n = len(p["token_ids"])
        assert p["token_ids"] == final.token_ids[:n]
        # float32 softmax of the same numbers in the same order: equal to rounding (1e-6)
        assert torch.allclose(torch.tensor(p["token_doc_posteriors"]).reshape(n, -1),
                              torch.tensor(final.token_doc_posteriors[:n]).reshape(n, -1), atol=1e-6)
        assert p["top_docs"] == final.top_docs[:n]
        assert [d["id"] for d in p["docs"]] == [d.id for d in final.docs]
        assert [d["prior"] for d in p["docs"]] == pytest.approx([d.prior for d in final.docs], abs=1e-6)
    assert parts[-1]["text"] == final.text


@pytest.mark.parametrize("decoding", ["thorough", "fast"])
def test_rag_sequence_streams_one_draft_per_passage_then_rescoring(pipe, decoding):
    """Thorough: the drafts, then a "rescoring" partial while every candidate is scored under every
    passage. Fast has no such pass: its drafts end, then the answer."""
    out, seen = _listen(pipe, ["sequence"], sequence_decoding=decoding)
    parts = [p for p in seen if p["mode"] == "sequence"]
    assert parts[0]["phase"] == "reading" and parts[0]["drafts"] == []
    parts = parts[1:]
    assert all(len(p["drafts"]) == 3 for p in parts)
    assert [d["rank"] for d in parts[0]["drafts"]] == [1, 2, 3]
    if decoding == "thorough":
        assert parts[-1]["phase"] == "rescoring" and all(d["done"] for d in parts[-1]["drafts"])
        parts = parts[:-1]
    assert all(p["phase"] == "decoding" for p in parts) and all(d["done"] for d in parts[-1]["drafts"])
    # the drafts are the candidates the rescoring ranks
    cands = {c["text"] for c in out["sequence"].candidates}
    assert {d["text"] for d in [p for p in seen if p["mode"] == "sequence"][-1]["drafts"]} == cands
    assert out["sequence"].text in cands


def test_closed_book_partials_grow_to_the_answer(pipe):
    out, seen = _listen(pipe, ["closed-book"])
    parts = [p for p in seen if p["mode"] == "closed-book"]
    assert parts[0]["phase"] == "reading" and parts[0]["k"] == 0
    final = out["closed-book"]
    assert parts and all(final.token_ids[: len(p["token_ids"])] == p["token_ids"] for p in parts)
    assert parts[-1]["token_ids"] == final.token_ids and parts[-1]["docs"] == []


def test_greedy_steps_hand_copies_and_the_row_log_probs_of_the_final_hypothesis(pipe):
    """decoding.search with on_step: each Step's tokens are prefixes of the result, its row
    log-probs those the result carries; changing a Step's tensor changes nothing."""
    gen = pipe.stack.modes["token"].generator
    prompts = [gen.prompt(QUESTION, p, 64) for p in pipe.retrieve(QUESTION, "token", 3).passages]
    first, state = gen.prefill(prompts)  # (3, V)
    prior = torch.log_softmax(torch.tensor([1.0, 0.5, 0.0]), 0)  # (3,)
    steps: list[Step] = []

    def keep(st: Step) -> None:
        steps.append(Step([list(t) for t in st.tokens], st.row_lp.clone(), list(st.done)))
        st.row_lp.zero_()  # a listener that writes on what it was handed

    greedy = RagSettings(preset="paper", max_new_tokens=8).decoding
    hyp = search(Rows(gen, state, per_beam=3, prior=prior), first, 1, greedy, gen.eos_token_ids, on_step=keep)[0][0]
    assert len(hyp.tokens) == 8 and len(steps) == 8 and steps[-1].done == [True]
    for t, st in enumerate(steps, start=1):
        assert st.tokens == [hyp.tokens[:t]]
        assert torch.allclose(st.row_lp[0, :, :t], hyp.row_lp[:, :t])


def test_bench_latency_records_time_to_first_token_and_the_streamed_generate(pipe):
    """bench.latency answers each question quietly and streamed: the first token comes before
    the streamed answer's end, and the report prints a row per mode (not a timing test)."""
    from rag_demo.measure import bench_report, latency

    settings = RagSettings(preset="aided", k=3, max_new_tokens=8, num_beams=1)
    lat = latency.latency(pipe, [QUESTION, "where is the eiffel tower"], ["token", "sequence", "closed-book"], settings,
                        say=lambda msg: None)
    for mode, rec in lat.items():
        assert len(rec["ttft"]) == len(rec["generate_streamed"]) == 2
        assert all(0 < t < g + rec["encode"][i] + rec["retrieve"][i] + 1.0 for i, (t, g) in
                   enumerate(zip(rec["ttft"], rec["generate_streamed"])))
    ttft, a = latency.streamed(pipe, QUESTION, "token", settings)
    assert ttft is not None and ttft < a.timings["total"] + 0.05 and len(a.token_ids) == 8
    text = bench_report.format_results({"n": 2, "stack": "tiny", "settings": {"k": 3, "max_new_tokens": 8},
                                 "latency": {"float32": lat},
                                 "memory": {"rss_loaded": 1, "rss_warm": 1, "peak_warm": 1, "peak_end": 1},
                                 "targets": {}, "machine": {"processor": "cpu", "cpus": 2, "torch": "x", "threads": 2},
                                 "load_avg": {"start": [], "end": []}})
    assert "| RAG-Token | float32 | " in text and "time to first token" in text and text.count("x |") >= 3
