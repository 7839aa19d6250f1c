"""Compare `python -m rag_demo eval --out` reports question by question (#11).

    python scripts/compare_evals.py "today's=artifacts/a.json" "new=artifacts/b.json" [--rows sequence|dense,token|dense]

Prints one markdown table: per report and row (mode|retriever), over the questions every report
answered, n, EM / F1 / contains, then the same over the questions whose K passages (the row's
own) hold a gold answer ("given retrieval"), and for every report after the first the paired
difference in given-retrieval contains with a 95% bootstrap interval (2,000 resamples of the
questions, seed 0). The given-retrieval set of a row can differ between reports when their
retrieval differs (K); the difference is then over the questions given in both.
"""
from __future__ import annotations

import argparse
import json
import random
import sys


def load(label_path: str) -> tuple[str, dict]:
    label, _, path = label_path.rpartition("=")
    if not path:
        sys.exit(f"{label_path!r}: give LABEL=PATH")
    with open(path) as fh:
        report = json.load(fh)
    return label, {q["question"]: q for q in report["questions"]} | {"__settings__": report["settings"]}


def mean(xs) -> float:
    xs = list(xs)
    return 100 * sum(xs) / len(xs) if xs else float("nan")


def bootstrap(diffs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    if not diffs:
        return float("nan"), float("nan")
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    return 100 * means[int(0.025 * n)], 100 * means[int(0.975 * n) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="LABEL=PATH of an eval --out JSON")
    ap.add_argument("--rows", help="comma-separated rows to show, e.g. token|dense (default: all)")
    a = ap.parse_args()
    runs = [load(x) for x in a.reports]
    common = set.intersection(*({q for q in r if q != "__settings__"} for _, r in runs))
    if not common:
        sys.exit("the reports share no question")
    qs = sorted(common)
    rows = sorted(set.intersection(*(set(r[qs[0]]["answers_by_row"]) for _, r in runs)))
    if a.rows:
        rows = [x for x in rows if x in a.rows.split(",")]
    print(f"Questions every report answered: {len(qs)}\n")
    print("| run | row | n | EM | F1 | contains | n given | EM | F1 | contains | Δ contains given (95% CI) | tokens |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    base_label, base = runs[0]
    for row in rows:
        for label, r in runs:
            res = [r[q]["answers_by_row"][row] for q in qs]
            given = [x for x in res if x["hit"]]
            delta = ""
            if r is not base:
                both = [q for q in qs if r[q]["answers_by_row"][row]["hit"] and base[q]["answers_by_row"][row]["hit"]]
                d = [r[q]["answers_by_row"][row]["contains"] - base[q]["answers_by_row"][row]["contains"] for q in both]
                lo, hi = bootstrap(d)
                delta = f"{mean(d):+.1f} ({lo:+.1f}, {hi:+.1f}), n={len(d)}"
            print(f"| {label} | {row} | {len(res)} | {mean(x['em'] for x in res):.1f} | {mean(x['f1'] for x in res):.1f} "
                  f"| {mean(x['contains'] for x in res):.1f} | {len(given)} | {mean(x['em'] for x in given):.1f} "
                  f"| {mean(x['f1'] for x in given):.1f} | {mean(x['contains'] for x in given):.1f} | {delta} "
                  f"| {sum(x['n_tokens'] for x in res) / len(res):.1f} |")


if __name__ == "__main__":
    main()
