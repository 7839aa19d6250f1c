"""What a request may cost, and how requests share one CPU.

Owns two things the app needs so that no visitor can take the demo down:

* `Budget`: server-side limits (not visitor settings); a request over them is refused with a
  message that says what was asked, what it would cost and what to change. The estimate itself
  is the models' (`rag_demo.models.cost.CostModel`).
How requests share the model's steps is serving/scheduler.py's (`StepScheduler`).
"""
from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30
# Model events running at once: a class of twenty asking together is served in one batched step
# (serving/scheduler.py), so the queue must hand them all to the model lane at once.
MODEL_CONCURRENCY = 20


@dataclass
class Budget:
    """Per-request limits of a server. Defaults fit a 16 GB, 2-vCPU Space: the app itself holds
    ~1.55 GB warm, plus at most StackSpec.passage_cache_mb (160 MiB) of kept passages and
    StackSpec.hidden_cache_mb (64 MiB) of kept hidden states: at most 1.8 GB once a class's wave has
    been answered. MODEL_CONCURRENCY requests may be in flight; at most one of them expensive, within
    `max_request_bytes`; the others at the page's defaults hold their own rows' keys and values, tens
    of MB each, while the model serves them in one batched step."""

    # Refuse what would take longer than this (estimated): a visitor waits at most ~this, and
    # the other visitors' questions interleave with it step by step (serving.scheduler.StepScheduler).
    max_seconds: float = 45.0
    # Refuse what would add more than this at its peak (estimated): one expensive request at a time, beside
    # the app and a class's cheap ones, within a 16 GB Space.
    max_request_bytes: int = 3 * GiB
    # Wall clock per request, less what it waits while the model serves other visitors (runs.Run.waited):
    # decoding stops and returns what it has, marked "time_limit". Above
    # max_seconds so an honest estimate finishes, bounded so a bad estimate cannot hold the lane.
    time_limit_s: float = 60.0
    # Estimated seconds above which a request is "expensive": it runs at low priority.
    heavy_seconds: float = 6.0
    # Refuse a learner's sweep (the Results tab) estimated above this in all: its answers run one
    # after another at low priority, so it delays nobody, but it holds the one expensive slot.
    max_sweep_seconds: float = 600.0
    # Refuse an upload whose embedding would take longer than this: priced from its first batch's own
    # seconds, the rest run batch by batch between the other visitors' model steps (embed_turn).
    max_upload_seconds: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_seconds", "time_limit_s", "heavy_seconds", "max_sweep_seconds", "max_upload_seconds"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}={v!r} must be a positive number of seconds.")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes={self.max_request_bytes!r} must be a positive number of bytes.")

    def upload_refusal(self, first_seconds: float, done: int, total: int, passages: int) -> str | None:
        """Why an upload's embedding is refused (None: admitted). Its price is the first batch's own
        seconds scaled to the whole: seconds ~= first_seconds * total / done, where done and total
        are the passages' lengths (tokens) in the first batch and in all; the first batch holds
        the longest passages, so the price errs high."""
        seconds = first_seconds * total / max(1, done)
        if seconds <= self.max_upload_seconds:
            return None
        share = max(1, int(100 * self.max_upload_seconds / seconds))
        return (f"Your documents hold {passages:,} passages; embedding them would take about {seconds:.0f} s on "
                f"this server, over the limit of {self.max_upload_seconds:.0f} s for an upload: upload fewer or "
                f"smaller files (about {share}% of this much text fits).")
