"""A test's reader: the paper's algorithm with the aids its settings switch on (rag_demo.reader.aided)."""
from __future__ import annotations

from rag_demo.config import RagSettings
from rag_demo.reader.aided import AidedReader


def aided(gen, s: RagSettings, prompts, question: str = "", passages=(), rejects=None, closed_book: bool = False):
    """The AidedReader of these settings over these prompts (passages: what the generator read;
    rejects: a stand-in for the echo tests)."""
    return AidedReader(s.aids, s.decoding, gen, question, list(passages), prompts,
                       [(p.title, p.text) for p in passages], closed_book=closed_book, rejects=rejects)


def in_two_threads(work, times: int = 3) -> list[list]:
    """work(i) `times` times in each of two threads started together (i = 0, 1) -> each thread's
    results; an exception in either is raised here (in a thread it would pass silently)."""
    import threading

    start, errors, got = threading.Barrier(2), [], [[], []]

    def run(i: int) -> None:
        try:
            start.wait()
            for _ in range(times):
                got[i].append(work(i))
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got
