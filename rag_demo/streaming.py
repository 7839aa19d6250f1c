"""Streaming: an answer's partial dicts while it is decoded (RAG-Token coloured as it grows,
RAG-Sequence's passages writing their drafts), and the worker thread that decodes while the caller's
thread hands the events on, closing early to cancel (docs/DESIGN.md §1)."""
from __future__ import annotations

import contextvars
import dataclasses
import queue
import threading
from typing import Callable, Iterator

import torch

from rag_demo.answer import AnswerEvent, Listen, RetrievedDoc
from rag_demo.rag.engine import Partial
from rag_demo.rag.marginalize import token_posteriors


def emitter(q: str, gen, listen: Listen | None, docs_of: Callable[[Partial], list[RetrievedDoc]],
            where: tuple[str, str]) -> Callable[[Partial], None] | None:
    """The engine's streaming hook: each Partial made into `partial_answer`'s dict and handed
    to `listen` (None when nobody listens: no work per step)."""
    if listen is None:
        return None
    return lambda part: listen(partial_answer(q, gen, part, docs_of(part), where))


def reading(q: str, mode: str, k: int, where: tuple[str, str]) -> dict:
    """The partial dict of a mode whose prompts are being read (before its first token)."""
    return {"question": q, "mode": mode, "partial": True, "phase": "reading", "k": k, "text": "", "tokens": [],
            "token_ids": [], "docs": [], "token_doc_posteriors": [], "top_docs": [], "drafts": [],
            "stack": where[0], "corpus": where[1]}


def partial_answer(q: str, gen, part: Partial, docs: list[RetrievedDoc], where: tuple[str, str]) -> dict:
    """An answer being decoded, as a JSON-able dict shaped like Answer.to_dict() plus
    "partial": True, "phase" and "drafts": "text"/"tokens" are the answer so far (RAG-Token
    coloured by the attribution so far, `token_doc_posteriors` (t, K): exactly the final
    answer's first t rows); RAG-Sequence's "drafts" are the K passages' own candidates being
    written ({"rank", "title", "text", "done"}), its "text" the draft of the passage with the
    highest p(z|x) until the candidates are rescored."""
    tokens = part.tokens[0] if part.mode != "sequence" else part.tokens[int(torch.argmax(part.prior))]
    shown = [i for i, t in enumerate(tokens) if not gen.is_special(t)]
    pieces = gen.token_pieces(tokens)
    rows: list[list[float]] = []
    if part.doc_lp is not None and part.prior is not None and len(tokens):
        post = token_posteriors(part.doc_lp, part.prior)[shown]  # (t', K)
        rows = post.tolist()
    drafts = []
    if part.mode == "sequence":
        drafts = [{"rank": d.rank, "title": d.title, "text": gen.decode(t), "done": done}
                  for d, t, done in zip(docs, part.tokens, part.done)]
    return {
        "question": q, "mode": part.mode, "partial": True, "phase": part.phase,
        "text": gen.decode(tokens), "tokens": [pieces[i] for i in shown], "token_ids": [tokens[i] for i in shown],
        "docs": [dataclasses.asdict(d) for d in docs], "token_doc_posteriors": rows,
        "top_docs": [max(range(len(r)), key=r.__getitem__) for r in rows], "drafts": drafts,
        "stack": where[0], "corpus": where[1],
    }


def either(a: Callable[[], bool] | None, b: Callable[[], bool]) -> Callable[[], bool]:
    return b if a is None else (lambda: a() or b())


def threaded(events: Callable[[Listen, Callable[[], bool]], Iterator[AnswerEvent]]) -> Iterator[AnswerEvent]:
    """Run `events(listen, gone)` in a worker thread and hand on, here, its partial answers (what
    `listen` got) and its events, in order. The worker runs with this thread's context (gradio's
    progress lives in it); its error is raised here. Stopping early sets `gone`: the decoding
    stops at its next step and the worker is waited for."""
    box: queue.Queue = queue.Queue()
    gone = threading.Event()
    done = object()

    def work() -> None:
        try:
            for event in events(lambda d: box.put(AnswerEvent(d["mode"], False, d)), gone.is_set):
                box.put(event)
                if gone.is_set():  # nobody waits for the modes left
                    break
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            box.put(e)
        finally:
            box.put(done)

    worker = threading.Thread(target=contextvars.copy_context().run, args=(work,), daemon=True,
                              name="rag-answer")
    worker.start()
    try:
        while (item := box.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        gone.set()
        worker.join()


