"""The one list of abbreviations whose period need not end a sentence, and what each of its two
readers does with it: the passage chunker (knowledge/chunking.py: does "X." before a capitalised
word end a sentence?) and the short answer's stop rule (models/decoder_only.py: does a period
right after X end the answer?).
"""
from __future__ import annotations

from typing import NamedTuple


class Abbreviation(NamedTuple):
    """ends_answer: a short answer may end at its period ("Martin Luther King Jr.", "No."); a title
    before a name may not ("St. Louis"). chunker_reads: the chunker reads it, and splits no sentence after it.
    The six military and clergy titles are False there: the Vital Articles index was cut without
    them, and adding them would re-cut it and change every shipped result (docs/DESIGN.md §2)."""

    ends_answer: bool
    chunker_reads: bool = True


ABBREVIATIONS = {
    # titles and place names before a name
    "St": Abbreviation(False), "Mt": Abbreviation(False), "Dr": Abbreviation(False), "Mr": Abbreviation(False),
    "Mrs": Abbreviation(False), "Ms": Abbreviation(False),
    "Ft": Abbreviation(False, False), "Gen": Abbreviation(False, False), "Lt": Abbreviation(False, False),
    "Sgt": Abbreviation(False, False), "Capt": Abbreviation(False, False), "Rev": Abbreviation(False, False),
    # after a name or inside a phrase: an answer may end with them
    "Jr": Abbreviation(True), "Sr": Abbreviation(True), "vs": Abbreviation(True), "No": Abbreviation(True),
    "e.g": Abbreviation(True), "i.e": Abbreviation(True), "c": Abbreviation(True), "ca": Abbreviation(True),
}

# What the stop rule reads: a period right after one of these does not end a short answer
NOT_ANSWER_ENDS = frozenset(a for a, x in ABBREVIATIONS.items() if not x.ends_answer)
# What the chunker reads: "x." (lower case) before a capitalised word does not end a sentence
NOT_SENTENCE_ENDS = frozenset(f"{a.lower()}." for a, x in ABBREVIATIONS.items() if x.chunker_reads)
