"""What the generators read: the prompts' instructions, the short-answer cue, and the token ids an
extractive answer may copy (`Span`) or a decoder-only prompt keeps of its passage (`Prompt`).

The adapters (models/decoder_only.py, models/encoder_decoder.py) build each (question, passage)
prompt from these; the reader's worked examples are in reader/examples.py.
"""
from __future__ import annotations

import re
from typing import Sequence




SYSTEM_PROMPT = "Answer the question in a few words, using the passage."
CLOSED_BOOK_SYSTEM_PROMPT = "Answer the question with a short phrase."
# answer_style="short" (RagSettings): ask for a span, as the paper's NQ answers are; the
# assistant turn is opened with SHORT_ANSWER_CUE (prompt tokens, neither generated nor scored,
# like BART's decoder start token), so the model's habit "The answer is: X. ..." becomes the
# span " X"; the answer ends at the first line end or sentence-final period (`stop_token_ids`).
# SmolLM2-135M ignored the instruction alone ("The answer is: San Diego, California."), and
# without the cue one worked example did not shorten its answers either; with the cue, the two
# WORKED_EXAMPLES below do (experiments/README.md).
# The closed-book prompt asks the same.
SHORT_ANSWER_CUE = "The answer is:"
SHORT_SYSTEM_PROMPT = (
    "Answer with the shortest phrase from the passage that answers the question: "
    "a name, a place, a date or a number, not a sentence."
)
SHORT_CLOSED_BOOK_SYSTEM_PROMPT = (
    "Answer with the shortest phrase that answers the question: a name, a place, a date or a number, not a sentence."
)


class Prompt(list):
    """A decoder-only prompt's token ids (a list, usable wherever one is) with where its passage
    lies: `passage` = (start, end), the whole tokens [start, end) holding the passage's "title:
    text" (None: no passage, or its tokens could not be told apart). `DecoderOnlyGenerator.prefill`
    keeps those tokens' keys and values for later questions (PassageKVCache); any split is exact,
    this one makes a passage's tokens the same in every prompt that reads it. `opening`: how many
    leading tokens every question's prompt of the same format shares (system prompt, worked
    examples, the last turn's header; None: not known), the prefix a one-row prefill holds once."""

    def __init__(self, ids: Sequence[int], passage: tuple[int, int] | None = None, opening: int | None = None):
        super().__init__(ids)
        self.passage = passage
        self.opening = opening


_JOINERS = ".,'-"  # inside a word or number when between two letters or digits: "68.5", "632,702", "U.S."
# A number's magnitude belongs to it: "242" is not "242 million".
_MAGNITUDE = re.compile(r"\s+(?:thousand|million|billion|trillion)\b", re.IGNORECASE)


def _joined(text: str, p: int) -> bool:
    """Is character position p (the boundary between text[p-1] and text[p]) inside a word or a
    number? "Can|berra", "6|3", "68|.5", "68.|5", "632|,702", "68.5| million", "O|'Brien" are;
    "Paris|, France", "68.5 million| people", "U.S.| dollar", "Dante|'s" (a possessive) are not."""
    if p <= 0 or p >= len(text):
        return False
    a, b = text[p - 1], text[p]
    possessive = b == "'" and text[p + 1: p + 2] in ("s", "S") and not text[p + 2: p + 3].isalnum()
    return ((a.isalnum() and b.isalnum())
            or (a.isalnum() and b in _JOINERS and p + 1 < len(text) and text[p + 1].isalnum() and not possessive)
            or (a in _JOINERS and p >= 2 and text[p - 2].isalnum() and b.isalnum())
            or (a.isdigit() and _MAGNITUDE.match(text, p) is not None))


class Span(list):
    """A passage's token ids that an extractive answer may copy (a list, usable wherever one is),
    with where a copy may start and end: `starts` holds the positions j whose token opens a word,
    `stops` the positions j such that a copy ending with token j-1 ends a word (len(self)
    included). None: anywhere. Without them a copy could stop inside a number and splice two:
    the model starts its remembered "68", the passage offers "63" (of "632,702"), and "63." ends."""

    def __init__(self, ids, starts: frozenset[int] | None = None, stops: frozenset[int] | None = None):
        super().__init__(ids)
        self.starts, self.stops = starts, stops

    @classmethod
    def from_offsets(cls, ids: list[int], text: str, offsets: list[tuple[int, int]]) -> "Span":
        """ids with their character offsets in `text` (a fast tokenizer's offset_mapping)."""
        starts = frozenset(j for j, (a, _) in enumerate(offsets) if not _joined(text, a))
        stops = frozenset(j + 1 for j, (_, b) in enumerate(offsets) if not _joined(text, b))
        return cls(ids, starts, stops | {len(ids)})
