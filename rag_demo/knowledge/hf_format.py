"""transformers' RAG knowledge format, both ways: our corpus + vectors + FAISS index out, theirs in.

Owns the on-disk layout that `transformers.RagRetriever` loads with `index_name="custom",
passages_path=..., index_path=...` (`CustomHFIndex.load_from_disk`): a `datasets.Dataset` with
columns `title` (str), `text` (str) and `embeddings` (float32 vectors), written with
`save_to_disk(passages_path)`, and a FAISS index over the `embeddings` column, written with
`dataset.get_index("embeddings").save(index_path)`. The retriever searches that index with the
question vector (`Dataset.search_batch`: the index's own search, so inner product for
RAG's indexes), takes the rows it returns as doc ids, and RAG scores each doc as the inner
product of the question vector with the stored `embeddings` row.

- `export_knowledge`: a `PassageIndex` -> `DIR/hf_dataset` + `DIR/hf_dataset_index.faiss` (the
  names `RagRetriever.save_pretrained` gives them), the index an exact `IndexFlatIP`, so
  transformers retrieves exactly what we do.
- `load_knowledge`: a dataset + index made that way (by us, or by transformers'
  `examples/research_projects/rag/use_own_knowledge_dataset.py`, whose index is an
  inner-product `IndexHNSWFlat`) -> a `Knowledge` holding a `PassageIndex` that keeps the
  stored embeddings and searches the stored FAISS index (nothing re-embedded), so we retrieve
  exactly what transformers does. Row i becomes passage id f"{title}#{j}" (j: the row's rank
  among rows with that title), our own ids for passages split from documents with unique titles.
- `Knowledge.check_encoder`: the stored vectors must be the stack's passage encoder's size.

Every problem (missing folder, file or column, ragged or wrongly sized vectors, an index that
is not inner product or not built from this dataset) is a `ValueError` naming it and the fix.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from rag_demo.knowledge.corpus import Corpus, datasets_quietly
from rag_demo.models.encoders import Encoder
from rag_demo.knowledge.index import IndexInfo, PassageIndex
from rag_demo.publish import publish_folder

log = logging.getLogger(__name__)

DATASET_DIR = "hf_dataset"  # the names RagRetriever.save_pretrained writes a custom index under
INDEX_FILE = "hf_dataset_index.faiss"
COLUMNS = ("title", "text", "embeddings")
READ_BATCH = 10_000  # rows per step while reading a dataset (progress is reported per step)
Say = Callable[[str], None]

_EXPORT_HOW = "export one with `python -m rag_demo index --export DIR`"


def _say(say: Say | None, msg: str) -> None:
    log.info(msg)
    if say:
        say(msg)


@dataclass
class Knowledge:
    """A knowledge dataset loaded as our corpus + index (stored vectors, stored FAISS index)."""

    index: PassageIndex
    dataset_path: Path
    index_path: Path
    seconds: float  # time to read it

    def info(self) -> IndexInfo:
        """key: the two paths, the index file's size and the shape (not a hash of every passage,
        which at the paper's 21M passages would take minutes)."""
        ident = f"{self.dataset_path.resolve()}|{self.index_path.resolve()}|{self.index_path.stat().st_size}|" \
                f"{self.index.embeddings.shape}"
        return IndexInfo("knowledge dataset", self.seconds, self.dataset_path, len(self.index),
                         hashlib.sha256(ident.encode()).hexdigest()[:16])

    def check_encoder(self, encoder: Encoder, stack: str) -> None:
        """The stored vectors must have the size of `encoder`'s (the stack's passage encoder);
        same size is necessary, not sufficient: they must also come from the same encoder."""
        if encoder.dim != self.index.dim:
            raise ValueError(
                f"the knowledge dataset {self.dataset_path} holds {self.index.dim}-d embeddings, but the {stack} "
                f"stack's passage encoder {encoder.name} makes {encoder.dim}-d vectors: load it with the stack whose "
                f"passage encoder embedded it (DPR, 768-d: --stack paper), or {_EXPORT_HOW} with --stack {stack}."
            )


# ---------------------------------------------------------------- export


def _features():
    from datasets import Features, Sequence, Value

    return Features({"title": Value("string"), "text": Value("string"), "embeddings": Sequence(Value("float32"))})


def check_export_dir(out_dir: str | Path) -> Path:
    """`out_dir` if an export may be written there (new, empty, or an earlier export), else a ValueError."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--export {out} is a file: give a folder to write {DATASET_DIR}/ and {INDEX_FILE} into.")
    others = sorted(p.name for p in out.iterdir() if p.name not in (DATASET_DIR, INDEX_FILE)) if out.is_dir() else []
    if others:
        raise ValueError(
            f"--export {out} already holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''}: "
            f"give a new or empty folder (an earlier export there is replaced; other files are never overwritten)."
        )
    return out


def export_knowledge(index: PassageIndex, out_dir: str | Path, say: Say | None = None) -> tuple[Path, Path]:
    """Write `index` as transformers' custom RAG knowledge: -> (passages_path, index_path).

    `out_dir` must be new, empty, or an earlier export (which is replaced atomically:
    `publish.publish_folder`); a folder holding anything else is refused, never overwritten.
    """
    from datasets import Dataset

    out = check_export_dir(out_dir)
    n, d = index.embeddings.shape
    _say(say, f"Exporting {n:,} passages ({d}-d) of {index.corpus.name} to {out} ...")
    ds = Dataset.from_dict(
        {"title": index.corpus.dataset["title"], "text": index.corpus.dataset["text"], "embeddings": index.embeddings},
        features=_features(),
    )

    def write(tmp: Path) -> None:
        with datasets_quietly():
            ds.save_to_disk(str(tmp / DATASET_DIR))  # before add_faiss_index: datasets will not save an indexed dataset
            _say(say, "Wrote the passages (title, text, embeddings); indexing them ...")
            # exact inner product, as our own index: transformers then retrieves what we retrieve
            ds.add_faiss_index("embeddings", custom_index=faiss.IndexFlatIP(d))
            ds.get_index("embeddings").save(str(tmp / INDEX_FILE))

    publish_folder(out, write)
    _say(say, f"Wrote {out / DATASET_DIR} (save_to_disk) and {out / INDEX_FILE} (FAISS IndexFlatIP)")
    return out / DATASET_DIR, out / INDEX_FILE


# ---------------------------------------------------------------- load


def _read_dataset(path: Path):
    from datasets import Dataset, DatasetDict, load_from_disk

    if not path.is_dir():
        raise ValueError(
            f"the knowledge dataset {path} is not a folder: give the folder written by dataset.save_to_disk() "
            f"(with columns {', '.join(COLUMNS)}), or {_EXPORT_HOW}."
        )
    try:
        ds = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise ValueError(
            f"{path} is not a dataset saved with datasets' save_to_disk() ({e}): give that folder, or {_EXPORT_HOW}."
        ) from e
    if isinstance(ds, DatasetDict):
        raise ValueError(
            f"{path} holds a DatasetDict with splits {', '.join(ds)}: give one split's folder, e.g. {path / next(iter(ds))}."
        )
    if not isinstance(ds, Dataset):
        raise ValueError(f"{path} holds a {type(ds).__name__}, not a datasets.Dataset: save a Dataset with save_to_disk().")
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(
            f"the knowledge dataset {path} has no {', '.join(repr(c) for c in missing)} column (it has "
            f"{', '.join(ds.column_names)}): RAG needs title (str), text (str) and embeddings (the passage "
            f"encoder's vectors of 'title' + 'text'); add them, or {_EXPORT_HOW}."
        )
    if not len(ds):
        raise ValueError(f"the knowledge dataset {path} has no rows: add passages to it.")
    return ds


def _rows(ds, path: Path, say: Say | None, batch_size: int) -> tuple[list[str], list[str], np.ndarray]:
    """Passage ids and titles, and (N, D) float32 embeddings, read in batches with a progress bar;
    the text stays in the dataset's Arrow table (checked here, row by row)."""
    ids: list[str] = []
    titles: list[str] = []
    blocks: list[np.ndarray] = []
    seen: dict[str, int] = {}
    n, start = len(ds), 0
    view = ds.with_format("numpy", columns=["embeddings"], output_all_columns=True)
    with tqdm(total=n, desc="reading knowledge dataset", unit="passage", disable=n < batch_size) as bar:
        for batch in view.iter(batch_size=batch_size):
            e = batch["embeddings"]
            if e.dtype == object or e.ndim != 2:
                raise ValueError(
                    f"the embeddings of rows {start}-{start + len(e) - 1} of {path} are not all vectors of one size: "
                    "give every passage one vector from the same passage encoder."
                )
            if blocks and e.shape[1] != blocks[0].shape[1]:
                raise ValueError(
                    f"row {start} of {path} has {e.shape[1]}-d embeddings, earlier rows {blocks[0].shape[1]}-d: "
                    "give every passage one vector from the same passage encoder."
                )
            blocks.append(e.astype(np.float32, copy=False))  # as transformers reads them (dtype="float32")
            for i, (title, text) in enumerate(zip(batch["title"], batch["text"])):
                if not isinstance(text, str):
                    raise ValueError(f"row {start + i} of {path} has text {text!r}: give every passage its text.")
                title = "" if title is None else str(title)  # transformers' script stores a missing title as ""
                j = seen.get(title, 0)
                seen[title] = j + 1
                ids.append(f"{title}#{j}")
                titles.append(title)
            start += len(e)
            bar.update(len(e))
            if n >= batch_size:
                _say(say, f"Reading {path.name}: {start:,}/{n:,} passages")
    return ids, titles, np.concatenate(blocks)


def _corpus(name: str, ds, ids: list[str], titles: list[str]) -> Corpus:
    """Our corpus over the knowledge dataset's own Arrow table: its text column as it is (memory-mapped),
    ids and titles (a missing title as "") and no urls alongside."""
    from datasets import Value

    table = ds.select_columns(["text"]).cast_column("text", Value("string"))
    table = table.add_column("id", ids).add_column("title", titles).add_column("url", [None] * len(ids))
    return Corpus(name, table)


def _check_index_file(path: Path, dataset_path: Path) -> None:
    if not path.is_file():
        raise ValueError(
            f"the knowledge index {path} does not exist: give the file written by "
            f"dataset.get_index('embeddings').save(path) for {dataset_path}, or {_EXPORT_HOW}."
        )


def _read_index(path: Path, n: int, d: int, dataset_path: Path) -> faiss.Index:
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as e:
        raise ValueError(
            f"{path} is not a FAISS index file ({str(e).strip().splitlines()[-1]}): give the file written by "
            "dataset.get_index('embeddings').save(path)."
        ) from e
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise ValueError(
            f"the FAISS index {path} ranks by metric {index.metric_type}, not inner product "
            f"({faiss.METRIC_INNER_PRODUCT}): RAG scores passages by q(x)·d(z); rebuild it with "
            "faiss.METRIC_INNER_PRODUCT (e.g. faiss.IndexHNSWFlat(d, 128, faiss.METRIC_INNER_PRODUCT))."
        )
    if (index.ntotal, index.d) != (n, d):
        raise ValueError(
            f"the FAISS index {path} holds {index.ntotal} x {index.d} vectors but {dataset_path} has {n} passages "
            f"of {d}-d embeddings: it was not built from this dataset; rebuild it with "
            "dataset.add_faiss_index('embeddings', ...) and save it again."
        )
    return index


def load_knowledge(dataset_path: str | Path, index_path: str | Path, say: Say | None = None,
                   batch_size: int = READ_BATCH) -> Knowledge:
    """A knowledge dataset (`save_to_disk` folder) and its FAISS index file as our corpus + index."""
    t0 = time.perf_counter()
    dataset_path, index_path = Path(dataset_path), Path(index_path)
    _check_index_file(index_path, dataset_path)  # before reading a dataset that may be large
    _say(say, f"Loading the knowledge dataset {dataset_path} ...")
    ds = _read_dataset(dataset_path)
    ids, titles, embeddings = _rows(ds, dataset_path, say, batch_size)
    index = _read_index(index_path, *embeddings.shape, dataset_path)
    name = f"{dataset_path.parent.name}/{dataset_path.name}" if dataset_path.parent.name else dataset_path.name
    knowledge = Knowledge(PassageIndex(_corpus(name, ds, ids, titles), embeddings, index), dataset_path, index_path,
                          time.perf_counter() - t0)
    _say(say, f"Knowledge dataset loaded in {knowledge.seconds:.1f} s: {len(ids):,} passages, "
              f"{embeddings.shape[1]}-d, FAISS {type(index).__name__}")
    return knowledge


def knowledge_paths(dataset: str | os.PathLike | None, index: str | os.PathLike | None) -> tuple[Path, Path] | None:
    """--knowledge-dataset and --knowledge-index: both or neither."""
    if dataset is None and index is None:
        return None
    if dataset is None or index is None:
        given, other = ("--knowledge-dataset", "--knowledge-index") if index is None else \
            ("--knowledge-index", "--knowledge-dataset")
        raise ValueError(f"{given} was given without {other}: give both (the save_to_disk folder and its FAISS index file).")
    return Path(dataset), Path(index)
