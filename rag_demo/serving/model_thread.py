"""The model's own thread: every model call runs on one thread with all of torch's intra-op
threads, and every other thread on one, so that one OpenMP team works in the process
(docs/results.md §3.6).

Why: GNU OpenMP (torch's) lets a team's idle threads spin between parallel regions only while the
threads it manages are no more than the CPUs; past that, every region sleeps and wakes its threads
through the kernel. A thread that runs torch at two intra-op threads grows a team of its own, so
once the warm-up's thread and a request's thread had each grown one, a decoding step in the
request's thread took over twice as long, and a class, each visitor's thread leading in turn, paid
it on every step. The count is each thread's own, fixed
on its first use of torch from the process's count: `others` sets the count of the thread that makes
the model thread, and of every thread that first uses torch after it, so it must come before
anything else grows a team (loading included). The app makes it first (app.py --model-thread); its
StepScheduler runs every answer's model calls on it, the pool its warm-up (which calibrates the
budget's speed), and the upload lane each batch of an upload's or an edit's embedding
(admission.Serving.embed_turn). A background build of a corpus's dense index and a first build of
another built-in corpus's index run in their own threads, at one thread.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch


class ModelThread:
    """Runs model calls on one thread (`run`) with `threads` intra-op threads (default: torch's
    count where it is made); `others`, if given, becomes the count of the calling thread and of
    every thread that first uses torch after it."""

    def __init__(self, threads: int | None = None, others: int | None = None) -> None:
        self.threads = torch.get_num_threads() if threads is None else int(threads)
        if self.threads < 1 or (others is not None and int(others) < 1):
            raise ValueError(f"threads={threads!r}, others={others!r}: each needs at least one intra-op thread.")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rag-demo-model", initializer=self._start)
        self.ident = self._pool.submit(threading.get_ident).result()  # started now, at its own count
        if others is not None:
            torch.set_num_threads(int(others))  # this thread's count, and the one later threads take

    def _start(self) -> None:
        torch.set_num_threads(self.threads)
        torch.get_num_threads()  # torch fixes a thread's count on its first use: now, at this one

    def run(self, fn: Callable[..., Any], *args, **kwargs) -> Any:
        """fn(*args, **kwargs) on the model's thread -> its result; its exception is raised here."""
        if threading.get_ident() == self.ident:  # already on it
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()
