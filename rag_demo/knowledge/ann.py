"""Index kinds for big corpora: which FAISS index holds the passage vectors, and how it is searched.

Owns the three kinds, their settings and the choice between them:

* ``flat``: `IndexFlatIP`, exact inner product. 4·D bytes a passage (1.5 KB at 384-d): the
  default while the vectors fit in `FLAT_LIMIT_BYTES`; every demo-sized corpus is flat.
* ``hnsw``: `IndexHNSWFlat`, a navigable small-world graph over the full vectors: fast and close
  to exact, but larger than flat (the vectors plus ~2·M neighbour ids each).
* ``ivfpq``: the compressed kind (the family of wiki_dpr's "compressed" index): an inverted
  file of `nlist` k-means cells, each vector stored as `pq_m` product-quantiser codes of
  `pq_bits` bits (plus an 8-byte id): 4-bit codes by default, `IndexIVFPQFastScan`, whose SIMD
  kernels score a cell several times faster than 8-bit `IndexIVFPQ` at the same bytes a vector.
  Searched in `nprobe` cells with approximate scores;
  with ``rerank`` > 0 the top rerank·k candidates are re-scored exactly against the float32
  vectors read from a memory-mapped file, so RAM holds only the codes.

Vectors are added in chunks (`CHUNK` rows) with `progress(done, total)` after each, so building
shows progress and never copies the whole matrix. ``bench --scale`` (rag_demo/measure/scale.py)
reports recall against exact search, speed and memory of each kind at 1M vectors; what to expect
is `expected_recall`, printed when an index is built.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import faiss
import numpy as np

KINDS = ("flat", "hnsw", "ivfpq")
PQ_BITS = (4, 8)  # AnnSettings.pq_bits: fast-scan or classic product-quantiser codes
CHUNK = 65536  # rows added at once: 100 MB of 384-d float32, whatever the corpus size
FLAT_LIMIT_BYTES = 2 * 2**30  # above 2 GB of float32 vectors (1.4M at 384-d) `choose_kind` picks ivfpq

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class AnnSettings:
    """How an index is built and searched; every field has a default and a reason."""

    kind: str = "flat"  # exact until the vectors outgrow RAM (choose_kind)
    # HNSW: 32 neighbours a node is FAISS's usual trade (recall vs 256 B of links a vector);
    # efConstruction 80 builds a better graph than 40 for a longer build; efSearch 64 buys recall
    # over 16 for little search time (bench --scale).
    hnsw_m: int = 32
    hnsw_ef_construction: int = 80
    hnsw_ef_search: int = 64
    # IVF: None = about sqrt(N) cells (a power of two, 1024 at 1M): ~1,000 vectors a cell, and
    # k-means trained on 40 points a cell stays seconds on 2 cores. nprobe 128 cells scanned: with
    # the exact re-rank, the cells a query's neighbours fall in, not the codes, limit recall, and
    # 128 cells find more of them than 64 for little search time (bench --scale; docs/results.md).
    nlist: int | None = None
    nprobe: int = 128
    # PQ: None = D/4 bytes of codes (at 4 bits, 192 sub-quantisers of 2 dimensions at 384-d; at
    # 8 bits, 96 of 4): 6% of flat's 4·D bytes; fewer bytes compress more and lose recall.
    pq_m: int | None = None
    # 4: fast-scan codes (FAISS keeps 16 centroids a sub-quantiser in SIMD registers): in the same
    # bytes they search several times faster than one-byte codes and build faster, for the same
    # recall once re-ranked (a little less without the re-rank; bench --scale, docs/results.md).
    # 8: classic one-byte codes.
    pq_bits: int = 4
    # exact re-rank of the top rerank·k approximate hits against the float32 vectors (0: off)
    rerank: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"index kind {self.kind!r} is unknown: use one of {', '.join(KINDS)}.")
        for name in ("hnsw_m", "hnsw_ef_construction", "hnsw_ef_search", "nprobe"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} is out of range: use 1 or more.")
        if self.nlist is not None and self.nlist < 1:
            raise ValueError(f"nlist={self.nlist!r} is out of range: use 1 or more, or None for about sqrt(N).")
        if self.pq_m is not None and self.pq_m < 1:
            raise ValueError(f"pq_m={self.pq_m!r} is out of range: use 1 or more, or None for D/4 bytes of codes.")
        if self.pq_bits not in PQ_BITS:
            raise ValueError(f"pq_bits={self.pq_bits!r} is not supported: use 4 (fast-scan, the default) or 8.")
        if self.rerank < 0:
            raise ValueError(f"rerank={self.rerank!r} is out of range: use 0 (off) or a factor such as 10.")


def choose_kind(n: int, dim: int, limit_bytes: int = FLAT_LIMIT_BYTES) -> str:
    """``flat`` while N·D float32 fit in `limit_bytes`, else ``ivfpq`` (compressed, ~6% of flat)."""
    return "flat" if n * dim * 4 <= limit_bytes else "ivfpq"


def kind_of(index: faiss.Index) -> str:
    """The kind of a FAISS index made elsewhere (a cache, a knowledge dataset): hnsw, ivfpq
    (any inverted file) or flat (anything else searched as it is)."""
    if isinstance(index, faiss.IndexHNSW):
        return "hnsw"
    if isinstance(index, faiss.IndexIVF):
        return "ivfpq"
    return "flat"


def settings_of(index: faiss.Index) -> AnnSettings:
    """The settings that search a FAISS index made elsewhere as it was saved (its own nprobe or
    efSearch kept: a knowledge dataset's index searches as transformers' retriever searches it)."""
    kind = kind_of(index)
    if kind == "hnsw":
        return AnnSettings(kind=kind, hnsw_ef_search=max(1, index.hnsw.efSearch))
    if kind == "ivfpq":  # any inverted file; a PQ one says its code width (4-bit fast-scan or 8-bit)
        bits = getattr(getattr(index, "pq", None), "nbits", None)
        bits = bits if bits in PQ_BITS else AnnSettings.pq_bits
        return AnnSettings(kind=kind, nprobe=max(1, index.nprobe), pq_bits=bits)
    return AnnSettings(kind=kind)


def settings_for(kind: str, n: int, dim: int, rerank: int = 10) -> AnnSettings:
    """StackSpec.index_kind ("auto" or a kind) and index_rerank -> the settings for N D-dim
    vectors: auto is `choose_kind`; the re-rank applies to ivfpq only."""
    kind = choose_kind(n, dim) if kind == "auto" else kind
    return AnnSettings(kind=kind, rerank=rerank if kind == "ivfpq" else 0)


def default_nlist(n: int) -> int:
    """About sqrt(N) cells, a power of two, at least 1 and at most N/40 (k-means needs ~40 points a cell)."""
    if n < 80:
        return 1
    return max(1, min(2 ** round(math.log2(math.sqrt(n))), 2 ** int(math.log2(n / 40))))


def default_pq_m(dim: int, bits: int = 4) -> int:
    """The sub-quantisers of D/4 bytes of `bits`-bit codes (D/2 at 4 bits, D/4 at 8), lowered
    until it divides D (FAISS needs D % m == 0)."""
    m = max(1, dim * 2 // bits)
    while dim % m:
        m -= 1
    return m


def expected_recall(s: AnnSettings) -> str:
    """What recall@5 against exact search to expect, as `bench --scale` found it at 1M synthetic
    vectors around the real Vital Articles embeddings (docs/results.md)."""
    if s.kind == "flat":
        return "exact (recall 1.0)"
    if s.kind == "hnsw":
        return "recall@5 0.6-0.8 at 1M with M 16 (efSearch 64-256), near 1 on small corpora (bench --scale)"
    if s.rerank:
        return "recall@5 about 0.95 (re-rank 10·k) to 0.99 (40·k, nprobe 128) at 1M (bench --scale)"
    return "recall@5 about 0.45-0.6 at 1M without the exact re-rank (bench --scale)"


def bytes_per_vector(s: AnnSettings, dim: int) -> float:
    """RAM a vector costs in the index (the structure's fixed part aside): the 21M projection."""
    if s.kind == "flat":
        return 4.0 * dim
    if s.kind == "hnsw":
        return 4.0 * dim + 2 * s.hnsw_m * 4 * 1.05  # base layer 2·M int32 links; upper layers ~5% more
    return (s.pq_m or default_pq_m(dim, s.pq_bits)) * s.pq_bits / 8 + 8.0  # the codes and the int64 id


def _add(index: faiss.Index, vectors: np.ndarray, progress: Progress | None) -> None:
    n = len(vectors)
    for start in range(0, n, CHUNK):
        index.add(np.ascontiguousarray(vectors[start:start + CHUNK], dtype=np.float32))  # (<=CHUNK, D)
        if progress is not None:
            progress(min(start + CHUNK, n), n)


def build(vectors: np.ndarray, s: AnnSettings, progress: Progress | None = None, seed: int = 0) -> faiss.Index:
    """A FAISS index of kind `s.kind` over (N, D) L2-normalised vectors (inner product = cosine).
    `vectors` may be a memory-mapped array: it is read in chunks."""
    if vectors.ndim != 2 or not len(vectors):
        raise ValueError(f"vectors have shape {vectors.shape}: pass an (N, D) array with N >= 1.")
    n, d = vectors.shape
    if s.kind == "flat":
        index = faiss.IndexFlatIP(d)
    elif s.kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, s.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = s.hnsw_ef_construction
        index.hnsw.efSearch = s.hnsw_ef_search
    else:
        nlist, m = s.nlist or default_nlist(n), s.pq_m or default_pq_m(d, s.pq_bits)
        if d % m:
            raise ValueError(f"pq_m={m} does not divide the vector dimension {d}: use a divisor of {d}.")
        if n < max(nlist, 2 ** s.pq_bits):
            raise ValueError(f"{n} vectors are too few to train ivfpq (nlist={nlist}, {2 ** s.pq_bits} PQ centroids): "
                             "use the flat kind below a few thousand passages.")
        if s.pq_bits == 4:
            index = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(d), d, nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
        else:
            index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        train = min(n, max(40 * nlist, 256 * 40))  # k-means: ~40 points a cell and a PQ centroid
        rows = np.sort(rng.choice(n, size=train, replace=False))
        index.train(np.ascontiguousarray(vectors[rows], dtype=np.float32))  # (train, D)
        index.nprobe = min(s.nprobe, nlist)
    _add(index, vectors, progress)
    return index


class Searcher:
    """Search an index of any kind: `search(q, k)` -> (scores (B, k), ids (B, k)); with
    `settings.rerank` and the float32 `vectors` (e.g. np.load(..., mmap_mode="r")), the top
    rerank·k approximate hits are re-scored exactly and the best k returned."""

    def __init__(self, index: faiss.Index, settings: AnnSettings, vectors: np.ndarray | None = None) -> None:
        if settings.rerank and settings.kind != "flat" and vectors is None:
            raise ValueError(f"rerank={settings.rerank} needs the float32 vectors to re-score: pass vectors= "
                             "(a memory-mapped .npy is enough), or rerank=0.")
        self.index, self.settings, self.vectors = index, settings, vectors
        if isinstance(index, faiss.IndexIVF):  # the search-time settings, whoever built the index
            index.nprobe = min(settings.nprobe, index.nlist)
        elif isinstance(index, faiss.IndexHNSW):
            index.hnsw.efSearch = settings.hnsw_ef_search

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(q, dtype=np.float32)  # (B, D)
        s = self.settings
        if not s.rerank or s.kind == "flat":
            return self.index.search(q, k)  # (B, k), (B, k)
        cand = min(self.index.ntotal, s.rerank * k)
        _, ids = self.index.search(q, cand)  # (B, C) approximate
        scores = np.full((len(q), k), -np.inf, np.float32)  # (B, k)
        out = np.full((len(q), k), -1, np.int64)  # (B, k)
        for b in range(len(q)):
            row = ids[b][ids[b] >= 0]  # (C',) FAISS pads missing hits with -1
            order = np.sort(row)  # ascending ids: sequential reads of the memory map
            exact = np.asarray(self.vectors[order], dtype=np.float32) @ q[b]  # (C',)
            top = np.argsort(-exact)[:k]
            scores[b, :len(top)], out[b, :len(top)] = exact[top], order[top]
        return scores, out
