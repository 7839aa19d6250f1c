"""A visitor's files as documents: text, Markdown (a heading a document), CSV and JSON Lines (a
text column or field, an optional title and url), PDF; decoded whatever their BOM, refused with
a message that names the file when they are binary, empty or too large.
"""

from __future__ import annotations

import codecs
import importlib.util
import io
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from rag_demo.knowledge.corpus import Corpus, Document, corpus_from_documents

log = logging.getLogger(__name__)

MAX_UPLOAD_BYTES = 5 * 1024 * 1024  # 5 MB of text is ~800k words, ~8k passages: minutes to embed on 2 cores
# the text an upload may hold once extracted (a 5 MB PDF can hold far more text than its bytes)
MAX_TEXT_CHARS = MAX_UPLOAD_BYTES
# what the server takes in over the wire: a file a little over the limit reaches the app's own check,
# which says the limit on the upload box; only a far larger one is cut off while it streams in
TRANSFER_LIMIT_BYTES = 4 * MAX_UPLOAD_BYTES
TEXT_FIELDS = ("text", "content", "body", "passage", "extract")  # accepted names of the text column / field

_BOMS = (  # UTF-32 first: its little-endian BOM starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)



def web_url(url: str | None) -> str | None:
    """An uploaded passage's url, kept only when it is http(s): the page links it, and a
    javascript: or data: url must never become a link."""
    return url.strip() if url and url.strip().lower().startswith(("http://", "https://")) else None

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


def heading(text: str) -> str | None:
    """A plain text's own title: its first line when that reads as a heading, a paragraph of its own
    (a blank line or the end after it) of at most 12 words and 100 characters with no sentence's
    full stop; else None.

    >>> heading("Fact sheet: Mars\\n\\nMars is the fourth planet."), heading("Mars is red. It is small.\\n\\nMore.")
    ('Fact sheet: Mars', None)
    >>> heading("Georges Seurat was a French painter who\\ndevised pointillism.")  # a sentence wrapped, not a title
    """
    lines = text.strip().splitlines()
    if not lines:
        return None
    first = lines[0].strip().lstrip("#").strip()
    alone = len(lines) == 1 or not lines[1].strip()
    if (not alone or not first or len(first) > 100 or len(first.split()) > 12 or ". " in first
            or first.endswith((".", ",", ";", ":"))):
        return None
    return first


def _titled(stem: str, text: str) -> Document:
    """One document from a plain text: titled by its heading (which then leaves the body), else by
    the file's name."""
    title = heading(text)
    if title is None:
        return (stem, text, None)
    body = text.split(title, 1)[1] if title in text else text
    return (title, body.lstrip("\n"), None)


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
        (_optional(r, "title") or f"{stem} row {i}", r[text_col], web_url(_optional(r, "url")))
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
        docs.append((_optional(obj, "title") or f"{stem} line {n}", obj[key], web_url(_optional(obj, "url"))))
    return docs


def _pdf(name: str, stem: str, data: bytes) -> list[Document]:
    import pypdf

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ValueError(f"{name} is password protected: upload an unprotected copy.")
        pages, chars = [], 0
        for page in reader.pages:  # page by page, so a PDF of more text than an upload may hold stops early
            pages.append(page.extract_text() or "")
            chars += len(pages[-1])
            if chars > MAX_TEXT_CHARS:
                raise ValueError(f"{name} holds over {MAX_TEXT_CHARS:,} characters of text, over the upload limit: "
                                 "upload some of its pages.")
        text = "\n".join(pages)
    except pypdf.errors.PyPdfError as e:
        raise ValueError(f"{name} is not a readable PDF ({e}): re-export it as PDF or upload its text as .txt.") from e
    return [_titled(stem, text)]


def check_type(path: str | Path) -> None:
    """ValueError naming the file and the types accepted when its extension is not one of them."""
    path = Path(path)
    ext = path.suffix.lower()
    if ext not in supported_extensions():
        raise ValueError(
            f"{path.name} has an unsupported type {ext or '(none)'}: upload one of {', '.join(supported_extensions())}."
        )


def _read_documents(path: Path, max_bytes: int) -> list[Document]:
    check_type(path)
    ext = path.suffix.lower()
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
        docs = [_titled(path.stem, _decode(path.name, data))]
    if not any(t.strip() for _, t, _ in docs):
        raise ValueError(f"{path.name} has no text: upload a file with text in it (a scanned PDF needs OCR first).")
    return docs


def load_documents(paths: list[str | Path], name: str = "Your documents", max_bytes: int = MAX_UPLOAD_BYTES) -> Corpus:
    """A corpus from uploaded files: .txt/.pdf (one document, titled by its first line when that is a
    heading, else by the file name), .md (titled by its first heading), .csv (one document per row)
    and .jsonl (one per line); refused when its text, once extracted, is over MAX_TEXT_CHARS."""
    if not paths:
        raise ValueError(f"no files given: upload at least one of {', '.join(supported_extensions())}.")
    docs = [d for p in paths for d in _read_documents(Path(p), max_bytes)]
    chars = sum(len(text) for _, text, _ in docs)
    if chars > MAX_TEXT_CHARS:
        raise ValueError(f"the upload holds {chars:,} characters of text, over the limit of {MAX_TEXT_CHARS:,}: "
                         "upload fewer or shorter files.")
    return corpus_from_documents(name, docs)
