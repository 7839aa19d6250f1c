"""Embedding a corpus in shards: one function, run in-process, by `datasets.map`, or by Ray Data.

Owns `embed_batch` (a batch of passages -> their vectors, with the encoder loaded once per
worker process) and the runners that apply it to a corpus held as a `datasets.Dataset`:

1. `passages_dataset`: the corpus as a Dataset with `id`, `title`, `text` columns (Arrow);
2. `embed_with_datasets`: `Dataset.map(embed_batch, batched=True, num_proc=N)`, N worker
   processes on one machine, each with its own copy of the encoder and torch threads split
   between them; the shards come back in corpus order;
3. `embed_with_ray`: Ray Data runs the same function in an actor pool (one encoder per actor;
   on a cluster, one per node or GPU), order preserved; Ray is an optional extra
   (`pip install -r requirements-scale.txt`), imported only here;
4. the (N, D) float32 vectors then go into one index (`PassageIndex(corpus, vectors, ann=...)`).

Every runner gives the same vectors as `Encoder.encode_passages` (batches differ only in
padding, which the pooling masks out: tests/test_shards.py, within 1e-5). On two cores one
process is as fast as any of them (docs/DESIGN.md §6a); they exist for machines with more
cores, and for clusters.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from rag_demo.knowledge.corpus import Corpus, Passage

BATCH = 64  # passages a call of embed_batch embeds (Encoder.encode_passages' default)


@dataclass(frozen=True)
class EncoderRef:
    """What a worker needs to load the passage encoder itself (picklable, unlike the model):
    the offline stack's MiniLM ("minilm", folder or None for the packaged one) or a DPR
    context encoder ("dpr", Hub id or folder), and the precision it embeds in (StackSpec's
    passage_dtype: "auto", "float32" or "bfloat16")."""

    kind: str = "minilm"
    path: str | None = None
    passage_dtype: str = "float32"

    def load(self):
        from rag_demo.models.encoders import DPRPassageEncoder, MiniLMEncoder
        from rag_demo.models.stacks import resolve_dtype

        dtype = resolve_dtype(self.passage_dtype)
        if self.kind == "minilm":
            return MiniLMEncoder(self.path, passage_dtype=dtype)
        if self.kind == "dpr":
            return DPRPassageEncoder.from_pretrained(self.path, passage_dtype=dtype)
        raise ValueError(f"encoder kind {self.kind!r} is unknown: use 'minilm' or 'dpr'.")


_LOADED: dict[EncoderRef, object] = {}  # per worker process: the encoder, loaded on first use


def _encoder(ref: EncoderRef):
    if ref not in _LOADED:
        _LOADED[ref] = ref.load()
    return _LOADED[ref]


def embed_batch(batch: dict[str, list], ref: EncoderRef = EncoderRef()) -> dict[str, list]:
    """{"id", "title", "text"} columns of B passages -> {"embeddings": B vectors} (float32)."""
    passages = [Passage(id=i, title=t, text=x) for i, t, x in zip(batch["id"], batch["title"], batch["text"])]
    vectors = _encoder(ref).encode_passages(passages, batch_size=max(1, len(passages)), show_bar=False)  # (B, D)
    return {"embeddings": list(vectors)}


def passages_dataset(corpus: Corpus):
    """The corpus's own Arrow table (id, title, text), in corpus order."""
    return corpus.dataset.select_columns(["id", "title", "text"])


def _threads_per_worker(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _set_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)


def _embed_in_worker(batch: dict[str, list], ref: EncoderRef, threads: int) -> dict[str, list]:
    _set_threads(threads)
    return embed_batch(batch, ref)


def embed_with_datasets(corpus: Corpus, ref: EncoderRef = EncoderRef(), workers: int = 1,
                        batch_size: int = BATCH) -> np.ndarray:
    """(N, D) float32 vectors of the corpus, `Dataset.map` over `workers` processes."""
    if workers < 1:
        raise ValueError(f"workers={workers!r} is out of range: use 1 or more processes.")
    ds = passages_dataset(corpus)
    out = ds.map(_embed_in_worker, batched=True, batch_size=batch_size, num_proc=workers if workers > 1 else None,
                 remove_columns=["id", "title", "text"], desc="embedding passages",
                 fn_kwargs={"ref": ref, "threads": _threads_per_worker(workers)})
    return np.asarray(out.with_format("numpy")["embeddings"], dtype=np.float32)  # (N, D)


class _RayEmbedder:
    """A Ray Data actor: loads the encoder once, then embeds every batch it is given."""

    def __init__(self, ref: EncoderRef, threads: int) -> None:
        _set_threads(threads)
        self.ref = ref
        _encoder(ref)

    def __call__(self, batch: dict) -> dict:
        cols = {k: [str(v) for v in batch[k]] for k in ("id", "title", "text")}
        return {"row": batch["row"], "embeddings": np.stack(embed_batch(cols, self.ref)["embeddings"])}


def embed_with_ray(corpus: Corpus, ref: EncoderRef = EncoderRef(), actors: int = 1,
                   batch_size: int = BATCH) -> np.ndarray:
    """(N, D) float32 vectors of the corpus: Ray Data runs `embed_batch` in a pool of `actors`
    actors (Ray started locally when no cluster is connected; requirements-scale.txt)."""
    try:
        import ray
    except ImportError:
        raise ValueError("Ray is not installed: pip install -r requirements-scale.txt "
                         "(or embed with datasets: embed_with_datasets).") from None
    if actors < 1:
        raise ValueError(f"actors={actors!r} is out of range: use 1 or more.")
    if not ray.is_initialized():
        ray.init(num_cpus=max(actors, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ds = passages_dataset(corpus)
    ds = ds.add_column("row", list(range(len(ds))))
    # the Arrow table itself (from_huggingface would need aiohttp for Hub datasets, which this is not)
    rd = ray.data.from_arrow(ds.data.table).map_batches(
        _RayEmbedder, fn_constructor_kwargs={"ref": ref, "threads": _threads_per_worker(actors)},
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=actors), batch_format="numpy")
    rows, vecs = [], []
    for batch in rd.iter_batches(batch_size=None, batch_format="numpy"):
        rows.append(batch["row"])
        vecs.append(np.asarray(batch["embeddings"], dtype=np.float32))
    order = np.concatenate(rows)
    out = np.zeros((len(corpus), vecs[0].shape[1]), np.float32)  # (N, D)
    out[order] = np.concatenate(vecs)  # each shard's rows where they belong, whatever order they came in
    return out
