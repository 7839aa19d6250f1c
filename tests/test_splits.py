"""The one split rule (rag_demo/splits.py): a question's split depends on its id alone, the ids an
earlier round chose anything on are always "train", and the three splits take their shares."""
from __future__ import annotations

import pytest

from rag_demo.measure.qa_files import load_qa
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


def test_an_unknown_split_is_refused_by_name():
    with pytest.raises(ValueError, match="split='dev' is unknown: use one of train, calibrate, report"):
        in_split([], "dev")
