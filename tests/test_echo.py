"""Answers that only repeat the question (ReaderAids.echo_retries: rag_demo/reader/echo.py, retries.py).

The text test on worked examples; validation; then the engine on a tiny random Llama with
SmolLM2's real tokenizer, where an echo is whatever a stand-in predicate says it is (a random
model never repeats a question by itself): the retried answer avoids the echo's first token,
its log-probs are still the model's own (checked against a teacher-forced pass), a group that
echoes every time keeps its original answer, and 0 retries change nothing. Last, the pipeline
hands the engine its question's echo test.
"""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.rag.decoding import score_candidates  # noqa: E402
from rag_demo.reader.echo import copies_example, echoes_question, names_question_subject, says_nothing  # noqa: E402
from rag_demo.rag.engine import closed_book, rag_sequence, rag_token  # noqa: E402
from rag_demo.rag.marginalize import doc_log_prior, rag_token_logprob  # noqa: E402
from aids import aided  # noqa: E402


@pytest.mark.parametrize("answer, question, echo", [
    ("Sherlock Holmes.", "Who created Sherlock Holmes?", True),
    ("the North Star", "What is the north star called?", True),
    ("Arthur Conan Doyle", "Who created Sherlock Holmes?", False),
    ("Holmesian", "Who created Sherlock Holmes?", False),  # whole words only
    ("Holmes Sherlock", "Who created Sherlock Holmes?", False),  # a run, in order
    ("The.", "Who is the king?", False),  # nothing left once normalised
    ("1780", "When did Maria Theresa die?", False),
])
def test_echoes_question_worked_examples(answer, question, echo):
    assert echoes_question(answer, question) is echo


CASTRO = ("Fidel Castro", "Fidel Alejandro Castro Ruz was a Cuban revolutionary and politician.")
NOBEL = ("Alfred Nobel", "Alfred Bernhard Nobel was a Swedish chemist, inventor and businessman.")
MEXICO = ("Mexico", "Mexico, officially the United Mexican States, is a country in North America.")
BARD = ("William Shakespeare (playwright)", "William Shakespeare was an English playwright and poet.")


@pytest.mark.parametrize("answer, question, passages, named", [
    ("Fidel Alejandro Castro.", "Which ruler did Fidel Castro depose?", [MEXICO, CASTRO], True),  # the lead's full name
    ("Castro", "Which ruler did Fidel Castro depose?", [CASTRO], True),
    ("Fulgencio Batista", "Which ruler did Fidel Castro depose?", [CASTRO], False),
    ("Alfred Nobel.", "What did Alfred Noble invent?", [NOBEL], True),  # a slip of spelling in the question
    ("Alfred Nobel.", "What was Alfred Nobel's invention?", [NOBEL], True),  # the name with a suffix
    ("Nobel was a Swedish chemist.", "What did Alfred Nobel invent?", [NOBEL], False),  # says more than the name
    ("Mexico City", "What is the capital of Mexico?", [MEXICO], False),  # "city" is not Mexico's name
    ("William Shakespeare", "Who wrote Hamlet?", [BARD], False),  # the question does not name him
    ("William Shakespeare", "When was William Shakespeare born?", [BARD], True),  # "(playwright)" aside
    ("Alfred Nobel.", "What did Alfred Nobel invent?", [], False),  # no passages: the setting is off
    ("The.", "What did Alfred Nobel invent?", [NOBEL], False),
])
def test_names_question_subject_worked_examples(answer, question, passages, named):
    assert names_question_subject(answer, question, passages) is named


PASSAGES = ["Alexander Fleming discovered penicillin in 1928.",
            "Mount Kilimanjaro is the highest mountain in Africa.",
            "Hamlet is a tragedy by William Shakespeare."]
QUESTION = "Who discovered penicillin?"


def _prompts(gen):
    from rag_demo.knowledge.corpus import Passage

    return [gen.prompt(QUESTION, Passage(f"d{i}#0", f"doc {i}", p), 64, "short", examples=())
            for i, p in enumerate(PASSAGES)]


SCORES = torch.tensor([2.0, 1.0, 0.5])  # (K,) retriever logits


def _run(mode, gen, s, rejects=None):
    """A RAG mode over the three passages, with the aids `s` switches on (rejects: a stand-in echo test)."""
    return mode(gen, _prompts(gen), SCORES, s.decoding, aided(gen, s, _prompts(gen), QUESTION, rejects=rejects))


def _closed_book(gen, prompt, s, rejects=None):
    return closed_book(gen, prompt, s.decoding, aided(gen, s, [prompt], QUESTION, rejects=rejects, closed_book=True))


class Echo:
    """A stand-in echo test: answers whose first token is in `firsts` echo, and those in `answers`
    (`always`: all do).
    Records every answer it was asked about."""

    def __init__(self, firsts=(), always=False, answers=()):
        self.firsts, self.always, self.answers, self.seen = set(firsts), always, [list(a) for a in answers], []

    def __call__(self, tokens):
        self.seen.append(list(tokens))
        return self.says(tokens)

    def says(self, tokens):
        """The verdict, not recorded."""
        return self.always or (bool(tokens) and tokens[0] in self.firsts) or list(tokens) in self.answers


def _settings(retries, drafts=False):
    """Greedy; RAG-Token's own search alone unless `drafts` (each doc's drafts are RAG-Sequence's, tested below)."""
    return RagSettings(preset="paper", k=3, max_new_tokens=5, answer_style="short", echo_retries=retries,
                       token_drafts=drafts)


def test_rag_token_retries_an_echo_with_its_first_token_banned_and_exact_scores(gen):
    base = _run(rag_token, gen, _settings(0))
    echo = Echo(firsts=[base.tokens[0]])
    out = _run(rag_token, gen, _settings(3), echo)
    assert out.tokens[0] != base.tokens[0] and not echo.says(out.tokens)
    # the new first token is the mixture's best once the banned one is gone
    first_lp, state = gen.prefill(_prompts(gen))  # (K, V)
    prior = doc_log_prior(SCORES)  # (K,)
    mixed = torch.logsumexp(prior[:, None] + first_lp, 0)  # (V,)
    mixed[base.tokens[0]] = float("-inf")
    assert out.tokens[0] == int(mixed.argmax())
    # what was recorded while decoding is the model's own log-prob of each token under each doc
    lp, _ = score_candidates(gen, state, first_lp, [out.tokens], gen.pad_token_id)  # (K, 1, T)
    torch.testing.assert_close(out.doc_lp, lp[:, 0], atol=1e-5, rtol=0)
    assert out.logprob == pytest.approx(float(rag_token_logprob(lp[:, 0], prior)), abs=1e-5)


def test_an_answer_that_echoes_every_time_keeps_the_greedy_one(gen):
    base = _run(rag_token, gen, _settings(0))
    echo = Echo(always=True)
    out = _run(rag_token, gen, _settings(2), echo)
    assert out.tokens == base.tokens and out.logprob == pytest.approx(base.logprob, abs=1e-5)
    firsts = [t[0] for t in echo.seen]
    assert len(echo.seen) == 3 and len(set(firsts)) == 3  # the original, then 2 retries, each a new start


def test_zero_retries_never_asks(gen):
    echo = Echo(always=True)
    base = _run(rag_token, gen, _settings(0))
    out = _run(rag_token, gen, _settings(0), echo)
    assert echo.seen == [] and out.tokens == base.tokens


def test_rag_sequence_retries_each_echoing_doc_on_its_own(gen):
    base = _run(rag_sequence, gen, _settings(0))
    drafts = [c[0] for c in base.candidates]
    echo = Echo(firsts=[drafts[0][0]])  # the first doc's draft (and any starting like it) echoes
    out = _run(rag_sequence, gen, _settings(1), echo)
    new = [c[0] for c in out.candidates]
    assert all(t[0] != drafts[0][0] for t in new)  # no candidate starts like the echo any more
    assert [t for t in new if t in drafts] == [t for t in drafts if t[0] != drafts[0][0]]  # the others stay
    assert out.tokens[0] != drafts[0][0]


def test_closed_book_retries_too(gen):
    prompt = gen.prompt(QUESTION, None, 64, "short", examples=())
    base = _closed_book(gen, prompt, _settings(0))
    out = _closed_book(gen, prompt, _settings(1), Echo(firsts=[base.tokens[0]]))
    assert out.tokens[0] != base.tokens[0]


def test_beam_search_prefers_a_hypothesis_that_is_not_an_echo(gen):
    s0 = _settings(0).merged(num_beams=3)
    base = _run(rag_token, gen, s0)
    echo = Echo(answers=[base.tokens])
    out = _run(rag_token, gen, s0.merged(echo_retries=1), echo)
    finished = list(echo.seen)  # every finished hypothesis was asked about, best first
    assert len(finished) > 1 and finished[0] == base.tokens
    others = [t for t in finished if not echo.says(t)]
    assert others, "one finished hypothesis only: the test would check nothing"
    assert out.tokens == others[0]


def test_beam_search_whose_every_hypothesis_echoes_is_retried_greedily_without_their_starts(gen):
    """2 beams: "Where is the Taj Mahal?" -> "Taj Mahal." when both finished hypotheses echo. Then
    the group is decoded again greedily with every echoing hypothesis's first token banned."""
    s0 = _settings(0).merged(num_beams=3)
    seen = Echo()  # echoes nothing: records the finished hypotheses
    base = _run(rag_token, gen, s0.merged(echo_retries=1), seen)
    firsts = {t[0] for t in seen.seen if t}
    echo = Echo(firsts=firsts)  # every hypothesis of the search echoes
    out = _run(rag_token, gen, s0.merged(echo_retries=1), echo)
    assert base.tokens[0] in firsts and out.tokens[0] not in firsts
    first_lp, state = gen.prefill(_prompts(gen))  # (K, V)
    prior = doc_log_prior(SCORES)  # (K,)
    mixed = torch.logsumexp(prior[:, None] + first_lp, 0)  # (V,)
    mixed[list(firsts)] = float("-inf")
    assert out.tokens[0] == int(mixed.argmax())  # the mixture's best start once theirs are banned
    lp, _ = score_candidates(gen, state, first_lp, [out.tokens], gen.pad_token_id)  # (K, 1, T)
    assert out.logprob == pytest.approx(float(rag_token_logprob(lp[:, 0], prior)), abs=1e-5)
    # and when the retry echoes too, the beam's own best stays
    again = _run(rag_token, gen, s0.merged(echo_retries=2), Echo(always=True))
    assert again.tokens == base.tokens


def test_closed_book_beam_search_retries_when_every_hypothesis_echoes(gen):
    prompt = gen.prompt(QUESTION, None, 64, "short", examples=())
    s0 = _settings(0).merged(num_beams=2)
    seen = Echo()
    _closed_book(gen, prompt, s0.merged(echo_retries=1), seen)
    firsts = {t[0] for t in seen.seen if t}
    out = _closed_book(gen, prompt, s0.merged(echo_retries=1), Echo(firsts=firsts))
    assert out.tokens and out.tokens[0] not in firsts


def test_the_pipeline_hands_the_engine_its_questions_echo_test(tiny_offline_echo, monkeypatch):
    import rag_demo.reader.aided as P

    pipe = tiny_offline_echo
    for mode in ("token", "sequence", "closed-book"):
        base = pipe.answer(QUESTION, mode, echo_retries=0)
        asked = []

        def fake(answer, question, _base=base.text):
            asked.append(question)
            return answer == _base

        monkeypatch.setattr(P, "echoes_question", fake)
        out = pipe.answer(QUESTION, mode, echo_retries=2)
        monkeypatch.undo()
        assert asked and set(asked) == {QUESTION}, mode
        assert out.text != base.text, mode


@pytest.mark.parametrize("answer, nothing", [
    ("He.", True), ("A.", True), ("The.", True), ("", True), ("It, and they", True), ("his", True),
    ("He was born in 1881.", False), ("Hagar.", False), ("It.", True), ("1780", False), ("I", True),
    ("The Who.", False),  # a band: normalised to "who", which is not counted as naming nothing
])
def test_says_nothing_worked_examples(answer, nothing):
    assert says_nothing(answer) is nothing


def test_the_pipeline_retries_an_answer_that_says_nothing(tiny_offline_echo, monkeypatch):
    import rag_demo.reader.aided as P

    pipe = tiny_offline_echo
    for mode in ("token", "sequence", "closed-book"):
        base = pipe.answer(QUESTION, mode, echo_retries=0)
        monkeypatch.setattr(P, "says_nothing", lambda answer, _base=base.text: answer == _base)
        out = pipe.answer(QUESTION, mode, echo_retries=2)
        monkeypatch.undo()
        assert out.text != base.text, mode  # retried: the echo test asked says_nothing too


@pytest.mark.parametrize("answer, passages, copied", [
    ("Tomas Reyl.", [], True),
    ("Tomas Rez.", [], True),  # the first name alone: the example's person, misspelt
    ("The Veltrania Dam.", [], True),
    ("Lake Kessal.", [], True),
    ("Lake Kessalik.", [], True),  # a variant: a one-word name of 5+ letters opening a word
    ("The Veltranian.", [], True),
    ("Ilsebill", [], False),  # a name under 5 letters counts whole only
    ('"The Glass Harbour"', [], True),
    ("Leonardo da Vinci.", [], False),
    ("Philip Glass", [], False),  # a word of a name is not the name
    ("Kesselring", [], False),  # whole words only
    ("Tomas Masaryk.", ["Tomas Garrigue Masaryk was a Czechoslovak politician."], False),  # a passage lends it
    ("Tomasz Kot.", ["Tomasz Kot is a Polish actor."], False),
])
def test_copies_example_worked_examples(answer, passages, copied):
    from rag_demo.reader.examples import EXAMPLE_NAMES

    names = [n for ex in EXAMPLE_NAMES for n in ex]
    assert copies_example(answer, names, passages) is copied
    assert not copies_example(answer, [], passages)  # no examples in the prompt: nothing to copy


def test_every_example_name_is_its_examples_own():
    """EXAMPLE_NAMES lines up with WORKED_EXAMPLES: each name is words of its own example's text,
    so a new or edited example must bring its names along."""
    from rag_demo.reader.text import normalize_answer
    from rag_demo.reader.examples import EXAMPLE_NAMES, WORKED_EXAMPLES

    assert len(EXAMPLE_NAMES) == len(WORKED_EXAMPLES)
    for names, (title, text, question, span, sentence) in zip(EXAMPLE_NAMES, WORKED_EXAMPLES):
        words = f" {normalize_answer(' '.join((title, text, question, span, sentence)))} "
        assert names and all(f" {normalize_answer(n)} " in words for n in names), (title, names)


def test_the_pipeline_checks_answers_against_the_examples_it_prompted_with(tiny_offline_echo, monkeypatch):
    """The echo test asks copies_example with the names of the first `worked_examples` examples
    and the passages the generator read (none for closed-book); an answer it flags is retried."""
    import rag_demo.reader.aided as P
    from rag_demo.reader.examples import EXAMPLE_NAMES

    pipe = tiny_offline_echo
    for mode in ("token", "sequence", "closed-book"):
        base = pipe.answer(QUESTION, mode, echo_retries=0, worked_examples=2)
        calls = []

        def fake(answer, names, read, _base=base.text):
            calls.append((list(names), list(read)))
            return answer == _base

        monkeypatch.setattr(P, "copies_example", fake)
        out = pipe.answer(QUESTION, mode, echo_retries=2, worked_examples=2)
        monkeypatch.undo()
        assert out.text != base.text, mode
        names, read = calls[0]
        assert names == [n for ex in EXAMPLE_NAMES[:2] for n in ex], mode
        if mode == "closed-book":
            assert read == []
        else:
            assert len(read) == 3 and all(any(p[:20] in r for p in PASSAGES) for r in read), mode


@pytest.fixture(scope="module")
def tiny_offline_echo(three_passage_pipe, gen):
    return three_passage_pipe(gen, PASSAGES, RagSettings(preset="aided", k=3, max_new_tokens=5, num_beams=1, worked_examples=0))


def test_the_pipeline_hands_the_subject_test_its_retrieved_passages_when_asked(tiny_offline_echo, monkeypatch):
    import rag_demo.reader.aided as P

    pipe = tiny_offline_echo
    for mode in ("token", "sequence"):
        base = pipe.answer(QUESTION, mode, echo_retries=0)
        for on in (False, True):
            handed = []

            def fake(answer, question, passages, _base=base.text):
                handed.append(sorted(text for _, text in passages))
                return bool(passages) and answer == _base

            monkeypatch.setattr(P, "names_question_subject", fake)
            out = pipe.answer(QUESTION, mode, echo_retries=2, echo_subjects=on)
            monkeypatch.undo()
            assert handed and all(h == (sorted(PASSAGES) if on else []) for h in handed), (mode, on)
            assert (out.text != base.text) is on, (mode, on)


def test_rag_token_with_drafts_ranks_an_echo_only_when_every_candidate_is_one(gen):
    """token_drafts: the best-scoring candidate of the pool, declared an echo, loses to the best
    candidate that is not one; declared echoes all, the pool ranks as it would without the test."""
    base = _run(rag_token, gen, _settings(0, drafts=True))
    assert base.decoding.endswith("with each doc's drafts") and len(base.candidates) > 1
    echo = Echo(answers=[base.tokens])
    out = _run(rag_token, gen, _settings(1, drafts=True), echo)
    assert out.tokens != base.tokens and not echo.says(out.tokens)
    exact = [sc for i, (t, sc) in enumerate(out.candidates) if i not in out.extras.get("upper_bounds", ())]
    assert out.logprob == pytest.approx(max(exact), abs=1e-5) and base.tokens not in [t for t, _ in out.candidates]
    every = _run(rag_token, gen, _settings(1, drafts=True), Echo(always=True))
    assert every.tokens == base.tokens and every.logprob == pytest.approx(base.logprob, abs=1e-5)
