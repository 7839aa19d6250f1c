"""Answers that only repeat the question (RagSettings.echo_retries).

Owns one test: is an answer nothing but a run of the question's own words? SmolLM2-135M,
handed a passage about Sherlock Holmes and asked who wrote Sherlock Holmes, often answers
"Sherlock Holmes": the subject of its passage, which the question already named. Such an answer
cannot be right (whatever is asked for, it is not the thing the question already says), so the
engine decodes it again with its first token banned (engine._without_echoes). Measured on saved
answers before this existed: of 119 hand-labelled external questions, 20-23 answers per RAG mode
were echoes and 1 of them was right; on the 80 dev questions 2 were, none right.
"""
from __future__ import annotations

from .evaluate import normalize_answer


def echoes_question(answer: str, question: str) -> bool:
    """True when the answer, SQuAD-normalised (lower case, no punctuation or articles), is a
    non-empty run of whole words of the normalised question: "Sherlock Holmes." echoes "Who
    created Sherlock Holmes?", "Arthur Conan Doyle" and "Holmesian" do not."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(question)} "
