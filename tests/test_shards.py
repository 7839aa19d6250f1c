"""One function embeds a shard of passages (rag_demo/shards.py); in-process, `datasets.map` with
worker processes, and Ray Data's actor pool (local mode) must all give the vectors the index
builder gives."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from rag_demo.knowledge import shards
from rag_demo.knowledge.corpus import load_vital_articles


@pytest.fixture(scope="module")
def small():
    from rag_demo.models.encoders import MiniLMEncoder

    corpus = load_vital_articles(limit=12)  # ~15 passages of real text
    return corpus, MiniLMEncoder().encode_passages(corpus.passages, show_bar=False)  # (N, 384) the builder's


def _same(a: np.ndarray, b: np.ndarray) -> None:
    # batches of other sizes pad differently; the masked mean pooling ignores padding, float order
    # aside: <= 2e-7 measured on unit vectors whose entries are ~0.05
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_embed_batch_is_the_encoders_own(small):
    corpus, want = small
    ps = corpus.passages[:5]
    got = shards.embed_batch({"id": [p.id for p in ps], "title": [p.title for p in ps], "text": [p.text for p in ps]})
    _same(np.stack(got["embeddings"]), want[:5])


def test_datasets_map_with_worker_processes_gives_the_same_vectors_in_order(small):
    corpus, want = small
    _same(shards.embed_with_datasets(corpus, workers=1, batch_size=4), want)
    _same(shards.embed_with_datasets(corpus, workers=2, batch_size=4), want)  # two processes, shards merged
    with pytest.raises(ValueError, match="workers=0 is out of range"):
        shards.embed_with_datasets(corpus, workers=0)


def test_an_unknown_encoder_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="encoder kind 'sbert' is unknown"):
        shards.EncoderRef(kind="sbert").load()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is the optional scale extra: "
                    "pip install -r requirements-scale.txt")
def test_ray_actor_pool_gives_the_same_vectors_in_order(small):
    import ray

    corpus, want = small
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)  # local: this machine only
        _same(shards.embed_with_ray(corpus, actors=2, batch_size=4), want)
    finally:
        ray.shutdown()
