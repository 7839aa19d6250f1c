"""RSS of the offline pipeline under threaded requests, with and without the allocator settings
of rag_demo/serving/memory.py (why the app limits malloc arenas and trims after each request).

    python experiments/memory_check.py              # both configurations, each in a fresh process
    python experiments/memory_check.py --one tuned  # one configuration in this process
    python experiments/memory_check.py --tiny --requests 2 --threads 2   # smoke run

Runs --requests questions on --threads worker threads (as gradio's worker pool does), varied
settings (K 5-15, beams 1-2), and prints RSS after warm-up, after the requests, and the peak,
with the load average. Numbers, not a test.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from _shared import TINY_HELP, tiny_pipeline

CONFIGS = ("default", "tuned")


def run_one(config: str, requests: int, threads: int, tiny: bool = False) -> None:
    from rag_demo.serving import memory

    if config == "tuned":
        memory.limit_arenas(2)
    from rag_demo.pipeline import RagPipeline
    from rag_demo.web.session_view import VITAL_EXAMPLES

    pipe = tiny_pipeline() if tiny else RagPipeline.load()
    modes = ["sequence", "token", "closed-book"]
    pipe.answers("Who wrote Hamlet?", modes)
    if config == "tuned":
        memory.trim()
    time.sleep(1)
    rss0 = memory.rss_bytes()
    lock = threading.Lock()
    todo = list(range(requests))

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            with lock:  # one model call at a time (as the app's gate does); threads still differ
                pipe.answers(VITAL_EXAMPLES[i % len(VITAL_EXAMPLES)], modes, k=min(5 + 5 * (i % 2), len(pipe.index)),
                             num_beams=1 + i % 2)
            if config == "tuned":
                memory.trim()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    time.sleep(1)
    rss1 = memory.rss_bytes()
    print(f"{config:>8}: RSS after warm-up {rss0 / 1e9:.2f} GB, after {requests} requests on {threads} threads "
          f"{rss1 / 1e9:.2f} GB ({100 * (rss1 / rss0 - 1):+.0f}%), peak {memory.peak_rss_bytes() / 1e9:.2f} GB; "
          f"{time.perf_counter() - t0:.0f} s; load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", choices=CONFIGS, help="one configuration, in this process")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help=TINY_HELP)
    args = p.parse_args(argv)
    if args.one:
        run_one(args.one, args.requests, args.threads, args.tiny)
        return 0
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    for config in CONFIGS:
        subprocess.run([sys.executable, __file__, "--one", config, "--requests", str(args.requests),
                        "--threads", str(args.threads), *(["--tiny"] if args.tiny else [])],
                       env={**env, "HF_HUB_OFFLINE": "1"}, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
