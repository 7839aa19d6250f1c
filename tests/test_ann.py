"""Index kinds (rag_demo/knowledge/ann.py) and the scale benchmark's pieces (rag_demo/measure/scale.py) on small
clustered vector sets: validation, each kind against exact search, the exact re-rank over a
memory-mapped file, the synthetic vectors' promises, and the 21M projection's arithmetic."""
from __future__ import annotations

import numpy as np
import pytest

from rag_demo.knowledge import ann
from rag_demo.measure import scale
from rag_demo.knowledge.ann import AnnSettings, Searcher, build


def _clustered(n: int, d: int, centres: int = 50, spread: float = 0.35, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d))
    x = c[rng.integers(0, centres, n)] + spread * rng.standard_normal((n, d))  # (n, d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    x = _clustered(6000, 32)
    q = _clustered(200, 32, seed=1)
    exact = (q @ x.T).argsort(1)[:, ::-1][:, :5]  # (200, 5) brute force
    return x, q, exact


def test_settings_validation_names_the_bad_value():
    with pytest.raises(ValueError, match=r"index kind 'ivf' is unknown: use one of flat, hnsw, ivfpq"):
        AnnSettings(kind="ivf")
    with pytest.raises(ValueError, match=r"nprobe=0 is out of range"):
        AnnSettings(nprobe=0)
    with pytest.raises(ValueError, match=r"rerank=-1 is out of range"):
        AnnSettings(rerank=-1)
    with pytest.raises(ValueError, match=r"pq_m=0 is out of range"):
        AnnSettings(pq_m=0)
    with pytest.raises(ValueError, match=r"pq_bits=6 is not supported: use 4 \(fast-scan, the default\) or 8"):
        AnnSettings(pq_bits=6)


def test_choose_kind_and_defaults():
    assert ann.choose_kind(11_485, 384) == "flat"
    assert ann.choose_kind(1_000_000, 384) == "flat"  # 1.5 GB: still under the 2 GB limit
    assert ann.choose_kind(2_000_000, 384) == "ivfpq" and ann.choose_kind(1_000_000, 768) == "ivfpq"
    assert ann.default_nlist(1_000_000) == 1024 and ann.default_nlist(50) == 1
    assert ann.default_nlist(6000) <= 6000 / 40  # ~40 training points a cell at least
    # D/4 bytes of codes: D/2 four-bit sub-quantisers, or D/4 one-byte ones
    assert ann.default_pq_m(384) == 192 and ann.default_pq_m(768) == 384 and 30 % ann.default_pq_m(30) == 0
    assert ann.default_pq_m(384, 8) == 96 and ann.default_pq_m(768, 8) == 192
    assert ann.bytes_per_vector(AnnSettings(kind="ivfpq"), 384) == ann.bytes_per_vector(AnnSettings(kind="ivfpq", pq_bits=8), 384) == 104


def test_flat_is_exact_and_hnsw_is_close(data):
    x, q, exact = data
    _, flat = Searcher(build(x, AnnSettings()), AnnSettings()).search(q, 5)
    assert (flat == exact).mean() > 0.99  # exact up to ties in float32
    s = AnnSettings(kind="hnsw")  # the defaults: M 32, efSearch 64
    _, hnsw = Searcher(build(x, s), s).search(q, 5)
    assert scale.recall_at(hnsw, exact) >= 0.9


# On these 32-d clustered vectors 4-bit codes need twice 8-bit's bytes for its recall (16 codes of
# 4 bits: recall@5 0.23 alone, 0.76 re-ranked, against 0.58 / 0.90 for 8 one-byte codes); at 1M
# 384-d vectors like MiniLM's the 40·k re-rank made them equal (bench --scale, docs/results.md §5.1)
@pytest.mark.parametrize("bits, m, kind", [(4, 32, "IndexIVFPQFastScan"), (8, 8, "IndexIVFPQ")])
def test_ivfpq_compresses_and_the_rerank_restores_exact_scores(data, tmp_path, bits, m, kind):
    x, q, exact = data
    s = AnnSettings(kind="ivfpq", pq_m=m, nprobe=8, pq_bits=bits)
    index = build(x, s)
    assert type(index).__name__ == kind and ann.kind_of(index) == "ivfpq"
    assert ann.settings_of(index) == AnnSettings(kind="ivfpq", nprobe=8, pq_bits=bits)  # read back from the index
    assert index.pq.M == m and index.pq.nbits == bits and index.nlist == ann.default_nlist(len(x))
    assert index.code_size == m * bits // 8  # 16 / 8 bytes of codes a vector against 128 bytes of float32
    _, approx = Searcher(index, s).search(q, 5)
    np.save(tmp_path / "v.npy", x)
    r = AnnSettings(kind="ivfpq", pq_m=m, nprobe=8, rerank=10, pq_bits=bits)
    scores, reranked = Searcher(index, r, np.load(tmp_path / "v.npy", mmap_mode="r")).search(q, 5)
    assert scale.recall_at(reranked, exact) > scale.recall_at(approx, exact)
    assert scale.recall_at(reranked, exact) >= 0.9
    # re-ranked scores are the exact inner products of the ids returned, best first
    np.testing.assert_allclose(scores, np.einsum("bd,bkd->bk", q, x[reranked]), rtol=0, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()
    with pytest.raises(ValueError, match="rerank=10 needs the float32 vectors"):
        Searcher(index, r)


def test_build_reports_progress_in_chunks(data, monkeypatch):
    x, _, _ = data
    monkeypatch.setattr(ann, "CHUNK", 2500)
    calls = []
    build(x, AnnSettings(), progress=lambda done, total: calls.append((done, total)))
    assert calls == [(2500, 6000), (5000, 6000), (6000, 6000)]


def test_ivfpq_refuses_too_few_vectors_and_a_bad_pq_m():
    with pytest.raises(ValueError, match=r"200 vectors are too few to train ivfpq \(nlist=4, 256 PQ centroids\)"):
        build(_clustered(200, 32), AnnSettings(kind="ivfpq", pq_bits=8))
    with pytest.raises(ValueError, match=r"10 vectors are too few to train ivfpq \(nlist=1, 16 PQ centroids\)"):
        build(_clustered(10, 32), AnnSettings(kind="ivfpq"))
    with pytest.raises(ValueError, match="pq_m=7 does not divide the vector dimension 32"):
        build(_clustered(3000, 32), AnnSettings(kind="ivfpq", pq_m=7))


def test_synthetic_vectors_keep_their_promises():
    real = _clustered(2000, 24, centres=200, spread=0.5)
    x, how = scale.synthesize(real, 8000, seed=0)
    assert x.shape == (8000, 24) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert how["nn_cosines"] == sorted(how["nn_cosines"])  # denser subsets, closer neighbours
    assert how["nn_cosine"] > how["nn_cosines"][-1]  # the fit, read at 4x the real size, is closer still
    assert abs(how["measured_nn_cosine"] - how["nn_cosine"]) < 0.1  # the set is as dense as the fit says
    lifted = scale.lift(x[:300], 64, noise_energy=0.0)
    np.testing.assert_allclose(lifted @ lifted.T, x[:300] @ x[:300].T, atol=1e-5)  # an isometry
    noisy = scale.lift(x[:300], 64, noise_energy=0.1)
    assert 0.85 < float(np.mean(np.sum(noisy * lifted, 1))) < 0.99  # ~sqrt(1 / 1.1) = 0.95 of it kept


def test_recall_and_the_projection_by_hand():
    assert scale.recall_at(np.array([[1, 2, 3], [4, 5, 6]]), np.array([[3, 2, 9], [4, 5, 6]])) == pytest.approx(5 / 6)
    rows = [{"kind": "flat", "dim": 384, "settings": {"kind": "flat"}},
            {"kind": "ivfpq", "dim": 384, "settings": {"kind": "ivfpq", "pq_m": 48, "pq_bits": 8, "rerank": 10}},
            {"kind": "ivfpq 4-bit", "dim": 384, "settings": {"kind": "ivfpq", "pq_m": 96, "pq_bits": 4}}]
    flat, pq, fast = scale.project(rows, n=21_015_300)
    assert flat["ram_gb"] == pytest.approx(21_015_300 * 384 * 4 / 1e9, abs=0.01)  # 32.28 GB
    # 48 code bytes + an 8-byte id a vector, plus 4096 cells x 384 x 4 bytes of centroids
    assert pq["ram_gb"] == pytest.approx((21_015_300 * 56 + 4096 * 384 * 4) / 1e9, abs=0.01)
    assert pq["rerank_vectors_on_disk_gb"] == pytest.approx(32.3, abs=0.1) and flat["rerank_vectors_on_disk_gb"] is None
    assert fast["ram_gb"] == pq["ram_gb"] and fast["rerank_vectors_on_disk_gb"] is None  # 96 x 4 bits = 48 bytes


def test_measure_on_a_small_set(tmp_path):
    x, q = _clustered(4000, 32), _clustered(50, 32, seed=1)
    configs = (("flat", AnnSettings()), ("ivfpq + re-rank", AnnSettings(kind="ivfpq", pq_m=32, rerank=10)))
    rows = scale.measure(x, q, configs, say=lambda m: None, workdir=tmp_path)
    assert [r["kind"] for r in rows] == ["flat", "ivfpq + re-rank"]
    assert rows[0]["recall_at_5"] == 1.0 and rows[0]["bytes_per_vector"] >= 128
    assert rows[1]["bytes_per_vector"] < 0.3 * rows[0]["bytes_per_vector"] and rows[1]["recall_at_5"] > 0.8
    assert not list(tmp_path.iterdir())  # the memory-mapped copy is removed
    assert "| ivfpq + re-rank | 32 |" in scale.format_scale(
        {"n": 4000, "cpu": "x", "load": [], "how": "h", "rows": rows, "projection": scale.project(rows)})


def test_cli_rejects_bad_scale_arguments(capsys):
    from rag_demo.cli import main

    assert main(["bench", "--scale", "--scale-dims", "384,wide"]) == 2
    assert "--scale-dims '384,wide' is not a list of numbers" in capsys.readouterr().err
    assert main(["bench", "--scale", "--scale-n", "10"]) == 2


# ---------------------------------------------------------------- the kinds inside PassageIndex and its cache


def test_stack_spec_takes_the_index_kind():
    from rag_demo.config import INDEX_KINDS
    from rag_demo.models.stack_spec import StackSpec

    assert INDEX_KINDS == ("auto", *ann.KINDS) and StackSpec().index_kind == "auto"
    with pytest.raises(ValueError, match=r"index_kind='ivf' is unknown: use one of auto, flat, hnsw, ivfpq"):
        StackSpec(index_kind="ivf")
    with pytest.raises(ValueError, match=r"index_rerank=-1 is out of range"):
        StackSpec(index_rerank=-1)
    assert ann.settings_for("auto", 11_485, 384) == AnnSettings(kind="flat")
    assert ann.settings_for("auto", 3_000_000, 384, rerank=7) == AnnSettings(kind="ivfpq", rerank=7)
    assert ann.settings_for("hnsw", 10, 384, rerank=7) == AnnSettings(kind="hnsw")  # re-rank: ivfpq only


class WordsEncoder:
    """A real, cheap encoder for index logic: hashed bag of words, 64-d, L2-normalised (the
    index kinds need a few hundred passages; MiniLM embeds them at ~20 passages/s here)."""

    name, dim = "hashed-words-64", 64

    def fingerprint(self) -> str:
        return "hashed-words-64 v1"

    def _vec(self, text: str) -> np.ndarray:
        import zlib

        v = np.zeros(self.dim, np.float32)
        for w in text.lower().split():
            v[zlib.crc32(w.strip(".,;:!?()\"'").encode()) % self.dim] += 1.0
        return v / max(np.linalg.norm(v), 1e-9)

    def encode_questions(self, questions):
        return np.stack([self._vec(q) for q in questions])

    def encode_passages(self, passages, progress=None, **_):
        out = np.stack([self._vec(f"{p.title}: {p.text}") for p in passages])
        if progress:
            progress(len(passages), len(passages))
        return out


@pytest.fixture(scope="module")
def small_vital():
    from rag_demo.knowledge.corpus import load_vital_articles

    return load_vital_articles(limit=260), WordsEncoder()  # ~320 passages: enough to train ivfpq


def test_each_kind_is_cached_apart_and_answers_like_flat(small_vital, tmp_path):
    from rag_demo.knowledge.index import cache_key, load_or_build_index

    corpus, enc = small_vital
    assert len(corpus) >= 300
    # a flat index keeps the key it always had: existing caches stay valid
    assert cache_key(corpus, enc) == cache_key(corpus, enc, AnnSettings()) != cache_key(corpus, enc, AnnSettings(kind="hnsw"))
    assert cache_key(corpus, enc, AnnSettings(kind="ivfpq")) == cache_key(corpus, enc, AnnSettings(kind="ivfpq", rerank=10))
    q = enc.encode_questions(["Who painted the Mona Lisa?", "What is the capital of France?", "Who wrote Hamlet?",
                              "What is the largest planet?", "When did the Second World War end?"])
    flat, info = load_or_build_index(corpus, enc, tmp_path)
    f_scores, f_hits = flat.search(q, 5)
    for s in (AnnSettings(kind="hnsw"), AnnSettings(kind="ivfpq", rerank=10)):
        built, b_info = load_or_build_index(corpus, enc, tmp_path, ann=s)
        again, a_info = load_or_build_index(corpus, enc, tmp_path, ann=s)
        assert (b_info.source, a_info.source) == ("built", "cache") and b_info.key != info.key
        assert ann.kind_of(again.index) == s.kind and again.ann == s
        scores, hits = again.search(q, 5)
        assert [h[0].id for h in hits] == [h[0].id for h in f_hits]  # the same best passage as exact search
        if s.rerank:  # re-ranked scores are the exact ones
            np.testing.assert_allclose(scores[:, 0], f_scores[:, 0], rtol=0, atol=1e-5)
    assert len(list((tmp_path / "indexes").iterdir())) == 3


def test_an_index_made_elsewhere_is_searched_as_it_was_saved(data):
    import faiss

    from rag_demo.knowledge.index import PassageIndex

    x, _, _ = data
    from rag_demo.knowledge.corpus import Corpus, Passage

    corpus = Corpus("c", [Passage(id=str(i), title="t", text="x") for i in range(len(x))])
    h = faiss.IndexHNSWFlat(32, 8, faiss.METRIC_INNER_PRODUCT)
    h.hnsw.efSearch = 24
    h.add(x)
    idx = PassageIndex(corpus, x, h)
    assert idx.ann == AnnSettings(kind="hnsw", hnsw_ef_search=24) and h.hnsw.efSearch == 24
    ivf = build(x, AnnSettings(kind="ivfpq", pq_m=8, nprobe=3))
    assert PassageIndex(corpus, x, ivf).ann.nprobe == 3 and ivf.nprobe == 3
