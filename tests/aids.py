"""A test's reader: the paper's algorithm with the aids its settings switch on (rag_demo.reader.aided)."""
from __future__ import annotations

from rag_demo.config import RagSettings
from rag_demo.reader.aided import AidedReader


def aided(gen, s: RagSettings, prompts, question: str = "", passages=(), rejects=None, closed_book: bool = False):
    """The AidedReader of these settings over these prompts (passages: what the generator read;
    rejects: a stand-in for the echo tests)."""
    return AidedReader(s.aids, s.decoding, gen, question, list(passages), prompts,
                       [(p.title, p.text) for p in passages], closed_book=closed_book, rejects=rejects)
