"""The same answers in a batch as alone: each question answered alone, one after another, then all of
them by a class of visitors at once through one StepScheduler (decoding steps batched across
visitors, serving/scheduler.py); every answer compared (text, tokens, log p(y|x)). The generator's
kept states are cleared between the two runs, so the batched answers are computed, not read back.

    .venv/bin/python scripts/batched_same.py --generator-dtype float32 --visitors 20
    .venv/bin/python scripts/batched_same.py --generator-dtype bfloat16 --out assets/results/batched_same_bf16.json

Questions: every dev question (assets/qa_dev.jsonl) and the answerable questions of the open file
(assets/qa_open_vital.jsonl) in its train and calibrate splits (its report split is kept for the
final tables), at the page's defaults (preset aided) unless --preset says otherwise.
Prints how many answers are the same and lists each difference with its log-prob gap.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def questions(limit: int | None) -> list[tuple[str, str]]:
    """(set, question) pairs: the dev file's, then the open file's answerable ones outside report."""
    from rag_demo.questions import answerable_ids, load_qa
    from rag_demo.splits import split_of

    out = [("dev", it.question) for it in load_qa(ROOT / "assets" / "qa_dev.jsonl")]
    path = ROOT / "assets" / "qa_open_vital.jsonl"
    labels = answerable_ids(path) or {}
    out += [("open", it.question) for it in load_qa(path)
            if labels.get(it.meta["id"]) and split_of(it.meta["id"]) in ("train", "calibrate")]
    return out[:limit] if limit else out


def clear_kept(pipe) -> None:
    for mm in pipe.stack.modes.values():
        for cache in mm.generator.kept_caches().values():
            cache.clear()


def main(argv: list[str] | None = None) -> int:
    from rag_demo.config import MODES, RagSettings
    from rag_demo.models.machine import cpu_name
    from rag_demo.models.stack_spec import StackSpec
    from rag_demo.pipeline import RagPipeline
    from rag_demo.runs import Run
    from rag_demo.serving.scheduler import StepScheduler

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generator-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--preset", default="aided")
    ap.add_argument("--visitors", type=int, default=20, help="visitors asking at once (default 20)")
    ap.add_argument("--limit", type=int, help="the first N questions only")
    ap.add_argument("--out", help="write the comparison to this JSON file")
    a = ap.parse_args(argv)
    pipe = RagPipeline.load(StackSpec(generator_dtype=a.generator_dtype))
    pipe.warm_up()
    s = RagSettings(preset=a.preset)
    qs = questions(a.limit)
    t0 = time.perf_counter()
    alone = [pipe.answers(q, list(MODES), s) for _, q in qs]
    t_alone = time.perf_counter() - t0
    clear_kept(pipe)
    sched = StepScheduler()
    together: list = [None] * len(qs)
    todo = iter(range(len(qs)))
    lock = threading.Lock()

    def visitor() -> None:  # asks the next question as soon as its last one is answered
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            together[i] = pipe.answers(qs[i][1], list(MODES), s, Run(share=lambda g: sched.gated(g)))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=visitor) for _ in range(a.visitors)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    t_batch = time.perf_counter() - t0
    rows, differ = {}, []
    for (name, q), one, many in zip(qs, alone, together):
        for m in MODES:
            x, y = one[m], many[m]
            same = x.text == y.text and x.token_ids == y.token_ids
            r = rows.setdefault(name, {"answers": 0, "same": 0})
            r["answers"] += 1
            r["same"] += same
            if not same:
                differ.append({"set": name, "question": q, "mode": m, "alone": x.text, "batched": y.text,
                               "logprob": [x.sequence_logprob, y.sequence_logprob],
                               "gap": y.sequence_logprob - x.sequence_logprob})
    members = [b.members for b in sched.recent]
    out = {"what": "answers alone and in a batch of visitors (scripts/batched_same.py)",
           "command": "python scripts/" + " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
           "cpu": cpu_name(), "generator_dtype": a.generator_dtype, "preset": a.preset, "visitors": a.visitors,
           "seconds_alone": round(t_alone, 1), "seconds_batched": round(t_batch, 1), "rows": rows, "differ": differ}
    for name, r in rows.items():
        print(f"{name}: {r['same']} of {r['answers']} answers the same alone and batched "
              f"({100 * r['same'] / r['answers']:.1f}%)")
    for d in differ:
        print(f"  differs ({d['set']}, {d['mode']}, gap {d['gap']:+.4f} nats): {d['question'][:50]!r}: "
              f"{d['alone']!r} alone, {d['batched']!r} batched")
    print(f"{a.generator_dtype} on {cpu_name()}: alone {t_alone:.0f} s, {a.visitors} visitors at once {t_batch:.0f} s; "
          f"last calls' visitors per call: max {max(members, default=0)}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
