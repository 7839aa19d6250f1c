"""Where a class's time goes, in one process: N visitors answer N different questions at once at the
page's defaults through one StepScheduler, after a few questions alone; prints each kind of model
call the scheduler ran (how many, seconds, visitors and rows a call) and the wall time, beside the
same for the questions alone, and the resident set after the wave by part (measure/resident.py).
No web server: the model's share of a class wave (scripts/load.py --class measures the app).

    .venv/bin/python scripts/class_calls.py --visitors 20 --alone 3
    .venv/bin/python scripts/class_calls.py --visitors 20 --alone 3 --model-thread --timeline
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def by_call(stats) -> dict[str, tuple[int, float, float, float]]:
    """{what: (calls, seconds, visitors a call, rows a call)} of the scheduler's BatchStats."""
    acc = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for b in stats:
        a = acc[b.what]
        a[0] += 1
        a[1] += b.seconds
        a[2] += b.members
        a[3] += b.rows
    return {k: (n, round(s, 2), round(m / n, 1), round(r / n, 1)) for k, (n, s, m, r) in acc.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--visitors", type=int, default=20)
    ap.add_argument("--alone", type=int, default=3)
    ap.add_argument("--trim-each", action="store_true",
                    help="give freed memory back after each visitor's answer, as the app does after every request")
    ap.add_argument("--model-thread", action="store_true",
                    help="every model call on one thread with torch's threads, every other thread at one from the "
                         "start, loading and warm-up included (serving/model_thread.py; the app's default)")
    ap.add_argument("--timeline", action="store_true",
                    help="also print the wave's model calls in the order they ran: kind, members, seconds "
                         "(pre = a prefill or other call of its own, adv = a batched step)")
    a = ap.parse_args(argv)
    from rag_demo.serving import memory

    # the app's allocator and kernel-cache bounds (app.py), before torch runs anything: the resident
    # set after the wave is then the one the app's pipeline holds
    memory.limit_arenas(int(os.environ.get("MALLOC_ARENA_MAX", "2")))
    memory.limit_kernel_cache()
    model_thread = None
    if a.model_thread:  # one OpenMP team in the process: no other thread may grow one, loading included
        from rag_demo.serving.model_thread import ModelThread

        model_thread = ModelThread(others=1)
    from load import class_questions

    from rag_demo.config import MODES, RagSettings
    from rag_demo.models.machine import cpu_name
    from rag_demo.pipeline import RagPipeline
    from rag_demo.runs import Run
    from rag_demo.measure.resident import mapped, memory_parts
    from rag_demo.serving.scheduler import StepScheduler

    before = mapped()  # the interpreter and the libraries imported so far, nothing loaded
    pipe = RagPipeline.load()
    pipe.warm_up()

    memory.trim()
    ready_rss = memory.rss_bytes()
    qs, s = class_questions(a.visitors + a.alone), RagSettings(preset="aided")
    sched = StepScheduler(model_thread=model_thread)
    sched.recent = collections.deque(maxlen=1_000_000)
    alone = []
    for q in qs[a.visitors:]:
        t0 = time.perf_counter()
        pipe.answers(q, list(MODES), s, Run(share=lambda g: sched.gated(g)))
        alone.append(time.perf_counter() - t0)
    print(f"{cpu_name()}: {len(alone)} questions alone, {sum(alone):.1f} s; calls {by_call(sched.recent)}")
    sched.recent.clear()
    def visit(q: str) -> None:
        pipe.answers(q, list(MODES), s, Run(share=lambda g: sched.gated(g)))
        if a.trim_each:
            memory.trim()

    threads = [threading.Thread(target=visit, args=(q,)) for q in qs[: a.visitors]]
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    calls = by_call(sched.recent)
    if a.timeline:
        print("the wave's calls in order: " + " ".join(f"{b.what[:3]}{b.members}:{b.seconds:.2f}" for b in sched.recent))

    memory.trim()
    after = memory.rss_bytes()
    print(f"RSS after the wave, trimmed: {after / 1e9:.2f} GB (after warm-up {ready_rss / 1e9:.2f} GB); by part: "
          + ", ".join(f"{k} {v / 1e9:.2f}" for k, v in memory_parts(pipe, before, after).items()))
    busy = sum(c[1] for c in calls.values())
    print(f"{a.visitors} visitors at once: {wall:.1f} s wall, {cpu:.0f} CPU s, the model busy {busy:.1f} s; "
          f"calls {calls}; serial estimate {a.visitors * sum(alone) / len(alone):.1f} s "
          f"({a.visitors * sum(alone) / len(alone) / wall:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
