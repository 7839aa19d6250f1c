"""Every table of measured numbers in README.md and docs/ is the one its result files give
(rag_demo/measure/tables.py): regenerating changes nothing, and a number edited by hand is caught."""
from __future__ import annotations

import re

import pytest

from rag_demo.measure import tables


def test_every_marked_table_is_what_the_runs_give():
    marked = [p for p in tables.DOCS if p.is_file() and tables.MARK.search(p.read_text(encoding="utf-8"))]
    assert marked, "no marked table anywhere"
    assert tables.update(check=True) == [], "run: python -m rag_demo tables"


def test_a_number_edited_by_hand_is_caught(tmp_path):
    doc = next(p for p in tables.DOCS if p.is_file() and tables.MARK.search(p.read_text(encoding="utf-8")))
    text = doc.read_text(encoding="utf-8")
    body = tables.MARK.search(text)["body"]
    number = re.search(r"\| (\d+\.\d)", body)  # the first decimal in the first table
    edited = text.replace(body, body.replace(number.group(0), f"| {float(number.group(1)) + 1:.1f}", 1), 1)
    copy = tmp_path / doc.name
    copy.write_text(edited, encoding="utf-8")
    assert tables.update([copy], check=True) == [copy]
    tables.update([copy])
    assert copy.read_text(encoding="utf-8") == text


def test_an_unknown_table_is_named():
    with pytest.raises(ValueError, match="table 'speeds' is unknown"):
        tables.render("<!-- table: speeds -->\n| x |\n<!-- /table -->")
