"""How one request runs among others: `Run`, plain data (no torch), so that the serving layer and
the page make one without importing the models (docs/DESIGN.md §10)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Run:
    """How one question runs among others (all optional).

    cancelled: polled between decoding steps; once True every mode stops where it is ("cancelled").
    seconds: each mode's own share of wall-clock time, counted from when that mode starts; past
    it the mode stops where it is ("time_limit"), and the next mode starts with its own share.
    share: wraps a generator so that its model calls take turns with other requests' (the
    server's StepScheduler, which batches decoding steps)."""

    cancelled: Callable[[], bool] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    share: Callable[[Any], Any] | None = None

    def stop_for(self, mode: str) -> Callable[[], str | None]:
        """The engine's stop check of one mode, its share counted from now."""
        deadline = time.monotonic() + self.seconds[mode] if mode in self.seconds else None

        def stop() -> str | None:
            if self.cancelled is not None and self.cancelled():
                return "cancelled"
            if deadline is not None and time.monotonic() > deadline:
                return "time_limit"
            return None
        return stop

    def gated(self, gen):
        return gen if self.share is None else self.share(gen)
