"""The one split rule (rag_demo/splits.py): a question's split depends on its id alone, the ids an
earlier round chose anything on are always "train", and the three splits take their shares."""
from __future__ import annotations

import pytest

from rag_demo.questions import load_qa
from rag_demo.splits import SPLITS, hash_fraction, in_split, seen_ids, split_of


def test_a_question_s_split_is_a_function_of_its_id_alone():
    assert split_of("q-1") == split_of("q-1")
    assert hash_fraction("q-1") == hash_fraction("q-1") and 0 <= hash_fraction("q-1") < 1
    assert {split_of(f"q-{i}") for i in range(50)} == set(SPLITS)


def test_every_seen_id_is_train_never_calibrate_or_report():
    seen = seen_ids()
    assert len(seen) > 150
    assert {split_of(i) for i in seen} == {"train"}


def test_the_external_file_splits_into_its_three_parts():
    items = load_qa("assets/qa_train_vital.jsonl")
    parts = {name: in_split(items, name) for name in SPLITS}
    assert sum(map(len, parts.values())) == len(items) == 600
    assert len(parts["report"]) >= 100 and len(parts["calibrate"]) >= 100  # enough to report on
    assert not {str(it.meta["id"]) for it in parts["report"] + parts["calibrate"]} & seen_ids()


def test_the_split_puts_answerable_questions_in_every_part():
    """Over both labelled external files, each split holds answerable questions: the headline
    numbers come from the report split's (at least 50), the confidence fits on calibrate's, training
    reads train's. (The old file's answerable questions all sit in train: earlier rounds chose on them.)"""
    from rag_demo.questions import answerable_ids

    answerable = {name: 0 for name in SPLITS}
    for path in ("assets/qa_open_vital.jsonl", "assets/qa_train_vital.jsonl"):
        for ident, ok in answerable_ids(path).items():
            answerable[split_of(ident)] += ok
    assert answerable["report"] >= 50 and answerable["calibrate"] >= 50 and answerable["train"] >= 150, answerable
    labels = answerable_ids("assets/qa_open_vital.jsonl")
    assert len(labels) == 1200 and sum(labels.values()) == 195  # the file's README: 195 answerable


def test_an_unknown_split_is_refused_by_name():
    with pytest.raises(ValueError, match="split='dev' is unknown: use one of train, calibrate, report"):
        in_split([], "dev")
