"""What the generator reads, as the reader aids set it (step 2b of pipeline.py): the question cased
as the passages write its words (truecase.py), the sentences of each passage it reads (focus.py),
and the reader that runs the engine's hooks (aided.py; the paper's own when no aid is on). The
pipeline asks here and branches on no aid itself.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from rag_demo.config import Decoding, ReaderAids
from rag_demo.knowledge.corpus import Passage
from rag_demo.models.generators import Generator
from rag_demo.rag.hooks import PAPER, Reader
from rag_demo.reader.aided import AidedReader, drafts_of, prompt
from rag_demo.reader.focus import focus_passages
from rag_demo.reader.truecase import recase
from rag_demo.reader.vote import QUESTION_LP


def question_read(aids: ReaderAids, question: str, passages: Sequence[Passage] | None = None) -> str:
    """The question as the generator reads it: cased as `passages` write its words, or with only
    its first letter and "?" when there are none (recase_question), else as typed."""
    if not aids.recase_question:
        return question
    return recase(question, [(p.title, p.text) for p in passages]) if passages is not None else recase(question)


def passages_read(aids: ReaderAids, question_vector: Callable[[], Any], passages: list[Passage], ctx_encoder: Any
                  ) -> tuple[list[Passage], list[list[int]] | None]:
    """(the passages as the generator reads them, the indices of the sentences each keeps or None
    when it reads them whole). question_vector() is the question's embedding (D,), asked for only
    when passage_sentences picks sentences."""
    if not aids.passage_sentences:
        return passages, None
    return focus_passages(question_vector(), passages, ctx_encoder, aids.passage_sentences)


def reader_for(aids: ReaderAids, d: Decoding, gen: Generator, question: str, fed: Sequence[Passage],
               prompts: list[list[int]], passages: Sequence[tuple[str, str]] = (), closed_book: bool = False
               ) -> Reader:
    """The hooks the engine runs with: the aids' (AidedReader) when any is on, else the paper's."""
    if aids == ReaderAids():
        return PAPER
    return AidedReader(aids, d, gen, question, fed, prompts, passages, closed_book=closed_book)


__all__ = ["QUESTION_LP", "drafts_of", "passages_read", "prompt", "question_read", "reader_for"]
