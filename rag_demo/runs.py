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
    # seconds this request has waited while the model served other requests (serving.scheduler's
    # WaitClock): not charged to its shares, so a class asking at once is not cut for the queue
    waited: Callable[[], float] | None = None

    def stop_for(self, mode: str) -> Callable[[], str | None]:
        """The engine's stop check of one mode, its share counted from now, less the time it waits
        for other requests' model calls (`waited`)."""
        deadline = time.monotonic() + self.seconds[mode] if mode in self.seconds else None
        waited0 = self.waited() if self.waited is not None else 0.0

        def stop() -> str | None:
            if self.cancelled is not None and self.cancelled():
                return "cancelled"
            queued = self.waited() - waited0 if self.waited is not None else 0.0
            if deadline is not None and time.monotonic() - queued > deadline:
                return "time_limit"
            return None
        return stop

    def gated(self, gen):
        return gen if self.share is None else self.share(gen)
