"""The chat prompt of a decoder-only generator (SmolLM2's chat template): the turns for a question and
one passage (or none: closed-book), with worked examples before them; the prompt's token ids and
where the passage's tokens lie in them; the short answer style's stop rule; the spans an extractive
answer may copy, and a passage's title as an answer. It needs only a tokenizer, so it is tested
apart from the KV runtime that runs the prompts (decoder_only.py), as transformers keeps chat
templates apart from its caches.
"""
from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from typing import Sequence

from rag_demo.models import Doc
from rag_demo.models.abbreviations import NOT_ANSWER_ENDS
from rag_demo.models.prompts import (
    CLOSED_BOOK_SYSTEM_PROMPT, SHORT_ANSWER_CUE, SHORT_CLOSED_BOOK_SYSTEM_PROMPT, SHORT_SYSTEM_PROMPT,
    SYSTEM_PROMPT, Prompt, Span,
)
from rag_demo.models.stopping import StopRule


# Prompts a format remembers, the least recently used dropped first: a request builds each of its
# prompts more than once (its price, then its run; each mode and aid that reads a passage); kept as
# int32 arrays, not lists of ints (docs/results.md §3.6).
PROMPTS_KEPT = 256


class ChatFormat:
    """The prompt format of a chat LM, from its tokenizer and its end-of-sequence ids."""

    def __init__(self, tokenizer, eos_token_ids: list[int]) -> None:
        self.tokenizer, self.eos_token_ids = tokenizer, eos_token_ids
        self._prompts: OrderedDict = OrderedDict()  # key -> (ids array, passage, opening)
        self._prompts_lock = threading.Lock()  # visitors' threads build prompts at once

    def messages(self, question: str, doc: Doc | None, max_doc_tokens: int, style: str = "sentence",
                 question_position: str = "after", examples: Sequence[tuple] = ()) -> list[dict]:
        """The chat turns for one doc (None: closed-book). question_position "both" puts the
        question before the passage as well as after it (RagSettings.question_position);
        `examples` (title, passage, question, short answer, sentence answer): worked examples that come
        first as earlier turns (rag_demo.reader.examples), each asked
        and answered the way the real question is (closed-book: without their passages)."""
        short = style == "short"
        if doc is None:
            system = SHORT_CLOSED_BOOK_SYSTEM_PROMPT if short else CLOSED_BOOK_SYSTEM_PROMPT
            user = lambda q, title, text: f"Question: {q}"  # noqa: E731
        else:
            system = SHORT_SYSTEM_PROMPT if short else SYSTEM_PROMPT
            ask = "" if short else "\nAnswer in a few words."

            def user(q, title, text):
                before = f"Question: {q}\n\n" if question_position == "both" else ""
                return f"{before}{title}: {text}\n\nQuestion: {q}{ask}"

        turns = [{"role": "system", "content": system}]
        for title, text, q, span, sentence in examples:
            answer = f"{SHORT_ANSWER_CUE} {span}." if short else sentence
            turns += [{"role": "user", "content": user(q, title, text)}, {"role": "assistant", "content": answer}]
        text = None if doc is None else self._doc_text(doc, max_doc_tokens)
        turns.append({"role": "user", "content": user(question, None if doc is None else doc.title, text)})
        return turns

    def stop_token_ids(self, style: str = "sentence") -> list[int]:
        """short: EOS, every token that ends a line (its text holds a newline with only
        whitespace after it) and every sentence-final period token ("." alone, or followed by
        whitespace only), so an answer is one phrase; except a period right after an initial or
        a title's abbreviation ("U.S. dollar", "J. K. Rowling", "St. Louis": decoding.StopRule),
        which looks one token back, or after a digit ("68.5 million": a decimal point; a year's
        final period then leaves the end to the model's end of turn or newline). A period after
        any other abbreviation ("Inc.") still ends it."""
        if style != "short":
            return self.eos_token_ids
        if not hasattr(self, "_short_rule"):
            vocab = self.tokenizer.get_vocab()
            ids = sorted(vocab.values())
            texts = self.tokenizer.batch_decode([[i] for i in ids])
            periods = [i for i, t in zip(ids, texts) if t.strip() == "."]
            line_ends = [i for i, t in zip(ids, texts) if "\n" in t and not t.split("\n", 1)[1].strip()]
            initials = [i for i, t in zip(ids, texts)
                        if (len(t.strip()) == 1 and t.strip().isupper()) or t.strip() in NOT_ANSWER_ENDS
                        or (t.strip().isdigit() and t.strip().isascii())]
            self._short_rule = StopRule([*self.eos_token_ids, *line_ends, *periods], soft=periods, after=initials)
        return self._short_rule

    def prompt(self, question, doc, max_doc_tokens, style="sentence", question_position="after", examples=()):
        """A `Prompt`: the chat template's token ids, with where the passage's tokens lie. The same
        arguments give the same prompt, so the last PROMPTS_KEPT are remembered (by question, the
        passage's title and text, and every other argument); each call returns a Prompt of its own."""
        key = (question, None if doc is None else (doc.title, doc.text), max_doc_tokens, style, question_position,
               tuple(tuple(e) for e in examples))
        with self._prompts_lock:
            kept = self._prompts.get(key)
            if kept is not None:
                self._prompts.move_to_end(key)
        if kept is None:
            made = self._prompt(question, doc, max_doc_tokens, style, question_position, examples)
            kept = (array("i", made), made.passage, made.opening)
            with self._prompts_lock:
                self._prompts[key] = kept
                while len(self._prompts) > PROMPTS_KEPT:
                    self._prompts.popitem(last=False)
        return Prompt(kept[0].tolist(), kept[1], kept[2])

    def _prompt(self, question, doc, max_doc_tokens, style, question_position, examples) -> Prompt:
        turns = self.messages(question, doc, max_doc_tokens, style, question_position, examples)
        ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        passage = opening = None
        if doc is not None:
            before = f"Question: {question}\n\n" if question_position == "both" else ""
            passage = self._passage_tokens(turns, ids, before, f"{doc.title}: {self._doc_text(doc, max_doc_tokens)}")
        else:  # closed-book: one row, whose opening a class's questions share (DecoderOnlyGenerator._prefill)
            opening = self._opening_tokens(turns, ids)
        if style == "short":  # open the answer with the cue; the model writes the span after it
            ids += self.tokenizer(SHORT_ANSWER_CUE, add_special_tokens=False)["input_ids"]
        return Prompt(ids, passage, opening)

    def _opening_tokens(self, turns: list[dict], ids: list[int]) -> int | None:
        """How many of `ids` (the chat template's tokens of `turns`) lie wholly before the last turn's
        content: the tokens every question's prompt with the same turns before it shares. None where
        the template's text cannot be matched to its tokens."""
        found = self._content_offsets(turns, ids)
        if found is None:
            return None
        at, offsets = found
        return next((j for j, (_, end) in enumerate(offsets) if end > at), len(ids))

    def _passage_tokens(self, turns: list[dict], ids: list[int], before: str, passage: str) -> tuple[int, int] | None:
        """[start, end): the tokens of `ids` (the chat template's tokens of `turns`) lying wholly
        inside `passage`, which the last turn holds right after `before`. A token that straddles
        either edge (a passage ending in a space merges it with the newline after it) is left
        out, so the same passage gives the same tokens in any prompt. None where the template's
        text cannot be matched to its tokens (a tokenizer without character offsets)."""
        if not turns[-1]["content"].startswith(before + passage):
            return None
        found = self._content_offsets(turns, ids)
        if found is None:
            return None
        at, offsets = found
        a = at + len(before)
        b = a + len(passage)
        start = next((j for j, (x, _) in enumerate(offsets) if x >= a), len(ids))
        end = next((j for j in range(start, len(ids)) if offsets[j][1] > b), len(ids))
        return (start, end) if start < end else None

    def _content_offsets(self, turns: list[dict], ids: list[int]) -> tuple[int, list] | None:
        """(where the last turn's content starts in the template's text, each of `ids`' character
        offsets in that text); None for a tokenizer without offsets, or where the template
        tokenised its text otherwise than `ids`."""
        if not getattr(self.tokenizer, "is_fast", False):
            return None
        text = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
        at = text.rfind(turns[-1]["content"])
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        if at < 0 or list(enc["input_ids"]) != ids:
            return None
        return at, enc["offset_mapping"]

    def title_answer_ids(self, title: str) -> list[int]:
        """A passage's title as a short answer, " Title.", tokenized the way an answer after the cue
        starts (a space, then words) and ends (the sentence-final period: the short style's stop)."""
        return self.tokenizer.encode(f" {title.strip().rstrip('.')}.", add_special_tokens=False)

    def span_ids(self, doc: Doc, max_doc_tokens: int) -> Span:
        """The token ids an extractive answer may copy from `doc`: " title: text" (the text cut as
        in the prompt), tokenized as words after a space, the way an answer after the cue starts;
        with where words start and end (from the tokenizer's character offsets) so a copy takes
        whole words and whole numbers (a slow tokenizer has no offsets: any token then)."""
        text = f" {doc.title}: {self._doc_text(doc, max_doc_tokens)}"
        if not getattr(self.tokenizer, "is_fast", False):
            return Span(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return Span.from_offsets(enc["input_ids"], text, enc["offset_mapping"])

    def _doc_text(self, doc: Doc, max_doc_tokens: int) -> str:
        """The passage text the prompt holds: whole, or cut to its first max_doc_tokens tokens."""
        text_ids = self.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        return doc.text if len(text_ids) <= max_doc_tokens else self.tokenizer.decode(text_ids[:max_doc_tokens])

    def question_tail(self, prompt, question):
        """The last run of the question's tokens (tokenized as " question", as it follows
        "Question:" in `messages`) in the prompt, counted from the end."""
        q = self.tokenizer(f" {question}", add_special_tokens=False)["input_ids"]
        ids, n = list(prompt), len(q)
        for start in range(len(ids) - n - 1, -1, -1):  # at least one token after it (the turn's end)
            if ids[start:start + n] == q:
                return n, len(ids) - start - n
        return None
