"""The one split rule: every question of every file is in "train", "calibrate" or "report".

    split(id) = "train"      if id is in SEEN (an earlier round chose something on it)
                "train"      if h(id) < 0.4
                "calibrate"  if h(id) < 0.7
                "report"     otherwise,        h(id) = first 8 bytes of sha256(id) / 2^64

Training reads only "train" (and pairs made from the corpus, never from a report question); the
confidence and cost fits read only "calibrate"; every number the project reports about a fit or a
training run comes from "report". The hash needs nothing but the id, so a question keeps its split
whatever file or sample it appears in. SEEN (assets/split_seen.json) lists the ids of the external
file that the reader aids or the old confidence were chosen on: they can never be in "report".
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Iterable, TypeVar

SPLITS = ("train", "calibrate", "report")
CUTS = (0.4, 0.7)  # h(id) below 0.4: train; below 0.7: calibrate; else report
SEEN_FILE = Path(__file__).resolve().parent.parent / "assets" / "split_seen.json"

T = TypeVar("T")


@lru_cache(maxsize=1)
def seen_ids() -> frozenset[str]:
    """The ids an earlier round chose something on (assets/split_seen.json), always "train"."""
    groups = json.loads(SEEN_FILE.read_text(encoding="utf-8"))["groups"]
    return frozenset(i for g in groups.values() for i in g["ids"])


def hash_fraction(question_id: str) -> float:
    """h(id) in [0, 1): the first 8 bytes of sha256(id) as a fraction of 2^64."""
    return int.from_bytes(hashlib.sha256(str(question_id).encode()).digest()[:8], "big") / 2**64


def split_of(question_id: str) -> str:
    """The split of one question id (see the module docstring)."""
    if str(question_id) in seen_ids():
        return "train"
    h = hash_fraction(question_id)
    return "train" if h < CUTS[0] else "calibrate" if h < CUTS[1] else "report"


def check_split(name: str) -> str:
    if name not in SPLITS:
        raise ValueError(f"split={name!r} is unknown: use one of {', '.join(SPLITS)}.")
    return name


def in_split(items: Iterable[T], name: str, key=lambda it: it.meta["id"]) -> list[T]:
    """The items whose id (key(item)) falls in split `name`, in their order."""
    check_split(name)
    return [it for it in items if split_of(key(it)) == name]
