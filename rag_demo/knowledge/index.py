"""The passage index: inner-product search over passage vectors, cached on disk.

Owns `PassageIndex` (a corpus, its (N, D) embeddings and a FAISS index: `IndexFlatIP`, exact,
for demo-sized corpora; HNSW or compressed IVF-PQ for big ones, rag_demo/knowledge/ann.py), the
per-session "edit a passage" copy, and the on-disk cache:
`cache_dir/indexes/<key>/{index.faiss, embeddings.npy, meta.json}` where key =
sha256(corpus fingerprint + encoder fingerprint [+ index kind])[:16]. A cache is written atomically (temp
sibling folder, fsync, rename: `publish.py`) and verified on load (key, sizes, format, file hashes);
anything missing, corrupt or stale is logged and rebuilt, never trusted; embeddings.npy is then
memory-mapped, not read into memory. A cached build is
resumable: it embeds `RESUME_CHUNK` passages at a time and keeps each finished chunk in
`cache_dir/indexes/<key>.partial/`, so a build that was interrupted (a killed process, a
restarted Space) embeds only what it had not saved; the folder goes once the index is published.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from tqdm import tqdm

from rag_demo.knowledge.ann import AnnSettings, Searcher, settings_of
from rag_demo.knowledge.ann import build as build_ann
from rag_demo.knowledge.corpus import Corpus, Passage
from rag_demo.knowledge.shipped import SHIPPED_DIR, shipped_vectors
from rag_demo.models.encoders import Encoder
from rag_demo.publish import publish_folder, write_synced

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_FILES = ("index.faiss", "embeddings.npy")
# Passages embedded between two checkpoints of a cached build: tens of seconds of work on a small
# CPU, so an interrupted build loses at most that (docs/DESIGN.md §6); a 10k-passage corpus writes
# ~11 small files.
RESUME_CHUNK = 1024


class PassageIndex:
    """A corpus and its passage vectors; row i of `embeddings` is `corpus.passages[i]`."""

    def __init__(self, corpus: Corpus, embeddings: np.ndarray, index: faiss.Index | None = None,
                 ann: AnnSettings | None = None) -> None:
        """`index`: a FAISS index over `embeddings` (loaded from a cache or a knowledge dataset), or
        None to build one of kind `ann` (default flat: exact). `ann.rerank` re-scores the top
        rerank x k approximate hits exactly against `embeddings` (ann.Searcher)."""
        embeddings = np.ascontiguousarray(embeddings, dtype=np.float32)
        if embeddings.ndim != 2 or embeddings.shape[0] != len(corpus):
            raise ValueError(
                f"embeddings have shape {embeddings.shape} but corpus {corpus.name!r} has {len(corpus)} passages: "
                "embed every passage, one row each."
            )
        ann = ann or (AnnSettings() if index is None else settings_of(index))
        if index is None:
            index = build_ann(embeddings, ann)
        if (index.ntotal, index.d) != embeddings.shape:
            raise ValueError(
                f"the FAISS index holds {index.ntotal} x {index.d} vectors, not {embeddings.shape}: rebuild it."
            )
        self.corpus, self.index, self.ann = corpus, index, ann
        self._vectors = embeddings  # (N, D) the vectors `index` searches: never written
        self._edited: dict[int, np.ndarray] = {}  # row -> its edited vector (D,), over `_vectors` and `index`
        self._searcher = Searcher(index, ann, embeddings if ann.rerank else None)

    @property
    def embeddings(self) -> np.ndarray:
        """Every passage's vector (N, D), row i `corpus.passages[i]`: with edits, a new array each call
        (an export, training); retrieval reads `vectors(rows)`."""
        if not self._edited:
            return self._vectors
        out = self._vectors.copy()  # (N, D)
        for i, v in self._edited.items():
            out[i] = v
        return out

    def vectors(self, rows) -> np.ndarray:
        """The vectors (K, D) of corpus rows, edits included."""
        out = np.asarray(self._vectors[rows], np.float32)  # (K, D) a copy
        for j, i in enumerate(rows):
            if int(i) in self._edited:
                out[j] = self._edited[int(i)]
        return out

    def __len__(self) -> int:
        return len(self.corpus)

    @property
    def dim(self) -> int:
        return self._vectors.shape[1]

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, list[list[Passage]]]:
        """Top-k passages by inner product for each of B question vectors: scores (B, k), passages B x k."""
        q = np.ascontiguousarray(q, dtype=np.float32)  # (B, D)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(
                f"question vectors have shape {q.shape}, expected (B, {self.dim}): "
                "encode questions with the encoder that built this index."
            )
        if not 1 <= k <= len(self):
            raise ValueError(
                f"k={k} is out of range for corpus {self.corpus.name!r} of {len(self)} passages: use 1 to {len(self)}."
            )
        scores, ids = self._search(q, k)  # (B, k), (B, k)
        if (ids < 0).any():  # an approximate index (e.g. a loaded HNSW one) may find fewer than k
            raise ValueError(
                f"the FAISS index of {self.corpus.name!r} found fewer than k={k} passages for a question: "
                "lower k, or use an exact index (python -m rag_demo index --export DIR writes one)."
            )
        return scores, [[self.corpus.passages[i] for i in row] for row in ids]

    def search_rows(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """`search` as row numbers of `corpus.passages`: scores (B, k) and rows (B, k)."""
        q = np.ascontiguousarray(q, dtype=np.float32)  # (B, D)
        if q.ndim != 2 or q.shape[1] != self.dim or not 1 <= k <= len(self):
            raise ValueError(f"question vectors {q.shape} with k={k}: expected (B, {self.dim}) and k from 1 to {len(self)}.")
        return self._search(q, k)  # (B, k), (B, k)

    def _search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The searcher's top k (B, k) scores and rows; with edits, the index's top k + m (m edited
        rows) without the edited rows, merged with the edited rows' own scores q·v: the top k the
        edited vectors would give in an index of their own (exact for a flat index)."""
        if not self._edited:
            return self._searcher.search(q, k)  # (B, k), (B, k)
        rows = np.array(sorted(self._edited), dtype=np.int64)  # (m,)
        edited = q @ np.stack([self._edited[int(i)] for i in rows]).T  # (B, m)
        found, ids = self._searcher.search(q, min(k + len(rows), len(self)))  # (B, k + m)
        out_s, out_i = np.full((len(q), k), -np.inf, np.float32), np.full((len(q), k), -1, np.int64)  # (B, k)
        for b in range(len(q)):
            keep = (ids[b] >= 0) & ~np.isin(ids[b], rows)  # the unedited rows the index found
            s = np.concatenate([found[b][keep], edited[b]])
            i = np.concatenate([ids[b][keep], rows])
            best = np.argsort(-s, kind="stable")[:k]
            out_s[b, : len(best)], out_i[b, : len(best)] = s[best], i[best]
        return out_s, out_i

    def with_edited_passage(self, passage_id: str, new_text: str, encoder: Encoder,
                            new_title: str | None = None) -> PassageIndex:
        """A new index with one passage's text (and title, if `new_title` is not blank) replaced and
        re-embedded; self is untouched (sessions share it). The new index shares this one's
        vectors and search index and holds only the edited rows' vectors beside them (a copy of
        the Vital Articles' vectors and search index was ~35 MB per editing visitor)."""
        corpus = self.corpus.with_passage_text(passage_id, new_text, new_title)
        i = corpus.position(passage_id)
        vec = encoder.encode_passages([corpus.passages[i]])  # (1, D)
        if vec.shape[1] != self.dim:
            raise ValueError(
                f"{encoder.name} gives {vec.shape[1]}-d vectors, this index holds {self.dim}-d: "
                "use the encoder that built it."
            )
        out = copy.copy(self)  # the same vectors, search index and searcher
        out.corpus = corpus
        out._edited = {**self._edited, i: np.asarray(vec[0], np.float32)}
        return out


@dataclass
class IndexInfo:
    source: str  # "shipped" (knowledge/shipped.py), "cache" or "built"
    seconds: float  # time to load or build
    path: Path  # the folder it was read from or written to
    n_passages: int
    key: str  # the fingerprint

    @property
    def how(self) -> str:
        """Where the index came from, as a log line says it: "loaded as shipped", "loaded from
        cache" or "built and cached"."""
        return {"shipped": "loaded as shipped", "cache": "loaded from cache"}.get(self.source, "built and cached")


def build_index(corpus: Corpus, encoder: Encoder, progress: Callable[[int, int], None] | None = None,
                ann: AnnSettings | None = None, turn: Callable[[], Any] | None = None,
                price: Callable[[float, int, int], None] | None = None) -> PassageIndex:
    """Embed every passage (tqdm bar + `progress(done, total)`) into an inner-product index of
    kind `ann` (default flat: exact); `turn` and `price` as Encoder.encode_passages takes them."""
    if not len(corpus):
        raise ValueError(f"the corpus is empty: {corpus.name!r} has no passages; add documents with text.")
    return PassageIndex(corpus, encoder.encode_passages(corpus.passages, progress=progress, turn=turn, price=price),
                        ann=ann)


def cache_key(corpus: Corpus, encoder: Encoder, ann: AnnSettings | None = None) -> str:
    """sha256(corpus + encoder fingerprints [+ the index kind's settings unless flat])[:16]: a
    flat index keeps the key it always had, another kind gets its own folder."""
    kind = "" if ann is None or ann.kind == "flat" else repr(dataclasses.replace(ann, rerank=0))
    return hashlib.sha256((corpus.fingerprint() + encoder.fingerprint() + kind).encode()).hexdigest()[:16]


class _StaleCache(Exception):
    """A cache folder that does not match what we expect."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    """sha256 hex of a file, read in blocks (never whole in memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _serialize(index: PassageIndex) -> dict[str, bytes]:
    npy = io.BytesIO()
    np.save(npy, index.embeddings, allow_pickle=False)
    # serialize_index writes the same bytes as faiss.write_index, and we need them to hash anyway.
    return {"index.faiss": faiss.serialize_index(index.index).tobytes(), "embeddings.npy": npy.getvalue()}


def _meta(key: str, index: PassageIndex, encoder: Encoder, blobs: dict[str, bytes]) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "key": key,
        "corpus": index.corpus.name,
        "n": len(index),
        "dim": index.dim,
        "encoder": encoder.name,
        "sha256": {name: _sha256(data) for name, data in blobs.items()},
    }


def _load(folder: Path, key: str, corpus: Corpus, encoder: Encoder, ann: AnnSettings | None = None) -> PassageIndex:
    meta = json.loads((folder / "meta.json").read_text())
    expected = {"format_version": FORMAT_VERSION, "key": key, "n": len(corpus), "dim": encoder.dim}
    wrong = {k: meta.get(k) for k, v in expected.items() if meta.get(k) != v}
    if wrong:
        raise _StaleCache(f"meta.json has {wrong}, expected {expected}")
    bad = [name for name in _FILES if _file_sha256(folder / name) != meta["sha256"][name]]
    if bad:
        raise _StaleCache(f"{', '.join(bad)} do not match the sha256 in meta.json (truncated or corrupt)")
    index = faiss.deserialize_index(np.frombuffer((folder / "index.faiss").read_bytes(), dtype=np.uint8))
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise _StaleCache("index.faiss does not use inner product")
    # memory-mapped: the vectors (a re-rank's exact scores, an edited passage's copy) are paged in
    # when read, and shared by every process serving this cache; the FAISS index holds its own
    embeddings = np.load(folder / "embeddings.npy", mmap_mode="r", allow_pickle=False)
    return PassageIndex(corpus, embeddings, index, ann=ann)


def _save(folder: Path, key: str, index: PassageIndex, encoder: Encoder) -> None:
    """Serialise into the cache folder via `publish_folder`; a concurrent winner is kept."""

    def write(tmp: Path) -> None:
        blobs = _serialize(index)
        for name, data in blobs.items():
            write_synced(tmp / name, data)
        write_synced(tmp / "meta.json", json.dumps(_meta(key, index, encoder, blobs), indent=1).encode())

    if not publish_folder(folder, write):
        log.info("index cache %s was written by another process first; keeping that one", folder)


def _partial_folder(folder: Path) -> Path:
    """Where a cached build keeps its finished chunks until the index is published."""
    return folder.with_name(folder.name + ".partial")


def _save_chunk(path: Path, vectors: np.ndarray) -> None:
    """One chunk's vectors, written to a temp name and renamed: a chunk file is whole or absent."""
    npy = io.BytesIO()
    np.save(npy, vectors, allow_pickle=False)
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, npy.getvalue())
    os.replace(tmp, path)


def _saved_chunk(path: Path, rows: int, dim: int) -> np.ndarray | None:
    """A chunk file's (rows, D) vectors, or None when it is missing or not exactly that."""
    try:
        v = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    ok = v.shape == (rows, dim) and v.dtype == np.float32 and bool(np.isfinite(v).all())
    return v if ok else None


def embed_resumably(corpus: Corpus, encoder: Encoder, partial: Path,
                    progress: Callable[[int, int], None] | None = None,
                    on_chunk: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:
    """(N, D) vectors of the corpus's passages, embedded RESUME_CHUNK at a time in corpus order.

    Each finished chunk is saved as `partial/chunk-<start>.npy`; chunks already there (from an
    interrupted build of the same key: the folder is named after it) are read instead of
    embedded, and a chunk file that does not load with the right shape is embedded again. A
    folder that cannot be written just means no checkpoints. One tqdm bar (stderr) and
    `progress(done, total)` count the saved chunks as done. `on_chunk(start, vectors)` gets each
    chunk's (c, D) vectors once they are final (read back or embedded), rows start..start+c."""
    n, dim, chunk = len(corpus), encoder.dim, RESUME_CHUNK
    out = np.zeros((n, dim), np.float32)  # (N, D)
    todo = []
    for start in range(0, n, chunk):
        saved = _saved_chunk(partial / f"chunk-{start:09d}.npy", min(chunk, n - start), dim)
        if saved is None:
            todo.append(start)
        else:
            out[start : start + len(saved)] = saved  # (c, D)
            if on_chunk is not None:
                on_chunk(start, saved)
    done = n - sum(min(chunk, n - start) for start in todo)
    if done:
        log.info("resuming the index build in %s: %d of %d passages were embedded before", partial, done, n)
    try:
        partial.mkdir(parents=True, exist_ok=True)
        writable = True
    except OSError as e:
        log.warning("cannot keep the index build's checkpoints in %s (%s); building without them", partial, e)
        writable = False
    with tqdm(total=n, initial=done, desc=f"embedding ({encoder.name})", unit="passage", file=sys.stderr,
              disable=not n) as bar:
        def tick(d: int, _t: int, base: int) -> None:
            """encode_passages' progress within a chunk (d of it), counted from `base` done before it."""
            bar.n = base + d
            bar.refresh()
            if progress is not None:
                progress(base + d, n)

        if progress is not None and done:
            progress(done, n)
        for start in todo:
            rows = corpus.passages[start : start + chunk]
            vectors = encoder.encode_passages(rows, progress=lambda d, t, base=done: tick(d, t, base),
                                              show_bar=False)  # (c, D)
            out[start : start + len(rows)] = vectors
            done += len(rows)
            if on_chunk is not None:
                on_chunk(start, vectors)
            if writable:
                try:
                    _save_chunk(partial / f"chunk-{start:09d}.npy", vectors)
                except OSError as e:
                    log.warning("cannot save the index build's checkpoint in %s (%s); going on without", partial, e)
                    writable = False
    return out


def load_cached_index(corpus: Corpus, encoder: Encoder, cache_dir: Path, ann: AnnSettings | None = None,
                      shipped_dir: Path | None = SHIPPED_DIR) -> tuple[PassageIndex, IndexInfo] | None:
    """The index of kind `ann` for (corpus, encoder) from the vectors shipped for them
    (knowledge/shipped.py) when there are, else from the cache when it is there and intact, else
    None (an unusable one is logged: the next build replaces it). Shipped vectors come first, so a
    cold start and a warm one read the same vectors."""
    start = time.perf_counter()
    if (shipped := shipped_vectors(corpus, encoder, shipped_dir)) is not None:
        vectors, folder, key = shipped
        index = PassageIndex(corpus, vectors, ann=ann)
        return index, IndexInfo("shipped", time.perf_counter() - start, folder, len(index), key)
    key = cache_key(corpus, encoder, ann)
    folder = Path(cache_dir) / "indexes" / key
    if not folder.exists():
        return None
    try:
        index = _load(folder, key, corpus, encoder, ann)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, _StaleCache) as e:
        log.warning("index cache %s is unusable (%s: %s); rebuilding it", folder, type(e).__name__, e)
        return None
    return index, IndexInfo("cache", time.perf_counter() - start, folder, len(index), key)


def load_or_build_index(
    corpus: Corpus,
    encoder: Encoder,
    cache_dir: Path,
    progress: Callable[[int, int], None] | None = None,
    rebuild: bool = False,
    ann: AnnSettings | None = None,
    on_chunk: Callable[[int, np.ndarray], None] | None = None,
    shipped_dir: Path | None = SHIPPED_DIR,
) -> tuple[PassageIndex, IndexInfo]:
    """The index of kind `ann` (default flat) for (corpus, encoder) from its shipped vectors or the
    cache (`load_cached_index`), else built (`embed_resumably`: progress and on_chunk as there) and
    cached; `rebuild` embeds every passage whatever is shipped or cached."""
    if not len(corpus):
        raise ValueError(f"the corpus is empty: {corpus.name!r} has no passages; add documents with text.")
    start = time.perf_counter()
    if not rebuild and (cached := load_cached_index(corpus, encoder, cache_dir, ann, shipped_dir)) is not None:
        return cached
    key = cache_key(corpus, encoder, ann)
    folder = Path(cache_dir) / "indexes" / key
    partial = _partial_folder(folder)
    if rebuild:
        shutil.rmtree(partial, ignore_errors=True)  # asked to rebuild: trust no earlier chunk either
    index = PassageIndex(corpus, embed_resumably(corpus, encoder, partial, progress, on_chunk), ann=ann)
    try:
        _save(folder, key, index, encoder)
    except OSError as e:
        log.warning("could not write the index cache %s (%s); the index works but will be rebuilt next time", folder, e)
    else:
        shutil.rmtree(partial, ignore_errors=True)  # published: the checkpoints are no longer needed
    return index, IndexInfo("built", time.perf_counter() - start, folder, len(index), key)
