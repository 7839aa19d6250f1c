"""The decoder-only generator keeps the last hidden state of every token sequence it ran (prompts,
answers so far, teacher-forced candidates) under the sequence's digest (`HiddenStateCache`). A
question asked again runs the model only where it reads a sequence not kept: the prefill and every
step whose rows are all kept are read, not run, and the model catches up with the tokens fed
meanwhile at the first step that needs it. Answers and log-probabilities must stay what they are
without it (float order only), the work must really be skipped, the bound must hold, and two
requests at once must not disturb each other."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach the Hub

from rag_demo.config import RagSettings  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.models.passage_kv import digest, extend  # noqa: E402
from rag_demo.rag import engine  # noqa: E402
from rag_demo.rag.hooks import PAPER  # noqa: E402
from tests.aids import aided, in_two_threads  # noqa: E402
from tests.test_passage_cache import ATOL, DOCS, QUESTIONS, SCORES, _close, _prompts, _same_generation  # noqa: E402


def _gen(folder, dtype=torch.float32, kept: bool = True, max_bytes: int | None = None):
    from rag_demo.models.random_models import tiny_smollm_generator

    gen = tiny_smollm_generator(folder, layers=2, kv_heads=1, seed=4)  # same seed: the same weights
    gen.model.to(dtype)
    if not kept:  # keeps nothing at all: every prefill and step runs
        gen.hidden_cache.resize(0)
        gen.passage_cache.resize(0)
    elif max_bytes is not None:
        gen.hidden_cache.resize(max_bytes)
    return gen


def _run(gen, mode: str, q: str, docs, s: RagSettings):
    prompts = _prompts(gen, q, s, docs)
    if mode == "closed-book":
        return engine.closed_book(gen, gen.prompt(q, None, 192, s.decoding.answer_style), s.decoding)
    reader = aided(gen, s, prompts, q, docs) if s.preset == "aided" else PAPER
    fn = engine.rag_token if mode == "token" else engine.rag_sequence
    return fn(gen, prompts, SCORES[: len(docs)], s.decoding, reader)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("preset", ["paper", "aided"])
@pytest.mark.parametrize("mode", ["token", "sequence", "closed-book"])
def test_same_answers_and_scores_with_kept_states_on_and_off(smollm_tokenizer_folder, mode, preset, dtype):
    """Every mode, both readers, both precisions: the first ask, the same again, another retrieval
    temperature, one passage taken away, a longer answer allowed (the kept steps run out and the
    model catches up from the prompts), another question: the same tokens and scores as a
    generator that keeps nothing."""
    on, off = _gen(smollm_tokenizer_folder, dtype), _gen(smollm_tokenizer_folder, dtype, kept=False)
    s = RagSettings(preset=preset, max_new_tokens=3, answer_style="short", num_beams=2 if preset == "aided" else 1)
    asks = [(QUESTIONS[0], DOCS, s), (QUESTIONS[0], DOCS, s), (QUESTIONS[0], DOCS, s.merged(prior_temperature=3.0)),
            (QUESTIONS[0], DOCS[1:], s), (QUESTIONS[0], DOCS, s.merged(max_new_tokens=6)), (QUESTIONS[1], DOCS, s)]
    for q, docs, st in asks:
        _same_generation(_run(on, mode, q, docs, st), _run(off, mode, q, docs, st), ATOL[dtype])
    assert on.hidden_cache.stats().hits > 0 and off.hidden_cache.stats().entries == 0


@pytest.mark.parametrize("mode", ["token", "sequence", "closed-book"])
def test_the_same_question_again_runs_nothing(smollm_tokenizer_folder, mode):
    """Asked again with the same settings, no mode runs a single position through the model; the
    paper's RAG-Sequence also runs nothing with another retrieval temperature (its searches and
    its rescoring do not read the prior)."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="paper", max_new_tokens=4, answer_style="short")
    first = _run(gen, mode, QUESTIONS[0], DOCS, s)
    ran = gen.positions_run
    assert ran > 0
    again = _run(gen, mode, QUESTIONS[0], DOCS, s)
    assert gen.positions_run == ran and again.tokens == first.tokens
    if mode == "sequence":
        _run(gen, mode, QUESTIONS[0], DOCS, s.merged(prior_temperature=3.0))
        assert gen.positions_run == ran
    _run(gen, mode, QUESTIONS[1], DOCS, s)  # a new question runs
    assert gen.positions_run > ran


def test_the_model_catches_up_with_the_tokens_it_skipped(smollm_tokenizer_folder):
    """On the generator's own calls: a prefill that is kept and two kept steps, then a step that is
    not: its log-probs, and the next step's, are those of a generator that ran every step; the same
    when the prefill ran (it asked for more prompt positions than were kept) and only steps were read."""
    on, off = _gen(smollm_tokenizer_folder), _gen(smollm_tokenizer_folder, kept=False)
    prompts = _prompts(on, QUESTIONS[0], RagSettings(preset="paper", answer_style="short"))
    feed = [torch.tensor([[11]] * len(prompts)), torch.tensor([[12]] * len(prompts)),
            torch.tensor([[13], [14], [15], [16]]), torch.tensor([[17]] * len(prompts))]

    def walk(gen, keep_prompt_logprobs: int, steps: int) -> list[torch.Tensor]:
        lp, state = gen.prefill(prompts, keep_prompt_logprobs=keep_prompt_logprobs)  # (K, V)
        out = [lp] + ([state.prompt_lp] if keep_prompt_logprobs else [])
        for t in feed[:steps]:
            out.append(gen.advance(state, t)[:, -1])  # (K, V)
        return out

    walk(on, 0, 2)  # keeps the prompts' last states and two steps
    ran = on.positions_run
    for a, b in zip(walk(on, 0, 4), walk(off, 0, 4)):
        _close(a, b, ATOL[torch.float32])
    # read: the prefill and two steps; run: nothing of the prompts (their question parts were kept
    # after their passages), then the two skipped tokens with the third, and the fourth
    assert on.positions_run - ran == len(prompts) * (3 + 1)
    for a, b in zip(walk(on, 3, 4), walk(off, 3, 4)):  # more prompt positions asked for than were kept: it runs
        _close(a, b, ATOL[torch.float32])


def test_eviction_keeps_the_bound_and_the_answers(smollm_tokenizer_folder):
    """A bound far below one question's states: bytes never exceed it, and answers, with some states
    read and some run again, are unchanged."""
    probe = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="aided", max_new_tokens=3, answer_style="short", num_beams=2)
    _run(probe, "token", QUESTIONS[0], DOCS, s)
    bound = probe.hidden_cache.stats().bytes // 3
    on, off = _gen(smollm_tokenizer_folder, max_bytes=bound), _gen(smollm_tokenizer_folder, kept=False)
    for q, docs, st in ((QUESTIONS[0], DOCS, s), (QUESTIONS[0], DOCS, s.merged(prior_temperature=2.0)),
                        (QUESTIONS[1], DOCS[::-1], s), (QUESTIONS[0], DOCS, s)):
        _same_generation(_run(on, "token", q, docs, st), _run(off, "token", q, docs, st), ATOL[torch.float32])
        assert on.hidden_cache.stats().bytes <= bound
    assert on.hidden_cache.stats().evictions > 0


def test_an_edited_passage_is_run_again(smollm_tokenizer_folder):
    """Editing a passage makes another prompt, so another digest: its answer is the one of a
    generator that keeps nothing, not the kept answer of the passage before the edit."""
    on, off = _gen(smollm_tokenizer_folder), _gen(smollm_tokenizer_folder, kept=False)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    _run(on, "sequence", QUESTIONS[1], DOCS, s)
    edited = [DOCS[0], Passage(id="p2", title="Orlan Vesk", text=DOCS[1].text.replace("1802", "1820")), *DOCS[2:]]
    ran = on.positions_run
    _same_generation(_run(on, "sequence", QUESTIONS[1], edited, s), _run(off, "sequence", QUESTIONS[1], edited, s),
                     ATOL[torch.float32])
    assert on.positions_run > ran


def test_digests_name_sequences():
    """Equal sequences, equal digests; any other token, or the same ids reached another way, another."""
    a = digest([1, 2, 3])
    assert a == digest([1, 2, 3]) and len(a) == 16
    assert len({a, digest([1, 2, 4]), digest([1, 2]), digest([3, 2, 1])}) == 4
    assert extend(a, 5) == extend(digest([1, 2, 3]), 5) != extend(a, 6)
    assert extend(digest([1, 2]), 3) != a  # a missed reuse at worst, never a wrong one


def test_two_requests_at_once(smollm_tokenizer_folder):
    """Two threads answering at once on one generator, over overlapping passages, several times each
    (the later ones read what the earlier ones kept): every result equals the one of a generator
    that keeps nothing."""
    on, off = _gen(smollm_tokenizer_folder), _gen(smollm_tokenizer_folder, kept=False)
    s = RagSettings(preset="aided", max_new_tokens=3, answer_style="short", num_beams=2)
    jobs = [(QUESTIONS[0], DOCS[:3]), (QUESTIONS[1], DOCS[1:])]
    want = [_run(off, "token", q, d, s) for q, d in jobs]
    got = in_two_threads(lambda i: _run(on, "token", *jobs[i], s))
    for i in range(2):
        assert len(got[i]) == 3
        for g in got[i]:
            _same_generation(g, want[i], ATOL[torch.float32])
    assert on.hidden_cache.stats().hits > 0


def test_answers_say_what_is_kept_and_a_reask_reads_it(three_passage_pipe, smollm_tokenizer_folder):
    """Each answer reports the generator's caches as it left them (bytes within their bounds), and a
    question asked again in all modes with another retrieval temperature reads hidden states and runs
    no position through the model."""
    gen = _gen(smollm_tokenizer_folder)
    s = RagSettings(preset="aided", k=3, max_new_tokens=3, num_beams=2)
    pipe = three_passage_pipe(gen, [d.text for d in DOCS[:3]], s)
    modes = ["sequence", "token", "closed-book"]
    first = pipe.answers(QUESTIONS[0], modes)
    ran = gen.positions_run
    again = pipe.answers(QUESTIONS[0], modes, s.merged(prior_temperature=2.0))
    for a in (*first.values(), *again.values()):
        assert set(a.kept) == {"passages", "hidden_states"}
        assert all(0 <= x["bytes"] <= x["max_bytes"] for x in a.kept.values())
    # closed-book runs first and reads no passage; the RAG answers after it leave both caches filled
    for a in (first["sequence"], first["token"], *again.values()):
        assert all(x["bytes"] > 0 for x in a.kept.values()), a.kept
    assert again["closed-book"].kept["hidden_states"]["hits"] > first["closed-book"].kept["hidden_states"]["hits"]
    assert again["sequence"].text == first["sequence"].text and gen.positions_run - ran < ran


def test_the_speed_estimate_times_only_what_ran(smollm_tokenizer_folder):
    """The server scales its estimates by how fast the generator runs now (`Timed` into `Speed`): a
    re-ask read from kept states must not look like a faster machine, so only calls that ran the
    model are timed."""
    from rag_demo.models.cost import CostModel, Speed, Timed

    gen, speed = _gen(smollm_tokenizer_folder), Speed()
    timed = Timed(gen, CostModel(), speed)
    s = RagSettings(preset="paper", max_new_tokens=3, answer_style="short")
    prompts = _prompts(gen, QUESTIONS[0], s)
    engine.rag_token(timed, prompts, SCORES, s.decoding)
    ratio = speed.ratio
    assert ratio is not None
    engine.rag_token(timed, prompts, SCORES, s.decoding)  # every call read from kept states
    assert speed.ratio == ratio
