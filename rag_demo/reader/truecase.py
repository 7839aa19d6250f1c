"""The question as the generator reads it (`RagSettings.recase_question`).

Owns one rewrite, made after retrieval and before the prompts are built (step 2b of the
pipeline): a question typed all in lower case ("what did george eastman make") gets the casing
its words have in the retrieved passages ("What did George Eastman make?"). People type
questions to a search box that way (NQ-open and WebQuestions are all lower case), and
SmolLM2-135M reads "george eastman" as a weaker name than "George Eastman". The retriever is
not affected (MiniLM and DPR lower-case their input anyway) and neither are the scores: only the
words in the generator's prompt change.

A run of two to four question words is recased when the passages write it with capitals and
never all in lower case ("south africa" -> "South Africa", "wall street journal" -> "Wall Street
Journal"); then a single word, on the same rule ("paris" -> "Paris"; "war" stays "war" beside a
passage's "Civil War" if the passages also write "war"). A text's sentence-initial words are not
counted (their capital says nothing); titles are. A question typed with any capital after its
first letter is the person's own casing and is kept. With or without passages the first letter
is raised and a missing question mark added (the closed-book prompt gets that much).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_WORD = re.compile(r"[^\W_]+")  # letters and digits: "Abdul-Jabbar" -> "Abdul", "Jabbar"
_JOIN = re.compile(r"[\s.'’-]{1,3}")  # what may stand between two words of one phrase ("St. Helens")
_SENTENCE_START = re.compile(r"[.!?]['\")\]]*\s+$")  # what precedes a sentence's first word
_QUESTION_WORDS = frozenset({"who", "what", "when", "where", "which", "why", "how", "whom", "whose"})
MAX_PHRASE = 4


def _adjacent(text: str) -> list[list[re.Match]]:
    """The text's words as runs of adjacent words (joined by spaces, hyphens, periods or
    apostrophes only), in order."""
    runs: list[list[re.Match]] = []
    for m in _WORD.finditer(text):
        if not runs or not _JOIN.fullmatch(text[runs[-1][-1].end() : m.start()]):
            runs.append([])
        runs[-1].append(m)
    return runs


def _runs(text: str) -> list[list[tuple[str, bool]]]:
    """`_adjacent`'s runs, each word with whether it starts a sentence."""
    return [[(m.group(), not text[: m.start()].strip()
              or bool(_SENTENCE_START.search(text[max(0, m.start() - 8) : m.start()]))) for m in run]
            for run in _adjacent(text)]


def phrase_forms(passages: Iterable[tuple[str, str]]) -> dict[tuple[str, ...], Counter]:
    """For each run of 1-4 words of the passages (lower case), how often each spelling of it
    appears; a text's runs that open a sentence are not counted, a title's are."""
    forms: dict[tuple[str, ...], Counter] = {}
    for title, text in passages:
        for source, is_title in ((title or "", True), (text or "", False)):
            for run in _runs(source):
                for i, (_, initial) in enumerate(run):
                    if initial and not is_title:
                        continue
                    for n in range(1, MAX_PHRASE + 1):
                        words = tuple(w for w, _ in run[i : i + n])
                        if len(words) == n:
                            forms.setdefault(tuple(w.lower() for w in words), Counter())[words] += 1
    return forms


def recase(question: str, passages: Iterable[tuple[str, str]] = ()) -> str:
    """`question` with its all-lower-case words written as the passages (title, text) write
    them (module docstring), the first letter raised and "?" added when it ends without . ! or
    ? (quotes aside). Other characters are kept."""
    question = " ".join(question.split())
    if question[1:] == question[1:].lower():  # typed with capitals: the person's casing stands
        forms = phrase_forms(passages)
        matches, runs = [], []  # the question's words; runs of indices into them, adjacent as in passages
        for run in _adjacent(question):
            runs.append(list(range(len(matches), len(matches) + len(run))))
            matches += run
        new = [m.group() for m in matches]
        done = [False] * len(matches)
        for n in range(MAX_PHRASE, 0, -1):
            for run in runs:
                for i in range(len(run) - n + 1):
                    idx = run[i : i + n]
                    if any(done[j] for j in idx) or (n == 1 and new[idx[0]] in _QUESTION_WORDS):
                        continue
                    key = tuple(new[j] for j in idx)
                    seen = forms.get(key)
                    if not seen or seen[key]:  # never in the passages, or written there in lower case too
                        continue
                    best = seen.most_common(1)[0][0]
                    for j, w in zip(idx, best):
                        new[j], done[j] = w, True
        parts, at = [], 0
        for m, w in zip(matches, new):
            parts += [question[at : m.start()], w]
            at = m.end()
        question = "".join(parts) + question[at:]
    if question and question[0].islower():
        question = question[0].upper() + question[1:]
    if question and question.rstrip("\"'’”)]")[-1:] not in (".", "!", "?"):
        question += "?"
    return question
