"""Shipped indexes: the passage vectors of a built-in corpus, made once by `scripts/ship_index.py`
from the pinned corpus and encoder and kept in the repository (`assets/indexes/<key>/`), so that a
cold start answers from the dense index at once instead of embedding every passage for minutes.

A shipped index is one `embeddings.npy` in float16 (half the bytes of float32; a score moves by at
most ~1e-4, which reorders the top 5 of a few questions in a thousand: docs/results.md §3) and a
`meta.json` naming what made it: the corpus's and the encoder's fingerprints, the precision the
passages were computed in, and the file's sha256. key = sha256(corpus fingerprint + the encoder's
model fingerprint)[:16], the precision left out: the vectors serve an encoder that would compute
passages in float32 or in bfloat16 alike. Another corpus, encoder or recipe finds no shipped
index and is built as before; the log says which shipped index was there and why it does not fit.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
from pathlib import Path

import numpy as np

from rag_demo.knowledge.corpus import Corpus
from rag_demo.models.encoders import Encoder

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "indexes"
STORED_DTYPE = np.float16
FORMAT_VERSION = 1


def model_fingerprint(encoder: Encoder) -> str:
    """The encoder's fingerprint without its passage precision (Encoder.model_fingerprint; an encoder
    that has none, duck-typed, is keyed by its whole fingerprint)."""
    own = getattr(encoder, "model_fingerprint", None)
    return own() if callable(own) else encoder.fingerprint()


def shipped_key(corpus: Corpus, encoder: Encoder) -> str:
    """sha256(corpus fingerprint + encoder model fingerprint)[:16]."""
    return hashlib.sha256((corpus.fingerprint() + model_fingerprint(encoder)).encode()).hexdigest()[:16]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_shipped(corpus: Corpus, encoder: Encoder, embeddings: np.ndarray, out_dir: Path = SHIPPED_DIR,
                  about: dict | None = None) -> Path:
    """Store (N, D) `embeddings` of `corpus` by `encoder` in float16 under out_dir/<key>/, with
    meta.json (what made them, and `about`: the command, the CPU); -> the folder."""
    if embeddings.shape != (len(corpus), encoder.dim):
        raise ValueError(f"embeddings of shape {embeddings.shape} do not fit {corpus.name!r}: "
                         f"expected ({len(corpus)}, {encoder.dim}), one row a passage")
    key = shipped_key(corpus, encoder)
    folder = Path(out_dir) / key
    folder.mkdir(parents=True, exist_ok=True)
    npy = io.BytesIO()
    np.save(npy, np.ascontiguousarray(embeddings, dtype=STORED_DTYPE), allow_pickle=False)
    (folder / "embeddings.npy").write_bytes(npy.getvalue())
    meta = {"format_version": FORMAT_VERSION, "key": key, "corpus": corpus.name, "n": len(corpus),
            "dim": encoder.dim, "encoder": encoder.name, "corpus_fingerprint": corpus.fingerprint(),
            "encoder_model_fingerprint": model_fingerprint(encoder),
            "computed_in": str(encoder.passage_dtype).removeprefix("torch."),
            "stored_as": np.dtype(STORED_DTYPE).name, "sha256": _sha256(npy.getvalue()), **(about or {})}
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return folder


def _why_none_fits(corpus: Corpus, encoder: Encoder, shipped_dir: Path) -> None:
    """Log the shipped indexes of this corpus's name that were made for another corpus or encoder."""
    for meta_file in sorted(shipped_dir.glob("*/meta.json")):
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        if meta.get("corpus") != corpus.name:
            continue
        differ = [what for what, mine, theirs in (
            ("corpus", corpus.fingerprint(), meta.get("corpus_fingerprint")),
            ("encoder", model_fingerprint(encoder), meta.get("encoder_model_fingerprint"))) if mine != theirs]
        log.warning("the shipped index of %s (%s, by %s) was made from another %s than this stack's %s: "
                    "building the index instead", corpus.name, meta_file.parent, meta.get("encoder"),
                    " and ".join(differ) or "format", encoder.name)


def shipped_vectors(corpus: Corpus, encoder: Encoder,
                    shipped_dir: Path | None = SHIPPED_DIR) -> tuple[np.ndarray, Path, str] | None:
    """(the (N, D) float32 vectors, their folder, the key) when a shipped index was made for this
    corpus and encoder and its file is intact; else None (a corrupt or mismatched one is logged)."""
    if shipped_dir is None or not Path(shipped_dir).is_dir():
        return None
    key = shipped_key(corpus, encoder)
    folder = Path(shipped_dir) / key
    if not (folder / "meta.json").is_file():
        _why_none_fits(corpus, encoder, Path(shipped_dir))
        return None
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        data = (folder / "embeddings.npy").read_bytes()
        expected = {"format_version": FORMAT_VERSION, "key": key, "n": len(corpus), "dim": encoder.dim,
                    "sha256": _sha256(data)}
        wrong = {k: meta.get(k) for k, v in expected.items() if meta.get(k) != v}
        if wrong:
            raise ValueError(f"meta.json has {wrong}: the file is truncated, corrupt or of another format")
        vectors = np.load(io.BytesIO(data), allow_pickle=False).astype(np.float32)  # (N, D)
    except (OSError, ValueError, KeyError) as e:
        log.warning("the shipped index %s is unusable (%s); building the index instead", folder, e)
        return None
    return vectors, folder, key
