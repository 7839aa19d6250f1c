"""Do the cards' estimates hold when the machine is busy? Warm up on a quiet machine (as the app
does), answer questions as the page asks them (all three modes in one call), then again while a
second process keeps every core busy; per mode, each card's expected seconds against the time it
took. Writes assets/results/estimates.json (docs/results.md reads it: `python -m rag_demo tables`).

    .venv/bin/python scripts/estimates.py [--n 12] [--qa assets/qa_dev.jsonl] [--split calibrate]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def burn(stop, threads: int) -> None:
    """A second process keeping `threads` cores busy with matrix products until `stop` is set."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(1024, 1024)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def ask(pipe, questions, settings) -> list[dict]:
    from rag_demo.config import MODES
    from rag_demo.measure.latency import in_own_thread

    rows = []
    for q in questions:
        answers = in_own_thread(pipe.answers, q, list(MODES), settings)
        for mode, a in answers.items():
            rows.append({"mode": mode, "expected": a.expected_seconds, "took": a.timings["total"],
                         "speed_factor": pipe.speed.factor})
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        ratios = [r["expected"] / r["took"] for r in rows if r["mode"] == mode and r["took"] > 0 and r["expected"]]
        out[mode] = {"n": len(ratios), "median": statistics.median(ratios),
                     "within": sum(0.7 <= x <= 1.3 for x in ratios)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=12, help="questions per condition (default 12)")
    ap.add_argument("--qa", default="assets/qa_dev.jsonl")
    ap.add_argument("--split", default="calibrate", help="the split of --qa's questions to ask (default calibrate)")
    ap.add_argument("--out", default="assets/results/estimates.json")
    a = ap.parse_args()
    from rag_demo.config import RagSettings
    from rag_demo.measure.evaluate import cpu_name
    from rag_demo.measure.latency import in_own_thread
    from rag_demo.questions import load_qa
    from rag_demo.pipeline import RagPipeline
    from rag_demo.splits import in_split

    items = in_split(load_qa(ROOT / a.qa), a.split)[: 2 * a.n]
    pipe = in_own_thread(RagPipeline.load)
    in_own_thread(pipe.warm_up)  # quiet, as the app's start: the cost model and the speed baseline
    settings = RagSettings.for_stack("offline")
    quiet = ask(pipe, [it.question for it in items[: a.n]], settings)
    stop = mp.Event()
    load = mp.Process(target=burn, args=(stop, os.cpu_count() or 2), daemon=True)
    load.start()
    time.sleep(2.0)
    busy = ask(pipe, [it.question for it in items[a.n: 2 * a.n]], settings)
    stop.set()
    load.join(timeout=30)
    result = {"command": "python scripts/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu_name(),
              "qa": a.qa, "split": a.split, "date": time.strftime("%Y-%m-%d"),
              "ratios": {"quiet": summary(quiet), "a second process on every core": summary(busy)},
              "rows": {"quiet": quiet, "busy": busy}}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    for load_name, modes in result["ratios"].items():
        for mode, x in modes.items():
            print(f"{load_name:32s} {mode:12s} n={x['n']:3d} median expected/took {x['median']:.2f} "
                  f"within ±30%: {x['within']}/{x['n']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
