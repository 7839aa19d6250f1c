"""How the app serves model requests: admission, limits, and answers streamed from a worker.

Owns `Serving` (what every model request of one app shares: the server's `Budget`, the
`StepGate` that runs one model step at a time with cheap requests first, at most `max_heavy`
expensive requests at once, a deadline per request), `client_gone` (has this request's browser
left? then decoding stops) and `stream` (runs an answer in a worker thread and yields its
partial states at most ~10 times a second). Imports neither torch nor gradio; the costs and the
RunControl are budget.py's.
"""

from __future__ import annotations

import contextvars
import dataclasses
import queue
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag_demo.config import MODES, RagSettings


@dataclass
class Serving:
    """What every model request of one app shares: the server's `Budget` (refuse, time limit,
    what counts as expensive), one `StepGate` (one model step at a time, cheap requests first),
    and the app's gradio queue, to learn that a request's client has gone."""

    budget: Any = None
    gate: Any = None
    queue: Callable[[], Any] = lambda: None
    # Expensive requests running at once. With model concurrency 2 this is 1, so a cheap request
    # always finds a free slot: two expensive ones would take both and cheap ones would queue
    # behind them for up to the time limit (the gate only orders requests that are running).
    max_heavy: int = 1
    _heavy: int = 0
    _heavy_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def heavy_busy(self) -> str | None:
        """Why an expensive request would be refused now (None: a slot is free)."""
        if self._heavy < self.max_heavy:
            return None
        # cheap = under heavy_seconds or at most 1.5x the defaults' estimate (Serving.check): on a slow
        # CPU the second is the larger, so the message names the defaults rather than a number
        cheap = (f" (under about {self.budget.heavy_seconds:.0f} s, or no more than 1.5x the default settings; "
                 "the defaults always run)") if self.budget is not None else ""
        running = f"{self._heavy} expensive question" + ("" if self._heavy == 1 else "s")
        return (f"{running} already running, and this server runs "
                f"{self.max_heavy} at a time so that cheap questions never wait behind them: try again in a "
                f"minute, or lower K, beams or max new tokens to make the question cheap{cheap}.")

    @contextmanager
    def heavy_slot(self, cost: Any):
        """Hold one of the `max_heavy` slots while an expensive request runs; ValueError if none is free."""
        if cost is None or not getattr(cost, "heavy", False):
            yield
            return
        with self._heavy_lock:
            busy = self.heavy_busy()
            if busy:
                raise ValueError(f"This question is expensive ({cost.describe()}): {busy}")
            self._heavy += 1
        try:
            yield
        finally:
            with self._heavy_lock:
                self._heavy -= 1

    def check(self, pipe: Any, question: str, settings: RagSettings) -> Any:
        """The request's Cost, or the library's ValueError (what was asked, what it would cost,
        what to change) when it is over the budget; None without a budget."""
        if self.budget is None or not hasattr(pipe, "check_budget"):
            return None
        try:
            cost = pipe.check_budget(question, list(MODES), settings, self.budget)
        except ValueError:
            if not within_defaults(settings):
                raise
            # the page's defaults are always admitted (the time limit still bounds them): the
            # estimate is a worst case calibrated at warm-up, and on a busy CPU it put the
            # defaults themselves over max_seconds, which would refuse every ordinary question
            cost = pipe.estimate(question, list(MODES), settings)
            cost.heavy = False
            return cost
        if cost.heavy:  # never expensive: a question no costlier than the page's default settings
            # (heavy_seconds is absolute; on a slow or busy CPU the calibrated estimate of the
            # defaults exceeds it, and every ordinary question would run at low priority and
            # count against max_heavy)
            defaults = RagSettings(preset=settings.preset)
            base = pipe.estimate(question, list(MODES), defaults.merged(k=min(defaults.decoding.k, settings.decoding.k)))
            cost.heavy = cost.seconds > 1.5 * base.seconds
        return cost

    def control(self, cost: Any, request: Any = None) -> Any:
        """The RunControl of one request: a deadline `time_limit_s` from now, low priority when
        the cost is heavy, the shared gate, and "cancelled" once the client has gone."""
        if self.budget is None:
            return None
        from rag_demo.pipeline import RunControl

        return RunControl(
            deadline=time.monotonic() + self.budget.time_limit_s,
            priority=1 if cost is not None and getattr(cost, "heavy", False) else 0,
            gate=self.gate,
            cancelled=client_gone(self.queue, request),
        )


def within_defaults(settings: RagSettings) -> bool:
    """Whether `settings` cost no more than their preset's defaults in every dimension."""
    d = RagSettings(preset=settings.preset)
    return (settings.decoding.k <= d.decoding.k and settings.decoding.num_beams <= d.decoding.num_beams and settings.decoding.max_new_tokens <= d.decoding.max_new_tokens
            and settings.decoding.max_doc_tokens <= d.decoding.max_doc_tokens
            # "both" puts the question in every passage's prompt twice: longer than "after"
            and settings.aids.question_position in (d.aids.question_position, "after"))


def client_gone(queue_of: Callable[[], Any], request: Any) -> Callable[[], bool] | None:
    """A predicate that turns True once the client of `request` has disconnected.

    gradio 6 has no public hook for this. When a client's event stream (SSE) closes, the queue
    calls `clean_events(session_hash=...)`, which sets `alive = False` on that session's running
    jobs (gradio/routes.py, gradio/queueing.py); a running sync handler is never interrupted.
    So the predicate looks up this session's running events in the queue's `active_jobs` and
    reports gone when all of them are dead. It reads private attributes (checked against gradio
    6.31 by tests/test_ui.py); if they change it answers False (never cancels), not an error."""
    session_hash = getattr(request, "session_hash", None)
    if not session_hash:
        return None

    def gone() -> bool:
        try:
            jobs = getattr(queue_of(), "active_jobs", None) or []
            mine = [e for job in jobs if job for e in job if getattr(e, "session_hash", None) == session_hash]
            return bool(mine) and not any(getattr(e, "alive", True) for e in mine)
        except Exception:  # noqa: BLE001 - a probe of gradio internals must never break an answer
            return False

    return gone


STREAM_INTERVAL_S = 0.1  # at most ~10 page updates a second while answers grow


def stream(run: Callable[[Callable[[dict], None], Callable[[], bool]], Any], interval: float = STREAM_INTERVAL_S):
    """Run `run(on_partial, stopped)` in a worker thread (with this thread's context, so gradio's
    warnings and progress still reach the page) and yield ("partial", {mode: latest dict}) while
    answers grow, at most every `interval` s, then ("done", what `run` returned). `run`'s error
    is raised here. If the consumer stops iterating (the visitor left), `stopped()` turns True
    and the worker's decoding ends at its next step."""
    events: queue.Queue = queue.Queue()
    gone = threading.Event()
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = run(events.put, gone.is_set)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            box["error"] = e
        finally:
            events.put(None)

    worker = threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True, name="rag-answer")
    worker.start()
    latest: dict[str, dict] = {}
    shown, finished, dirty = 0.0, False, False
    try:
        while not finished:
            try:
                item = events.get(timeout=interval)
            except queue.Empty:
                item = ...
            while item is not ... and item is not None:  # drain: only the newest state of each mode matters
                latest[item["mode"]], dirty = item, True
                try:
                    item = events.get_nowait()
                except queue.Empty:
                    item = ...
            finished = item is None
            if dirty and not finished and time.monotonic() - shown >= interval:
                shown, dirty = time.monotonic(), False
                yield "partial", dict(latest)
        worker.join()
        if "error" in box:
            raise box["error"]
        yield "done", box["result"]
    finally:
        gone.set()
