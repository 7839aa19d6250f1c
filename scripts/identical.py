"""How many answers are identical before and after a change: two sets of `eval --out` reports of the
same questions (each mode's answer, its token count and log p(y|x)), compared answer by answer.
Writes assets/results/identical.json (the `identical` table: python -m rag_demo tables).

    .venv/bin/python scripts/identical.py --before runs/evals/old_{set}_{preset}.json \\
        --after runs/evals/new_{set}_{preset}.json --sets dev,ext --presets paper,aided
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TITLES = {"dev": "dev (assets/qa_dev.jsonl)", "ext": "the first 100 of assets/qa_train_vital.jsonl"}
LOGPROB_TOLERANCE = 1e-4  # nats: the same tokens scored on the same CPU; float sums in another order at most


def answers(path: str) -> dict[tuple[str, str], dict]:
    r = json.loads(Path(path).read_text())
    return {(q["question"], row): a for q in r["questions"] for row, a in q["answers_by_row"].items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="a path with {set} and {preset} in it")
    ap.add_argument("--after", required=True)
    ap.add_argument("--sets", default="dev,ext")
    ap.add_argument("--presets", default="paper,aided")
    ap.add_argument("--pairs", help="set:preset pairs to compare instead of every set with every preset, "
                    "e.g. dev:paper,dev:aided,ext:paper")
    ap.add_argument("--what", default="the session's first commit against this tree")
    ap.add_argument("--out", default="assets/results/identical.json")
    a = ap.parse_args()
    rows, differ = [], []
    pairs = ([tuple(p.split(":")) for p in a.pairs.split(",")] if a.pairs else
             [(name, preset) for name in a.sets.split(",") for preset in a.presets.split(",")])
    for name, preset in pairs:
        old = answers(a.before.format(set=name, preset=preset))
        new = answers(a.after.format(set=name, preset=preset))
        keys = sorted(set(old) & set(new))
        same = [k for k in keys if old[k]["text"] == new[k]["text"] and old[k]["n_tokens"] == new[k]["n_tokens"]
                and abs(old[k]["logprob"] - new[k]["logprob"]) <= LOGPROB_TOLERANCE]
        rows.append({"questions": TITLES.get(name, name), "preset": preset, "answers": len(keys),
                     "identical": len(same)})
        differ += [{"set": name, "preset": preset, "question": k[0], "row": k[1], "before": old[k]["text"],
                    "after": new[k]["text"], "logprob": [old[k]["logprob"], new[k]["logprob"]]}
                   for k in keys if k not in set(same)]
    out = {"what": a.what, "command": "python scripts/" + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
           "rule": f"identical: the same text and number of tokens, log p(y|x) within {LOGPROB_TOLERANCE}",
           "rows": rows, "differ": differ}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in rows:
        print(f"{r['questions']}, {r['preset']}: {r['identical']} of {r['answers']} identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
