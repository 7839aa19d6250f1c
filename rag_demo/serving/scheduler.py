"""How the model's steps are shared: every visitor waiting for a decoding step is served by one
forward, and everything else takes its turn (docs/DESIGN.md §10a).

A decoding step of SmolLM2-135M reads all of its weights whatever the number of rows, so twenty
visitors decoding one after another pay for twenty reads where one would do. `StepScheduler`
keeps one model call at a time, as llama.cpp's server keeps slots and vLLM's scheduler keeps a
running batch:

* a decoding step (`advance`) waits with the others; when the model is free the first in line
  leads: it takes every waiting step of the same model and priority (up to `max_rows` rows) and
  runs them as one call of the generator's `advance_many`, then hands each its own log-probs;
* a teacher-forced pass (`advance_gather`: an answer's tokens scored under its passages) joins
  the same batch: its tokens are rows of the same forward, and it gets its tokens' log-probs;
* any other model call (a prefill) is a step of its own, taken in turn, so a new visitor's
  prefill runs between two batched steps and delays the others by that one call;
* the lowest priority number goes first (cheap before expensive), first come first served within
  it, and a batch holds one priority;
* before a batched step the leader waits up to `gather_s` for the visitors of the last batch who
  are still decoding (their own bookkeeping between steps), so the batch does not split in two.

Each visitor's rows are its own: the generator's marginalisation, Stop, time limit and streaming
run in the visitor's thread on what its rows returned. Imports neither torch nor gradio.
"""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

# Tokens one batched step may hold (a decoding row is one token, a teacher-forced row its answer's
# length): twenty visitors at the page's defaults (K 5, 2 beams: 10 rows each at most) fit in one
# step beside a few teacher-forced answers; more make every member's step slower (docs/results.md §3.6).
MAX_BATCH_ROWS = 320
# How long a batch waits for the visitors of the last one who are still between steps: their
# bookkeeping takes a few milliseconds each, one at a time (Python's lock).
GATHER_S = 0.02
# Tests only: while the file this names exists, every decoding step after a mode's first waits
# TEST_HOLD_S first (less once its request is stopped), so an answer streams its first tokens and
# is still running when a browser test presses Stop, on any CPU (a step that waited until Stop
# would leave its first token unstreamed: the page's updates are throttled, not timed).
TEST_HOLD_ENV = "RAG_DEMO_TEST_HOLD_DECODING"
TEST_HOLD_S = 0.3


class WaitClock:
    """Seconds one request has waited while the model served other requests (its calls queued, its
    decoding step gathering), summed over its modes: `runs.Run.waited` reads it, so a class's queue
    is not charged to any visitor's time limit; the calls the model runs for it are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += max(0.0, seconds)

    def __call__(self) -> float:
        with self._lock:
            return self._seconds


@dataclass(eq=False)
class _Ticket:
    """One call waiting for the model: a solo step (gen None) or a decoding step to batch."""

    priority: int
    seq: int
    stream: int | None = None
    gen: Any = None
    state: Any = None
    tokens: Any = None
    targets: Any = None  # a teacher-forced pass's targets (advance_gather), None for a decoding step
    rows: int = 0  # tokens it feeds
    clock: WaitClock | None = None
    since: float = field(default_factory=time.perf_counter)  # when it began to wait
    wake: threading.Condition | None = None  # its own, over the scheduler's lock: only it is woken
    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def __lt__(self, other: "_Ticket") -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


@dataclass
class BatchStat:
    """One model call the scheduler ran: how many visitors' steps and rows it served, and how long it took."""

    members: int
    rows: int
    seconds: float
    what: str = "advance"  # the call: "advance" (decoding steps), or the generator method that ran alone
    forced: int = 0  # of the members, teacher-forced passes (advance_gather)


@dataclass
class StepScheduler:
    """One model call at a time; decoding steps of every waiting visitor batched into one call."""

    max_rows: int = MAX_BATCH_ROWS
    gather_s: float = GATHER_S
    # where model calls run: an object with run(fn, *args) (model_thread.ModelThread); None: in the
    # thread of the visitor first in line
    model_thread: Any = None
    # one lock; each waiting call sleeps on its own condition over it and is woken alone when its
    # turn comes or its batch is done (a condition for all woke every waiting visitor at every call)
    _mutex: threading.RLock = field(default_factory=threading.RLock)
    _cv: threading.Condition = field(init=False)  # over _mutex: `wait_queued` and tests' `held` wait on it
    _gathering: _Ticket | None = None  # the leader waiting for the last batch's streams, if one is
    _busy: bool = False
    _waiting: list = field(default_factory=list)  # heap of _Ticket
    _tickets: Any = field(default_factory=itertools.count)
    _expected: set = field(default_factory=set)  # streams of the last batch that have not come back
    _last_end: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # BatchStat of recent calls
    # tests only (TEST_HOLD_ENV): the file whose existence slows decoding after a mode's first step
    hold: str | None = field(default_factory=lambda: os.environ.get(TEST_HOLD_ENV) or None)

    def __post_init__(self) -> None:
        self._cv = threading.Condition(self._mutex)
        if not isinstance(self.max_rows, int) or self.max_rows < 1:
            raise ValueError(f"max_rows={self.max_rows!r} must be a positive number of rows.")
        if not isinstance(self.gather_s, (int, float)) or self.gather_s < 0:
            raise ValueError(f"gather_s={self.gather_s!r} must be a number of seconds, 0 or more.")

    # -- a model call of its own ------------------------------------------------------------
    @contextmanager
    def step(self, priority: int = 0, stream: int | None = None, what: str = "step", clock: WaitClock | None = None):
        """Hold the model for one call (a prefill, teacher forcing; `what` names it in `recent`):
        wait for the turn of (priority, arrival), run alone."""
        me = self._enqueue(_Ticket(priority, next(self._tickets), stream, clock=clock))
        with self._cv:
            while self._busy or self._waiting[0] is not me:
                me.wake.wait()
            heapq.heappop(self._waiting)
            self._busy = True
        t0 = time.perf_counter()
        if clock is not None:
            clock.add(t0 - me.since)
        try:
            yield
        finally:
            self._release(BatchStat(1, 0, time.perf_counter() - t0, what))

    # -- a decoding step, batched -----------------------------------------------------------
    def advance(self, gen, state, tokens, priority: int = 0, stream: int | None = None, clock: WaitClock | None = None,
                targets=None):
        """gen.advance(state, tokens), or with targets gen.advance_gather(state, tokens, targets), run
        in one call with every other waiting step of the same model and priority (gen.advance_many);
        -> this state's log-probs. A step whose own item failed raises its error here, in its own
        thread; the others' are untouched."""
        me = self._enqueue(_Ticket(priority, next(self._tickets), stream, gen, state, tokens, targets,
                                   int(tokens.numel()), clock))
        with self._cv:
            while not me.done and (self._busy or self._waiting[0] is not me):
                me.wake.wait()
            if not me.done:
                batch = self._gather(me)
        if not me.done:
            self._run(batch)
        if me.error is not None:
            raise me.error
        return me.result

    def call(self, fn, *args, **kwargs):
        """fn(*args, **kwargs), a model call, where model calls run (`model_thread`)."""
        return fn(*args, **kwargs) if self.model_thread is None else self.model_thread.run(fn, *args, **kwargs)

    def leave(self, stream: int) -> None:
        """The stream will not come back for a step: no batch waits for it."""
        with self._cv:
            self._expected.discard(stream)
            self._wake_gathering()

    def wait_queued(self, n: int, timeout: float | None = None) -> bool:
        """Block until at least n calls wait for the model; False if `timeout` passes first."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self._waiting) >= n, timeout)

    def gated(self, gen, priority: int = 0, cancelled=None, clock: WaitClock | None = None):
        """`gen` with its model calls taken through this scheduler at `priority`; `cancelled()`,
        the request's own, releases a test's hold (`hold`); `clock` sums the request's waits."""
        return Gated(gen, self, priority, next(_STREAMS), cancelled, clock)

    @staticmethod
    def clock() -> WaitClock:
        """A new request's WaitClock (runs.Run.waited)."""
        return WaitClock()

    def held(self, cancelled) -> None:
        """Tests only: while the `hold` file exists, wait TEST_HOLD_S before this step, less once
        `cancelled()` says the request was stopped (checked every 50 ms)."""
        end = time.monotonic() + TEST_HOLD_S
        while (self.hold and os.path.exists(self.hold) and time.monotonic() < end
               and not (cancelled is not None and cancelled())):
            with self._cv:
                self._cv.wait(0.05)

    # -- inside ------------------------------------------------------------------------------
    def _enqueue(self, ticket: _Ticket) -> _Ticket:
        ticket.wake = threading.Condition(self._mutex)  # the scheduler's lock: waited on under it
        with self._cv:
            heapq.heappush(self._waiting, ticket)
            self._expected.discard(ticket.stream)
            self._wake_gathering()
            self._cv.notify_all()  # `wait_queued` alone waits on the scheduler's own condition
        return ticket

    def _wake_gathering(self) -> None:
        """(Under the lock) wake the leader waiting for the last batch's streams: one came or left."""
        if self._gathering is not None:
            self._gathering.wake.notify()

    def _gather(self, head: _Ticket) -> list[_Ticket]:
        """(Under the lock, the model free, `head` first in line) take the model, wait briefly for
        the last batch's streams still decoding, and take the waiting steps that batch with `head`."""
        self._busy = True
        deadline = self._last_end + self.gather_s
        self._gathering = head
        while True:
            here = {t.stream for t in self._waiting}
            missing = self._expected - here
            left = deadline - time.perf_counter()
            if not missing or left <= 0:
                break
            head.wake.wait(left)
        self._gathering = None
        key = getattr(head.gen, "batch_key", None)
        batch, rows, rest = [], 0, []
        for t in sorted(self._waiting):
            fits = (t is head or (t.gen is not None and t.priority == head.priority and key is not None
                                  and getattr(t.gen, "batch_key", None) == key and rows + t.rows <= self.max_rows))
            if fits:
                batch.append(t)
                rows += t.rows
            else:
                rest.append(t)
        self._waiting = rest
        heapq.heapify(self._waiting)
        return batch

    def _run(self, batch: list[_Ticket]) -> None:
        """Run the batch in one call (outside the lock), hand each its result, free the model."""
        t0 = time.perf_counter()
        for t in batch:
            if t.clock is not None:
                t.clock.add(t0 - t.since)
        head = batch[0]
        try:
            if len(batch) == 1:  # alone: checked as a batch's items are, then the generator's own call
                check = getattr(head.gen, "check_step", None)
                item = _item(head)
                bad = check(*item) if check is not None else None
                outs = [bad if bad is not None else
                        self.call(head.gen.advance if head.targets is None else head.gen.advance_gather, *item)]
            else:
                outs = self.call(head.gen.advance_many, [_item(t) for t in batch])
            for t, out in zip(batch, outs):
                if isinstance(out, BaseException):
                    t.error = out
                else:
                    t.result = out
        except BaseException as e:  # noqa: BLE001 - handed to each member, raised in its own thread
            for t in batch:
                t.error = e
        forced = sum(t.targets is not None for t in batch)
        self._release(BatchStat(len(batch), sum(t.rows for t in batch), time.perf_counter() - t0,
                                "advance" if forced < len(batch) else "advance_gather", forced), batch)

    def _release(self, stat: BatchStat, batch: list[_Ticket] = ()) -> None:
        with self._cv:
            for t in batch:
                t.done = True
            if batch:
                self._expected = {t.stream for t in batch if t.stream is not None and t.error is None}
            self._last_end = time.perf_counter()
            self.recent.append(stat)
            self._busy = False
            for t in batch:  # the batch's members: their results are in
                t.wake.notify()
            if self._waiting:  # the next in line: the model is its
                self._waiting[0].wake.notify()
            self._cv.notify_all()  # tests' `held` waits on the scheduler's own condition


def _item(t: _Ticket) -> tuple:
    """A ticket's item for the generator's advance_many: (state, tokens), or (state, tokens, targets)."""
    return (t.state, t.tokens) if t.targets is None else (t.state, t.tokens, t.targets)


_STREAMS = itertools.count(1)


class Gated:
    """A generator whose model calls go through a StepScheduler: decoding steps and teacher-forced
    passes batched with other visitors', prefills each a call of their own; `select` (a copy of
    rows, no model call) and everything else are the wrapped generator's. `leave()` when done."""

    def __init__(self, gen, scheduler: StepScheduler, priority: int, stream: int, cancelled=None,
                 clock: WaitClock | None = None) -> None:
        self._gen, self._scheduler, self._priority, self.stream = gen, scheduler, priority, stream
        self._cancelled, self._steps, self._clock = cancelled, 0, clock

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def _call(self, fn, *args, **kwargs):
        with self._scheduler.step(self._priority, self.stream, fn.__name__, self._clock):
            return self._scheduler.call(fn, *args, **kwargs)

    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        return self._call(self._gen.prefill, prompts, keep_prompt_logprobs=keep_prompt_logprobs)

    def advance(self, state, tokens):
        if self._steps and self._scheduler.hold:
            self._scheduler.held(self._cancelled)
        self._steps += 1
        return self._scheduler.advance(self._gen, state, tokens, self._priority, self.stream, self._clock)

    def advance_gather(self, state, tokens, targets, *args, **kwargs):
        if args or kwargs:  # a bound on its logits of its own: a call of its own
            return self._call(self._gen.advance_gather, state, tokens, targets, *args, **kwargs)
        return self._scheduler.advance(self._gen, state, tokens, self._priority, self.stream, self._clock, targets)

    def leave(self) -> None:
        self._scheduler.leave(self.stream)
