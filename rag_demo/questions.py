"""Questions with their answers, as training and measurement both read them: QA files (one JSON object
a line, {"question", "answers", "id"?}; lines that are not a question said by number and dropped),
a deterministic sample, the answerable labels, and whether a text holds a gold answer (DPR's
has_answer). Below measure/ and training/, which both read it and never each other.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

from rag_demo.config import KNOBS, MODES
from rag_demo.reader.text import normalize_answer, occurs_in

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- QA files


@dataclass
class QAItem:
    question: str
    answers: list[str]
    meta: dict = field(default_factory=dict)  # any other fields of the line (type, topic, source)

    @property
    def type(self) -> str:
        return str(self.meta.get("type", "?"))


@dataclass
class QAFile:
    """A QA file as read: its usable questions, and what was dropped on the way (shown in the report)."""

    path: str
    items: list[QAItem]
    skipped: list[str] = field(default_factory=list)  # "file line N: why", rows with no usable answer
    dropped: list[str] = field(default_factory=list)  # "file line N: answer '*' ...", answers removed from kept rows


def parse_qa_line(line: str, where: str, dropped: list[str] | None = None) -> QAItem | None:
    """One JSONL line -> QAItem, or a ValueError naming `where` (file:line) and the fix.

    An answer that is empty after normalisation (only punctuation or articles, e.g. '*': no
    prediction can match it) is dropped and noted in `dropped`; a row left with no answer
    returns None (the caller skips and counts it)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e.msg}): write one JSON object per line.") from e
    if not isinstance(obj, dict):
        raise ValueError(f'{where} is a JSON {type(obj).__name__}, not an object: write {{"question": ..., "answers": [...]}}.')
    missing = [k for k in ("question", "answers") if k not in obj]
    if missing:
        raise ValueError(
            f'{where} is missing {" and ".join(repr(m) for m in missing)}: each line needs '
            '{"question": "...", "answers": ["...", ...]}.'
        )
    q, answers = obj.pop("question"), obj.pop("answers")
    if not isinstance(q, str) or not q.strip():
        raise ValueError(f'{where}: "question" must be a non-empty string.')
    if isinstance(answers, str):
        raise ValueError(f'{where}: "answers" must be a list of strings, e.g. ["{answers}"], not a string.')
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a.strip() for a in answers):
        raise ValueError(f'{where}: "answers" must be a non-empty list of non-empty strings.')
    kept = [a for a in answers if normalize_answer(a)]
    for a in answers:
        if a not in kept and dropped is not None:
            dropped.append(f"{where}: answer {a!r} is empty after normalisation (only punctuation or articles); dropped")
    if not kept:
        return None
    return QAItem(q.strip(), kept, obj)


def read_qa(path: str | Path, limit: int | None = None) -> QAFile:
    """Read a QA JSONL file; blank lines are skipped; `limit` keeps the first N usable questions.
    Rows whose every answer is empty after normalisation are skipped and listed in `skipped`."""
    path = Path(path)
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r} is out of range: use a positive number of questions.")
    if not path.is_file():
        raise ValueError(f"QA file {path} not found: pass --qa with a JSONL file (e.g. assets/qa_dev.jsonl).")
    out = QAFile(str(path), [])
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path.name} line {n}"
        item = parse_qa_line(line, where, out.dropped)
        if item is None:
            out.skipped.append(f"{where}: no answer left after dropping the ones empty after normalisation")
        else:
            item.meta.setdefault("id", f"{path.stem}:{n}")  # a file without ids: its line number names the question
            out.items.append(item)
    for msg in out.dropped + out.skipped:
        log.warning(msg)
    if not out.items:
        raise ValueError(f"{path} holds no usable questions: write one JSON object per line, each with an answer.")
    out.items = out.items[:limit]
    return out


def sample_items(items: list[QAItem], n: int, seed: int = 0) -> list[QAItem]:
    """A deterministic random sample of n questions (same n, seed and file: same questions),
    kept in file order. QA files are often ordered by source, so the first N are not
    representative; a sample is.

    >>> [it.question for it in sample_items([QAItem(q, ["a"]) for q in "abcdef"], 3, seed=1)]
    ['a', 'b', 'e']
    """
    if not isinstance(n, int) or not 1 <= n <= len(items):
        raise ValueError(f"sample={n!r} is out of range: choose 1 to {len(items)} questions (the file's usable rows).")
    return [items[i] for i in sorted(random.Random(seed).sample(range(len(items)), n))]


def keep_answerable(items: list[QAItem], labels_path: str | Path) -> list[QAItem]:
    """The questions a labels file marks answerable, in file order. The file is JSONL, one
    {"id": ..., "answerable": true|false} a line, written by a person who read each question's
    supporting passages (is the answer really stated there, or does the gold string only occur?);
    it holds ids, never questions. String-matched QA files mix in many questions no passage
    answers: the labelled subset is the sharper instrument (../shared/data/README.md).

    >>> import tempfile, json; f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    >>> _ = f.write(json.dumps({"id": "b", "answerable": True}) + "\\n"); f.close()
    >>> [it.question for it in keep_answerable([QAItem("qa", ["x"], {"id": "a"}), QAItem("qb", ["y"], {"id": "b"})], f.name)]
    ['qb']
    """
    path = Path(labels_path)
    if not path.is_file():
        raise ValueError(f"labels file {path} not found: pass --labels with a JSONL file of {{\"id\", \"answerable\"}} rows.")
    keep, seen = set(), set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            ident, ok = row["id"], row["answerable"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f'{path.name} line {n}: write one {{"id": ..., "answerable": true|false}} object a line.') from None
        if not isinstance(ok, bool):
            raise ValueError(f'{path.name} line {n}: "answerable" must be true or false, not {ok!r}.')
        seen.add(str(ident))
        if ok:
            keep.add(str(ident))
    ids = [str(it.meta.get("id")) for it in items]
    if not seen.intersection(ids):
        raise ValueError(f"no question of the QA file has an id labelled in {path}: the labels belong to another file.")
    kept = [it for it, i in zip(items, ids) if i in keep]
    if not kept:
        raise ValueError(f"{path} labels no question of the QA file answerable: nothing to evaluate.")
    return kept


def labels_path(qa_path: str | Path) -> Path:
    """Where the answerable labels of a QA file that carries none inline are kept: beside it as
    `<name>_labels.jsonl` (assets/qa_train_vital_labels.jsonl)."""
    qa_path = Path(qa_path)
    return qa_path.with_name(qa_path.stem + "_labels.jsonl")


def answerable_ids(qa_path: str | Path) -> dict[str, bool] | None:
    """id -> whether a person reading one summary would give a gold answer (../shared/data/README.md):
    from the rows' own "answerable" field (qa_open_vital.jsonl), else from the labels file beside the
    QA file (`labels_path`); None when the file is labelled neither way (the dev set: every question
    was written from a passage, so all are answerable by construction)."""
    rows = [json.loads(line) for line in Path(qa_path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if rows and all("answerable" in r for r in rows):
        return {str(r["id"]): bool(r["answerable"]) for r in rows}
    labels = labels_path(qa_path)
    if not labels.is_file():
        return None
    return {str(r["id"]): bool(r["answerable"]) for r in
            (json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines() if line.strip())}


def load_qa(path: str | Path, limit: int | None = None) -> list[QAItem]:
    """The usable questions of a QA file (see `read_qa`)."""
    return read_qa(path, limit).items


def parse_modes(text: str) -> list[str]:
    """"closed-book,sequence,token" (or "all") -> a list of known modes, in the order given."""
    modes = list(MODES) if text.strip() == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"unknown mode(s) {unknown or [text]}: use a comma-separated list of {', '.join(MODES)}, or all.")
    return list(dict.fromkeys(modes))


def parse_retrievers(text: str) -> list[str]:
    names = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in names if r not in KNOBS["retriever"].choices]
    if unknown or not names:
        raise ValueError(f"unknown retriever(s) {unknown or [text]}: use a comma-separated list of "
                         f"{', '.join(KNOBS['retriever'].choices)}.")
    return list(dict.fromkeys(names))


def has_answer(text: str, golds: list[str]) -> bool:
    """True when some gold answer's tokens occur as a contiguous token sequence in `text`
    (DPR's has_answer, string mode). Token match, not substring match: "1961" is not found in
    "19612", nor "art" in "party".

    >>> has_answer("The Wall was built in 1961.", ["1961"]), has_answer("party", ["art"])
    (True, False)
    """
    return any(occurs_in(g, text) for g in golds)


def passage_text(p) -> str:
    """What has_answer searches: the title and the text, as the generator sees them."""
    return f"{p.title}. {p.text}"
