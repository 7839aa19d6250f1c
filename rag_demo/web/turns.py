"""Each visitor's turn, and what every part of the page's handlers shares (web/handlers.py).

A visitor (a browser tab) has one question at a time: a new run supersedes the one still going,
which then writes nothing more to the page; Stop ends a run's decoding where it is.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import gradio as gr

from rag_demo.serving.admission import Serving
from rag_demo.serving.pool import PipelinePool
from rag_demo.serving.session import Session
from rag_demo.web.answering import stop_button


@dataclasses.dataclass(frozen=True)
class Turn:
    """One visitor's run. superseded(): a newer question, Stop or a switch took over and this run
    must write nothing more; cancelled(): decoding should stop (superseded, or Stop pressed: then
    the run still shows what it answered, marked stopped)."""

    superseded: Callable[[], bool]
    cancelled: Callable[[], bool]


class Turns:
    """Each visitor's current run and the run they last pressed Stop on."""

    def __init__(self) -> None:
        self._runs: dict[str, int] = {}  # each visitor's (session hash's) current run number
        self._stopped: dict[str, int] = {}  # the run number each visitor last pressed Stop on
        self._runs_lock = threading.Lock()

    def begin_run(self, request: Any) -> Turn:
        """A new run for this visitor (browser tab): any run of theirs still going is superseded
        (it stops decoding at its next step and writes nothing more to the page). -> the new run's
        `Turn`."""
        key = getattr(request, "session_hash", None)
        if key is None:
            return Turn(lambda: False, lambda: False)
        with self._runs_lock:
            n = self._runs.get(key, 0) + 1
            self._runs[key] = n
        superseded = lambda: self._runs.get(key) != n  # noqa: E731
        return Turn(superseded, lambda: superseded() or self._stopped.get(key) == n)

    def forget(self, request: gr.Request = None) -> None:
        """A visitor's tab has closed (demo.unload): their run numbers go, so the maps hold only
        the visitors still here."""
        key = getattr(request, "session_hash", None)
        with self._runs_lock:
            self._runs.pop(key, None)
            self._stopped.pop(key, None)

    def stop_run(self, request: gr.Request = None):
        """Stop this visitor's running question: its decoding ends at the next step and its cards
        show what was answered so far, marked stopped, each with a button to finish it."""
        key = getattr(request, "session_hash", None)
        with self._runs_lock:
            if key is not None:
                self._stopped[key] = self._runs.get(key, 0)
        return '<div class="rag-status-note">Stopped: the answers end where they were.</div>', stop_button(False)


class Part:
    """What every part of the handlers holds: the stack pool, the stack a new visitor starts on,
    the serving limits (None: unlimited, in tests) and the visitors' turns."""

    def __init__(self, pool: PipelinePool, default_stack: str, serving: Serving | None, turns: Turns) -> None:
        self.pool, self.default_stack, self.serving, self.turns = pool, default_stack, serving, turns

    def fresh(self, s: Session | None) -> Session:
        return s if isinstance(s, Session) else Session(stack=self.default_stack)
