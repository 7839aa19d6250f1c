"""The sweep (`eval --sweep`): tidy rows for every setting of a grid, resumed after a kill
without recomputing a finished row, on tiny random RAG checkpoints over three passages."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.knowledge.corpus import corpus_from_documents  # noqa: E402
from rag_demo.measure import sweep as sw  # noqa: E402
from rag_demo.questions import QAItem  # noqa: E402

DOCS = [
    ("The Starry Night", "The Starry Night is an oil-on-canvas painting by the Dutch painter Vincent van Gogh.", None),
    ("Paris", "Paris is the capital and largest city of France, on the Seine.", None),
    ("Apollo 11", "Apollo 11 was the spaceflight that first landed humans on the Moon, in July 1969.", None),
]
ITEMS = [QAItem("Who painted The Starry Night?", ["Vincent van Gogh"], {"id": "q1"}),
         QAItem("What is the capital of France?", ["Paris"], {"id": "q2"}),
         QAItem("When did Apollo 11 land?", ["1969"], {"id": "q3"})]


@pytest.fixture(scope="module")
def pipe(tiny_ckpts, tmp_path_factory):
    """The paper stack's loading code on tiny random checkpoints (two question encoders), K up to 3."""
    from rag_demo.config import RagSettings
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.pipeline import RagPipeline

    spec = StackSpec(name="paper", rag_token=str(tiny_ckpts["rag_token"]), rag_sequence=str(tiny_ckpts["rag_sequence"]),
                     ctx_encoder=str(tiny_ckpts["ctx_encoder"]), cache_dir=tmp_path_factory.mktemp("sweepcache"))
    return RagPipeline.load(spec, corpus=corpus_from_documents("three", DOCS),
                            settings=RagSettings(preset="paper", max_new_tokens=3))


GRID = dict(ks=(2, 1), modes=("token", "sequence", "closed-book"), presets=("paper",), retrievers=("dense", "hybrid"),
            knobs={"max_new_tokens": 3})


class Counting:
    """The pipeline with its answering calls counted: what a resumed sweep must not repeat."""

    def __init__(self, pipe):
        self.pipe, self.calls = pipe, []

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def answers(self, q, modes, *a, **kw):
        self.calls += [(q, m, None) for m in modes]
        return self.pipe.answers(q, modes, *a, **kw)

    def answer_from_modes(self, q, modes, passages, scores, settings, *a, **kw):
        self.calls += [(q, m, settings.decoding.k) for m in modes]
        return self.pipe.answer_from_modes(q, modes, passages, scores, settings, *a, **kw)


def test_rows_are_tidy_and_cover_the_grid(pipe):
    """One row per (question, mode, preset, retriever, K): answers for every RAG mode, retriever
    and K, one closed-book answer per question (no retriever, no K), retrieval rows for every
    recall retriever and K; each with the schema's fields and scores in 0..1."""
    grid = sw.Grid(**GRID)
    rows = list(sw.sweep(pipe, ITEMS, grid, qa="three"))
    keys = [sw.row_key(r) for r in rows]
    assert len(keys) == len(set(keys))
    expected = {(i.meta["id"], m, "paper", r, k) for i in ITEMS for m in ("token", "sequence")
                for r in ("dense", "hybrid") for k in (1, 2)}
    expected |= {(i.meta["id"], "closed-book", "paper", None, None) for i in ITEMS}
    expected |= {(i.meta["id"], "retrieval", None, r, k) for i in ITEMS for r in ("dense", "bm25", "hybrid") for k in (1, 2)}
    assert set(keys) == expected
    for r in rows:
        assert set(sw.FIELDS) <= set(r)
        if r["mode"] == "retrieval":
            assert r["em"] is None and isinstance(r["gold_in_top_k"], bool)
        else:
            assert 0 <= r["em"] <= r["contains"] <= 1 or r["em"] <= 1
            assert isinstance(r["answer"], str) and r["seconds"] >= 0 and r["signals"]
    # the default K (5 is not in the grid: the smallest first) runs first: order 0 is K = 1
    token = {(r["retriever"], r["k"]): r["order"] for r in rows if r["mode"] == "token" and r["question_id"] == "q1"}
    assert token == {("dense", 1): 0, ("dense", 2): 1, ("hybrid", 1): 0, ("hybrid", 2): 1}
    # K = 3 is the whole corpus: every retriever's recall is 1 there
    full = sw.Grid(ks=(3,), modes=(), presets=("paper",))
    assert all(r["gold_in_top_k"] for r in sw.sweep(pipe, ITEMS, full) if r["mode"] == "retrieval")


def test_a_row_equals_the_answer_asked_alone(pipe):
    """A sweep row is the answer the pipeline gives that question with those settings."""
    from rag_demo.config import RagSettings

    grid = sw.Grid(ks=(2,), modes=("token",), presets=("paper",), recall_retrievers=(), knobs={"max_new_tokens": 3})
    row = next(sw.sweep(pipe, ITEMS[:1], grid))
    alone = pipe.answer(ITEMS[0].question, "token", RagSettings(preset="paper", k=2, max_new_tokens=3))
    assert row["answer"] == alone.text
    assert row["logprob"] == pytest.approx(alone.sequence_logprob, abs=1e-4)


def test_a_killed_sweep_resumes_without_recomputing_a_finished_row(pipe, tmp_path):
    """Kill after some rows (the file ends in a half-written line), run again: the half line is
    cut, every finished row is kept and none is recomputed, and the file ends with each row once."""
    grid = sw.Grid(**GRID)
    out = tmp_path / "s.jsonl"
    first = []
    for row in sw.sweep(pipe, ITEMS, grid, qa="three"):
        first.append(row)
        if sum(r["mode"] != "retrieval" for r in first) == 7:
            break  # killed here
    out.write_text("".join(json.dumps(r) + "\n" for r in first) + '{"qa": "three", "question_id": "q2", "mo',
                   encoding="utf-8")
    counting = Counting(pipe)
    finished = {sw.row_key(r) for r in first}
    missing = sw.to_do(ITEMS, grid, finished)
    assert 0 < missing < sw.to_do(ITEMS, grid, set())
    written, before = sw.run_to_file(counting, ITEMS, grid, out, "three.jsonl", "python -m rag_demo eval --sweep",
                                     progress=False)
    assert before == len(first)
    # one answering call per missing answer, none for a finished one
    assert len(counting.calls) == missing
    rows = sw.read_rows(out)
    keys = [sw.row_key(r) for r in rows]
    assert len(keys) == len(set(keys)) == len(list(sw.sweep(pipe, ITEMS, grid))) and written == len(rows) - before
    assert out.read_text(encoding="utf-8").endswith("\n")
    # written compactly: a retrieval row leaves out what it has not (preset, answer, ...), and the
    # reader gives every column back, empty where the row had nothing
    new = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()[len(first):]]
    retrieval = next(r for r in new if r["mode"] == "retrieval")
    assert "preset" not in retrieval and "answer" not in retrieval and None not in retrieval.values()
    from rag_demo.measure.run_rows import load_rows

    table = load_rows(out)
    assert len(table) == len(rows) and table.loc[table["mode"] == "retrieval", "preset"].isna().all()
    meta = json.loads(sw.meta_path_of(out).read_text(encoding="utf-8"))
    assert meta["command"].startswith("python -m rag_demo eval --sweep") and meta["grid"]["ks"] == [2, 1]
    assert meta["cpu"] and meta["date"] and len(meta["runs"]) == 1
    # run a third time: nothing left to do
    counting.calls.clear()
    assert sw.run_to_file(counting, ITEMS, grid, out, "three.jsonl", "cmd", progress=False)[0] == 0
    assert counting.calls == []


def test_a_stopped_run_yields_no_more_rows(pipe):
    """The page's Stop: once the run is cancelled the sweep ends at the next answer."""
    from rag_demo.runs import Run

    stop = {"now": False}
    grid = sw.Grid(**GRID)
    rows = []
    for row in sw.sweep(pipe, ITEMS, grid, run=Run(cancelled=lambda: stop["now"])):
        rows.append(row)
        if row["mode"] == "closed-book":
            stop["now"] = True
    assert rows[-1]["mode"] == "closed-book" and len({r["question_id"] for r in rows}) == 1


@pytest.mark.parametrize("kw, message", [
    ({"ks": (0,)}, "K=0 is out of range"),
    ({"ks": (1,), "modes": ("tokens",)}, "modes ['tokens'] unknown"),
    ({"ks": (1,), "presets": ("plain",)}, "presets ['plain'] unknown"),
    ({"ks": (1,), "retrievers": ("sparse",)}, "retrievers ['sparse'] unknown"),
    ({"ks": (1,), "knobs": {"k": 3}}, "K and the retriever are the grid's own"),
])
def test_a_bad_grid_is_refused_by_name(kw, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sw.Grid(**kw)


def test_read_rows_refuses_a_file_that_is_not_a_run(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"a": 1}\n{"qa": "x", "question_id": "1", "mode": "token"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 is not a sweep row"):
        sw.read_rows(bad)
    assert sw.parse_list("1,3,5", "k", int) == [1, 3, 5] and sw.parse_list(5, "k", int) == [5]
    with pytest.raises(ValueError, match="--k '1,x'"):
        sw.parse_list("1,x", "k", int)
