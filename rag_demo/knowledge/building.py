"""A dense index built in a background thread while the app already answers (docs/DESIGN.md §6b).

Owns `IndexBuild`: `load_or_build_index` (resumable, cached: §6) run in a daemon thread, how far it
is, the vectors of the chunks finished so far (so BM25's picks meanwhile are scored with the very
vectors the index will hold: knowledge/retrievers.py), a pause (the pipeline's warm-up measures the
CPU with nothing beside it), and what to call when the index is complete (the pipeline swaps its
retriever then). The build embeds in corpus order, so row i of the index is passage i, as always.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from rag_demo.knowledge.ann import AnnSettings
from rag_demo.knowledge.corpus import Corpus
from rag_demo.knowledge.index import IndexInfo, PassageIndex, load_or_build_index
from rag_demo.models.encoders import Encoder

log = logging.getLogger(__name__)

Ready = Callable[[PassageIndex, IndexInfo], None]


class IndexBuild:
    """The dense index of `corpus` under `encoder`, loaded from the disk cache or built, in a
    background thread (`start`); `index` and `info` once complete, `error` if it failed."""

    def __init__(self, corpus: Corpus, encoder: Encoder, cache_dir: Path, ann: AnnSettings | None = None,
                 rebuild: bool = False, gate: str | Path | None = None) -> None:
        if not len(corpus):
            raise ValueError(f"the corpus is empty: {corpus.name!r} has no passages; add documents with text.")
        self.corpus, self.encoder, self.cache_dir, self.ann = corpus, encoder, Path(cache_dir), ann
        self.rebuild = rebuild
        self.gate = Path(gate) if gate else None  # tests only: the file whose existence lets the build complete
        self.total = len(corpus)
        self.done = 0  # passages embedded (or read back from checkpoints) so far
        # set while the thread waits out a pause (`paused`) between batches: nothing is embedded then
        self.held = threading.Event()
        self.index: PassageIndex | None = None
        self.info: IndexInfo | None = None
        self.error: str | None = None
        self.seconds: float | None = None  # from start to complete (or failed)
        self._vectors: np.ndarray | None = np.zeros((self.total, encoder.dim), np.float32)  # (N, D) chunks so far
        self._have = np.zeros(self.total, bool)  # (N,) rows of _vectors that are final
        self._lock = threading.Lock()
        self._go = threading.Event()  # cleared while paused
        self._go.set()
        self._pauses = 0
        self._finished = threading.Event()
        self._ready: list[Ready] = []
        self._thread: threading.Thread | None = None

    # -- running ------------------------------------------------------------------
    def start(self) -> IndexBuild:
        """Begin in a daemon thread (once; later calls do nothing)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"index-{self.corpus.name}", daemon=True)
                self._thread.start()
        return self

    def on_ready(self, fn: Ready) -> None:
        """Call fn(index, info) when the index is complete (at once if it already is)."""
        with self._lock:
            if self.index is None:
                self._ready.append(fn)
                return
        fn(self.index, self.info)

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._finished.is_set()

    @property
    def fraction(self) -> float:
        return 1.0 if self.index is not None else min(self.done / self.total, 0.99)

    @property
    def percent(self) -> int:
        """Whole percent done, 100 only once the index is complete (rounded down, never up)."""
        return 100 if self.index is not None else min(int(100 * self.done / self.total), 99)

    def wait(self, timeout: float | None = None) -> tuple[PassageIndex, IndexInfo]:
        """(index, info) once complete; ValueError if the build failed, TimeoutError after `timeout` s."""
        if self._thread is None:
            raise ValueError(f"the index build of {self.corpus.name!r} was never started: call start() first.")
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the index of {self.corpus.name!r} is still being built after {timeout:.0f} s "
                               f"({self.percent}% done)")
        if self.index is None:
            raise ValueError(f"the index of {self.corpus.name!r} could not be built: {self.error}")
        return self.index, self.info  # type: ignore[return-value]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No new batch is embedded inside this block (the one running finishes first)."""
        with self._lock:
            self._pauses += 1
            self._go.clear()
        try:
            yield
        finally:
            with self._lock:
                self._pauses -= 1
                if not self._pauses:
                    self._go.set()

    # -- what retrieval may use meanwhile ---------------------------------------------
    def vectors(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(vectors (K, D), final (K,) bool) of corpus rows: the index's own vectors of the rows
        whose chunk is done (zeros elsewhere)."""
        with self._lock:
            if self.index is not None:
                return np.asarray(self.index.embeddings[rows], np.float32), np.ones(len(rows), bool)
            return self._vectors[rows].copy(), self._have[rows].copy()  # type: ignore[index]

    # -- the thread -------------------------------------------------------------------
    def _progress(self, done: int, _total: int) -> None:
        """After every batch: count it, wait out a pause, and (tests only) wait for the gate file."""
        self.done = done
        while self.gate is not None and done >= self.total and not self.gate.exists():
            time.sleep(0.1)  # another process (a browser test) says when: a file is all it can share
        if not self._go.is_set():
            self.held.set()  # waiting out a pause after a finished batch (what `held` tells)
        self._go.wait()
        self.held.clear()

    def _chunk(self, start: int, vectors: np.ndarray) -> None:
        with self._lock:
            self._vectors[start : start + len(vectors)] = vectors  # type: ignore[index]
            self._have[start : start + len(vectors)] = True

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            index, info = load_or_build_index(self.corpus, self.encoder, self.cache_dir, self._progress,
                                              self.rebuild, self.ann, self._chunk)
        except Exception as e:  # noqa: BLE001 - kept for the status line; retrieval goes on without it
            self.error = f"{type(e).__name__}: {e}"
            log.exception("the background index build of %s failed", self.corpus.name)
            self.seconds = time.perf_counter() - t0
            self._finished.set()
            return
        with self._lock:
            self.index, self.info, self.done = index, info, self.total
            self.seconds = time.perf_counter() - t0
            self._vectors = None  # the index holds them now
            ready, self._ready = self._ready, []
        for fn in ready:
            try:
                fn(index, info)
            except Exception:  # noqa: BLE001 - one listener's failure must not keep the others waiting
                log.exception("a listener of the index build of %s failed", self.corpus.name)
        self._finished.set()
