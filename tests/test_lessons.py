"""Every question the Ask tab's lessons offer (assets/lessons.json), on the real offline models at
their defaults: a lesson that says what both RAG modes answer is answered so, and a lesson that
presents a deliberate failure still fails the way it explains (else its text would no longer be
true), and where a lesson says whether the "probably wrong" cue fires on a card ("cued"), it does or
does not. Slow: the real SmolLM2 over all Wikipedia Vital Articles, then the CIA World Factbook."""
from __future__ import annotations

import pytest
import torch

from rag_demo.config import RagSettings
from rag_demo.knowledge.corpus import VITAL_ARTICLES_NAME
from rag_demo.knowledge.factbook import FACTBOOK_NAME, load_factbook
from rag_demo.web.session_view import LESSONS

pytestmark = pytest.mark.slow


def _check(pipe, corpus: str) -> None:
    for lesson in LESSONS[corpus]:
        assert lesson["title"] and lesson["look"] and lesson["questions"], lesson
        for q in lesson["questions"]:  # each question says what both RAG modes answer, or how they fail
            said = {**lesson.get("expect", {}).get(q, {}), **lesson.get("fails", {}).get(q, {})}
            assert set(said) == {"sequence", "token"}, (lesson["title"], q)
            a = pipe.answers(q, ["sequence", "token"])
            for mode, want in lesson.get("expect", {}).get(q, {}).items():
                assert want.casefold() in a[mode].text.casefold(), (lesson["title"], q, mode, a[mode].text)
            for mode, right in lesson.get("fails", {}).get(q, {}).items():
                assert "deliberate failure" in lesson["look"], lesson["title"]  # said so, with the why
                assert right.casefold() not in a[mode].text.casefold(), (lesson["title"], q, mode, a[mode].text)
            for mode, cued in lesson.get("cued", {}).get(q, {}).items():
                kinds = [c["kind"] for c in a[mode].cues]
                assert ("probably_wrong" in kinds) == cued, (lesson["title"], q, mode, a[mode].text, a[mode].confidence)
            for mode, right in lesson.get("paper_fails", {}).get(q, {}).items():
                plain = pipe.answers(q, [mode], RagSettings(preset="paper"))[mode]
                assert right.casefold() not in plain.text.casefold(), (lesson["title"], q, mode, plain.text)


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def vital_pipe_in(request, vital_pipe):
    """The Vital Articles pipeline with its generator in each precision: a lesson must hold on a
    CPU that computes in bfloat16 and on one that computes in float32 (`--generator-dtype`)."""
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.models.stacks import resolve_dtype
    from rag_demo.pipeline import RagPipeline

    if resolve_dtype("auto") == getattr(torch, request.param):
        return vital_pipe  # this CPU's default: the shared pipeline
    return RagPipeline.load(StackSpec(generator_dtype=request.param))


def test_the_vital_articles_lessons_answer_as_they_say(vital_pipe_in):
    _check(vital_pipe_in, VITAL_ARTICLES_NAME)


def test_the_factbook_lessons_answer_as_they_say(vital_pipe):
    _check(vital_pipe.with_corpus(load_factbook()), FACTBOOK_NAME)
