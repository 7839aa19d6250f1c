"""Per-session state of the web app: what one browser tab has chosen, and the index it answers from.

Owns `Session` (a frozen dataclass kept in a `gr.State`: the stack, the corpus chosen, an
upload and its index, an edited copy of the index, the last answer's passages, the warnings
seen) and the index a session answers from (`active_index`, `session_pipeline`). The shared
pipelines are never changed: an upload gets its own index, an edit a copy. Imports neither
torch nor gradio.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rag_demo.serving.pool import PipelinePool


@dataclass(frozen=True)
class Session:
    """What one browser tab (or one gradio_client.Client) has chosen; stored in a gr.State.

    The shared pipelines and their indexes are never changed: an upload gets its own index,
    an edit a copy of the active index (PassageIndex.with_edited_passage), held for the session
    as its recipe (`Edits`).
    """

    stack: str = "offline"
    corpus: str = "builtin"  # "builtin" (the stack's corpus), "upload", or a key of pool.corpora() ("factbook")
    upload: Any = None  # Corpus of this visitor's uploaded documents
    upload_index: Any = None  # its PassageIndex under `upload_stack`'s passage encoder
    upload_stack: str | None = None
    named_index: Any = None  # the shared index of the other built-in corpus chosen (pool.corpus_index)
    named_stack: str | None = None  # the stack whose passage encoder made `named_index`
    edited: Any = None  # this visitor's edits of the active index (`Edits`; None: no edits)
    edits: tuple[str, ...] = ()  # ids of edited passages
    last_docs: tuple[tuple[str, str, str], ...] = ()  # (id, title, text) of the last answer's passages
    # what this server computed for the last answers, per RAG mode: (mode, passage ids, each passage's
    # drop of log p(y|x) when taken away, the posterior p(z|x,y) or None); what /without_passage
    # shows, never the numbers a client sends back
    last_numbers: tuple[tuple[str, tuple, tuple, tuple | None], ...] = ()
    warned: frozenset[str] = frozenset()  # warnings this visitor has seen (each is shown once)


# Edited copies of an index kept at once, server-wide: an edited Vital Articles index holds its own
# copy of the passages' table (~10 MB; the vectors and search index are the base's, the edited rows'
# vectors beside them), and a class's sessions each holding a whole copy took the app from 1.3 to
# 2.4 GB within minutes (docs/results.md §3.6); one dropped is rebuilt from its edits.
EDITED_KEPT = 3


class Edits:
    """A visitor's edits of an index, as a recipe: the index they were made on (shared, never
    changed) and each edit (passage id, text, title or None) in order. The edited copy is kept in a
    bounded store shared by every session (EDITED_KEPT, least recently used dropped first) and
    rebuilt from the recipe when it was dropped: a session holds a few hundred bytes, not a copy."""

    _kept: "OrderedDict[int, tuple[Edits, Any]]" = OrderedDict()  # id(recipe) -> (recipe, its edited index)
    _lock = threading.Lock()

    def __init__(self, base: Any, edits: tuple[tuple[str, str, str | None], ...] = ()) -> None:
        self.base, self.edits = base, tuple(edits)

    def then(self, passage_id: str, text: str, title: str | None, encoder: Any) -> "Edits":
        """These edits and one more, its copy built now (ValueError for a passage or text the
        index refuses, before anything is kept)."""
        index = self.index(encoder).with_edited_passage(passage_id, text, encoder, title)
        out = Edits(self.base, (*self.edits, (passage_id, text, title)))
        out._keep(index)
        return out

    @property
    def passage_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(pid for pid, _, _ in self.edits))

    def index(self, encoder: Any) -> Any:
        """The edited copy: kept, or rebuilt from the base and the edits (one passage embedded each)."""
        if not self.edits:
            return self.base
        with self._lock:
            got = self._kept.get(id(self))
            if got is not None and got[0] is self:
                self._kept.move_to_end(id(self))
                return got[1]
        index = self.base
        for pid, text, title in self.edits:
            index = index.with_edited_passage(pid, text, encoder, title)
        self._keep(index)
        return index

    def _keep(self, index: Any) -> None:
        with self._lock:
            self._kept[id(self)] = (self, index)
            self._kept.move_to_end(id(self))
            while len(self._kept) > EDITED_KEPT:
                self._kept.popitem(last=False)

    @classmethod
    def kept(cls) -> int:
        """How many edited copies are held now (tests)."""
        with cls._lock:
            return len(cls._kept)


def active_index(s: Session, base: Any) -> Any:
    """The index this visitor answers from: its edited copy, its upload, the other built-in corpus
    it chose, or the stack's own."""
    if s.edited is not None:
        return s.edited.index(base.stack.ctx_encoder)
    if s.corpus == "upload" and s.upload_index is not None:
        return s.upload_index
    if s.corpus not in ("builtin", "upload") and s.named_index is not None and s.named_stack == base.stack.name:
        return s.named_index
    return base.index


def embed_corpus(base: Any, corpus: Any, progress: Callable, serving: Any = None) -> Any:
    """A fresh (uncached: uploads stay in memory) index of `corpus` under `base`'s passage encoder.
    With the server's `serving` (admission.Serving; the caller holds its `upload_lane`): priced
    after the first batch (ValueError over the budget), each batch a model call of its own at the
    shared gate, so a class's answers wait on it for at most one batch."""
    from rag_demo.knowledge.index import build_index

    def bar(done: int, total: int) -> None:
        progress((done, total), desc=f"Embedding {total:,} passages", unit="passages")

    progress((0, len(corpus)), desc=f"Embedding {len(corpus):,} passages", unit="passages")
    if serving is None:
        return build_index(corpus, base.stack.ctx_encoder, bar)
    return build_index(corpus, base.stack.ctx_encoder, bar, turn=serving.embed_turn,
                       price=serving.upload_price(len(corpus)))


def upload_lane(serving: Any, progress: Callable):
    """The server's upload lane (admission.Serving.upload_lane), its wait shown by `progress`; none
    without a server."""
    if serving is None:
        return contextlib.nullcontext(True)
    return serving.upload_lane(lambda: progress(0.0, desc="Waiting for another visitor's upload to be indexed"))


def session_pipeline(pool: PipelinePool, s: Session, progress: Callable | None = None,
                     serving: Any = None) -> tuple[Any, Session]:
    """(pipeline with the session's index, session): re-embeds an upload made under another stack
    (as `embed_corpus` does, with `serving`), and gets the shared index of another built-in corpus
    (built with a progress bar the first time)."""
    relay = (lambda frac, msg: progress(frac, desc=msg)) if progress else None
    base = pool.get(s.stack, relay)
    if s.corpus == "upload" and s.upload is not None and s.edited is None and s.upload_stack != s.stack:
        quiet = progress or (lambda *a, **k: None)
        with upload_lane(serving, quiet):
            index = embed_corpus(base, s.upload, quiet, serving)
        s = dataclasses.replace(s, upload_index=index, upload_stack=s.stack)
    if s.corpus not in ("builtin", "upload") and s.edited is None and (s.named_index is None or s.named_stack != s.stack):
        index = pool.corpus_index(s.stack, s.corpus, relay)
        s = dataclasses.replace(s, named_index=index, named_stack=s.stack)
    index = active_index(s, base)
    return (base if index is base.index else base.with_index(index)), s
