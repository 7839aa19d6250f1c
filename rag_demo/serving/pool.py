"""Loading the model stacks for the app: one `RagPipeline` per stack, loaded once, in the background.

Owns `PipelinePool` (lazy loading with progress, the error of a stack that cannot load, the
lock the app takes while it swaps indexes), the factory that loads a stack with the app's
corpus, and the check of whether the paper stack's Hub checkpoints can be had at all. Imports
no gradio: the page (web/page.py, web/handlers.py) reads the pool's state and shows it.
"""
from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rag_demo.config import RagSettings
from rag_demo.models.stack_spec import TEST_EMBED_GATE_ENV, StackSpec

Progress = Callable[[float | None, str], None]  # (fraction done or None, message)
HUB_PROBE_S = 5.0  # longest the page waits to learn whether the Hub is reachable


def _log(msg: str) -> None:
    print(f"[rag-demo] {msg}", file=sys.stderr, flush=True)


def default_unavailable(stack: str) -> str | None:
    """Why `stack` cannot be loaded here, or None. The paper stack needs the Hub unless its three
    checkpoints are in the local Hugging Face cache; the probe takes HUB_PROBE_S at most."""
    if stack != "paper":
        return None
    from rag_demo.models.stacks import hub_unavailable_reason

    reason = hub_unavailable_reason(HUB_PROBE_S)  # bounded, DNS lookup included
    if reason is None:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        spec = StackSpec(name="paper")
        repos = (spec.rag_token, spec.rag_sequence, spec.ctx_encoder)
        if all(isinstance(try_to_load_from_cache(r, "config.json"), str) for r in repos):
            return None  # cached: loads without the Hub
    except Exception:  # noqa: BLE001 - a cache probe must never break the page
        pass
    return reason


def _load_factbook() -> Any:
    from rag_demo.models.stack_spec import default_cache_dir
    from rag_demo.knowledge.factbook import load_factbook

    return load_factbook(cache_dir=default_cache_dir())


def default_corpora() -> dict[str, tuple[str, Callable[[], Any]]]:
    """The built-in corpora a session can switch to besides its stack's own: key -> (name, loader)."""
    from rag_demo.knowledge.factbook import FACTBOOK_NAME  # torch-free: reads no data until the loader runs

    return {"factbook": (FACTBOOK_NAME, _load_factbook)}


def stack_factory(corpus_fn: Callable[[], Any] | None = None, settings: RagSettings | None = None,
                  knowledge: Any = None, **spec: Any):
    """factory(stack, progress) -> RagPipeline over `corpus_fn()` (Vital Articles by default), or
    over `knowledge` (a loaded knowledge.Knowledge, shared by the stacks whose passage encoder
    fits it): `RagPipeline.load`, which relays its progress. A large corpus whose dense index is
    not cached answers with BM25 at once while that index is built in the background
    (`RagPipeline.index_in_background`; for tests, $RAG_DEMO_TEST_EMBED_GATE holds that build
    until a file exists). `spec`: StackSpec fields (e.g. generator_dtype). Imports the library
    lazily."""
    gate = os.environ.get(TEST_EMBED_GATE_ENV) or None

    def factory(stack: str, progress: Progress) -> Any:
        from rag_demo.pipeline import RagPipeline

        return RagPipeline.load(StackSpec(name=stack, **spec), corpus_fn() if corpus_fn else None, settings,
                                progress, knowledge=knowledge, background_index=True, build_gate=gate)

    return factory


class PipelinePool:
    """One loaded pipeline per stack, loaded lazily in a background thread on first use.

    A stack counts as loaded (and the page says "Live") only once it has answered a question in
    every mode (`RagPipeline.warm_up`): the first real question is then as fast as any other.
    `get` waits for the load and relays its progress. `lock` serialises the builds of the other
    built-in corpora's indexes (each built once, then loaded from the disk cache); answers never
    hold it (the StepScheduler orders their model steps), nor do uploads and edits (their batches
    are the scheduler's calls, in the upload lane: admission.Serving). `corpus_index` gives the index of
    another built-in corpus (the
    CIA World Factbook) under a stack's models: built or loaded from the disk cache once per
    stack, then shared by every session (the paper's index hot-swap).
    """

    def __init__(
        self,
        factory: Callable[[str, Progress], Any] | None = None,
        preloaded: dict[str, Any] | None = None,
        unavailable: Callable[[str], str | None] = default_unavailable,
        corpora: dict[str, tuple[str, Callable[[], Any]]] | None = None,
        model_thread: Any = None,
    ):
        self._factory = factory or stack_factory()
        # where the server runs model calls (serving.model_thread.ModelThread; None: the caller's
        # thread): warm-up runs there too, so that it measures the CPU as the answers will use it
        self.model_thread = model_thread
        self._corpora = default_corpora() if corpora is None else dict(corpora)
        self._indexes: dict[tuple[str, str], Any] = {}
        self._pipes: dict[str, Any] = dict(preloaded or {})
        self._errors: dict[str, str] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._progress: dict[str, tuple[float | None, str]] = {}
        self._reasons: dict[str, str | None] = {}
        self._unavailable_fn = unavailable
        self._guard = threading.Lock()
        self.lock = threading.RLock()
        # the command-line flags that give `python -m rag_demo ask` this server's stack options and
        # built-in corpus (app.py sets them: e.g. --corpus-file FILE); "show the code" prints them
        self.cli_flags: list[str] = []

    @classmethod
    def of(cls, pipelines: Any, unavailable: Callable[[str], str | None] = default_unavailable) -> PipelinePool:
        """A pool from a pool, a factory(stack, progress), or one loaded RagPipeline (other stacks
        then load over the same built-in corpus)."""
        if isinstance(pipelines, PipelinePool):
            return pipelines
        if hasattr(pipelines, "answer_modes"):
            corpus = pipelines.index.corpus
            factory = stack_factory(lambda: corpus, pipelines.settings)
            return cls(factory, {pipelines.stack.name: pipelines}, unavailable)
        return cls(pipelines, None, unavailable)

    def unavailable(self, stack: str) -> str | None:
        """Cached reason the stack cannot load here (None: it can, or it is loaded already)."""
        if stack in self._pipes:
            return None
        if stack not in self._reasons:
            self._reasons[stack] = self._unavailable_fn(stack)
        return self._reasons[stack]

    def loaded(self, stack: str) -> Any | None:
        return self._pipes.get(stack)

    def loaded_stacks(self) -> list[str]:
        return list(self._pipes)

    def loading(self, stack: str) -> bool:
        t = self._threads.get(stack)
        return stack not in self._pipes and t is not None and t.is_alive()

    def error(self, stack: str) -> str | None:
        """Why the last load of `stack` failed (None: it did not)."""
        return self._errors.get(stack)

    def progress(self, stack: str) -> tuple[float | None, str]:
        return self._progress.get(stack, (None, "waiting to load"))

    def start(self, stack: str) -> None:
        """Begin loading `stack` in the background (no-op if loaded or loading)."""
        with self._guard:
            if stack in self._pipes or (stack in self._threads and self._threads[stack].is_alive()):
                return
            self._errors.pop(stack, None)
            self._progress[stack] = (0.0, f"Starting the {stack} stack ...")
            t = threading.Thread(target=self._load, args=(stack,), name=f"load-{stack}", daemon=True)
            self._threads[stack] = t
            t.start()

    def _load(self, stack: str) -> None:
        def report(frac: float | None, msg: str) -> None:
            prev = self._progress.get(stack, (None, ""))[0]
            self._progress[stack] = (prev if frac is None else frac, msg)
            _log(msg)

        t0 = time.perf_counter()
        try:  # not under `lock`: loading a stack touches only its own models, others keep answering
            pipe = self._factory(stack, report)
            warm = getattr(pipe, "warm_up", None)
            if warm is not None:  # ready means warm: the first question must not pay for lazy set-up
                report(0.95, f"Warming up the {stack} stack: one question in every mode ...")
                say = lambda msg: report(None, msg)  # noqa: E731
                secs = warm(say) if self.model_thread is None else self.model_thread.run(warm, say)
                report(None, f"Warmed up in {secs:.1f} s")
            self._pipes[stack] = pipe
            weights = getattr(getattr(pipe, "stack", None), "weights", None)
            if weights is not None:  # which file answers, said once at start (models/weights.py)
                _log(f"the {stack} stack's generator weights: {weights.describe()}"
                     + ("" if weights.measured else f" (NOT the measured ones: {weights.warning()})"))
            report(1.0, f"The {stack} stack is ready ({time.perf_counter() - t0:.1f} s)")
            build = getattr(pipe, "index_build", None)
            if build is not None:  # answering with BM25 until its dense index is complete
                build.on_ready(lambda index, info: _log(
                    f"The dense index of the {stack} stack is complete ({len(index):,} passages, "
                    f"{time.perf_counter() - t0:.1f} s after the load began): answers retrieve with it now"))
        except Exception as e:  # noqa: BLE001 - shown to the user, the app keeps serving
            if isinstance(e, ValueError):  # the library's message: what is wrong and what to do
                self._errors[stack] = str(e)
            else:  # never the exception's own text on the page (paths, values): an id, the log holds it
                ident = secrets.token_hex(4)
                logging.getLogger(__name__).error("loading the %s stack failed (error %s)", stack, ident, exc_info=e)
                self._errors[stack] = (f"an unexpected error on the server (error {ident}; the server's log holds "
                                       "it): try again later, or use the offline stack")
            report(None, f"Loading the {stack} stack failed: {self._errors[stack]}")

    def get(self, stack: str, progress: Progress | None = None, timeout: float | None = None) -> Any:
        """The loaded pipeline of `stack`, loading it first (relaying progress); ValueError if it cannot load."""
        if stack in self._pipes:
            return self._pipes[stack]
        reason = self.unavailable(stack)
        if reason:
            raise ValueError(f"the {stack} stack is unavailable here: {reason}. Use the offline stack.")
        self.start(stack)
        t0, last = time.monotonic(), None
        while stack not in self._pipes:
            thread = self._threads.get(stack)
            if stack in self._errors and not (thread and thread.is_alive()):
                raise ValueError(f"the {stack} stack could not be loaded: {self._errors[stack]}")
            now = self._progress.get(stack)
            if progress and now != last:
                progress(*now)
                last = now
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise TimeoutError(f"the {stack} stack is still loading after {timeout:.0f} s")
            if thread:
                thread.join(0.25)
        return self._pipes[stack]

    def corpora(self) -> dict[str, str]:
        """The other built-in corpora: key (the corpus dropdown's value) -> corpus name."""
        return {key: name for key, (name, _) in self._corpora.items()}

    def corpus_index(self, stack: str, key: str, progress: Progress | None = None) -> Any:
        """The index of built-in corpus `key` under `stack`'s passage encoder: loaded from the disk
        cache or built (relaying progress: the embedding's fraction done) the first time, then the
        same object for every session. The stack's own index when it already serves that corpus."""
        if key not in self._corpora:
            known = ", ".join(self._corpora) or "none"
            raise ValueError(f"corpus {key!r} is not a built-in corpus here: use one of {known}.")
        if (stack, key) in self._indexes:
            return self._indexes[(stack, key)]
        pipe = self.get(stack, progress)
        name, load = self._corpora[key]
        with self.lock:  # one build at a time; a second session asking waits, then shares it
            if (stack, key) not in self._indexes:
                if pipe.index.corpus.name == name:
                    index = pipe.index
                else:
                    t0 = time.perf_counter()
                    index, _ = pipe.indexes.build_index(load(), progress)
                    _log(f"{name} index for the {stack} stack ready in {time.perf_counter() - t0:.1f} s")
                self._indexes[(stack, key)] = index
        return self._indexes[(stack, key)]
