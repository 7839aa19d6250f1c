"""The reader aids of one question, attached to the paper's algorithm as its hooks (`AidedReader`).

Each aid is one of ReaderAids' knobs, lives in its own module and is a part (part.Aid) that
implements the hooks it needs; the aided reader is the list of them (`AidedReader.parts`):

    prompt       worked examples first, the question where question_position puts it (`prompt`);
                 the question cased as the passages write it and the sentences each passage keeps
                 (recase_question, passage_sentences: reading.py)
    prior        the generator's vote on p(z|x) (question_weight: vote.QuestionVote; UPR)
    processors   context contrast (context_contrast: contrast.ContextContrast) and extractive
                 spans (extractive, copy_min_prior: spans.Extractive)
    review       answers that only echo the question, decoded again (echo_retries, echo_subjects:
                 retries.EchoRetries, echo.py)
    candidates   each passage's title as an answer of its own (title_candidates: drafts.TitleCandidates)
    choose_token RAG-Token weighs each passage's drafts (token_drafts: drafts.TokenDrafts)

`listed` names the parts a settings object turns on.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from rag_demo.config import Decoding, ReaderAids
from rag_demo.models import Doc
from rag_demo.models.generators import DECODER_ONLY, Generator
from rag_demo.rag.decoding import Hyp, LogitsProcessor
from rag_demo.rag.hooks import PAPER, Choice, Prefilled, Reader, Search
from rag_demo.reader.contrast import ContextContrast
from rag_demo.reader.drafts import TitleCandidates, TokenDrafts
from rag_demo.reader.echo import copies_example, echoes_question, names_question_subject, says_nothing
from rag_demo.reader.examples import EXAMPLE_NAMES, WORKED_EXAMPLES
from rag_demo.reader.part import Aid
from rag_demo.reader.retries import EchoRetries, Rejects
from rag_demo.reader.spans import Extractive
from rag_demo.reader.vote import QuestionVote

# The aids that shape what the generator reads, by knob: they are applied before the engine runs
# (`prompt` here, reading.py), so they have no engine hook. Every other knob is a part's.
PROMPT_AIDS = {
    "worked_examples": "invented passages asked and answered first (prompt)",
    "question_position": "the question before the passage as well (prompt)",
    "recase_question": "the question cased as the passages write it (reading.question_read)",
    "passage_sentences": "only the passage's sentences nearest the question (reading.passages_read)",
}
# The parts, in the order AidedReader composes them (its processors run in this order: contrast
# reweighs, then the spans mask)
PARTS = (QuestionVote, ContextContrast, Extractive, EchoRetries, TitleCandidates, TokenDrafts)
# Knobs that tune another aid's part rather than add one: knob -> the aid it tunes
TUNES = {"copy_min_prior": "extractive", "echo_subjects": "echo_retries"}


def prompt(gen: Generator, question: str, doc: Doc | None, d: Decoding, aids: ReaderAids) -> list[int]:
    """The generator's input for one passage (None: closed-book, the question alone), with the
    prompt's aids: the worked examples first, the question where `question_position` puts it."""
    examples = WORKED_EXAMPLES[: aids.worked_examples]
    if doc is None:
        return gen.prompt(question, None, d.max_doc_tokens, d.answer_style, examples=examples)
    return gen.prompt(question, doc, d.max_doc_tokens, d.answer_style, aids.question_position, examples)


def drafts_of(aids: ReaderAids) -> bool:
    """Whether RAG-Token weighs each passage's drafts (token_drafts): contrast decoding has its own
    rule for choosing tokens, so the drafts stay out of it."""
    return aids.token_drafts and not aids.context_contrast


def rejects_for(gen: Generator, question: str, aids: ReaderAids, subjects: Sequence[tuple[str, str]] = (),
                read: Sequence[str] = ()) -> Rejects:
    """The test of an answer (token ids) no question can want: it only repeats words of the
    question, names nothing (echo.says_nothing), names a worked example's invented name that no
    passage read holds (echo.copies_example; decoder-only), or (subjects (title, text) given,
    echo_subjects) only names a retrieved passage's subject that the question names."""
    names = [n for ex in EXAMPLE_NAMES[: aids.worked_examples] for n in ex] if gen.kind == DECODER_ONLY else []

    def rejects(tokens: list[int]) -> bool:
        text = gen.decode(tokens)
        return (echoes_question(text, question) or says_nothing(text) or copies_example(text, names, read)
                or names_question_subject(text, question, subjects))
    return rejects


class AidedReader(Reader):
    """The aids of one question, for one generator and one mode: the paper's reader with `parts`.

    question: the question as the generator reads it; fed: the passages as it reads them (none
    for closed-book); prompts: their prompts; passages: (title, text) of the retrieved passages,
    whose subjects an echo may name; rejects: the test of answers no question can want (default:
    `rejects_for` this question)."""

    def __init__(self, aids: ReaderAids, d: Decoding, gen: Generator, question: str, fed: Sequence[Doc],
                 prompts: list[list[int]], passages: Sequence[tuple[str, str]] = (), closed_book: bool = False,
                 rejects: Rejects | None = None):
        decoder_only = gen.kind == DECODER_ONLY
        rejects = rejects or rejects_for(gen, question, aids, passages if aids.echo_subjects else (),
                                         [f"{p.title} {p.text}" for p in fed])
        # the token ids an answer may copy (extractive), and each passage's title as an answer of its own
        spans = [gen.span_ids(p, d.max_doc_tokens) for p in fed] if aids.extractive and decoder_only else None
        titles = ([gen.title_answer_ids(p.title) for p in fed]
                  if aids.title_candidates and d.answer_style == "short" and decoder_only else None)
        # where the question sits in the prompts, for the generator's vote on p(z|x)
        tail = gen.common_question_tail(prompts, question) if aids.question_weight and not closed_book else None
        parts: list[Aid | None] = [
            QuestionVote(aids.question_weight, tail) if tail else None,
            ContextContrast(aids.context_contrast, prompt(gen, question, None, d, aids))
            if aids.context_contrast and not closed_book else None,
            Extractive(spans, aids.copy_min_prior) if spans is not None else None,
            EchoRetries(rejects, aids.echo_retries) if aids.echo_retries else None,
            TitleCandidates(titles, rejects) if titles else None,
            TokenDrafts(rejects if aids.echo_retries else None) if drafts_of(aids) and not closed_book else None,
        ]
        self.parts: list[Aid] = sorted((p for p in parts if p is not None), key=lambda p: PARTS.index(type(p)))
        self.rejects = rejects
        self.keep_prompt_logprobs = max((p.keep_prompt_logprobs for p in self.parts), default=0)
        self.keeps_prefill = any(p.keeps_prefill for p in self.parts)
        self.key = ("aided", tuple(aids.model_dump().items()), _ids(spans), _ids(titles))
        self._prior = [p for p in self.parts if "prior" in p.hooks]
        self._chooser = [p for p in self.parts if "choose_token" in p.hooks]
        assert len(self._prior) <= 1 and len(self._chooser) <= 1, "one part sets the prior, one chooses"

    def prior(self, logits: torch.Tensor, prompt_lp: torch.Tensor | None, temperature: float
              ) -> tuple[torch.Tensor, dict]:
        got = self._prior[0].prior(logits, prompt_lp, temperature) if self._prior else None
        return PAPER.prior(logits, prompt_lp, temperature) if got is None else got

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        return [proc for p in self.parts for proc in p.processors(q, kind, groups)]

    def review(self, search: Search, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        for p in self.parts:
            hyps = p.review(search, hyps)
        return hyps

    def candidates(self, q: Prefilled, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        for p in self.parts:
            hyps = p.candidates(q, hyps)
        return hyps

    def choose_token(self, q: Prefilled, mixture: list[Hyp]) -> Choice:
        got = self._chooser[0].choose_token(q, mixture) if self._chooser else None
        return PAPER.choose_token(q, mixture) if got is None else got


def listed(aids: ReaderAids) -> list[tuple[str, str]]:
    """The aids these settings switch on, as (knob, where it attaches): the prompt's aids first, then
    the engine's hooks in the order AidedReader composes them; a knob that tunes another aid is
    listed with it. Whether a part then runs for a question also depends on the generator, the
    answer style and the mode (titles and spans need a decoder-only reader, the drafts step aside
    for context contrast, closed-book has no prior): `AidedReader.parts` is what runs."""
    default = ReaderAids()
    on = [k for k in type(aids).model_fields if getattr(aids, k) != getattr(default, k)]
    out = [(k, PROMPT_AIDS[k]) for k in PROMPT_AIDS if k in on]
    for part in PARTS:
        if part.knob in on:
            tuned = [t for t, of in TUNES.items() if of == part.knob and t in on]
            out.append((part.knob, f"{', '.join(part.hooks)}: {part.__name__}"
                        + (f" (tuned by {', '.join(tuned)})" if tuned else "")))
    return out


def _ids(lists) -> tuple | None:
    return None if lists is None else tuple(map(tuple, lists))
