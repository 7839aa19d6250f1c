"""The models: generator adapters and their KV caches, encoders, the two stacks, the cost of generator work."""
from __future__ import annotations

from typing import Protocol


class Doc(Protocol):
    """What a model reads of a passage: its title and text (rag_demo.knowledge.corpus.Passage is one)."""

    title: str
    text: str
