"""What a request may cost, and how requests share one CPU.

Owns two things the app needs so that no visitor can take the demo down:

* `Budget`: server-side limits (not visitor settings); a request over them is refused with a
  message that says what was asked, what it would cost and what to change. The estimate itself
  is the models' (`rag_demo.models.cost.CostModel`).
* `StepGate`: one model step at a time across threads; at each step the waiting request with the
  lowest priority number goes first (FIFO within a priority), so a cheap question is never stuck
  behind a whole expensive one, only behind one of its steps.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass

GiB = 2**30
# Model events run two at a time: a cheap question can start while an expensive one runs. They
# do not compute at the same time: the StepGate below lets one model step run at a time and at
# each step gives it to the waiting request with the lowest priority (cheap before expensive).
MODEL_CONCURRENCY = 2


@dataclass
class Budget:
    """Per-request limits of a server. Defaults fit a 16 GB, 2-vCPU Space: the app itself holds
    ~1.5-2 GB, plus at most StackSpec.passage_cache_mb (512 MiB) of kept passages and
    StackSpec.hidden_cache_mb (64 MiB) of kept hidden states, two requests
    may be in flight (the model lane's concurrency), each within `max_request_bytes`, leaving
    room for the OS and the browser-facing server."""

    # Refuse what would take longer than this (estimated): a visitor waits at most ~this, and
    # the other visitors' questions interleave with it step by step (StepGate).
    max_seconds: float = 45.0
    # Refuse what would add more than this at its peak (estimated): 2 requests x 3 GiB + the app < 16 GB.
    max_request_bytes: int = 3 * GiB
    # Wall clock per request: decoding stops and returns what it has, marked "time_limit". Above
    # max_seconds so an honest estimate finishes, bounded so a bad estimate cannot hold the lane.
    time_limit_s: float = 60.0
    # Estimated seconds above which a request is "expensive": it runs at low priority.
    heavy_seconds: float = 6.0
    # Refuse a learner's sweep (the Results tab) estimated above this in all: its answers run one
    # after another at low priority, so it delays nobody, but it holds the one expensive slot.
    max_sweep_seconds: float = 600.0

    def __post_init__(self) -> None:
        for name in ("max_seconds", "time_limit_s", "heavy_seconds", "max_sweep_seconds"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}={v!r} must be a positive number of seconds.")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes={self.max_request_bytes!r} must be a positive number of bytes.")


class StepGate:
    """One model step at a time; the waiting request with the lowest (priority, arrival) goes next.

    A request asks for the gate at every prefill, decoding step and scoring chunk, so requests
    interleave at step granularity: a cheap (priority 0) question waits for at most one step of
    an expensive (priority 1) one, and two cheap ones take turns."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, int]] = []  # heap of (priority, ticket)
        self._tickets = itertools.count()

    @contextmanager
    def step(self, priority: int = 0):
        with self._cv:
            me = (priority, next(self._tickets))
            heapq.heappush(self._waiting, me)
            self._cv.notify_all()  # one watching the queue (`wait_queued`) sees the arrival
            while self._busy or self._waiting[0] != me:
                self._cv.wait()
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def wait_queued(self, n: int, timeout: float | None = None) -> bool:
        """Block until at least n requests wait for the gate; False if `timeout` passes first."""
        with self._cv:
            return self._cv.wait_for(lambda: len(self._waiting) >= n, timeout)

    def gated(self, gen, priority: int = 0):
        """`gen` with its model calls taken through this gate at `priority`."""
        return _Gated(gen, self, priority)


class _Gated:
    """A generator whose outer model calls each hold the StepGate (inner calls, e.g. BART's
    prefill calling advance, go to the wrapped generator directly: no nested waits)."""

    def __init__(self, gen, gate: StepGate, priority: int) -> None:
        self._gen, self._gate, self._priority = gen, gate, priority

    def __getattr__(self, name):
        return getattr(self._gen, name)

    def _call(self, fn, *args, **kwargs):
        with self._gate.step(self._priority):
            return fn(*args, **kwargs)

    def prefill(self, prompts, keep_prompt_logprobs: int = 0):
        return self._call(self._gen.prefill, prompts, keep_prompt_logprobs=keep_prompt_logprobs)

    def advance(self, state, tokens):
        return self._call(self._gen.advance, state, tokens)

    def advance_gather(self, state, tokens, targets, *args, **kwargs):
        return self._call(self._gen.advance_gather, state, tokens, targets, *args, **kwargs)

    def select(self, state, rows):
        return self._call(self._gen.select, state, rows)
