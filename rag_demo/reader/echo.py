"""Answers that only repeat the question, or say nothing (RagSettings.echo_retries).

Owns the tests: is an answer nothing but a run of the question's own words, the name of what the
question is about (`names_question_subject`), no name at all ("He.", `says_nothing`), or a name
copied from the prompt's invented worked examples (`copies_example`)? SmolLM2-135M,
handed a passage about Sherlock Holmes and asked who wrote Sherlock Holmes, often answers
"Sherlock Holmes": the subject of its passage, which the question already named. Such an answer
cannot be right (whatever is asked for, it is not the thing the question already says), so the
engine decodes it again with its first token banned (engine._without_echoes). How often it
happens, and what retrying gains: experiments/README.md.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import SequenceMatcher

from rag_demo.reader.text import normalize_answer


def echoes_question(answer: str, question: str) -> bool:
    """True when the answer, SQuAD-normalised (lower case, no punctuation or articles), is a
    non-empty run of whole words of the normalised question: "Sherlock Holmes." echoes "Who
    created Sherlock Holmes?", "Arthur Conan Doyle" and "Holmesian" do not."""
    a = normalize_answer(answer)
    return bool(a) and f" {a} " in f" {normalize_answer(question)} "


# Words that name nothing on their own: an answer made only of them ("He.", "A.", "It.") answers
# no question, whatever it asks (normalize_answer has already dropped "a", "an", "the").
_EMPTY_WORDS = frozenset({"he", "she", "it", "they", "him", "her", "his", "its", "their", "them", "this", "that",
                          "these", "those", "there", "here", "i", "we", "you", "what", "which", "one",
                          "and", "or", "of", "in", "on", "to"})


def says_nothing(answer: str) -> bool:
    """True when the answer, SQuAD-normalised, is empty or only pronouns, articles and
    connectives ("He.", "A.", "The.", "": an answer that names nothing; "He was" is not one, "was"
    being a word of its own). The engine retries it like an echo (RagSettings.echo_retries)."""
    return all(w in _EMPTY_WORDS for w in normalize_answer(answer).split())


# Words a title may hold that a question need not repeat ("Parliament of South Africa").
_GLUE = frozenset({"of", "and", "in", "on", "at", "for", "to", "de", "la", "le", "von", "van"})


def _same_word(title_word: str, question_word: str) -> bool:
    """A question's word names a title's word: the same, the title's word with a suffix
    ("Madonna's" -> "madonnas"), or one slip of spelling in a word of 4+ letters ("Noble" for
    "Nobel": the same first letter and length, at least 80% alike)."""
    if question_word == title_word:
        return True
    if len(title_word) >= 3 and question_word.startswith(title_word) and len(question_word) - len(title_word) <= 2:
        return True
    return (len(title_word) >= 4 and len(question_word) == len(title_word) and question_word[0] == title_word[0]
            and SequenceMatcher(None, title_word, question_word).ratio() >= 0.8)


def _lead_name(text: str) -> str:
    """What a Wikipedia lead opens with, the subject's full name: the text before its first " is ",
    " was ", " are ", " were ", "(" or "," ("Alfred Bernhard Nobel was a Swedish chemist ..." ->
    "Alfred Bernhard Nobel")."""
    return re.split(r"\s(?:is|was|are|were)\s|\(|,", text, maxsplit=1)[0]


def names_question_subject(answer: str, question: str, passages: Iterable[tuple[str, str]]) -> bool:
    """True when the answer only names the thing the question is about: for some retrieved
    passage (title, text) whose title the question names (each of the title's words, its
    parenthesised part and glue words aside, matches a question word, `_same_word`), the answer
    shares a word with the title and every answer word is one of the question's or of the
    passage's lead name (`_lead_name`). Over a passage "Fidel Alejandro Castro Ruz was a Cuban
    revolutionary ...", "Fidel Alejandro Castro." names the subject of "What dictator did Fidel
    Castro force out?"; "Mexico City" does not for "What is the capital of Mexico?" ("city" is
    neither the question's nor Mexico's name), nor "William Shakespeare" for "Who wrote Hamlet?"
    (the question does not name him)."""
    a = normalize_answer(answer).split()
    if not a:
        return False
    q = normalize_answer(question).split()
    for title, text in passages:
        words = [w for w in normalize_answer(re.sub(r"\s*\([^)]*\)", "", title)).split() if w not in _GLUE]
        if not words or not set(words) & set(a):
            continue
        if all(any(_same_word(w, x) for x in q) for w in words) and \
                set(a) <= set(q) | set(normalize_answer(_lead_name(text)).split()) | set(words):
            return True
    return False


def copies_example(answer: str, names: Iterable[str], passages: Iterable[str] = ()) -> bool:
    """True when the answer names one of the worked examples' invented `names`
    (generators.EXAMPLE_NAMES) that no `passages` text (what the generator read) holds, so a real
    passage that happens to use the word still lends it. SQuAD-normalised, a name is a run of
    whole words of the answer ("Tomas Reyl.", "The Veltrania Dam.", "Lake Kessal."), and a
    one-word name of 5+ letters also opens a word ("The Veltranian.", "Lake Kessalik.": the
    model's variants). "Philip Glass" does not copy "Glass Harbour", nor "Kesselring" "Kessal"."""
    words = normalize_answer(answer).split()
    a = f" {' '.join(words)} "
    read = None  # the passages, normalised only once a name is found (rare: most answers name none)
    for name in names:
        n = normalize_answer(name)
        if not n:
            continue
        if " " not in n and len(n) >= 5:
            hit = any(w.startswith(n) for w in words)
        else:
            hit = f" {n} " in a
        if hit:
            read = read if read is not None else [f" {normalize_answer(t)} " for t in passages]
            if not any(f" {n}" in r for r in read):
                return True
    return False
