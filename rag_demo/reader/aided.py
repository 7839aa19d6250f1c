"""The reader aids of one question, attached to the paper's algorithm as its hooks (`AidedReader`).

Each aid is one of ReaderAids' knobs and lives in its own module; this one wires them to the
hooks of rag_demo.rag.hooks.Reader:

    prior        the generator's vote on p(z|x) (question_weight; UPR, Sachan et al. 2022)
    processors   extractive spans (extractive, copy_min_prior: spans.py) and context contrast
                 (context_contrast: contrast.py)
    review       answers that only echo the question, decoded again (echo_retries, echo_subjects:
                 echo.py, retries.py)
    candidates   each passage's title as an answer of its own (title_candidates: drafts.py)
    choose_token RAG-Token weighs each passage's drafts (token_drafts: drafts.py)

The prompt's aids (worked_examples, question_position, recase_question, passage_sentences) shape
what the generator reads and are applied by the pipeline before the engine runs.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from rag_demo.config import Decoding, ReaderAids
from rag_demo.models import Doc
from rag_demo.models.generators import DECODER_ONLY, Generator
from rag_demo.rag.decoding import Hyp, LogitsProcessor
from rag_demo.rag.hooks import PAPER, Choice, Prefilled, Reader, Search
from rag_demo.rag.marginalize import doc_log_prior
from rag_demo.reader.contrast import Contrast
from rag_demo.reader.drafts import choose_among_drafts, with_titles
from rag_demo.reader.echo import copies_example, echoes_question, names_question_subject, says_nothing
from rag_demo.reader.examples import EXAMPLE_NAMES, WORKED_EXAMPLES
from rag_demo.reader.retries import Rejects, retry_rejected
from rag_demo.reader.spans import SpanConstraint, copy_sources


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
    """The aids of one question, for one generator and one mode.

    question: the question as the generator reads it; fed: the passages as it reads them (none
    for closed-book); prompts: their prompts; passages: (title, text) of the retrieved passages,
    whose subjects an echo may name; rejects: the test of answers no question can want (default:
    `rejects_for` this question)."""

    def __init__(self, aids: ReaderAids, d: Decoding, gen: Generator, question: str, fed: Sequence[Doc],
                 prompts: list[list[int]], passages: Sequence[tuple[str, str]] = (), closed_book: bool = False,
                 rejects: Rejects | None = None):
        self.aids, self.d = aids, d
        decoder_only = gen.kind == DECODER_ONLY
        # the token ids an answer may copy (extractive), and each passage's title as an answer of its own
        self.spans = [gen.span_ids(p, d.max_doc_tokens) for p in fed] if aids.extractive and decoder_only else None
        self.titles = ([gen.title_answer_ids(p.title) for p in fed]
                       if aids.title_candidates and d.answer_style == "short" and decoder_only else None)
        # where the question sits in the prompts, for the generator's vote on p(z|x)
        self.tail = gen.common_question_tail(prompts, question) if aids.question_weight and not closed_book else None
        self.keep_prompt_logprobs = sum(self.tail) if self.tail else 0
        self.rejects = rejects or rejects_for(gen, question, aids, passages if aids.echo_subjects else (),
                                              [f"{p.title} {p.text}" for p in fed])
        self.contrast_prompt = prompt(gen, question, None, d, aids) if aids.context_contrast and not closed_book else None
        self._contrast = None  # the closed-book row's prefill, made when a search first needs it
        self.drafts = drafts_of(aids) and not closed_book
        self.decodes_again = aids.echo_retries > 0 or self.drafts
        self.key = ("aided", tuple(aids.model_dump().items()), _ids(self.spans), _ids(self.titles))

    def prior(self, logits: torch.Tensor, prompt_lp: torch.Tensor | None, temperature: float
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """With the generator's vote: log p(z|x) = log_softmax_z((logits_z + w · log p_G(x|z)) / T),
        log p_G(x|z) the generator's log-likelihood of the question's tokens after passage z, read
        from the prefill's logits at no extra cost. T tempers the vote too: a vote of tens of nats
        would otherwise leave the temperature nothing to flatten."""
        if not self.tail:
            return PAPER.prior(logits, prompt_lp, temperature)
        question_lp = prompt_lp[:, : self.tail[0]].sum(-1)  # (K,) log p_G(x|z)
        return voted_prior(logits, question_lp, self.aids.question_weight, temperature), question_lp

    def processors(self, q: Prefilled, kind: str, groups: list[int]) -> list[LogitsProcessor]:
        if kind == "closed_book":
            return []
        out: list[LogitsProcessor] = []
        contrast = self._contrast_prefill(q)
        if contrast is not None:
            out.append(Contrast.start(q.gen, *contrast, self.aids.context_contrast, len(groups), q.ends))
        if self.spans is not None:  # RAG-Token copies from the passages it reads, each passage's search its own
            sets = ([copy_sources(q.prior, self.aids.copy_min_prior)] * len(groups) if kind == "mixture"
                    else [[z] for z in groups])
            out.append(SpanConstraint(self.spans, sets, q.ends))
        return out

    def _contrast_prefill(self, q: Prefilled):
        """(state with one row, first log-probs (1, V)) of the question without passages, which every
        contrasted search copies; None when off or not greedy (the contrast is greedy only)."""
        if self.contrast_prompt is None or q.d.num_beams > 1:
            return None
        if self._contrast is None:
            lp0, state0 = q.gen.prefill([self.contrast_prompt])  # (1, V)
            self._contrast = (state0, lp0)
        return self._contrast

    def review(self, search: Search, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        if not self.aids.echo_retries:
            return hyps
        return retry_rejected(search, hyps, self.rejects, self.aids.echo_retries)

    def candidates(self, q: Prefilled, hyps: list[list[Hyp]]) -> list[list[Hyp]]:
        return with_titles(q, hyps, self.titles, self.rejects) if self.titles else hyps

    def choose_token(self, q: Prefilled, mixture: list[Hyp]) -> Choice:
        if not self.drafts:
            return PAPER.choose_token(q, mixture)
        return choose_among_drafts(q, mixture, self.rejects if self.aids.echo_retries else None)


def voted_prior(logits: torch.Tensor, question_lp: torch.Tensor, weight: float, temperature: float) -> torch.Tensor:
    """log p(z|x) = log_softmax_z((logits_z + w · log p_G(x|z)) / T): logits (K,) the retriever's
    scale · q(x)·d(z), question_lp (K,) the generator's log p_G(x|z)."""
    # the doc log-prior: the retriever's logits plus w times the reader's vote, tempered together
    return doc_log_prior((logits + weight * question_lp) / temperature)  # (K,)


def _ids(lists) -> tuple | None:
    return None if lists is None else tuple(map(tuple, lists))
