"""The passage index: search, per-session edits, and the on-disk cache (hits, corruption, staleness, atomicity)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import faiss
import numpy as np
import pytest

from rag_demo.knowledge.corpus import Corpus, corpus_from_documents
from rag_demo.models.encoders import MiniLMEncoder
from rag_demo.knowledge.index import PassageIndex, build_index, cache_key, load_or_build_index

DOCS = [
    ("Seine", "The Seine is a river that flows through Paris into the English Channel.", None),
    ("Georges Seurat", "Georges Seurat painted A Sunday Afternoon on the Island of La Grande Jatte.", None),
    ("Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.", None),
]
PAINTER_Q = "Who painted A Sunday Afternoon on the Island of La Grande Jatte?"


@pytest.fixture(scope="module")
def encoder() -> MiniLMEncoder:
    return MiniLMEncoder()


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return corpus_from_documents("three", DOCS)


@pytest.fixture(scope="module")
def base(corpus: Corpus, encoder: MiniLMEncoder) -> PassageIndex:
    return build_index(corpus, encoder)


def top_titles(index: PassageIndex, encoder: MiniLMEncoder, question: str, k: int = 3) -> list[str]:
    _, passages = index.search(encoder.encode_questions([question]), k)
    return [p.title for p in passages[0]]


def folder_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))


# ---------------------------------------------------------------- search


def test_search_returns_sorted_scores_and_passages(base: PassageIndex, encoder: MiniLMEncoder):
    q = encoder.encode_questions([PAINTER_Q, "What is the tallest mountain on Earth?"])  # (2, D)
    scores, passages = base.search(q, 2)
    assert scores.shape == (2, 2) and scores.dtype == np.float32
    assert [p.title for p in passages[0]][0] == "Georges Seurat"
    assert [p.title for p in passages[1]][0] == "Mount Everest"
    assert np.all(scores[:, 0] >= scores[:, 1])
    # FAISS's inner product vs numpy's: a 384-term float32 dot summed in another order, 0 measured
    # here, ~1e-7 relative at most elsewhere; 1e-5 relative, while another row's score is 0.15, not 0.80
    np.testing.assert_allclose(scores[0, 0], base.embeddings[1] @ q[0], rtol=1e-5, atol=0)
    assert len(base) == 3 and base.embeddings.shape == (3, 384) and base.index.ntotal == 3


@pytest.mark.parametrize("k", [0, 4, -1])
def test_search_k_out_of_range(base: PassageIndex, encoder: MiniLMEncoder, k: int):
    with pytest.raises(ValueError, match=f"k={k} is out of range for corpus 'three' of 3 passages: use 1 to 3"):
        base.search(encoder.encode_questions(["x"]), k)


def test_search_rejects_vectors_of_another_encoder(base: PassageIndex):
    with pytest.raises(ValueError, match=r"shape \(1, 768\), expected \(B, 384\)"):
        base.search(np.zeros((1, 768), np.float32), 1)


def test_build_rejects_mismatched_embeddings(corpus: Corpus):
    with pytest.raises(ValueError, match=r"embeddings have shape \(2, 384\) but corpus 'three' has 3 passages"):
        PassageIndex(corpus, np.zeros((2, 384), np.float32))


# ---------------------------------------------------------------- edits


def test_edited_passage_changes_retrieval_and_leaves_the_base_alone(base: PassageIndex, encoder: MiniLMEncoder):
    before = base.embeddings.copy()
    assert top_titles(base, encoder, "Which river is polluted by plastic waste?")[0] != "Mount Everest"
    edited = base.with_edited_passage("Mount Everest#0", "Mount Everest is a river polluted by plastic waste.", encoder)
    assert top_titles(edited, encoder, "Which river is polluted by plastic waste?")[0] == "Mount Everest"
    assert edited.corpus.passages[2].text == "Mount Everest is a river polluted by plastic waste."
    # stored vectors, compared bitwise: the others are copied, not re-encoded, and the base is untouched
    np.testing.assert_array_equal(edited.embeddings[:2], before[:2])
    np.testing.assert_array_equal(base.embeddings, before)
    assert base.corpus.passages[2].text == DOCS[2][1]
    assert top_titles(base, encoder, "What is the tallest mountain on Earth?")[0] == "Mount Everest"
    with pytest.raises(ValueError, match="'Nope#0' is not in corpus"):
        base.with_edited_passage("Nope#0", "text", encoder)


def test_edited_title_is_embedded_with_the_text(base: PassageIndex, encoder: MiniLMEncoder):
    pid = base.corpus.passages[2].id
    text = base.corpus.passages[2].text
    same = base.with_edited_passage(pid, text, encoder)
    retitled = base.with_edited_passage(pid, text, encoder, new_title="Plastic pollution of rivers")
    assert retitled.corpus.passages[2].title == "Plastic pollution of rivers"
    np.testing.assert_allclose(same.embeddings[2], base.embeddings[2], atol=1e-5)  # same title and text
    assert not np.allclose(retitled.embeddings[2], base.embeddings[2], atol=1e-3)  # the title is embedded


def test_an_edited_index_shares_the_base_and_searches_as_a_rebuilt_one(encoder: MiniLMEncoder):
    """Edits are held beside the base's vectors and search index, not in a copy of them: two edits
    in turn search (top k for several k, the whole corpus included) and score passages as an index
    rebuilt from the edited vectors does, while the base's arrays are shared and unchanged."""
    from rag_demo.knowledge.corpus import Passage
    from rag_demo.knowledge.retrievers import DenseRetriever

    rng = np.random.default_rng(0)
    n = 60
    vecs = rng.standard_normal((n, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    base = PassageIndex(Corpus("random", [Passage(f"p{i}", f"Title {i}", f"Text number {i}.") for i in range(n)]), vecs)
    before = base.embeddings.copy()
    once = base.with_edited_passage("p7", "A passage about rivers and plastic.", encoder)
    twice = once.with_edited_passage("p40", "A passage about mountains.", encoder, new_title="Peaks")
    assert twice.index is base.index and twice._vectors is base._vectors  # shared, not copied
    rebuilt = PassageIndex(twice.corpus, twice.embeddings)  # what a copy with the edits would search
    q = np.vstack([encoder.encode_questions(["Which river is polluted by plastic?", "What is the highest peak?"]),
                   rng.standard_normal((3, 384)).astype(np.float32)])  # (5, D)
    for k in (1, 3, 10, n):
        got_s, got_i = twice.search_rows(q, k)
        want_s, want_i = rebuilt.search_rows(q, k)
        np.testing.assert_array_equal(got_i, want_i)
        np.testing.assert_allclose(got_s, want_s, rtol=0, atol=1e-5)
    assert twice.search_rows(q[:1], 1)[1][0, 0] == 7  # the edited passage is found by what it says now
    passages = [twice.corpus.passages[i] for i in (7, 40, 3)]
    np.testing.assert_allclose(DenseRetriever(twice).scores(q[:1], passages),
                               DenseRetriever(rebuilt).scores(q[:1], passages), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(base.embeddings, before)
    np.testing.assert_array_equal(once.embeddings[40], before[40])  # the second edit is not in the first


# ---------------------------------------------------------------- cache


def test_cache_is_written_then_loaded(corpus: Corpus, encoder: MiniLMEncoder, tmp_path: Path):
    calls: list[tuple[int, int]] = []
    built, info = load_or_build_index(corpus, encoder, tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert (info.source, info.n_passages, info.key) == ("built", 3, cache_key(corpus, encoder))
    assert info.path == tmp_path / "indexes" / info.key and len(info.key) == 16 and info.seconds > 0
    assert calls == [(3, 3)]
    assert folder_files(tmp_path) == [
        "indexes",
        f"indexes/{info.key}",
        f"indexes/{info.key}/embeddings.npy",
        f"indexes/{info.key}/index.faiss",
        f"indexes/{info.key}/meta.json",
    ]  # no temp folders left behind
    meta = json.loads((info.path / "meta.json").read_text())
    assert (meta["key"], meta["n"], meta["dim"], meta["corpus"], meta["encoder"]) == (
        info.key,
        3,
        384,
        "three",
        "all-MiniLM-L6-v2",
    )

    loaded, info2 = load_or_build_index(corpus, encoder, tmp_path)
    assert (info2.source, info2.key, info2.path) == ("cache", info.key, info.path)
    np.testing.assert_array_equal(loaded.embeddings, built.embeddings)  # stored: the .npy round trip is exact
    q = encoder.encode_questions([PAINTER_Q])
    s1, p1 = built.search(q, 3)
    s2, p2 = loaded.search(q, 3)
    # scores are computed (FAISS inner products over identical vectors): 0 measured; 1e-6 relative
    # (~8 ulps) allows only for a kernel that reorders the 384-term sum
    np.testing.assert_allclose(s2, s1, rtol=1e-6, atol=0)
    assert p1 == p2


def test_rebuild_flag_replaces_a_good_cache(corpus: Corpus, encoder: MiniLMEncoder, tmp_path: Path):
    load_or_build_index(corpus, encoder, tmp_path)
    _, info = load_or_build_index(corpus, encoder, tmp_path, rebuild=True)
    assert info.source == "built"
    assert load_or_build_index(corpus, encoder, tmp_path)[1].source == "cache"
    assert len(folder_files(tmp_path)) == 5


@pytest.mark.parametrize(
    "damage",
    [
        lambda f: (f / "index.faiss").write_bytes((f / "index.faiss").read_bytes()[:100]),  # truncated
        lambda f: (f / "index.faiss").write_bytes(b"\x00garbage" * 64),
        lambda f: (f / "embeddings.npy").unlink(),
        lambda f: (f / "meta.json").write_text("{not json"),
        lambda f: (f / "meta.json").write_text(
            json.dumps(
                {
                    **json.loads((f / "meta.json").read_text()),
                    "sha256": {"index.faiss": "0" * 64, "embeddings.npy": "0" * 64},
                }
            )
        ),
        lambda f: (f / "meta.json").write_text(
            json.dumps({**json.loads((f / "meta.json").read_text()), "format_version": 0})
        ),
    ],
    ids=["truncated-index", "garbage-index", "missing-embeddings", "bad-json", "wrong-hash", "old-format"],
)
def test_damaged_cache_is_rebuilt_not_trusted(
    corpus, encoder, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage
):
    built, info = load_or_build_index(corpus, encoder, tmp_path)
    damage(info.path)
    with caplog.at_level(logging.WARNING, logger="rag_demo.knowledge.index"):
        rebuilt, info2 = load_or_build_index(corpus, encoder, tmp_path)
    assert info2.source == "built"
    assert any("unusable" in r.message and "rebuilding" in r.message for r in caplog.records)
    # re-encoded with the same model and batches: 0 measured; 1e-6 abs (~70 ulps on unit-vector
    # entries <= 0.2) for kernels that reorder sums; another passage's vector differs by > 0.11
    np.testing.assert_allclose(rebuilt.embeddings, built.embeddings, rtol=0, atol=1e-6)
    assert load_or_build_index(corpus, encoder, tmp_path)[1].source == "cache"  # the rebuilt cache is good
    assert len(folder_files(tmp_path)) == 5  # the damaged copy and the temp folders are gone


def test_concurrent_writer_that_finishes_first_wins(corpus, encoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import shutil

    import rag_demo.publish as publish_module

    _, info = load_or_build_index(corpus, encoder, tmp_path)
    winner = tmp_path / "winner"
    shutil.copytree(info.path, winner)
    (winner / "meta.json").write_text((winner / "meta.json").read_text().replace('"three"', '"three (other process)"'))
    remove = publish_module._remove

    def remove_then_other_process_renames(folder: Path) -> None:
        remove(folder)
        winner.rename(folder)  # lands between our delete and our rename

    monkeypatch.setattr(publish_module, "_remove", remove_then_other_process_renames)
    index, info2 = load_or_build_index(corpus, encoder, tmp_path, rebuild=True)
    assert info2.source == "built" and len(index) == 3
    assert json.loads((info.path / "meta.json").read_text())["corpus"] == "three (other process)"
    assert folder_files(tmp_path / "indexes") == sorted(
        [info.key] + [f"{info.key}/{n}" for n in ("embeddings.npy", "index.faiss", "meta.json")]
    )


def test_changed_passage_gets_another_key(corpus: Corpus, encoder: MiniLMEncoder, tmp_path: Path):
    _, info = load_or_build_index(corpus, encoder, tmp_path)
    changed = corpus.with_passage_text("Seine#0", "The Seine flows through Rouen and Le Havre.")
    index, info2 = load_or_build_index(changed, encoder, tmp_path)
    assert info2.source == "built" and info2.key != info.key
    assert index.corpus.passages[0].text == "The Seine flows through Rouen and Le Havre."


def test_meta_for_another_corpus_is_stale(corpus: Corpus, encoder: MiniLMEncoder, tmp_path: Path, caplog):
    _, info = load_or_build_index(corpus, encoder, tmp_path)
    meta = json.loads((info.path / "meta.json").read_text())
    (info.path / "meta.json").write_text(json.dumps({**meta, "n": 4}))
    with caplog.at_level(logging.WARNING, logger="rag_demo.knowledge.index"):
        assert load_or_build_index(corpus, encoder, tmp_path)[1].source == "built"
    assert "'n': 4" in caplog.text


def test_unwritable_cache_still_returns_an_index(corpus: Corpus, encoder: MiniLMEncoder, tmp_path: Path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="rag_demo.knowledge.index"):
        index, info = load_or_build_index(corpus, encoder, blocker)
    assert info.source == "built" and len(index) == 3
    assert "could not write the index cache" in caplog.text


class Interrupted(Exception):
    """Stands for a build killed midway (a Space restarting, Ctrl-C)."""


def _interrupt_after(encoder, monkeypatch, n_calls: int, seen: list[str]) -> None:
    """The encoder embeds `n_calls` batches (recording their passage ids), then is interrupted."""
    real = type(encoder)._passages_batch

    def batch(passages):
        if len(seen) >= n_calls:
            raise Interrupted
        seen.extend(p.id for p in passages)
        return real(encoder, passages)
    monkeypatch.setattr(encoder, "_passages_batch", batch)


def _record(encoder, monkeypatch, seen: list[str]) -> None:
    real = type(encoder)._passages_batch
    monkeypatch.setattr(encoder, "_passages_batch", lambda ps: (seen.extend(p.id for p in ps), real(encoder, ps))[1])


@pytest.fixture
def interrupted(corpus, encoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cached build of the 3 passages, one chunk a passage, interrupted after 2: its checkpoint folder."""
    import rag_demo.knowledge.index as index_module

    monkeypatch.setattr(index_module, "RESUME_CHUNK", 1)
    seen: list[str] = []
    _interrupt_after(encoder, monkeypatch, 2, seen)
    with pytest.raises(Interrupted):
        load_or_build_index(corpus, encoder, tmp_path)
    assert seen == [p.id for p in corpus.passages[:2]]
    partial = tmp_path / "indexes" / f"{cache_key(corpus, encoder)}.partial"
    assert sorted(f.name for f in partial.iterdir()) == ["chunk-000000000.npy", "chunk-000000001.npy"]
    assert not (tmp_path / "indexes" / cache_key(corpus, encoder)).exists()  # nothing published
    return partial


def test_an_interrupted_build_resumes_where_it_stopped(corpus, encoder, base, tmp_path, monkeypatch, interrupted):
    seen: list[str] = []
    _record(encoder, monkeypatch, seen)
    calls: list[tuple[int, int]] = []
    index, info = load_or_build_index(corpus, encoder, tmp_path, progress=lambda d, t: calls.append((d, t)))
    assert seen == [corpus.passages[2].id]  # only the passage whose chunk was not saved
    assert calls == [(2, 3), (3, 3)] and info.source == "built"
    # saved chunks are the same model's vectors: 0 measured; 1e-6 as in the rebuild test above
    np.testing.assert_allclose(index.embeddings, base.embeddings, rtol=0, atol=1e-6)
    assert top_titles(index, encoder, PAINTER_Q)[0] == "Georges Seurat"
    assert not interrupted.exists() and len(folder_files(tmp_path)) == 5  # published, checkpoints gone
    assert load_or_build_index(corpus, encoder, tmp_path)[1].source == "cache"


@pytest.mark.parametrize("damage", [
    lambda f: f.write_bytes(f.read_bytes()[:60]),  # truncated mid-header
    lambda f: np.save(f, np.zeros((2, 384), np.float32)),  # the wrong number of rows
    lambda f: np.save(f, np.full((1, 384), np.nan, np.float32)),  # not numbers
], ids=["truncated", "wrong-shape", "nan"])
def test_a_damaged_checkpoint_is_embedded_again(corpus, encoder, base, tmp_path, monkeypatch, interrupted, damage):
    damage(interrupted / "chunk-000000000.npy")
    seen: list[str] = []
    _record(encoder, monkeypatch, seen)
    index, _ = load_or_build_index(corpus, encoder, tmp_path)
    assert seen == [corpus.passages[0].id, corpus.passages[2].id]
    np.testing.assert_allclose(index.embeddings, base.embeddings, rtol=0, atol=1e-6)


def test_rebuild_trusts_no_checkpoint(corpus, encoder, tmp_path, monkeypatch, interrupted):
    seen: list[str] = []
    _record(encoder, monkeypatch, seen)
    load_or_build_index(corpus, encoder, tmp_path, rebuild=True)
    assert seen == [p.id for p in corpus.passages] and not interrupted.exists()


def test_empty_corpus_is_rejected(encoder: MiniLMEncoder, tmp_path: Path):
    with pytest.raises(ValueError, match="the corpus is empty"):
        load_or_build_index(Corpus("none", []), encoder, tmp_path)
    with pytest.raises(ValueError, match="the corpus is empty"):
        build_index(Corpus("none", []), encoder)


def test_an_index_that_finds_fewer_than_k_is_a_clear_error():
    """An approximate index (a loaded one may be) can return fewer than k rows (-1 ids); that must
    not silently become the last passage. IVF with 2 lists probing 1: 3 passages reachable."""
    d = 8
    vecs = np.zeros((6, d), np.float32)
    vecs[:3, 0], vecs[3:, 0] = 1.0, -1.0
    vecs[:, 1:] = np.random.default_rng(0).standard_normal((6, d - 1)) * 0.01
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, 2, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vecs)
    ivf.add(vecs)
    corpus = corpus_from_documents("six", [(f"doc {i}", f"text {i}", None) for i in range(6)])
    index = PassageIndex(corpus, vecs, ivf)
    assert len(index.search(vecs[:1], 3)[1][0]) == 3
    with pytest.raises(ValueError, match="found fewer than k=5 passages for a question: lower k, or use an exact index"):
        index.search(vecs[:1], 5)


# ---------------------------------------------------------------- shipped indexes (knowledge/shipped.py)

def test_a_shipped_index_is_read_before_the_cache_and_answers_as_the_built_one(corpus, encoder, base, tmp_path):
    from rag_demo.knowledge.shipped import write_shipped

    load_or_build_index(corpus, encoder, tmp_path / "cache")  # a cache is there too: the shipped vectors win
    folder = write_shipped(corpus, encoder, base.embeddings, tmp_path / "shipped", about={"command": "test"})
    meta = json.loads((folder / "meta.json").read_text())
    assert (meta["stored_as"], meta["computed_in"], meta["n"], meta["command"]) == ("float16", "float32", 3, "test")
    index, info = load_or_build_index(corpus, encoder, tmp_path / "cache", shipped_dir=tmp_path / "shipped")
    assert (info.source, info.path, info.key) == ("shipped", folder, folder.name)
    # float16 keeps ~3 significant digits of unit-length vectors: 5e-4 at most, relative to 1
    np.testing.assert_allclose(index.embeddings, base.embeddings, atol=5e-4, rtol=0)
    assert top_titles(index, encoder, PAINTER_Q) == top_titles(base, encoder, PAINTER_Q)


def test_a_shipped_index_serves_the_encoder_in_either_passage_precision(corpus, encoder, base, tmp_path):
    import torch

    from rag_demo.knowledge.shipped import shipped_key, write_shipped

    bf16 = MiniLMEncoder(passage_dtype=torch.bfloat16)
    assert bf16.fingerprint() != encoder.fingerprint()  # the cache keeps apart what each precision computed
    assert shipped_key(corpus, bf16) == shipped_key(corpus, encoder)
    write_shipped(corpus, encoder, base.embeddings, tmp_path / "shipped")
    assert load_or_build_index(corpus, bf16, tmp_path, shipped_dir=tmp_path / "shipped")[1].source == "shipped"


def test_a_damaged_or_mismatched_shipped_index_is_built_instead_saying_why(corpus, encoder, base, tmp_path, caplog):
    from rag_demo.knowledge.shipped import write_shipped

    shipped = tmp_path / "shipped"
    folder = write_shipped(corpus, encoder, base.embeddings, shipped)
    data = bytearray((folder / "embeddings.npy").read_bytes())
    data[-1] ^= 0xFF
    (folder / "embeddings.npy").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="rag_demo.knowledge.shipped"):
        assert load_or_build_index(corpus, encoder, tmp_path / "a", shipped_dir=shipped)[1].source == "built"
    assert "unusable" in caplog.text and "sha256" in caplog.text
    caplog.clear()
    changed = corpus.with_passage_text("Seine#0", "The Seine flows through Rouen and Le Havre.")
    with caplog.at_level(logging.WARNING, logger="rag_demo.knowledge.shipped"):
        assert load_or_build_index(changed, encoder, tmp_path / "b", shipped_dir=shipped)[1].source == "built"
    assert "made from another corpus than this stack's all-MiniLM-L6-v2" in caplog.text
    with pytest.raises(ValueError, match=r"do not fit 'three': expected \(3, 384\)"):
        write_shipped(corpus, encoder, base.embeddings[:2], shipped)


def test_the_shipped_files_match_their_meta():
    """What the repository ships: each file's sha256 as its meta says, under 20 MB, float16."""
    from rag_demo.knowledge.shipped import SHIPPED_DIR

    metas = sorted(SHIPPED_DIR.glob("*/meta.json"))
    assert {json.loads(m.read_text())["corpus"] for m in metas} == {"Wikipedia Vital Articles (en)", "CIA World Factbook"}
    for m in metas:
        meta, data = json.loads(m.read_text()), (m.parent / "embeddings.npy").read_bytes()
        assert hashlib.sha256(data).hexdigest() == meta["sha256"] and len(data) < 20e6, m
        assert np.load(m.parent / "embeddings.npy").shape == (meta["n"], meta["dim"]) and meta["stored_as"] == "float16"


def test_a_sessions_edits_are_a_recipe_whose_copy_is_kept_bounded_and_rebuilt(base: PassageIndex, encoder):
    """A session holds its edits, not a copy of the index: the edited copy lives in a store of at
    most EDITED_KEPT shared by every session, and a copy dropped from it is rebuilt from the edits,
    the same passages and vectors as the copy made at the edit."""
    from types import SimpleNamespace

    from rag_demo.serving import session as sess

    pid = "Mount Everest#0"
    first = sess.Edits(base).then(pid, "Mount Everest is a river polluted by plastic waste.", None, encoder)
    both = first.then(pid, "Mount Everest is a lake in Peru.", "Everest lake", encoder)
    made = both.index(encoder)
    direct = (base.with_edited_passage(pid, "Mount Everest is a river polluted by plastic waste.", encoder)
              .with_edited_passage(pid, "Mount Everest is a lake in Peru.", encoder, "Everest lake"))
    assert [p.text for p in made.corpus.passages] == [p.text for p in direct.corpus.passages]
    np.testing.assert_allclose(made.embeddings, direct.embeddings, atol=1e-6)
    assert both.passage_ids == (pid,) and base.corpus.passages[2].text != "Mount Everest is a lake in Peru."
    others = [sess.Edits(base).then(pid, f"Mount Everest is peak number {i}.", None, encoder)
              for i in range(sess.EDITED_KEPT + 1)]
    assert sess.Edits.kept() == sess.EDITED_KEPT  # bounded whatever the number of sessions
    again = both.index(encoder)  # dropped by the others, rebuilt from its edits
    assert again is not made and [p.title for p in again.corpus.passages] == [p.title for p in made.corpus.passages]
    np.testing.assert_allclose(again.embeddings, made.embeddings, atol=1e-6)
    pipe = SimpleNamespace(index=base, stack=SimpleNamespace(ctx_encoder=encoder))
    assert sess.active_index(sess.Session(edited=others[-1], edits=(pid,)), pipe).corpus.passages[2].text == (
        f"Mount Everest is peak number {sess.EDITED_KEPT}.")
