"""How the app serves model requests: admission, time shares, and answers streamed to a page.

Owns `Serving` (what every model request of one app shares: the server's `Budget`, the
`StepScheduler` that runs one model call at a time, decoding steps batched, cheap requests first, at most `max_heavy`
expensive requests at once, each mode's share of the time limit), `client_gone` (has this
request's browser left? then decoding stops) and `throttled` (a question's answer events, at
most ~10 page updates a second). Imports neither torch nor gradio.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag_demo.config import MODES, RagSettings
from rag_demo.runs import Run


@dataclass
class Serving:
    """What every model request of one app shares: the server's `Budget` (refuse, time limit,
    what counts as expensive), one `StepScheduler` (one model call at a time, every waiting decoding step in it, cheap first),
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
    # one upload read or embedded at a time, server-wide (upload_lane): its own lane beside the questions
    _uploads: threading.Semaphore = dataclasses.field(default_factory=lambda: threading.BoundedSemaphore(1))

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
    def _slot(self, refused: Callable[[], str | None]):
        """Hold one of the `max_heavy` slots while the block runs; ValueError(refused()) when
        `refused()` names why none may be taken (it runs under the lock)."""
        with self._heavy_lock:
            why = refused()
            if why:
                raise ValueError(why)
            self._heavy += 1
        try:
            yield
        finally:
            with self._heavy_lock:
                self._heavy -= 1

    @contextmanager
    def heavy_slot(self, cost: Any):
        """Hold one of the `max_heavy` slots while an expensive request runs; ValueError if none is free."""
        if cost is None or not getattr(cost, "heavy", False):
            yield
            return

        def refused() -> str | None:
            busy = self.heavy_busy()
            return f"This question is expensive ({cost.describe()}): {busy}" if busy else None

        with self._slot(refused):
            yield

    def sweep_slot(self):
        """Hold one of the `max_heavy` slots for a learner's sweep (every answer of it low priority):
        a cheap question still always finds a slot and waits at most one model step of the sweep's.
        ValueError when the slots are taken."""
        return self._slot(lambda: None if self._heavy < self.max_heavy else (
            "Another sweep or an expensive question is running on this server, which runs "
            f"{self.max_heavy} at a time so that questions never wait behind them: try again in a minute."))

    @contextmanager
    def upload_lane(self, wait: Callable[[], None] | None = None, block: bool = True):
        """Hold the server's one upload lane while an upload is read and embedded; yields True.
        A second upload waits its turn (`wait()` is told once, to show it) for at most the time
        limit, then gets a ValueError; with block=False it yields False at once, holding nothing.
        Questions never wait on this lane; an upload's model work goes through `embed_turn`."""
        held = self._uploads.acquire(blocking=False)
        if not held and block:
            if wait is not None:
                wait()
            limit = self.budget.time_limit_s if self.budget is not None else None
            held = self._uploads.acquire(timeout=limit) if limit else self._uploads.acquire()
            if not held:
                raise ValueError(f"Another visitor's upload was still being indexed after {limit:.0f} s of waiting, "
                                 "and this server indexes one upload at a time: try again in a minute.")
        try:
            yield held
        finally:
            if held:
                self._uploads.release()

    @contextmanager
    def embed_turn(self):
        """The context one batch of an upload's embedding (or an edit's passage) runs in: a model call
        of its own at the shared gate, in line with the questions' steps (so no answer waits on an
        upload for more than one batch); it yields the runner that puts the batch where the gate
        runs model calls (run(fn, *args)). No gate: no wait, and None (run it here)."""
        if self.gate is None:
            yield None
            return
        with self.gate.step(0, what="embed"):
            yield self.gate.call

    def upload_price(self, passages: int) -> Callable[[float, int, int], None] | None:
        """The `price` an upload's embedding calls after its first batch: ValueError (the message says
        the estimate, the limit and the fix) when the whole would take over max_upload_seconds."""
        if self.budget is None:
            return None

        def price(first_seconds: float, done: int, total: int) -> None:
            why = self.budget.upload_refusal(first_seconds, done, total, passages)
            if why:
                raise ValueError(why)
        return price

    def background_run(self, request: Any = None, cancelled: Callable[[], bool] | None = None) -> Any:
        """The `Run` of work that must delay no visitor (a sweep's answers): low priority at the gate,
        each mode within the time limit, cancelled with its client or by `cancelled()`."""
        gone = client_gone(self.queue, request)
        stop = gone if cancelled is None else (cancelled if gone is None else (lambda: gone() or cancelled()))
        limit = self.budget.time_limit_s if self.budget is not None else None
        return Run(cancelled=stop, seconds={m: limit for m in MODES} if limit else {},
                   share=(lambda gen: self.gate.gated(gen, 1, stop)) if self.gate is not None else None)

    def check(self, pipe: Any, question: str, settings: RagSettings, modes: list[str] | None = None,
              passages: list | None = None) -> Any:
        """The request's Cost, or the library's ValueError (what was asked, what it would cost,
        what to change) when it is over the budget; None without a budget. `modes` default to all
        three; `passages`: a request over given passages (a passage taken away, a mode answered
        again), priced over them and admitted by the same rules."""
        if self.budget is None or not hasattr(pipe, "check_budget"):
            return None
        modes = list(MODES) if modes is None else list(modes)
        try:
            cost = pipe.check_budget(question, modes, settings, self.budget, passages)
        except ValueError:
            # a request no costlier than its preset's defaults is always admitted (the time limit
            # still bounds it): the estimate is a worst case calibrated at warm-up, and on a busy
            # CPU it put the defaults themselves over max_seconds, which would refuse every
            # ordinary question. "No costlier" is the same estimate, so every knob counts.
            cost = pipe.estimate(question, modes, settings, passages)
            if not within_defaults(pipe, question, settings, cost):
                raise
            cost.heavy = False
            return cost
        if cost.heavy:  # never expensive: a question no costlier than the page's default settings
            # (heavy_seconds is absolute; on a slow or busy CPU the calibrated estimate of the
            # defaults exceeds it, and every ordinary question would run at low priority and
            # count against max_heavy)
            defaults = RagSettings(preset=settings.preset)
            base = pipe.estimate(question, modes, defaults.merged(k=min(defaults.decoding.k, settings.decoding.k)))
            cost.heavy = cost.seconds > 1.5 * base.seconds
        return cost

    def run(self, cost: Any, request: Any = None, cancelled: Callable[[], bool] | None = None) -> Any:
        """How one request runs: each mode gets the time limit's share the estimate gives it
        (`time_shares`: at least a third of the limit, and its own estimate where the limit
        allows), low priority when the cost is heavy, its model steps through the shared gate,
        cancelled once the client has gone (or `cancelled()` says so)."""
        gone = client_gone(self.queue, request)
        stop = gone if cancelled is None else (cancelled if gone is None else (lambda: gone() or cancelled()))
        if self.budget is None:
            return Run(cancelled=stop)
        priority = 1 if cost is not None and getattr(cost, "heavy", False) else 0
        clock = self.gate.clock() if self.gate is not None and hasattr(self.gate, "clock") else None
        return Run(cancelled=stop, seconds=time_shares(cost, self.budget.time_limit_s),
                   share=(lambda gen: self.gate.gated(gen, priority, stop, clock)) if self.gate is not None else None,
                   waited=clock)


def time_shares(cost: Any, limit: float) -> dict[str, float]:
    """Each mode's own share of the time limit (`limit`, seconds), from its estimated seconds s_m:

        share_m = max(limit / 3, a · s_m),   a = max(limit / Σ s, min(1, a*))

    where a* is the factor that makes the shares add up to 5/3 of the limit. Every mode gets at
    least a third of the limit, so that none pays for another's overrun; at least its share of
    the limit in proportion to its estimate (a ≥ limit / Σ s); and its whole estimate whenever
    the shares can still add up to no more than 5/3 of the limit (a = 1), so that a mode priced
    above its proportional share, thorough RAG-Sequence's rescoring, gets the time it was priced
    at rather than falling back. In all, a question's modes take at most 5/3 of the limit, the
    bound the first two rules alone give."""
    per_mode = dict(getattr(cost, "per_mode", None) or {})
    if not per_mode:  # not priced: each mode may take the whole limit
        return {m: limit for m in MODES}
    floor, total = limit / 3, sum(per_mode.values())
    if total <= limit:  # proportional shares already give each mode more than its estimate
        a = limit / (total or 1.0)
    else:
        a = min(1.0, _scale_to(per_mode, floor, 5 / 3 * limit))
        a = max(a, limit / total)
    return {m: max(floor, a * sec) for m, sec in per_mode.items()}


def _scale_to(seconds: dict[str, float], floor: float, bound: float) -> float:
    """The factor a with Σ_m max(floor, a · s_m) = bound (or inf when no factor reaches it): with
    the j largest s_m above the floor, a = (bound - (n - j) · floor) / (their sum)."""
    desc = sorted(seconds.values(), reverse=True)
    n = len(desc)
    for j in range(1, n + 1):
        top = sum(desc[:j])
        if top <= 0:
            break
        a = (bound - (n - j) * floor) / top
        # consistent: the j largest are above the floor at this a, the others at or below it
        if a * desc[j - 1] >= floor and (j == n or a * desc[j] <= floor):
            return a
    return float("inf")


def within_defaults(pipe: Any, question: str, settings: RagSettings, cost: Any) -> bool:
    """Whether `cost` (the estimate of `settings`) is no more than the estimate of the preset's
    defaults for the same question, in seconds and in memory."""
    base = pipe.estimate(question, list(MODES), RagSettings(preset=settings.preset))
    return cost.seconds <= base.seconds * (1 + 1e-9) and cost.peak_bytes <= base.peak_bytes


def client_gone(queue_of: Callable[[], Any], request: Any) -> Callable[[], bool] | None:
    """A predicate that turns True once the client of `request` has disconnected.

    gradio 6 has no public hook for this. When a client's event stream (SSE) closes, the queue
    calls `clean_events(session_hash=...)`, which sets `alive = False` on that session's running
    jobs (gradio/routes.py, gradio/queueing.py); a running sync handler is never interrupted.
    So the predicate looks up this visitor's running events in the queue's `active_jobs` and
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


def throttled(events: Iterator[Any], interval: float = STREAM_INTERVAL_S) -> Iterator[dict[str, Any]]:
    """Answer events (RagPipeline.answer_modes with partials) coalesced for a page: {mode: the latest
    partial dict, or the final Answer} at most every `interval` seconds while answers grow, at
    once when a mode's answer is final, and once at the end."""
    latest: dict[str, Any] = {}
    shown, dirty = 0.0, False
    for e in events:
        latest[e.mode] = e.answer
        dirty = True
        if e.final or time.monotonic() - shown >= interval:
            shown, dirty = time.monotonic(), False
            yield dict(latest)
    if dirty:
        yield dict(latest)
