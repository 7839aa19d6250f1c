"""The aids are parts you can list (rag_demo/reader/part.py, aided.py): the aided reader is the list
of the parts its settings turn on, composed into the engine's hooks; with no part it is the
paper's reader; every knob is a part, a prompt aid, or tunes a part; and the paper's core types
carry no field named for one aid (what a hook adds travels in `extras`)."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rag_demo.config import RagSettings, ReaderAids  # noqa: E402
from rag_demo.knowledge.corpus import Passage  # noqa: E402
from rag_demo.rag.engine import Generation, rag_sequence, rag_token  # noqa: E402
from rag_demo.rag.hooks import PAPER, Choice, Prefilled, Reader  # noqa: E402
from rag_demo.reader.aided import PROMPT_AIDS, TUNES, AidedReader, listed  # noqa: E402
from rag_demo.reader.contrast import Contrast  # noqa: E402
from rag_demo.reader.part import HOOKS  # noqa: E402
from rag_demo.reader.reading import reader_for  # noqa: E402
from rag_demo.reader.spans import SpanConstraint  # noqa: E402
from test_echo import PASSAGES, QUESTION, SCORES, _prompts  # noqa: E402


def _fed():
    return [Passage(f"d{i}#0", f"doc {i}", p) for i, p in enumerate(PASSAGES)]


def _reader(gen, s: RagSettings):
    return reader_for(s.aids, s.decoding, gen, QUESTION, _fed(), _prompts(gen), [(p.title, p.text) for p in _fed()])


def test_the_aided_reader_is_the_list_of_the_parts_its_settings_turn_on(gen):
    assert _reader(gen, RagSettings()) is PAPER  # the paper's settings: the paper's reader, no parts
    aided = RagSettings(preset="aided", max_doc_tokens=64)
    r = _reader(gen, aided)
    knobs = [p.knob for p in r.parts]
    assert knobs == ["question_weight", "extractive", "echo_retries", "title_candidates", "token_drafts"], r.parts
    assert all(p.hooks and set(p.hooks) <= set(HOOKS) for p in r.parts)
    assert r.keeps_prefill and r.keep_prompt_logprobs > 0  # retries and drafts search again; the vote reads the question
    # one knob off: its part is gone and the rest stay in order
    r2 = _reader(gen, aided.merged(echo_retries=0))
    assert [p.knob for p in r2.parts] == ["question_weight", "extractive", "title_candidates", "token_drafts"]
    # listed names the same parts, after the prompt's aids, with the knobs that tune them
    names = [k for k, _ in listed(aided.aids)]
    assert names == [k for k in PROMPT_AIDS if k in names] + knobs
    assert "tuned by copy_min_prior" in dict(listed(aided.aids))["extractive"]
    assert listed(ReaderAids()) == []


def test_processors_concatenate_in_the_parts_order(gen):
    s = RagSettings(preset="paper", k=3, max_new_tokens=4, answer_style="short", max_doc_tokens=64,
                    context_contrast=1.0, extractive=True)
    r = _reader(gen, s)
    got = []

    real = r.processors

    def processors(q, kind, groups):
        out = real(q, kind, groups)
        got.append((kind, [type(p) for p in out]))
        return out
    r.processors = processors
    rag_token(gen, _prompts(gen), SCORES, s.decoding, r)
    assert got and got[0] == ("mixture", [Contrast, SpanConstraint])  # it reweighs, then they mask


def test_every_knob_is_a_part_a_prompt_aid_or_tunes_one():
    every = ReaderAids(worked_examples=1, question_weight=0.5, question_position="both", passage_sentences=2,
                       extractive=True, copy_min_prior=0.1, echo_retries=1, echo_subjects=True,
                       recase_question=True, token_drafts=True, title_candidates=True, context_contrast=0.5)
    assert all(getattr(every, k) != getattr(ReaderAids(), k) for k in ReaderAids.model_fields)
    named = {k for k, _ in listed(every)} | {t for t, of in TUNES.items()}
    assert named == set(ReaderAids.model_fields)


@pytest.mark.parametrize("mode", [rag_token, rag_sequence])
def test_an_aided_reader_with_no_part_runs_the_paper(gen, mode):
    s = RagSettings(preset="paper", k=3, max_new_tokens=5, answer_style="short", max_doc_tokens=64)
    bare = AidedReader(s.aids, s.decoding, gen, QUESTION, _fed(), _prompts(gen))
    assert bare.parts == [] and not bare.keeps_prefill and bare.keep_prompt_logprobs == 0
    a = mode(gen, _prompts(gen), SCORES, s.decoding, PAPER)
    b = mode(gen, _prompts(gen), SCORES, s.decoding, bare)
    assert a.tokens == b.tokens and a.extras == b.extras == {}
    assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
    torch.testing.assert_close(a.doc_lp, b.doc_lp, atol=1e-5, rtol=0)


def test_the_core_types_carry_the_papers_fields_and_one_place_for_extras():
    """No field of the paper's types is named for one aid; the hooks' extras travel by name."""
    knobs = set(ReaderAids.model_fields)
    generation = {f.name for f in dataclasses.fields(Generation)}
    assert generation == {"tokens", "logprob", "decoding", "doc_lp", "posteriors", "doc_posterior", "candidates",
                          "prior", "extras", "timings", "stopped", "inspection", "fell_back"}
    prefilled = {f.name for f in dataclasses.fields(Prefilled)}
    assert prefilled == {"gen", "prompts", "first_lp", "state0", "prior", "ends", "d", "stop", "reader", "extras"}
    choice = set(vars(Choice(None)))
    assert choice == {"best", "candidates", "doc_lp", "note", "fell_back", "extras"}
    reader = {k for k in vars(Reader) if not k.startswith("_")}
    assert reader == {"key", "keep_prompt_logprobs", "keeps_prefill", "prior", "sequence_scores", "processors",
                      "review", "candidates", "choose_token"}
    assert not (generation | prefilled | choice | reader) & knobs
